"""What ``kvledger audit`` returns: the report of one replayed log, and the violation it raises.

Kept apart from the replay (:mod:`kvledger.audit.replay`, which re-exports both) so that a reader of audit
results needs neither the auditor's state machine nor numpy. Imports only ``kvledger.contracts``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvledger.contracts.errors import ContractViolation


class AuditViolation(ContractViolation):
    """An invariant the log breaks, at event ``event`` (its line number); ``line`` is the event's text."""

    def __init__(self, message: str, event: int, line: str) -> None:
        super().__init__(message)
        self.event = event
        self.line = line


@dataclass
class AuditReport:
    """What an audit found: the events read, per kind, and why the log is not clean, if it is not.

    ``verdict``: ``clean`` (a complete log that keeps every invariant), ``violation`` (the first event that
    breaks one, or an end marker saying the engine stopped on one), ``incomplete`` (no end marker: the run
    was cut off). ``violation`` holds the text of either of the last two, ``violation_event`` the event it
    is dated by (for an incomplete log, its last event); ``clean`` is true only for ``clean``."""

    path: str
    events: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    pools: dict[str, int] = field(default_factory=dict)  # pool -> size in ids
    steps: int = 0
    requests: int = 0
    violation: str | None = None
    violation_event: int | None = None
    incomplete: bool = False
    outcome: str | None = None  # the end marker's: completed, stopped, violation (None: none was read)
    cpu_s: float = 0.0

    @property
    def clean(self) -> bool:
        return self.violation is None and not self.incomplete

    @property
    def verdict(self) -> str:
        if self.incomplete:
            return "incomplete"
        return "clean" if self.violation is None else "violation"

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "clean": self.clean,
            "verdict": self.verdict,
            "outcome": self.outcome,
            "events": self.events,
            "by_kind": self.by_kind,
            "pools": self.pools,
            "steps": self.steps,
            "requests": self.requests,
            "violation": self.violation,
            "violation_event": self.violation_event,
            "cpu_s": self.cpu_s,
            "events_per_s": (self.events / self.cpu_s) if self.cpu_s > 0 else None,
        }
