"""``benchmarks/alloc_free_pairs.py --quick``: one JSON line, both settings measured, figures well-formed.

Timings are checked for their domain (finite, non-negative, or None when unmeasurable), never their size
(issue 8); the derived figures are checked against the raw ones they come from, which holds exactly
because the benchmark reports unrounded values.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clock_figures import assert_clock_figure

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "alloc_free_pairs.py"


@pytest.mark.slow
def test_quick_run_prints_one_json_line_with_both_settings() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    assert result["benchmark"] == "alloc_free_pairs"
    assert result["pairs"] == 2000
    for pool in ("token", "paged"):
        entry = result[pool]
        assert set(entry) == {"tokens_per_alloc", "off", "on", "ratio_on_off", "cpu_ratio_on_off"}
        assert entry["off"]["ledger"] == "NullLedger" and entry["on"]["ledger"] == "Ledger"
        for setting in ("off", "on"):
            timing = entry[setting]
            for figure in ("total_s", "us_per_pair", "cpu_s"):
                assert_clock_figure(timing[figure], f"{pool}.{setting}.{figure}")
            assert timing["us_per_pair"] == pytest.approx(timing["total_s"] / result["pairs"] * 1e6)
        for figure, key in (("ratio_on_off", "total_s"), ("cpu_ratio_on_off", "cpu_s")):
            assert_clock_figure(entry[figure], f"{pool}.{figure}")
            off = entry["off"][key]
            if off <= 0:
                assert entry[figure] is None
            else:
                assert entry[figure] == pytest.approx(entry["on"][key] / off)


def test_derived_figures_survive_an_interval_that_reads_zero() -> None:
    """A loaded machine can read a short interval as 0 s: the figure is None, never a crash or Infinity."""
    spec = importlib.util.spec_from_file_location("bench_figures", REPO / "benchmarks" / "_figures.py")
    assert spec is not None and spec.loader is not None
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    assert figures.per_second(100, 0.0) is None
    assert figures.per_second(100, 0.5) == 200.0
    assert figures.ratio(1.0, 0.0) is None
    assert figures.ratio(None, 1.0) is None
    assert figures.ratio(3.0, 2.0) == 1.5
