"""Audit a recorded run: the event log format, the recorder that writes it, and the replay that checks it.

* :mod:`kvledger.audit.events`: the format (``kvledger-events`` version 1, JSON lines; ``spec/event-log.md``
  says which engine call emits which event).
* :class:`Recorder`: writes the log of a running kvledger engine (``kvledger simulate --record FILE``);
  :class:`PDRecorder`: one log per instance of a PD pair (``kvledger simulate --pd --record FILE``).
* :func:`audit_file` / :func:`audit_lines` / :class:`Auditor`: replay a log through the ledger and the
  identities; the first violation stops the audit with the ids, owners and moves (``kvledger audit FILE``).
  A log without its ``end`` marker is *incomplete* (:attr:`AuditReport.verdict`), never clean; a malformed
  one (bad JSON or UTF-8, a mistyped field, a number beyond the format's bounds, steps out of order) is an
  :class:`EventLogError`, raised before anything is allocated for it.

The replay imports only ``kvledger.contracts``: it can audit any engine that writes the format.
"""

from kvledger.audit.events import FORMAT, VERSION
from kvledger.audit.pd_record import PDRecorder
from kvledger.audit.record import Recorder
from kvledger.audit.replay import Auditor, AuditReport, AuditViolation, audit_file, audit_lines
from kvledger.contracts.errors import EventLogError

__all__ = [
    "FORMAT",
    "VERSION",
    "AuditReport",
    "AuditViolation",
    "Auditor",
    "EventLogError",
    "PDRecorder",
    "Recorder",
    "audit_file",
    "audit_lines",
]
