"""A log the audit cannot read is an operating error (EventLogError, I-EVENT-LOG) naming the line."""

from __future__ import annotations

import json

import pytest

from kvledger.audit import EventLogError, audit_lines
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
