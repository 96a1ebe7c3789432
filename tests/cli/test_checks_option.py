"""``--checks LEVEL`` on ``kvledger simulate`` and ``kvledger hunt`` (spec/checking-levels.md).

The level is read at import, so a command asked for another level re-executes itself with
``KVLEDGER_CHECKS`` set: what the child reports (``checks`` in the JSON) is the proof it ran there.
"""

from __future__ import annotations

import json
import os
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
