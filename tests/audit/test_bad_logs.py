"""A log the audit cannot read is an operating error (EventLogError, I-EVENT-LOG) naming the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvledger.audit import EventLogError, audit_file, audit_lines
from kvledger.audit import events as E
from kvledger.audit.events import header

HEAD = json.dumps(header("tests"))
POOL = json.dumps({"ev": "pool", "pool": "kv", "first": 1, "size": 8, "unit": 1, "unit_name": "tokens"})


@pytest.mark.fires("I-EVENT-LOG")
@pytest.mark.parametrize(
    ("lines", "pattern"),
    [
        ([POOL], r"event 1: the log must start with a header event"),
        ([json.dumps({**header("x"), "version": 99})], r"event 1: .*version 99"),
        ([HEAD, "{not json"], r"event 2: not JSON"),
        ([HEAD, "[1, 2]"], r'event 2: not an event object with an "ev" field'),
        ([HEAD, json.dumps({"ev": "teleport"})], r"event 2: unknown event 'teleport'"),
        (
            [HEAD, json.dumps({"ev": "pool", "pool": "kv"})],
            r"event 2: pool: first must be an integer, got None \(missing\)",
        ),
        ([HEAD, POOL, POOL], r"event 3: pool 'kv' declared twice"),
        (
            [HEAD, json.dumps({"ev": "alloc", "pool": "kv", "ids": [1], "to": "req#1"})],
            r"pool 'kv' was never declared",
        ),
        (
            [HEAD, POOL, json.dumps({"ev": "alloc", "pool": "kv", "ids": ["1"], "to": "req#1"})],
            r"ids must be a list of ints",
        ),
        (
            [HEAD, POOL, json.dumps({"ev": "alloc", "pool": "kv", "ids": [1], "to": "pd#1"})],
            r"declare it with an account event",
        ),
        ([HEAD, POOL, json.dumps({"ev": "account", "owner": "req#1", "account": "x"})], r"derived"),
        ([HEAD, POOL, json.dumps({"ev": "req", "rid": 1, "state": "sleeping"})], r"unknown state 'sleeping'"),
        ([HEAD, ""], r"event 2: an empty line"),
    ],
    ids=[
        "no-header",
        "version",
        "not-json",
        "not-object",
        "unknown-event",
        "missing-field",
        "pool-twice",
        "undeclared-pool",
        "mistyped-ids",
        "undeclared-owner-kind",
        "stated-derived-account",
        "unknown-state",
        "empty-line",
    ],
)
def test_a_malformed_log_is_refused_with_the_line(lines: list[str], pattern: str) -> None:
    with pytest.raises(EventLogError, match=pattern) as info:
        audit_lines(lines)
    assert "I-EVENT-LOG" in str(info.value)


def test_an_empty_log_is_refused() -> None:
    with pytest.raises(EventLogError, match="an empty log"):
        audit_lines([])


@pytest.mark.fires("I-DIAG-DOMAIN")
def test_ids_outside_the_pool_are_a_violation_not_a_format_error() -> None:
    alloc = json.dumps({"ev": "alloc", "pool": "kv", "ids": [0, 3], "to": "req#1"})
    report = audit_lines([HEAD, POOL, alloc])
    assert report.violation_event == 3 and "I-DIAG-DOMAIN: [kv] alloc: ids [0] outside" in (
        report.violation or ""
    )


def test_other_holders_declare_their_account_first() -> None:
    """A holder the format does not know (a PD queue) is declared with an account event, then holds ids."""
    lines = [
        HEAD,
        POOL,
        json.dumps({"ev": "account", "owner": "pd.transfer#3", "account": "pd.inflight"}),
        json.dumps({"ev": "alloc", "pool": "kv", "ids": [1, 2], "to": "pd.transfer#3"}),
        json.dumps({"ev": "step", "step": 1, "terms": {"kv": {"free": 6, "pd.inflight": 2}}}),
        json.dumps({"ev": "free", "pool": "kv", "ids": [1, 2], "from": "pd.transfer#3"}),
        json.dumps({"ev": "step", "step": 2, "terms": {"kv": {"free": 8}}, "quiescent": True}),
        json.dumps({"ev": "end", "events": 7, "outcome": "completed"}),
    ]
    report = audit_lines(lines)
    assert report.clean, report.violation


# ------------------------------------------------------------------ hostile input: always EventLogError
DEEP = 100_000


@pytest.mark.fires("I-EVENT-LOG")
@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ('{"ev":"alloc","pool":"kv","ids":' + "[" * DEEP + "]" * DEEP + ',"to":"req#1"}', r"nested too deep"),
        ("[" * DEEP + "]" * DEEP, r"event 2: not an event: JSON nested too deep"),
        ("1", r'event 2: not an event object with an "ev" field'),
        ('"alloc"', r'event 2: not an event object with an "ev" field'),
        ("null", r'event 2: not an event object with an "ev" field'),
        ('{"ev": 5}', r'event 2: not an event object with an "ev" field'),
        ('{"ev":"step","step":NaN,"terms":{}}', r"event 2: not JSON: NaN is not a JSON number"),
        (
            '{"ev":"step","step":1,"terms":{"kv":{"free":Infinity}}}',
            r"event 2: not JSON: Infinity is not a JSON",
        ),
        ('{"ev":"step","step":' + "9" * 5000 + "}", r"event 2: not JSON: Exceeds the limit"),
        (
            '{"ev":"alloc","pool":"kv","ids":[1],"to":"req#\\ud800"}',
            r"event 2: a string with a lone surrogate",
        ),
        ("\ufeff" + json.dumps(header("x")), r"event 2: not JSON \(a UTF-8 byte order mark"),
    ],
    ids=[
        "deep-ids",
        "deep-line",
        "number",
        "string",
        "null",
        "ev-not-str",
        "nan",
        "infinity",
        "5000-digits",
        "surrogate",
        "bom",
    ],
)
def test_hostile_lines_are_refused_naming_the_line(line: str, pattern: str) -> None:
    with pytest.raises(EventLogError, match=pattern):
        audit_lines([HEAD, line])


def test_a_binary_file_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(HEAD.encode() + b"\n" + POOL.encode() + b"\n\x00\xff\xfe binary\n")
    with pytest.raises(
        EventLogError, match=r"event 3: not UTF-8 text \(byte 2 of the line: invalid start byte\)"
    ):
        audit_file(path)
    path.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(EventLogError, match=r"event 1: not UTF-8 text|event 1: not JSON"):
        audit_file(path)


def test_a_line_over_the_bound_is_refused_without_reading_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(E, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "run.jsonl"
    path.write_text(
        HEAD + "\n" + POOL + "\n" + "x" * 5000
    )  # no newline: a reader without a bound reads it all
    reads: list[int] = []
    real_open = open

    def counting_open(*args: object, **kwargs: object) -> object:
        f = real_open(*args, **kwargs)  # type: ignore[call-overload]
        readline = f.readline

        def bounded(size: int = -1) -> bytes:
            line: bytes = readline(size)
            reads.append(len(line))
            return line

        f.readline = bounded
        return f

    monkeypatch.setattr("builtins.open", counting_open)
    with pytest.raises(EventLogError, match=r"event 3: a line longer than 1000 bytes"):
        audit_file(path)
    assert max(reads) == 1001  # the bound and one byte more, never the 5000
    with pytest.raises(EventLogError, match=r"event 2: a line longer than 1000 bytes"):
        audit_lines([HEAD, "x" * 1001])
