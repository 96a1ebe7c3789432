"""The README's two commands as a user runs them: every stage of ``scripts/test.sh`` runs and a failure is
summarised at the end; ``scripts/setup.sh`` says what it is doing; the package is visible to type checkers.

``test.sh`` runs against a copy of itself in a scratch tree whose ``.venv/bin/python`` and ``mkdocs`` are
stand-ins that fail exactly the stage a test asks for: the stages' order, the summary and the exit status
are the script's, not the tools'.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FAKE_TOOL = """#!/usr/bin/env bash
# Stand-in for a tool: records its arguments; fails when they mention $FAIL_WHEN.
echo "$(basename "$0") $*" >> "$CALLS"
if [ -n "${FAIL_WHEN:-}" ] && [[ "$*" == *"$FAIL_WHEN"* ]]; then exit 7; fi
echo "1 passed in 0.01s"
"""


def scratch_tree(tmp: Path) -> Path:
    (tmp / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "test.sh", tmp / "scripts" / "test.sh")
    bin_dir = tmp / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("python", "mkdocs"):
        (bin_dir / tool).write_text(FAKE_TOOL)
        (bin_dir / tool).chmod(0o755)
    (tmp / "scripts" / "site_check.sh").write_text(FAKE_TOOL)  # run with bash: the same stand-in
    return tmp


def run_test_sh(tree: Path, fail_when: str = "") -> tuple[subprocess.CompletedProcess[str], list[str]]:
    calls = tree / "calls.txt"
    env = dict(os.environ, CALLS=str(calls), FAIL_WHEN=fail_when)
    done = subprocess.run(
        ["bash", str(tree / "scripts" / "test.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    return done, calls.read_text().splitlines()


def test_every_stage_runs_and_the_suite_line_comes_last(tmp_path: Path) -> None:
    done, calls = run_test_sh(scratch_tree(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(calls) == 10  # ruff, registry, mypy, docs, site, crosshair, kernels, sweep x2 (levels), suite
    assert done.stdout.strip().splitlines()[-1] == "1 passed in 0.01s"  # what CI reads


def test_a_failed_stage_does_not_stop_the_rest_and_is_named_at_the_end(tmp_path: Path) -> None:
    done, calls = run_test_sh(scratch_tree(tmp_path), fail_when="crosshair_gate.py")
    assert done.returncode == 1
    assert len(calls) == 10, calls  # the kernels, the sweeps and the suite still ran
    assert "-m pytest -q -m not interp and not gpu and not deep" in calls[-1]
    tail = done.stdout.strip().splitlines()[-2:]
    assert tail[0] == "== 1 stage(s) failed:"
    assert tail[1].strip().startswith("crosshair (") and "(exit 7," in tail[1]


def test_every_failed_stage_is_listed(tmp_path: Path) -> None:
    done, calls = run_test_sh(scratch_tree(tmp_path), fail_when="-m pytest")
    assert done.returncode == 1 and len(calls) == 10
    summary = done.stdout[done.stdout.index("== 4 stage(s) failed:") :].splitlines()[1:]
    assert [line.split(" (")[0].strip() for line in summary] == [
        "kernels under the Triton interpreter",
        "bad-input sweep at the level release",
        "bad-input sweep at the level owners",
        "test suite",
    ]


def test_setup_announces_each_step() -> None:
    text = (REPO / "scripts" / "setup.sh").read_text()
    assert text.count('step "') >= 3  # venv, torch, package: each says what it does before pip goes quiet
    assert "editable_mode=compat" in text


def test_the_installed_package_is_visible_to_mypy_outside_the_clone(tmp_path: Path) -> None:
    """``mypy --strict`` on a user's script elsewhere finds ``kvledger`` (a .pth install, not an import hook)."""
    script = tmp_path / "user_script.py"
    script.write_text(
        "from kvledger.contracts.errors import KVLedgerError\n\n\n"
        "def describe(e: KVLedgerError) -> str:\n    return str(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
