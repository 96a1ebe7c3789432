"""``benchmarks/checking_levels.py`` measures every level on every workload and prints one JSON line each.

Timings are never asserted (issue 8): only the shape of what is printed, that each child ran at the level
it was asked for, and that the figures are well formed (``tests/clock_figures.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clock_figures import assert_clock_figure

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "checking_levels.py"
LEVELS = ["release", "owners", "ledger", "full"]


@pytest.mark.slow
def test_quick_run_prints_every_level_of_every_workload() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--only", "simulate,pairs"],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [r["workload"] for r in results] == ["simulate", "pairs"]
    for result in results:
        assert result["benchmark"] == "checking_levels"
        assert list(result["levels"]) == LEVELS
        for level, row in result["levels"].items():
            assert_clock_figure(row["cpu_s"], f"{result['workload']}.{level}.cpu_s")
            assert len(row["runs_cpu_s"]) == 1
        assert result["levels"]["release"]["ratio_to_release"] == 1.0
        assert result["levels"]["release"]["ratio_of_minima"] == 1.0
        for row in result["levels"].values():  # one run each: the minimum is the median
            assert row["ratio_of_minima"] == row["ratio_to_release"]
        assert [f["figure"] for f in result["figures"]] == [f"{result['workload']}, {lv}" for lv in LEVELS[1:]]
        for figure in result["figures"]:
            assert_clock_figure(figure["on_off_ratio"], figure["figure"])
    simulate = results[0]["levels"]
    assert simulate["owners"]["target"] == 1.10 and simulate["ledger"]["target"] == 1.6
    assert simulate["full"]["target"] == 2.5 and simulate["release"]["target"] is None
    assert set(results[1]["levels"]["ledger"]["pools"]) == {"token_p1", "paged_p16"}
    for level, target in (("owners", 1.25), ("ledger", 1.6), ("full", 4.0)):  # issue 38: a ratio per path
        paths = results[1]["levels"][level]["paths"]
        assert set(paths) == {"token_p1", "paged_p16"}
        for row in paths.values():
            assert row["target"] == target and row["met"] == (row["ratio_to_release"] <= target)
            assert_clock_figure(row["ratio_to_release"], f"pairs.{level}")


def test_scale_prints_cpu_per_request_and_peak_rss_per_size() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--only", "scale", "--levels", "release,owners", "--scales", "1,2,17"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (result,) = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert result["workload"] == "scale" and result["scale_by"] == "groups"
    levels = result["levels"]
    assert list(levels["release"]["sizes"]) == ["1x", "2x", "17x"]  # above 16x: release only
    assert list(levels["owners"]["sizes"]) == ["1x", "2x"]
    assert levels["release"]["sizes"]["17x"]["requests"] == 17 * levels["release"]["sizes"]["1x"]["requests"]
    for row in levels.values():
        assert row["target"] == 1.2 and row["met"] == (row["worst_ratio"] <= 1.2)
        for size in row["sizes"].values():
            assert_clock_figure(size["cpu_per_request_ms"], "scale cpu per request")
            assert size["peak_rss_mib"] > 0 and 0 <= size["prefix_hit_rate"] <= 1
    assert [f["figure"] for f in result["figures"]] == [
        "scale, release, 2x", "scale, release, 17x", "scale, owners, 2x"
    ]  # fmt: skip


def test_a_child_runs_at_the_level_it_was_given() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", "simulate", "--quick"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("KVLEDGER_")} | {"KVLEDGER_CHECKS": "owners"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child["checks"] == "owners" and child["steps"] > 0


def test_unknown_workloads_and_levels_are_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "simulate,warp", "--levels", "paranoid"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown workload or level: warp, paranoid" in done.stderr
