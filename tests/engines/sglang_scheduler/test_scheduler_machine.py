"""The Hypothesis machine over SGLang's real loop (generic rules; :mod:`kvledger.engines.sglang.scheduler.machine`).

Each release runs in its own subprocess. CI: one short derandomized budget on 0.5.10 (must run clean:
aborts from every queue, follow-ups, chunk sizes, all under the attach). Deep: the budget that finds
#16067 in 0.5.9 and the same budget clean in 0.5.10.
"""

from __future__ import annotations

import pytest

from tests.engines.sglang_scheduler.test_scheduler_seeds import _release_or_skip, _run


def test_short_machine_budget_is_clean_in_0_5_10() -> None:
    _release_or_skip("0.5.10")
    out = _run("machine", "--release", "0.5.10", "--examples", "10", "--ops", "40")
    assert out["finding"] is None, out
    assert out["examples"] >= 10 and out["operations"] > 100, out


@pytest.mark.deep
def test_machine_finds_16067_in_0_5_9() -> None:
    _release_or_skip("0.5.9")
    out = _run("machine", "--release", "0.5.9", "--examples", "200", "--ops", "80")
    found = out["finding"]
    assert found is not None and found["kind"] == "sglang-check-wrong", out
    assert "is held by waiting request" in found["message"]


@pytest.mark.deep
def test_machine_is_clean_in_0_5_10_at_the_same_budget() -> None:
    _release_or_skip("0.5.10")
    out = _run("machine", "--release", "0.5.10", "--examples", "200", "--ops", "80")
    assert out["finding"] is None, out
