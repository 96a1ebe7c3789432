"""Ctrl-C: one line on stderr, exit status 130, and none of the command's output files left behind.

Each command runs in a child process; SIGINT is sent once the child has started writing (its staged
temporary file exists, or it said it started hunting). A log cut off by Ctrl-C must not survive: the
audit would otherwise vouch for a run that never finished.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.process import ROOT

pytestmark = pytest.mark.slow

BIG = ["--gsp-num-groups", "64"]  # a run of a minute or more: still running when the signal comes


def _terminal_sigint() -> None:
    """In the child, before Python starts: SIGINT at its default, as a command started from a terminal
    has it. A suite run as a background job (a CI runner's ``cmd &``) inherits SIGINT ignored, and a
    Python started with it ignored keeps ignoring it (test_swallowed_interrupt): not what these test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kvledger", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_terminal_sigint,
    )


def _wait_for(ready: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the command ended before it was interrupted: {proc.communicate()}"
        assert time.monotonic() < deadline, "the command never started writing"
        time.sleep(0.05)


def _interrupt(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _staged(directory: Path) -> bool:
    return any(".partial" in p.name for p in directory.iterdir())


@pytest.mark.parametrize(
    "outputs",
    [
        ["--record", "run.jsonl", "--plot", "timeline.svg", "--json"],
        ["--record", "logs/run.jsonl", "--no-plot"],
    ],
    ids=["record+plot+json", "record in a new directory"],
)
def test_ctrl_c_during_simulate_leaves_no_output(tmp_path: Path, outputs: list[str]) -> None:
    proc = _start(["simulate", *BIG, *outputs], tmp_path)
    _wait_for(lambda: _staged(tmp_path) or ((tmp_path / "logs").is_dir() and _staged(tmp_path / "logs")), proc)
    time.sleep(0.5)  # well inside the run: the log has events in it
    code, out, err = _interrupt(proc)
    assert code == 130, err
    assert err == "kvledger simulate: interrupted\n"
    assert out == ""
    assert list(tmp_path.iterdir()) == []  # no log, no plot, no temporary, no directory made for them


def test_ctrl_c_during_a_pd_run_removes_the_directories_made_for_its_plots(tmp_path: Path) -> None:
    proc = _start(["simulate", "--pd", *BIG, "--plot", "plots/pd/timeline.png"], tmp_path)
    _wait_for(lambda: (tmp_path / "plots" / "pd").is_dir(), proc)  # made when the run starts
    code, _, err = _interrupt(proc)
    assert code == 130 and err == "kvledger simulate: interrupted\n", err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_hunt_is_one_line(tmp_path: Path) -> None:
    proc = _start(["hunt", "--machine", "scheduler", "--budget", "600", "--out", "repros"], tmp_path)
    assert proc.stderr is not None
    started = proc.stderr.readline()
    assert started == "hunt (clean) scheduler: started (budget 600 s)\n"
    time.sleep(2.0)  # inside the machine's examples
    code, out, err = _interrupt(proc)
    assert code == 130
    assert err == "kvledger hunt: interrupted\n"  # the one line after the progress line, no traceback
    assert out == ""
    assert list(tmp_path.iterdir()) == []
