"""Fault soaks: allocation failures and client aborts injected into a ``kvledger simulate`` run.

``--alloc-fault-rate P``: before each step, with probability ``P``, the allocation of one kind (a request
row, a Mamba slot or KV), drawn at random, fails after the next 0 to 2 allocations of that kind go
through, so a failure lands at the start or in the middle of an admission (undoing what earlier requests
of the round took), of a decode step or of a speculative verify. ``--abort-rate P``: before each step,
with probability ``P``, one live request drawn at random is aborted, wherever it stands. Both are
seeded by the workload's seed: a run is repeatable. The engine must take every fault back to a state
its checks accept (a rolled-back admission, a skipped decode step) and still drain.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from kvledger.reference.scheduler.scheduler import FAULT_KINDS

MAX_AFTER = 2  # allocations of the kind let through before the failure: 0, 1 or 2


@dataclass
class FaultDriver:
    """Draws the faults of one run; counts what it injected."""

    alloc_fault_rate: float
    abort_rate: float
    seed: int
    faults_planned: int = 0
    aborts_sent: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(f"kvledger faults {self.seed}")  # a stream apart from the workload's

    @property
    def active(self) -> bool:
        return bool(self.alloc_fault_rate or self.abort_rate)

    def before_step(self, scheds: list[Any], abort_in: Any | None = None) -> None:
        """Maybe plan an allocation failure in one of ``scheds`` (a PD system's two instances, or the one
        scheduler), and maybe abort one live request of ``abort_in`` (a PD run draws its own aborts)."""
        rng = self._rng
        if self.alloc_fault_rate and rng.random() < self.alloc_fault_rate:
            target = scheds[rng.randrange(len(scheds))]
            target.faults.fail_next(rng.choice(FAULT_KINDS), after=rng.randrange(MAX_AFTER + 1))
            self.faults_planned += 1
        if abort_in is not None and self.abort_rate and rng.random() < self.abort_rate:
            live = [r for r in abort_in.live_requests() if not r.state.is_done]
            if live:
                abort_in.abort(live[rng.randrange(len(live))].rid)
                self.aborts_sent += 1
