"""No per-step work proportional to the queue (issue 38 item 3), and the checks that cost it still fire.

I-OWNER-RELEASE after a step walked every queued request (14 % of a 16x ``full`` run); it now looks at the
requests ended since the last check and the ones parked then (``reference/scheduler/ended.py``); the walk
over the queue stays at quiescence and for callers asking for it. These tests pin both sides: a request
that ends unreleased is caught at the step it ends in, one that leaves its parking account unreleased at
the next check, and a step with a long queue walks none of it. The admission scan copied and rebuilt the
waiting list every step (15 % of a 64x release run); it now looks at the head it scans only.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import BATCH_INFLIGHT, REQ_RUNNING
from kvledger.reference.engine import build_parts
from kvledger.reference.scheduler import ReqState, Scheduler
from kvledger.reference.scheduler.request import Req
from tests.scheduler.harness import Setup, build

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="the per-step checks run with contracts on")


def _engine(overlap: bool = False) -> Scheduler:
    return build(Setup(tree="radix", hybrid=False, kv_tokens=512, rows=4, max_running=2, overlap=overlap))


def _leak_release_of(monkeypatch: pytest.MonkeyPatch, rid: int) -> None:
    """Re-enact a lost release outside the reference: request ``rid`` ends and is never released."""
    real = Scheduler._release_or_defer

    def lossy(self: Scheduler, req: Req) -> None:
        if req.rid != rid:
            real(self, req)

    monkeypatch.setattr(Scheduler, "_release_or_defer", lossy)


@needs_contracts
@pytest.mark.fires("I-OWNER-RELEASE")
def test_a_request_ended_unreleased_is_caught_in_the_step_it_ends_in(monkeypatch: pytest.MonkeyPatch) -> None:
    sched = _engine()
    for rid in range(8):  # a queue behind the leaking request: the step is far from quiescent
        sched.add_request(rid, [1, 2, 3, rid, rid + 1], 3)
    _leak_release_of(monkeypatch, 0)
    first = sched.requests[0]
    with pytest.raises(ContractViolation, match=r"I-OWNER-RELEASE: .*req#0.* ended \(finished"):
        while True:
            state_before = first.state
            sched.step()
            assert not sched.is_quiescent()
    assert state_before is not ReqState.FINISHED  # it fired in the step that ended it, not later
    with pytest.raises(ContractViolation, match="I-OWNER-RELEASE"):  # the evidence is kept, not consumed
        sched.check_ended_requests_released(every_queued=False)


@needs_contracts
@pytest.mark.fires("I-OWNER-RELEASE")
def test_a_parked_request_that_leaves_its_parking_unreleased_is_caught() -> None:
    """With overlap a request that ends while its batch is in flight is parked on the batch; the check keeps
    looking at it until it is released, so a retag out of the parking account (a lost release) fires."""
    sched = _engine(overlap=True)
    req = sched.add_request(0, [1, 2, 3, 4], 8)
    sched.add_request(1, [5, 6, 7, 8], 8)
    while not (req.state.is_done and req.owner.account is BATCH_INFLIGHT):
        sched.step()
    sched.check_ended_requests_released(every_queued=False)  # parked: holds
    assert len(sched.ended_requests) >= 1
    req.owner.set_account(REQ_RUNNING, op="a lost release (test)")
    with pytest.raises(ContractViolation, match=r"I-OWNER-RELEASE: .*req#0"):
        sched.check_ended_requests_released(every_queued=False)


class _CountedWalks(dict[int, Req]):
    """The scheduler's map of queued requests, counting the walks over it (``values()``)."""

    walks: list[int]

    def values(self):  # type: ignore[override]
        self.walks.append(len(self))
        return super().values()


@needs_contracts
def test_no_step_walks_the_queue_while_requests_wait() -> None:
    """The cost side: with 200 requests queued, no step walks the queue while requests wait (the check used
    to, after every step: with that put back ``walks`` grows in every step)."""
    sched = _engine()
    for rid in range(200):
        sched.add_request(rid, [9, rid % 50, rid % 7, 4], 2)
    queued = _CountedWalks(sched._live)
    queued.walks = []
    sched._live = queued
    steps = 0
    while sched.has_work():
        queued.walks.clear()
        sched.step()
        steps += 1
        if sched.waiting:  # (with nothing waiting, telling quiescence walks the few requests left)
            assert queued.walks == [], f"step {sched.step_no} walked the queue"
    assert steps > 50 and sched.stats.finished == 200
    assert not sched.ended_requests  # every end was looked at and released


class _CountedQueue(list[Req]):
    """A waiting list counting the requests its iterators hand out (a copy or a rebuild hands out all)."""

    handed: int = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        for r in super().__iter__():
            self.handed += 1
            yield r


def test_the_admission_scan_looks_at_the_head_of_the_queue_only() -> None:
    """300 requests wait, at most 2 run: each step's admission hands out a few of them, not the queue."""
    sched = _engine()
    for rid in range(300):
        sched.add_request(rid, [7, rid % 40, rid % 3, 5], 2)
    queue = _CountedQueue(sched.waiting)
    sched.waiting = queue
    served: list[int] = []
    while len(queue) > 10:
        before = list.copy(queue)  # not through __iter__: not counted
        queue.handed = 0
        sched.step()
        handed = queue.handed
        assert handed <= 2 * sched.config.max_running_requests + 1, f"step {sched.step_no}: {handed}"
        assert sched.waiting is queue  # admitted ones are taken out in place, the rest keep their order
        left = set(map(id, list.copy(queue)))
        served += [r.rid for r in before if id(r) not in left]
    assert served == list(range(len(served))) and len(served) >= 290  # first come, first served
    sched.run_until_idle(10_000)
    assert sched.stats.finished == 300


@pytest.mark.parametrize("every_step", [True, False], ids=["checked", "unchecked"])
def test_ended_requests_are_not_kept_where_no_check_takes_them(every_step: bool) -> None:
    """Memory stays flat: with the per-step checks off (the release level, ``check_every_step=False``) no
    end is remembered for a check that never runs; with them on, every one is let go once released."""
    parts = build_parts(Setup(tree="radix", hybrid=False, kv_tokens=512, rows=4, max_running=2))
    config = dataclasses.replace(parts.config, check_every_step=every_step)
    sched = Scheduler(config, **parts.scheduler_kwargs())
    for rid in range(40):
        sched.add_request(rid, [3, rid, 1], 2)
        sched.step()
    sched.run_until_idle(1000)
    assert sched.stats.finished == 40
    assert len(sched.ended_requests) == 0
