"""Start-up: the commands that do not run the engine never import torch or the engine.

``kvledger --version`` used to cost 3.6 s of CPU because every command imported torch and the whole
package first. What each command costs is measured outside the tests (the report of issue 22); what is
asserted here is the cause: which modules the child process imported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvledger.cli import main
from tests.cli.process import SMALL, kvledger

LIGHT_COMMANDS = [
    ["--version"],
    ["--help"],
    ["simulate", "--help"],
    ["audit", "--help"],
    ["hunt", "--help"],
    ["museum", "--help"],
    ["explore", "--help"],
    ["museum"],
    ["museum", "--json"],
    ["simulate", "--kv-pool-tokens", "0"],  # refused while parsing
    ["simulate", "--no-mamba", "--mamba-slots", "8"],  # refused by the checks before the run
]


@pytest.mark.parametrize("args", LIGHT_COMMANDS, ids=[" ".join(a) for a in LIGHT_COMMANDS])
def test_a_command_that_runs_no_engine_imports_no_torch(args: list[str]) -> None:
    done = kvledger(*args)
    assert done.returncode in (0, 2), done.stderr
    assert "Traceback" not in done.stderr
    assert done.modules, "the probe saw no modules: the child did not run"
    assert not done.imported_torch, f"kvledger {' '.join(args)} imported torch"
    assert not done.imported_engine, f"kvledger {' '.join(args)} imported kvledger.reference"


@pytest.fixture(scope="module")
def small_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("startup") / "run.jsonl"
    assert main(["simulate", *SMALL, "--no-plot", "--json", "--record", str(path)]) == 0
    return path


def test_audit_replays_a_log_without_torch(small_log: Path) -> None:
    done = kvledger("audit", str(small_log))
    assert done.returncode == 0, done.stderr
    assert "clean: every event keeps every invariant" in done.stdout
    assert not done.imported_torch and not done.imported_engine


def test_simulate_does_import_the_engine() -> None:
    """The probe can see an import: the command that runs the engine has it (and torch) loaded."""
    done = kvledger("simulate", *SMALL, "--no-plot", "--json")
    assert done.returncode == 0, done.stderr
    assert done.imported_torch and done.imported_engine


def test_no_command_is_a_usage_error() -> None:
    done = kvledger()
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: kvledger")
    assert done.stderr.splitlines()[-1] == "kvledger: error: a command is required (see kvledger --help)"


def test_top_level_help_lists_every_subcommand() -> None:
    done = kvledger("--help")
    assert done.returncode == 0
    for command in ("simulate", "audit", "hunt", "museum", "explore"):
        assert f"    {command} " in done.stdout, command


@pytest.mark.parametrize("command", [[], ["simulate"], ["audit"], ["hunt"], ["museum"], ["explore"]])
def test_help_is_plain_text(command: list[str]) -> None:
    """argparse prints a description as it is: no reStructuredText markup from a docstring."""
    done = kvledger(*command, "--help")
    assert done.returncode == 0
    for markup in ("``", ":mod:", ":class:", ":func:", ":data:"):
        assert markup not in done.stdout, (command, markup)
