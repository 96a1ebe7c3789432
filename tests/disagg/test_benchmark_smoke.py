"""The PD benchmark prints one JSON line with the documented keys; shapes and domains only, no timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clock_figures import assert_clock_figure

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "pd_steps.py"


def _run(*args: str) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


@pytest.mark.slow
def test_pd_steps_quick_prints_on_and_off_figures() -> None:
    report = _run("--quick")
    assert report["benchmark"] == "pd_steps" and report["quick"] is True
    for label in ("contracts_off", "contracts_on"):
        fig = report[label]
        assert isinstance(fig, dict) and fig["violations"] == 0 and fig["steps"] > 0
        assert_clock_figure(fig["steps_per_s"], f"{label}.steps_per_s")
    assert_clock_figure(report["on_off_time_ratio"], "on_off_time_ratio")


@pytest.mark.slow
def test_pd_machine_figures_shape() -> None:
    report = _run("--machine", "2", "10")
    assert report["benchmark"] == "pd_machine" and report["clean"] is True and report["examples"] == 2
    assert isinstance(report["system_steps"], int) and report["system_steps"] >= 0
    assert_clock_figure(report["system_steps_per_s"], "system_steps_per_s")
