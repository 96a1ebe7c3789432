"""A V2 keep half donated at a chunk boundary while its batch is in flight (issue 42, the seed-1 clean hunt).

Under Mamba V2 with the overlap scheduler, ``cache_unfinished`` runs at the start of the next round, while
the chunked request's own extend batch (which captures into the keep half) is still in flight. When the
tree already holds a state at the tracked length, the donated slot goes back to the free list and the same
round may hand it to another request, as SGLang does. That is safe: the next owner zeroes or copies into
it only in a later forward, after the in-flight one on the device stream. The check that used to fire
here (I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT on a slot the request no longer named) was wrong; the check still
fires for a Mamba slot a request of the in-flight batch still names.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.museum.machines.scheduler import SchedulerMachine
from kvledger.reference.engine import EngineSpec
from kvledger.reference.scheduler.accounting import Accounting
from kvledger.reference.scheduler.batch import ScheduleBatch
from tests.scheduler.test_v2_paths import v2

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")

SEED_1_SETUP = EngineSpec(
    page_size=4,
    tree="mamba_radix",
    hybrid=True,
    kv_tokens=152,
    rows=3,
    mamba_slots=8,
    mamba_layers=1,
    max_running=4,
    chunk=16,
    max_prefill=64,
    overlap=True,
    cow_release_policy="if_not_appended",
    max_context_len=96,
    model="hash",
    mamba_strategy="extra_buffer",
    mamba_track_interval=12,
    mamba_chunk_size=8,
)


def run_seed_1_example() -> None:
    """The shrunk example of ``kvledger hunt --machine scheduler --seed 1`` (page 4, V2, overlap, faults)."""
    state = SchedulerMachine()
    state.init(setup=SEED_1_SETUP, spec=None, faults=["kv", "mamba", "row"])
    steps: list[tuple[str, dict[str, Any]]] = [
        ("arrive", {"edge": None, "family": 1, "max_new": 5, "suffix": [14, 57]}),
        ("arrive_follow_up", {"copies": 2, "max_new": 4, "pick": 0, "suffix": []}),
        ("arrive", {"edge": (14, 0), "family": 1, "max_new": 6, "suffix": [94]}),
        ("arrive_follow_up", {"copies": 1, "max_new": 8, "pick": 3, "suffix": [5, 98, 15, 44]}),
        ("arrive_follow_up", {"copies": 2, "max_new": 5, "pick": 31, "suffix": [78, 43, 26]}),
        ("arrive_follow_up", {"copies": 2, "max_new": 1, "pick": 44, "suffix": [78, 36, 74, 66, 23]}),
        ("arrive_follow_up", {"copies": 2, "max_new": 4, "pick": 11, "suffix": [82]}),
        ("arrive", {"edge": None, "family": 2, "max_new": 2, "suffix": [24, 65]}),
        ("arrive_follow_up", {"copies": 2, "max_new": 11, "pick": 36, "suffix": [31, 79, 18]}),
        ("arrive_follow_up", {"copies": 3, "max_new": 3, "pick": 36, "suffix": [99, 44, 44, 49, 18, 95, 10, 89]}),
    ]
    state.identities_hold()
    for rule, kwargs in steps:
        getattr(state, rule)(**kwargs)
        state.identities_hold()
    state.teardown()


@needs_contracts
def test_a_declined_donation_is_handed_out_while_its_batch_flies_and_nothing_fires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seed-1 example runs clean, and it does reach the case: a new batch takes a slot that an
    in-flight batch captured into and whose request gave it away."""
    reused: list[int] = []
    original = Accounting.check_not_in_flight

    def watching(self: Accounting, batch: ScheduleBatch) -> None:
        for b in self.s.inflight:
            given_away = b.ref_mamba - b.mamba_still_held()
            reused.extend(s for r in batch.reqs if r not in b.reqs for s in r.mamba_slots() if s in given_away)
        original(self, batch)

    monkeypatch.setattr(Accounting, "check_not_in_flight", watching)
    run_seed_1_example()
    assert reused, "the example no longer reaches a donated capture target handed out in flight"


@needs_contracts
@pytest.mark.fires("I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT")
@pytest.mark.parametrize("which", ["working", "capture"])
def test_a_mamba_slot_its_request_still_names_may_not_change_hands(which: str) -> None:
    """The in-flight batch's working slot, and the capture target while the request still names it, are
    refused to a new batch's request (here a handle forged to name it, as a bookkeeping bug would)."""
    sched = v2(page_size=4, overlap=True, chunk=8, mamba_chunk_size=8)
    first = sched.add_request(0, list(range(1, 25)), 4)
    second = sched.add_request(1, list(range(100, 104)), 4)
    sched.step()  # launches the first chunk of request 0; its results are not processed yet (overlap)
    (flying,) = sched.inflight
    assert first in flying.reqs and first.mamba_track is None and flying.ref_mamba
    slot = first.mamba_slots()[0] if which == "working" else next(iter(flying.ref_mamba - {first.mamba_slots()[0]}))
    assert slot in flying.mamba_still_held()
    second.mamba_pool_idx = torch.tensor([slot], dtype=torch.int64)  # the forged handle
    batch = ScheduleBatch(10_000, [second], False, [4], torch.empty(0, dtype=torch.int64))
    with pytest.raises(ContractViolation, match=f"I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT: .*Mamba slot\\(s\\) \\[{slot}\\]"):
        sched.accounting.check_not_in_flight(batch)
