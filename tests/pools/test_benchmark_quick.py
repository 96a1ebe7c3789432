"""``benchmarks/alloc_free_pairs.py --quick``: one JSON line, both settings measured, ratio consistent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
            assert timing["total_s"] > 0 and timing["us_per_pair"] > 0 and timing["cpu_s"] > 0
            assert timing["us_per_pair"] == pytest.approx(timing["total_s"] / result["pairs"] * 1e6, rel=0.01)
        ratio = entry["on"]["total_s"] / entry["off"]["total_s"]
        assert entry["ratio_on_off"] == pytest.approx(ratio, rel=0.01)
