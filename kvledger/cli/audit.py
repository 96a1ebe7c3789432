"""``kvledger audit FILE``: replay a recorded event log through the ledger and the identities.

Imports only :mod:`kvledger.audit` (numpy and :mod:`kvledger.contracts`), never torch: auditing a log is
a matter of a second, whatever engine wrote it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvledger.cli.options import usage_error
from kvledger.cli.simulate_checks import record_paths

NAME = "audit"


def add_parser(sub: Any) -> None:
    a = sub.add_parser(
        NAME,
        help="replay a recorded event log through the ledger and the identities",
        description=(
            "Replay an event log (JSON lines, spec/event-log.md: `kvledger simulate --record FILE`, or an"
            " engine's debug build) through the ownership ledger and the identities. Stops at the first"
            " violation and names the event, the ids, their owner and their last moves. Exit status 0: the"
            " log is clean; 1: a violation, or an incomplete log (no end marker: a cut-off run); 2: the file"
            " cannot be read or is not a valid log."
        ),
    )
    a.add_argument("log", metavar="FILE", type=Path, help="the event log")
    a.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")


def run(ns: argparse.Namespace) -> int:
    """0 clean, 1 a violation (printed with its evidence) or an incomplete log, 2 not a readable log."""
    from kvledger.audit import audit_file
    from kvledger.contracts.errors import EventLogError

    pd_logs = [p for p in record_paths(ns.log, pd=True) if p.is_file()]
    if not ns.log.exists() and pd_logs:  # `simulate --pd --record FILE` wrote one log per instance beside it
        each = ", ".join(f"kvledger audit {p}" for p in pd_logs)
        return usage_error(NAME, f"{ns.log}: no such file; a --pd run recorded one log per instance: {each}")
    try:
        report = audit_file(ns.log)
    except EventLogError as exc:
        return usage_error(NAME, str(exc).splitlines()[0])
    if ns.json:
        print(json.dumps(report.summary()))
    else:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(report.by_kind.items(), key=lambda kv: -kv[1]))
        print(f"kvledger audit {ns.log}: {report.events} events ({kinds})")
        print(f"  pools {report.pools}, {report.requests} requests, {report.steps} steps")
        if report.clean:
            print("  clean: every event keeps every invariant the log determines")
        elif report.verdict == "incomplete":
            print(f"  INCOMPLETE after event {report.violation_event}: the log has no end marker (a cut-off run)")
            print(report.violation)
        else:
            print(f"  VIOLATION at event {report.violation_event}:")
            print(report.violation)
    return 0 if report.clean else 1
