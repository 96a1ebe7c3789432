"""``benchmarks/radix_cache.py --quick`` runs (contracts off and on, in subprocesses) and prints one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clock_figures import assert_clock_figure

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "radix_cache.py"


@pytest.mark.slow
def test_quick_benchmark_prints_one_json_line_with_every_key() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--requests", "60"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    out = json.loads(lines[0])
    assert out["benchmark"] == "radix_cache" and out["requests"] == 60
    for key in (
        "prefixes",
        "prefix_len",
        "unique_len",
        "pool_tokens",
        "mamba_slots",
        "v2_chunk",
        "sglang_0_5_23_req_s",
    ):
        assert key in out
    for switch in ("contracts_off", "contracts_on"):
        assert set(out[switch]) == {"plain_p1", "plain_p16", "mamba_p1", "mamba_v2_p1", "mamba_v2_p16"}
        for mode in out[switch].values():
            for figure in ("req_s", "req_s_cpu"):
                assert_clock_figure(mode[figure], f"{switch}.{figure}")
            assert len(mode["req_s_runs"]) == out["repeats"]
            assert 0 <= mode["hit_rate"] <= 1
        assert 0 <= out[switch]["mamba_p1"]["cow_rate"] <= 1
        for v2 in ("mamba_v2_p1", "mamba_v2_p16"):
            assert 0 < out[switch][v2]["donations_per_request"] <= 2 and 0 <= out[switch][v2]["cow_rate"] <= 1
