"""SGLang #26941 (2026, N1 of pd-disaggregation-and-2026-bugs.md): ping-pong slots freed, handle left set.

With ``extra_buffer`` and overlap a request holds a working slot and two tracking slots. SGLang's
``free_mamba_cache`` freed the tracking slots but left ``req.mamba_ping_pong_track_buffer`` set, and
``HybridReqToTokenPool.alloc`` skips the allocation when that field is not None: a retracted (or aborted
and retried) request came back with tracking slots it no longer owned, now free or someone else's. The
identity stays balanced at the moment of the release (the slots are counted once, as free); it is the
handle that lies.

The bug is re-enacted outside the reference code by the museum's exhibit ``N1`` (``MambaTracking.release``
replaced by one that frees the slots and keeps the handle), and is caught at the first bad
step, the retraction, naming the slots and the stale handle. The regression test runs the same schedule
against the reference code: it fails if the fix (``MambaTracking.release`` clearing the handle) is
taken out.
"""

from __future__ import annotations

import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.museum import exhibit
from kvledger.reference.scheduler import ReqState, Scheduler
from kvledger.reference.scheduler.request import Req
from tests.scheduler.harness import Setup, build, expected_output

pytestmark = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")

PROMPT = list(range(10, 30))
OTHER = [90, 91, 92, 93, 94, 95, 96, 97, 98]


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
            overlap=True,  # two tracking slots per request
            max_context_len=128,
            mamba_strategy="extra_buffer",
            mamba_track_interval=4,
            mamba_chunk_size=4,
        )
    )


def retract_then_readmit(sched: Scheduler) -> tuple[Req, Req, list[int]]:
    """A runs, is retracted (the release under test), B arrives and may take the freed slots, A returns."""
    a = sched.add_request(0, PROMPT, 8)
    while a not in sched.running:
        sched.step()
    held = a.mamba_ping_pong_track_buffer.tolist()  # type: ignore[union-attr]
    assert len(held) == 2
    sched.force_retract(1)  # the first bad step when the handle is left set
    b = sched.add_request(1, OTHER, 2)
    sched.run_until_idle(300)
    return a, b, held


def test_a_retracted_request_comes_back_with_fresh_tracking_slots() -> None:
    sched = engine()
    a, b, _ = retract_then_readmit(sched)
    assert a.retract_count == 1 and a.state is ReqState.FINISHED and b.state is ReqState.FINISHED
    assert a.output_ids == expected_output(PROMPT, 8) and b.output_ids == expected_output(OTHER, 2)
    assert a.mamba_ping_pong_track_buffer is None and sched.mamba_pool.ledger.held_count(a.owner) == 0
    sched.accounting.check_quiescent()


@pytest.mark.fires("I-HANDLE-OWNED")
def test_26941_is_caught_at_the_retraction_naming_the_slots_and_the_stale_handle() -> None:
    sched = engine()
    a = sched.add_request(0, PROMPT, 8)
    while a not in sched.running:
        sched.step()
    stale = a.mamba_ping_pong_track_buffer.tolist()  # type: ignore[union-attr]
    with exhibit("N1").installed(), pytest.raises(ContractViolation) as caught:
        sched.force_retract(1)
    message = str(caught.value)
    assert "I-HANDLE-OWNED" in message and "mamba_ping_pong_track_buffer" in message, message
    assert f"names mamba ids {sorted(stale)}" in message or f"names mamba ids {stale}" in message, message
    for slot in stale:  # each slot named with its owner (the free list) and its last moves
        assert f"slot {slot}: owner free_list" in message, message
    assert "req#0" in message and a.mamba_ping_pong_track_buffer is not None
