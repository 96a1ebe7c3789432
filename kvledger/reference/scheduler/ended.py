"""I-OWNER-RELEASE after a step in O(requests ended since the last check), not O(queue) (issue 38).

A request that has ended must have been released, or be parked in one of the scheduler's
``parked_accounts`` (a launched batch, a PD lease) that releases it later. Every end goes through
``Scheduler._finish_state``, which hands the request to :meth:`EndedRequests.ended`; the per-step check
then looks at those requests only, and keeps the parked ones until they are released (a parked request
that leaves its parking account without a release is caught at the next check). The walk over every
queued request stays: at quiescence, under ``KVLEDGER_RECOUNT_EVERY_STEP`` and for callers asking for it
(the museum's state machines), so an end that bypassed ``_finish_state`` is still found there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from kvledger.contracts.errors import ContractViolation

if TYPE_CHECKING:
    from kvledger.contracts.owners import Account
    from kvledger.reference.scheduler.accounting import Accounting
    from kvledger.reference.scheduler.request import Req


class _SchedulerView(Protocol):
    """What the check reads of the scheduler (a protocol: this module is imported by ``scheduler``)."""

    @property
    def parked_accounts(self) -> frozenset[Account]: ...

    @property
    def accounting(self) -> Accounting: ...

    def queued_request(self, rid: int) -> Req | None: ...

    def queued_requests(self) -> Iterable[Req]: ...


class EndedRequests:
    """The ended requests the next I-OWNER-RELEASE check must look at (an ordered set).

    Invariant: every request that ended and is still queued unreleased outside a parking account since
    the last check is in it (the ones parked at that check stay in it until released).
    """

    def __init__(self) -> None:
        self._unchecked: dict[Req, None] = {}

    def __len__(self) -> int:
        return len(self._unchecked)

    def ended(self, req: Req) -> None:
        """``req`` has just ended (finished, aborted or rejected). Post: the next check looks at it."""
        self._unchecked[req] = None

    def check(self, sched: _SchedulerView, *, every_queued: bool) -> None:
        """Raise ContractViolation (I-OWNER-RELEASE) for an ended request neither released nor parked.

        Looks at the requests ended since the last check and those parked then; with ``every_queued`` at
        every queued request too. Post (no raise): only the still parked ones are kept. On a violation the
        set is unchanged, and the request reported is the first in queue order (what a full walk names).
        """
        parked = sched.parked_accounts
        keep: dict[Req, None] = {}
        bad: list[Req] = []
        for r in self._unchecked:
            if r.released or sched.queued_request(r.rid) is not r or not r.state.is_done:
                continue  # released (or never ended: nothing to release yet)
            if r.owner.account in parked:
                keep[r] = None
            else:
                bad.append(r)
        if every_queued:
            bad += _not_released(sched.queued_requests(), parked)
        if bad:
            raise _violation(sched, next(r for r in sched.queued_requests() if r in bad))
        self._unchecked = keep


def _not_released(reqs: Iterable[Req], parked: frozenset[Account]) -> list[Req]:
    return [r for r in reqs if r.state.is_done and r.owner.account not in parked]


def _violation(sched: _SchedulerView, r: Req) -> ContractViolation:
    held = {
        name: sorted(pool.ledger.holdings(r.owner))[:8]
        for name, pool in sched.accounting.pools_by_name().items()
        if pool.ledger.enabled and pool.ledger.held_count(r.owner)
    }
    return ContractViolation(
        f"I-OWNER-RELEASE: {r.owner!r} ended ({r.state.value}: {r.finish_reason}) at step"
        f" {r.finish_step} but was neither released nor parked; it still holds {held}: {r!r}"
    )
