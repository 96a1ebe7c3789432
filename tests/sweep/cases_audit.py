"""Bad calls on the audit of recorded runs (``kvledger.audit``): ``Recorder``, ``Auditor``, ``audit_lines``
and ``audit_file``. A malformed log or argument is an :class:`EventLogError` (or ``InvalidArgument`` for a
recorder's wiring), never a bare TypeError/KeyError, and a refused recorder writes and installs nothing."""

from __future__ import annotations

import io
from typing import Any

from kvledger.audit import Auditor, Recorder, audit_file, audit_lines
from kvledger.reference.engine import EngineSpec, build_engine
from tests.sweep.table import DEGENERATE, NEGATIVE, WRONG_STATE, WRONG_TYPE, Case, Query

Rec: Any = Recorder  # typed as Any: the wrong-type arguments below are deliberate
Aud: Any = Auditor
lines: Any = audit_lines
file: Any = audit_file


def _row(member: str, category: str, label: str, error: str, call: Any) -> Case:
    return Case(member, category, label, "empty", call, error)


CASES: list[Case] = [
    _row(
        "Recorder.__init__",
        WRONG_TYPE,
        "a None scheduler",
        "InvalidArgument",
        lambda s: Rec(None, io.StringIO()),
    ),
    _row(
        "Recorder.__init__",
        WRONG_TYPE,
        "a path as the stream",
        "InvalidArgument",
        lambda s: Rec(build_engine(EngineSpec()), "/tmp/log"),
    ),
    _row(
        "Recorder.__init__",
        WRONG_TYPE,
        "a None source",
        "InvalidArgument",
        lambda s: Rec(build_engine(EngineSpec()), io.StringIO(), source=None),
    ),
    _row(
        "Recorder.__init__",
        WRONG_STATE,
        "an engine without ledgers (contracts off)",
        "InvalidArgument",
        lambda s: _recorder_without_ledgers(),
    ),
    _row("Auditor.feed_line", WRONG_TYPE, "a None line", "EventLogError", lambda s: Aud().feed_line(None, 1)),
    _row(
        "Auditor.feed_line", WRONG_TYPE, "not JSON", "EventLogError", lambda s: Aud().feed_line("garbage", 1)
    ),
    _row("Auditor.feed", WRONG_TYPE, "an event without 'ev'", "EventLogError", lambda s: Aud().feed({}, 1)),
    _row("Auditor.feed", WRONG_TYPE, "a None event", "EventLogError", lambda s: Aud().feed(None, 1)),
    _row(
        "Auditor.feed", NEGATIVE, "event number 0", "EventLogError", lambda s: Aud().feed({"ev": "step"}, 0)
    ),
    _row(
        "Auditor.feed",
        WRONG_TYPE,
        "a str event number",
        "EventLogError",
        lambda s: Aud().feed({"ev": "step"}, "1"),
    ),
    _row(
        "Recorder.close",
        WRONG_TYPE,
        "an unknown outcome",
        "InvalidArgument",
        lambda s: _closed_with("finished"),
    ),
    _row("PDRecorder.__init__", WRONG_TYPE, "a None system", "InvalidArgument", lambda s: _pd_recorder(None)),
    _row(
        "PDRecorder.__init__",
        WRONG_TYPE,
        "streams for one instance only",
        "InvalidArgument",
        lambda s: _pd_recorder(_pd_system(), sides=1),
    ),
    _row(
        "PDRecorder.close",
        WRONG_TYPE,
        "an unknown outcome",
        "InvalidArgument",
        lambda s: _pd_closed_with("finished"),
    ),
    _row("audit_lines", WRONG_TYPE, "None", "EventLogError", lambda s: lines(None)),
    _row(
        "audit_lines", WRONG_TYPE, "a str (not lines)", "EventLogError", lambda s: lines('{"ev": "header"}')
    ),
    _row("audit_lines", WRONG_TYPE, "an int line", "EventLogError", lambda s: lines([5])),
    _row("audit_lines", DEGENERATE, "no lines", "EventLogError", lambda s: lines([])),
    _row("audit_file", WRONG_TYPE, "a None path", "EventLogError", lambda s: file(None)),
    _row(
        "audit_file",
        WRONG_STATE,
        "a missing file",
        "EventLogError",
        lambda s: file("/nonexistent/kvledger.log"),
    ),
]


def _closed_with(outcome: object) -> None:
    """A recorder closed with ``outcome``; a refused close leaves it open, its log without an end."""
    out = io.StringIO()
    rec = Rec(build_engine(EngineSpec()), out)
    try:
        rec.close(outcome)
    finally:
        assert '"ev":"end"' not in out.getvalue().replace(" ", ""), "a refused close wrote the end marker"
        rec.detach()


def _pd_system() -> Any:
    from kvledger.reference.disagg import PDSpec, build_pd

    return build_pd(PDSpec())


def _pd_recorder(system: Any, sides: int = 2) -> object:
    from kvledger.audit.pd_record import SIDES, PDRecorder

    return PDRecorder(system, {side: io.StringIO() for side in SIDES[:sides]})


def _pd_closed_with(outcome: object) -> None:
    """A PD recorder closed with ``outcome``: refused before either instance's log gets its end marker."""
    from kvledger.audit.pd_record import SIDES, PDRecorder

    outs = {side: io.StringIO() for side in SIDES}
    rec = PDRecorder(_pd_system(), outs)
    try:
        rec.close(outcome)
    finally:
        for out in outs.values():
            assert '"ev":"end"' not in out.getvalue().replace(" ", ""), "a refused close wrote an end marker"
        rec.detach()


def _recorder_without_ledgers() -> object:
    from kvledger.contracts.levels import CheckLevel

    sched = build_engine(EngineSpec(checks=CheckLevel.RELEASE))
    out = io.StringIO()
    try:
        return Rec(sched, out)
    finally:
        assert out.getvalue() == "", "a refused recorder wrote its header"
        assert (
            sched.kv_allocator.ledger.observer is None
            if hasattr(sched.kv_allocator.ledger, "observer")
            else True
        )


QUERIES: list[Query] = [
    Query("Auditor.__init__", "empty", lambda s: Aud(), "a fresh auditor: nothing to misuse")
]

NO_BAD_CALL: dict[str, str] = {
    "Recorder.detach": "no argument; unhooks the recorder, allowed in every state (a second call does nothing)",
    "PDRecorder.detach": "no argument; unhooks both instances' recorders, allowed in every state",
    "PDRecorder.events": "no argument; the number of events each instance's log holds (a read)",
    "Auditor.unfinished": "no argument; a description of what the replay holds, allowed in every state",
}
NOT_ENTRY_POINTS: dict[str, str] = {
    "Recorder.moved": "a ledger observer callback the pools call on every move",
    "Recorder.retagged": "a ledger observer callback the owners call on every retag",
}
