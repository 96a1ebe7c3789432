"""I-HANDLE-OWNED is verified for the requests whose handles may have changed, and that is every way one
can go stale.

After every step (and for a batch's requests before its forward) the scheduler verifies the handles of
the requests the accounting marked: a handle field written, or ids given away by the request's owner in
a ledger. A decode step writes only lengths, so it marks nothing and costs nothing. These tests pin both
sides: the marks that must be made (a handle rewritten, ids freed behind the handle's back, each caught
at the next step with the slot named) and the marks that must not (lengths only).
"""

from __future__ import annotations

import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import BATCH_INFLIGHT, REQ_RUNNING
from kvledger.reference.scheduler import Scheduler
from kvledger.reference.scheduler.request import Req
from tests.scheduler.harness import Setup, build

pytestmark = pytest.mark.skipif(not switch.ENABLED, reason="I-HANDLE-OWNED is checked at the full level")


def engine() -> Scheduler:
    return build(
        Setup(
            tree="mamba_radix",
            hybrid=True,
            kv_tokens=256,
            rows=4,
            mamba_slots=8,
            max_running=4,
            chunk=None,
            max_prefill=128,
            max_context_len=128,
        )
    )


def decoding_pair(sched: Scheduler) -> tuple[Req, Req]:
    a = sched.add_request(0, list(range(10, 30)), 16)
    b = sched.add_request(1, list(range(40, 52)), 16)
    while not (a in sched.running and b in sched.running):
        sched.step()
    sched.step()  # one more step, so that the admission's marks are taken
    return a, b


def test_a_decode_step_marks_no_handle() -> None:
    sched = engine()
    a, b = decoding_pair(sched)
    before = (a.kv_allocated_len, b.kv_allocated_len)
    assert sched.accounting.take_unverified_handles() == []
    sched.step()
    assert (a.kv_allocated_len, b.kv_allocated_len) > before  # the step decoded both: lengths were written
    assert sched.accounting.take_unverified_handles() == []  # ... and no handle needs verifying


def test_writing_a_handle_marks_the_request_and_a_length_does_not() -> None:
    sched = engine()
    a, b = decoding_pair(sched)
    a.kv_committed_len = a.kv_committed_len  # a length: the identity's mark, not the handle's
    assert sched.accounting.take_unverified_handles() == []
    b.req_pool_idx = b.req_pool_idx
    assert sched.accounting.take_unverified_handles() == [b]


@pytest.mark.fires("I-HANDLE-OWNED")
def test_a_slot_freed_behind_its_handle_is_named_at_the_next_step() -> None:
    """The ids leave the owner without the handle being written: the ledger's give-away marks it."""
    sched = engine()
    a, _ = decoding_pair(sched)
    assert a.mamba_pool_idx is not None
    slot = int(a.mamba_pool_idx[0])
    sched.mamba_pool.free(a.mamba_pool_idx, a.owner)  # the request keeps pointing at the freed slot
    with pytest.raises(ContractViolation, match="I-HANDLE-OWNED") as err:
        sched.step()
    assert f"{slot}" in str(err.value)


@pytest.mark.fires("I-HANDLE-OWNED")
def test_a_handle_rewritten_to_another_requests_slot_is_named_before_the_forward() -> None:
    sched = engine()
    a, b = decoding_pair(sched)
    assert b.mamba_pool_idx is not None
    a.mamba_pool_idx = b.mamba_pool_idx.clone()  # a now names b's Mamba slot, which b owns
    with pytest.raises(ContractViolation, match="I-HANDLE-OWNED") as err:
        sched.step()
    assert "mamba_pool_idx" in str(err.value)


def test_a_retag_after_the_step_is_in_the_next_snapshot_and_marks_no_handle() -> None:
    """A retag is a terms change, not a handle change: the timeline's snapshot, which reuses the step's
    terms, must drop them; the handles stay verified."""
    sched = engine()
    a, _ = decoding_pair(sched)
    before = sched.accounting.snapshot()
    assert before["kv"].get(REQ_RUNNING.name, 0) > 0
    a.owner.set_account(BATCH_INFLIGHT, "test retag")  # what a launch does to a running request
    after = sched.accounting.snapshot()
    assert after == {pool: terms for pool, terms in _recount(sched).items()}
    assert after["kv"][BATCH_INFLIGHT.name] == a.kv_allocated_len - a.cache_protected_len
    assert sched.accounting.take_unverified_handles() == []


def _recount(sched: Scheduler) -> dict[str, dict[str, int]]:
    """The snapshot's rows from a full recount of every live request."""
    out = {}
    for t in sched.accounting.pool_terms():
        row = {"size": t.size, "free": t.free, "pending_free": t.pending}
        row |= {"cache.evictable": t.evictable, "cache.protected": t.protected, **t.held}
        out[t.pool] = row
    return out
