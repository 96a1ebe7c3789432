"""The end marker: the recorder writes it last, and the audit vouches only for a log that has it.

A log without it was cut off (``head -100 run.jsonl``, an interrupted run, a recorder never closed): the
audit calls it *incomplete* (exit status 1 in the CLI), naming the last event and what was still held,
never clean. An end marker whose count disagrees with the lines before it, or events after it, are a
malformed log (EventLogError).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kvledger.audit import EventLogError, Recorder, audit_file, audit_lines
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from tests.audit._logs import PLAIN, PROMPTS, events, record
from tests.scheduler.harness import build, ledgers


@pytest.fixture(scope="module")
def plain_log() -> list[str]:
    return record(PLAIN)


def _recorder() -> tuple[object, io.StringIO, Recorder]:
    sched = build(ledgers(PLAIN))
    out = io.StringIO()
    return sched, out, Recorder(sched, out, source="tests")


def test_close_writes_the_end_marker_last_with_the_count_before_it(plain_log: list[str]) -> None:
    end = json.loads(plain_log[-1])
    assert end == {"ev": "end", "events": len(plain_log) - 1, "outcome": "completed"}
    assert sum(1 for ev in events(plain_log) if ev["ev"] == "end") == 1


def test_close_mid_run_says_stopped_and_a_second_close_writes_nothing() -> None:
    sched, out, rec = _recorder()
    sched.add_request(1, PROMPTS[1], 5)  # type: ignore[attr-defined]
    sched.step()  # type: ignore[attr-defined]
    rec.close()
    rec.close()
    lines = out.getvalue().splitlines()
    assert json.loads(lines[-1]) == {"ev": "end", "events": len(lines) - 1, "outcome": "stopped"}
    assert sum('"ev":"end"' in line for line in lines) == 1
    report = audit_lines(lines)  # a complete log of a run closed while busy: consistent, so clean
    assert report.clean and report.outcome == "stopped", report.violation


def test_an_unknown_outcome_is_refused_and_nothing_is_written() -> None:
    _, out, rec = _recorder()
    before = out.getvalue()
    with pytest.raises(InvalidArgument, match="outcome must be one of"):
        rec.close("fine")
    assert out.getvalue() == before
    rec.close("violation")
    assert json.loads(out.getvalue().splitlines()[-1])["outcome"] == "violation"


def test_a_violation_leaving_the_recorder_is_its_outcome_and_the_audit_is_not_clean() -> None:
    sched, out, rec = _recorder()
    with pytest.raises(ContractViolation), rec:
        sched.add_request(1, PROMPTS[1], 5)  # type: ignore[attr-defined]
        sched.step()  # type: ignore[attr-defined]
        raise ContractViolation("I-COUNT: planted")
    lines = out.getvalue().splitlines()
    assert json.loads(lines[-1])["outcome"] == "violation"
    report = audit_lines(lines)
    assert report.verdict == "violation" and report.violation_event == len(lines)
    assert "the engine stopped on a contract violation" in (report.violation or "")


def test_an_interrupt_leaves_no_end_marker_and_the_audit_says_incomplete() -> None:
    sched, out, rec = _recorder()
    with pytest.raises(KeyboardInterrupt), rec:
        sched.add_request(1, PROMPTS[1], 5)  # type: ignore[attr-defined]
        sched.step()  # type: ignore[attr-defined]
        raise KeyboardInterrupt
    lines = out.getvalue().splitlines()
    assert all('"ev":"end"' not in line for line in lines)
    report = audit_lines(lines)
    assert report.verdict == "incomplete" and not report.clean
    assert "1 request(s) not released; 1 of them still hold ids" in (report.violation or "")
    sched.step()  # type: ignore[attr-defined]  # detached: the engine runs on unobserved
    assert out.getvalue().splitlines() == lines


def test_a_close_in_a_finally_while_an_interrupt_propagates_writes_no_end_marker() -> None:
    """What ``run_simulation``'s ``finally: recorder.close()`` does on Ctrl-C: the run did not end."""
    sched, out, rec = _recorder()
    with pytest.raises(KeyboardInterrupt):
        try:
            sched.add_request(1, PROMPTS[1], 5)  # type: ignore[attr-defined]
            sched.step()  # type: ignore[attr-defined]
            raise KeyboardInterrupt
        finally:
            rec.close()
    lines = out.getvalue().splitlines()
    assert rec.closed and all('"ev":"end"' not in line for line in lines)
    assert audit_lines(lines).verdict == "incomplete"


def test_a_close_in_a_finally_while_a_violation_propagates_says_violation() -> None:
    _, out, rec = _recorder()
    with pytest.raises(ContractViolation):
        try:
            raise ContractViolation("I-COUNT: planted")
        finally:
            rec.close()
    assert json.loads(out.getvalue().splitlines()[-1])["outcome"] == "violation"


