"""``benchmarks/run_all.py`` finds every benchmark, runs it, and prints a table plus one JSON line per figure.

Timings are never asserted (issue 8): only the shape of what is printed, and that the figures are well
formed (``tests/clock_figures.py``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.clock_figures import assert_clock_figure

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


run_all = _load("run_all")

FAKE_WITH_FIGURES = """
import json
print("some log line")
print(json.dumps({"benchmark": "fake", "figures": [
    {"benchmark": "fake", "figure": "ops", "unit": "op/s", "release": 10.0, "contracts_on": 5.0,
     "on_off_ratio": 2.0, "target": "on/off <= 3", "note": None}]}))
"""
FAKE_PLAIN = 'import json\nprint(json.dumps({"tokens_per_s": 123.5, "nested": {"steps": 7}, "ok": True}))\n'
FAKE_BROKEN = "raise SystemExit('no GPU here')\n"
FAKE_NEEDS_ARGS = (
    "import argparse\np = argparse.ArgumentParser()\np.add_argument('--baseline', required=True)\np.parse_args()\n"
)


def test_every_benchmark_script_is_discovered() -> None:
    found = {p.name for p in run_all.discover([], [])}
    expected = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_") and p.name != "run_all.py"}
    assert found == expected
    assert {"long_run.py", "allocator.py", "radix_cache.py", "scheduler_steps.py"} <= found


def test_figures_tables_and_json_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "fake.py").write_text(FAKE_WITH_FIGURES)
    (tmp_path / "plain.py").write_text(FAKE_PLAIN)
    (tmp_path / "broken.py").write_text(FAKE_BROKEN)
    (tmp_path / "driver.py").write_text(FAKE_NEEDS_ARGS)
    (tmp_path / "_helper.py").write_text("raise RuntimeError('helpers are not benchmarks')\n")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    status = run_all.main([])
    out = capsys.readouterr().out
    assert status == 1, "a failed benchmark makes the run fail"
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    by = {(r["benchmark"], r["figure"]): r for r in rows}
    assert by[("fake", "ops")]["on_off_ratio"] == 2.0
    assert by[("plain", "tokens_per_s")]["release"] == 123.5  # a script without figures: its numbers
    assert by[("plain", "nested.steps")]["release"] == 7.0
    assert ("plain", "ok") not in by  # booleans are not figures
    assert "no GPU here" in by[("broken", "FAILED")]["error"]
    assert "--baseline" in by[("driver", "SKIPPED")]["note"] and "error" not in by[("driver", "SKIPPED")]
    assert not any(r["benchmark"] == "_helper" for r in rows)
    table = out.split("\n\n")[0].splitlines()
    assert table[0].split()[:3] == ["benchmark", "figure", "unit"]
    assert len(table) == 2 + len(rows)  # header, rule, one line per figure


@pytest.mark.slow
@pytest.mark.parametrize("name", ["allocator", "long_run"])
def test_quick_benchmarks_print_well_formed_figures(name: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--quick"], cwd=REPO, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["benchmark"] == name and result["figures"]
    for row in result["figures"]:
        assert {"benchmark", "figure", "unit", "release", "contracts_on", "on_off_ratio", "target"} <= row.keys()
        if row["unit"] != "KiB/1000 req":  # a slope may be negative; everything else is a clock figure
            for key in ("release", "contracts_on", "on_off_ratio"):
                assert_clock_figure(row[key], f"{row['figure']}.{key}")
    if name == "allocator":
        assert all(r["sglang_baseline"] is not None for r in result["figures"])
        for row in result["rows"]:  # issue 38: SGLang's own classes next to release, the random loop too
            assert row["sglang"]["version"] == "0.5.23"
            assert set(row["release_vs_sglang"]) == {"alloc", "free", "random_loop_ops"}
            for key, value in row["release_vs_sglang"].items():
                assert_clock_figure(value, f"release_vs_sglang.{key}")
    else:
        for setting in ("contracts_off", "contracts_on"):
            retained = result[setting]["retained"]
            assert retained["tracked_by_accounting"] == 0
            assert retained["requests_in_scheduler"] <= 1024
