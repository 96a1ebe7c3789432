"""PD transfer failures on SGLang 0.5.23's real scheduler (:mod:`kvledger.engines.sglang.scheduler.pd_faults`).

One subprocess (``pd-faults``): the PD prefill side with the fake backend, attached; a transfer failing in
the bootstrap queue, a chunked request's transfer failing mid-prefill, a waiting request's sender timing
out after the clock moves past SGLang's waiting timeout. SGLang's own failure paths must release
everything (the attach checks every step) and end the requests aborted; a failure path made to forget
its release (scoped patch, outside SGLang) must be named as a leak. The machine's failure rules on both
PD sides, and on 0.5.10 where they are not drawn, are ``deep``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.engines.sglang_scheduler.test_scheduler_23 import _installed_or_skip
from tests.engines.sglang_scheduler.test_scheduler_seeds import _release_or_skip, _run


@pytest.fixture(scope="module")
def faults() -> dict[str, Any]:
    _installed_or_skip()
    return _run("pd-faults", "--release", "0.5.23")


def test_each_failure_reaches_sglangs_failure_path_and_releases_everything(faults: dict[str, Any]) -> None:
    assert faults["bootstrap_failed"] and faults["mid_prefill_failed"] and faults["chunked_is_long"]
    outcomes = faults["outcomes"]
    assert {o["reason"] for o in outcomes.values()} == {"FINISH_ABORT"}, outcomes
    assert "bootstrap failed" in outcomes["boot."]["message"]  # failed before its prefill
    assert "transfer failed" in outcomes["long."]["message"]  # failed after its first chunk was sent
    assert "bootstrap failed" in outcomes["wait."]["message"]  # timed out while waiting
    # nothing left to a request: free + tree only, in every pool
    for pool, accounts in faults["accounts"].items():
        assert set(accounts) <= {"free", "cache.evictable"}, (pool, accounts)
    assert faults["checked_steps"] >= faults["steps"]


def test_a_failure_path_that_forgets_its_release_is_named(faults: dict[str, Any]) -> None:
    """Fails if the attach misses the KV, row and Mamba slot a failed request leaves to nobody."""
    caught = faults["forgotten_release"]
    assert caught["caught"], caught
    assert "leak" in caught["message"] and "long." in caught["message"]


@pytest.mark.deep
@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_machine_with_failure_rules_is_clean_on_0_5_23(side: str) -> None:
    _installed_or_skip()
    out = _run("machine", "--release", "0.5.23", "--pd", side, "--examples", "30", "--ops", "60")
    assert out["finding"] is None, out
    assert out["transfer_failures"] > 0, out
    # the clock matters to the fake sender's deadline only: moved on the prefill side, never on decode
    assert (out["clock_moves"] > 0) is (side == "prefill"), out


@pytest.mark.deep
def test_machine_draws_no_failure_rule_on_0_5_10() -> None:
    _release_or_skip("0.5.10")
    out = _run("machine", "--release", "0.5.10", "--examples", "20", "--ops", "60")
    assert out["finding"] is None, out
    assert out["transfer_failures"] == 0 and out["clock_moves"] == 0, out
