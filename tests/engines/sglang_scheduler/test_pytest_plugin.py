"""The pytest plugin puts every Scheduler a test builds under the attach (a child pytest, one release)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.engines.sglang_scheduler.test_scheduler_seeds import _release_or_skip

ROOT = Path(__file__).resolve().parents[3]
RELEASE = "0.5.10"


def test_plugin_attaches_every_scheduler_and_reports_a_leak_at_teardown() -> None:
    _release_or_skip(RELEASE)
    env = dict(os.environ, PYTHONPATH=str(ROOT), KVLEDGER_PLUGIN_RELEASE=RELEASE)
    proc = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
            "kvledger.engines.sglang.scheduler.pytest_plugin", "-o", "addopts=-rA",
            str(Path(__file__).with_name("plugin_cases.py")),
        ],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900,
    )  # fmt: skip
    out = proc.stdout
    assert (
        "PASSED tests/engines/sglang_scheduler/plugin_cases.py::test_a_built_scheduler_is_attached" in out
    ), out[-3000:]
    assert (
        "ERROR tests/engines/sglang_scheduler/plugin_cases.py::test_a_leak_left_by_the_test_fails_at_teardown"
        in out
    ), out[-3000:]
    assert "no live request names them: a leak" in out, out[-3000:]
    assert proc.returncode == 1
