"""Planned allocation failures (``FaultInjector``), for tests, the museum's machines and fault soaks.

The scheduler asks its injector before each allocation of a kind; a planned failure makes that
allocation fail as an exhausted pool would, so the admission's rollback runs on real state.
"""

from __future__ import annotations

from kvledger.contracts.errors import InvalidArgument
from kvledger.reference.pools.validate import check_count, check_positive

FAULT_KINDS = ("row", "mamba", "kv")


class FaultInjector:
    """Makes allocations of a kind (``row``, ``mamba``, ``kv``) fail, for tests and fault soaks.

    ``fail_next(kind, times, after)`` lets the next ``after`` allocations of that kind through, then fails
    ``times``: with ``after`` > 0 a failure lands in the middle of an admission, after earlier requests of
    the round (the chunked one first) took their ids, so the rollback has something to undo. The plan
    of each kind is a queue of outcomes, consumed one allocation at a time; a second ``fail_next`` joins
    its outcomes to the end."""

    MAX_PLAN = 4096  # outcomes one call may plan: a test's or a soak's schedule, never a pool's worth

    def __init__(self) -> None:
        self.pending: dict[str, tuple[bool, ...]] = {}  # per kind, the next allocations' outcomes (True: fail)
        self.fired = 0

    def fail_next(self, what: str, times: int = 1, after: int = 0) -> None:
        if what not in FAULT_KINDS:
            raise InvalidArgument(f"fail_next: what must be one of {FAULT_KINDS}, got {what!r}")
        check_positive(times, "times")
        check_count(after, "after")
        if after + times > self.MAX_PLAN:
            raise InvalidArgument(f"fail_next: after + times is at most {self.MAX_PLAN}, got {after + times}")
        self.pending[what] = self.pending.get(what, ()) + (False,) * after + (True,) * times

    def __call__(self, what: str) -> bool:
        plan = self.pending.get(what)
        if not plan:
            return False
        self.pending[what] = plan[1:]
        if plan[0]:
            self.fired += 1
        return plan[0]
