"""The generic PD state machine (``kvledger.museum.machines.pd``) under the loaded profile.

The machine lives in the package so ``kvledger hunt`` can run it against the museum's exhibits; here it
runs against the reference code.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvledger.museum.machines.pd import PDMachine, PDMachinePage16, PDModelMachine, pd_setups
from tests.scheduler.harness import long_fuzz_settings

__all__ = ["PDMachine", "PDMachinePage16", "PDModelMachine", "pd_setups"]

TestPDMachine = PDMachine.TestCase
_DEFAULT = settings()  # the loaded profile's settings
TestPDMachine.settings = settings(max_examples=max(10, _DEFAULT.max_examples // 3))
TestPDMachinePage16 = PDMachinePage16.TestCase
TestPDMachinePage16.settings = settings(max_examples=max(6, _DEFAULT.max_examples // 6))
TestPDModelMachine = PDModelMachine.TestCase
TestPDModelMachine.settings = settings(max_examples=max(6, _DEFAULT.max_examples // 12))


@pytest.mark.deep
@pytest.mark.timeout(7200)  # its own budget, not the suite's 600 s default
def test_pd_machine_long_fuzz() -> None:
    """Nightly-style fuzzing of both instances and the channel: ``pytest -m deep``."""
    run_state_machine_as_test(PDMachine, settings=long_fuzz_settings(2000, 120))


@pytest.mark.deep
@pytest.mark.timeout(7200)
def test_pd_model_machine_long_fuzz() -> None:
    run_state_machine_as_test(PDModelMachine, settings=long_fuzz_settings(300, 60))


@pytest.mark.deep
@pytest.mark.timeout(7200)
def test_pd_machine_page16_long_fuzz() -> None:
    run_state_machine_as_test(PDMachinePage16, settings=long_fuzz_settings(500, 120))