def test_a_cut_off_recorded_run_is_incomplete_not_clean(plain_log: list[str]) -> None:
    for n in (2, 40, len(plain_log) - 1):  # the last cut drops only the end marker
        report = audit_lines(plain_log[:n])
        assert report.verdict == "incomplete" and not report.clean, n
        assert report.violation_event == n and report.events == n
        assert f"no end marker after event {n} (the last: {plain_log[n - 1][:40]}" in (report.violation or "")


def test_an_end_marker_with_the_wrong_count_is_refused(plain_log: list[str]) -> None:
    *body, _ = plain_log
    n = len(body)
    for count in (n - 1, n + 1, 0):  # a line lost or added somewhere before it
        end = json.dumps({"ev": "end", "events": count, "outcome": "completed"})
        with pytest.raises(
            EventLogError,
            match=rf"event {n + 1}: the end marker counts {count} events before it, but {n} lines",
        ):
            audit_lines([*body, end])


def test_events_after_the_end_marker_are_refused(plain_log: list[str]) -> None:
    n = len(plain_log)
    with pytest.raises(EventLogError, match=rf"event {n + 1}: 'req' after the end marker \(event {n}\)"):
        audit_lines([*plain_log, json.dumps({"ev": "req", "rid": 99, "state": "waiting"})])
    with pytest.raises(EventLogError, match=rf"event {n + 1}: 'end' after the end marker"):
        audit_lines([*plain_log, json.dumps({"ev": "end", "events": n, "outcome": "completed"})])


@pytest.mark.parametrize(
    ("end", "pattern"),
    [
        ({"ev": "end", "outcome": "completed"}, r"end: events must be an integer, got None \(missing\)"),
        ({"ev": "end", "events": True, "outcome": "completed"}, r"end: events must be an integer, got True"),
        (
            {"ev": "end", "events": 10**30, "outcome": "completed"},
            r"end: events must be in \[0, \d+\], got a 100-bit integer",
        ),
        ({"ev": "end", "events": -1, "outcome": "completed"}, r"end: events must be in \[0, \d+\], got -1"),
        ({"ev": "end", "events": "12", "outcome": "completed"}, r"end: events must be an integer, got '12'"),
        ({"ev": "end", "events": "*"}, r"end: outcome must be a string of 1 to 256 characters, got None"),
        ({"ev": "end", "events": "*", "outcome": "done"}, r"end: unknown outcome 'done'"),
    ],
    ids=[
        "no-count",
        "bool-count",
        "huge-count",
        "negative-count",
        "str-count",
        "no-outcome",
        "unknown-outcome",
    ],
)
def test_a_malformed_end_marker_is_refused(
    plain_log: list[str], end: dict[str, object], pattern: str
) -> None:
    *body, _ = plain_log
    if end.get("events") == "*":
        end = {**end, "events": len(body)}
    with pytest.raises(EventLogError, match=pattern):
        audit_lines([*body, json.dumps(end)])


def test_a_completed_end_checks_that_nothing_is_held(plain_log: list[str]) -> None:
    """A ``completed`` end is the engine's word that it drained: a request still holding ids breaks it."""
    *body, _ = plain_log
    last_step = max(i for i, ev in enumerate(events(body)) if ev["ev"] == "step")
    kept = body[: last_step + 1]
    alloc = json.dumps({"ev": "alloc", "pool": "req", "ids": [0], "to": "req#99"})
    end = json.dumps({"ev": "end", "events": len(kept) + 1, "outcome": "completed"})
    report = audit_lines([*kept, alloc, end])
    assert report.verdict == "violation" and report.violation_event == len(kept) + 2
    assert "I-IDLE-IDENTITY: [req] quiescent but the replayed ledger has" in (report.violation or "")


def test_head_100_of_a_recorded_simulate_run_is_not_clean(tmp_path: Path) -> None:
    """The issue's case exactly: ``kvledger simulate --record run.jsonl; head -100 run.jsonl > t.jsonl``."""
    from kvledger.sim.simulate import SimOptions, run_simulation

    run = tmp_path / "run.jsonl"
    with open(run, "w", encoding="utf-8") as f:
        result = run_simulation(SimOptions(), record=f)
    assert result.violation is None
    assert audit_file(run).clean
    t = tmp_path / "t.jsonl"
    t.write_bytes(b"".join(run.read_bytes().splitlines(keepends=True)[:100]))
    report = audit_file(t)
    assert not report.clean and report.verdict == "incomplete" and report.events == 100
    text = report.violation or ""
    assert text.startswith("incomplete log: no end marker after event 100")
    assert "24 request(s) not released" in text
