"""``--checks LEVEL`` on ``kvledger simulate`` and ``kvledger hunt`` (spec/checking-levels.md).

The level is read at import, so a command asked for another level re-executes itself with
``KVLEDGER_CHECKS`` set: what the child reports (``checks`` in the JSON) is the proof it ran there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from kvledger.cli.checks import without_option
from tests.cli.process import SMALL, kvledger


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KVLEDGER_")} | extra


@pytest.mark.slow
@pytest.mark.parametrize(("given", "level"), [(["--checks", "owners"], "owners"), (["--checks=ledger"], "ledger")])
def test_simulate_reexecutes_at_the_level_asked(given: list[str], level: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvledger", "simulate", *SMALL, *given, "--json", "--no-plot"],
        capture_output=True, text=True, timeout=600, check=False, env=_env(KVLEDGER_CHECKS="full"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["checks"] == level and result["contracts"] is False and result["finished"] == 8


@pytest.mark.slow
def test_contracts_off_still_means_release_whatever_kvledger_checks_says() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvledger", "simulate", *SMALL, "--contracts", "off", "--json", "--no-plot"],
        capture_output=True, text=True, timeout=600, check=False, env=_env(KVLEDGER_CHECKS="owners"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["checks"] == "release"


def test_contracts_and_checks_together_are_a_usage_error() -> None:
    done = kvledger("simulate", *SMALL, "--contracts", "on", "--checks", "owners", see_imports=False)
    assert done.returncode == 2
    assert "--contracts and --checks both set the checking level" in done.stderr


def test_an_unknown_level_is_a_usage_error() -> None:
    done = kvledger("hunt", "--checks", "paranoid", see_imports=False)
    assert done.returncode == 2 and "invalid choice: 'paranoid'" in done.stderr


def test_the_option_is_removed_before_reexecuting() -> None:
    args = ["simulate", "--checks", "owners", "--seed", "3", "--checks=full", "--json"]
    assert without_option(args, "--checks") == ["simulate", "--seed", "3", "--json"]
    assert without_option(["--checksum", "x"], "--checks") == ["--checksum", "x"]


@pytest.mark.parametrize(
    ("variable", "value", "complaint"),
    [
        (
            "KVLEDGER_CHECKS",
            "paranoid",
            "KVLEDGER_CHECKS: unknown checking level 'paranoid': one of release, owners, ledger, full",
        ),
        ("KVLEDGER_CONTRACTS", "maybe", "KVLEDGER_CONTRACTS must be 0 or 1, got 'maybe'"),
    ],
)
@pytest.mark.parametrize("command", [["simulate", *SMALL, "--no-plot"], ["museum"], ["hunt", "--budget", "1"]])
def test_an_unreadable_level_variable_is_one_line_and_the_usage_status(
    variable: str, value: str, complaint: str, command: list[str]
) -> None:
    """Exit status 1 means a violation; a typo in the environment is a usage error, said in one line."""
    done = subprocess.run(
        [sys.executable, "-m", "kvledger", *command],
        capture_output=True, text=True, timeout=600, check=False, env=_env(**{variable: value}),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"kvledger {command[0]}: error: {complaint}"], done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("given", [["--checks", "owners"], ["--contracts", "off"]])
def test_a_level_on_the_command_line_overrides_an_unreadable_variable(given: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvledger", "simulate", *SMALL, *given, "--no-plot"],
        capture_output=True, text=True, timeout=600, check=False, env=_env(KVLEDGER_CHECKS="paranoid"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    level = "owners" if "owners" in given else "release"
    assert re.search(rf"checking level\s+.\s+{level}: ", done.stdout), done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("level", "violations"),
    [
        ("release", r"not looked for \(release knows no owner per id\)"),
        ("owners", r"0 \(every call naming ids checked against its owner\)"),
        ("ledger", r"0 \(every move checked\)"),
        ("full", r"0\b"),
    ],
)
def test_the_summary_names_the_level_and_what_it_checked(level: str, violations: str) -> None:
    from kvledger.contracts.levels import LEVEL_DOCS, parse_level

    done = subprocess.run(
        [sys.executable, "-m", "kvledger", "simulate", *SMALL, "--checks", level, "--no-plot"],
        capture_output=True, text=True, timeout=600, check=False, env=_env(COLUMNS="250"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{level}: {LEVEL_DOCS[parse_level(level)].short}" in done.stdout, done.stdout
    assert re.search(rf"violations\s+.\s+{violations}", done.stdout), done.stdout
    assert "contracts " not in done.stdout  # the old on/off row said "off" for owners and ledger alike
