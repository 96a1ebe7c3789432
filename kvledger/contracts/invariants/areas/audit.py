"""The audit of a recorded run: the event log's own well-formedness, and the invariants its replay checks."""

from __future__ import annotations

from kvledger.contracts.invariants.model import Area, Invariant, Origin, Severity, input_check

EVENTS = "kvledger/audit/events.py"
REPLAY = "kvledger/audit/replay.py"

AREA = Area(
    key="audit",
    title="Audit of a recorded run",
    order=50,
    intro=(
        "`kvledger audit FILE` replays an event log (`spec/event-log.md`: JSON lines that"
        " `kvledger simulate --record FILE` or an engine's debug build writes) through one ledger per pool,"
        " the cache's tree and the requests' states, and stops at the first event that breaks an invariant,"
        " with the ids, their owner and their last moves dated by event number. The invariants it checks are"
        " the ones above, as far as the events determine them: I-EXCLUSIVE and I-NODUP-FREE (`alloc`, `free`,"
        " `move`), I-DIAG-DOMAIN, I-PENDING (free groups), I-LOCK-TREE and I-MAMBA-LOCK (`unlock` below zero),"
        " I-EVICT-LOCKED and I-KEYS (`evict`, frees of a locked node), I-COW-SOURCE and I-MAMBA-VALUE (`cow`),"
        " I-OWNER-RELEASE (a released request or an evicted node that still owns ids), I-COUNT, I-CAP and"
        " I-LEDGER-AGREES (every `step`'s terms), I-IDLE-IDENTITY (a quiescent `step`). Checks:"
        " `kvledger/audit/replay.py:Auditor`; round-trip tests: `tests/audit/test_round_trip.py`."
    ),
    invariants=(
        Invariant(
            id="I-EVENT-LOG",
            title="an audited log is well formed",
            statement=(
                "A log starts with a `kvledger-events` version 1 header; every line is one JSON object with a"
                " known `ev` and its fields, typed exactly and within the format's bounds (checked before"
                " anything is allocated for them); step numbers strictly increase; pools are declared before"
                " use and once; owners are requests, cache nodes or holders declared by an `account` event;"
                " nothing follows the `end` marker, whose count is the number of lines before it. A log that is"
                " not is refused with a typed error naming the line, before any invariant is judged on it. (A"
                " log without an `end` marker is not malformed but incomplete: the audit reports it, never"
                " clean.)"
            ),
            severity=Severity.OPERATING_ERROR,
            origin=Origin.KVLEDGER,
            parts=("audit",),
            checks=(
                input_check(f"{EVENTS}:parse", "JSON object with an `ev` field"),
                input_check(f"{EVENTS}:check_header", "format and version"),
                input_check(
                    f"{REPLAY}:Auditor.feed", "known events, their fields, declared pools and owners"
                ),
            ),
        ),
    ),
)
