"""The bandwidth benchmark runs on CPU and prints exactly one JSON line with the documented keys.

It checks the output's shape and that the work was verified, never a timing (issue 8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clock_figures import assert_clock_figure

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "kernel_bandwidth.py"
TIMINGS = {"torch_gbps", "triton_gbps", "triton_checked_gbps"}


@pytest.mark.slow
def test_kernel_bandwidth_quick_cpu_prints_one_json_line():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--device", "cpu"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    report = json.loads(lines[0])
    assert {"device", "torch", "triton", "triton_timed", "quick", "mamba_copy", "kv_store"} <= report.keys()
    assert report["device"] == "cpu" and report["quick"] is True and report["triton_timed"] is False
    assert report["mamba_copy"] and report["kv_store"]
    for row in report["mamba_copy"]:
        assert {"pairs", "layers", "slot_mib", "verified"} | TIMINGS <= row.keys()
    for row in report["kv_store"]:
        assert {"model", "layers", "kv_heads", "head_dim", "tokens", "verified"} | TIMINGS <= row.keys()
    for row in report["mamba_copy"] + report["kv_store"]:
        assert row["verified"] is True
        assert row["torch_gbps"] is not None, "the torch path is always timed on CPU"
        assert_clock_figure(row["torch_gbps"], "torch_gbps")
        assert row["triton_gbps"] is None and row["triton_checked_gbps"] is None
