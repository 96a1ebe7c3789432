"""Step order and the format's bounds: refused as EventLogError naming the line, before anything is allocated.

Every number a log carries is typed exactly (an int is not a bool, a float or a string) and bounded
(``kvledger/audit/events.py``, ``spec/event-log.md`` "Bounds"): a ``pool`` event of 2^40 ids must not
make the auditor allocate 20 TiB, an id of 10^30 must not overflow numpy.
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

from kvledger.audit import EventLogError, audit_lines
from kvledger.audit import events as E
from kvledger.audit.events import header

HEAD = json.dumps(header("tests"))
POOL = {"ev": "pool", "pool": "kv", "first": 1, "size": 8, "unit": 1, "unit_name": "tokens"}
TREE = {"ev": "tree", "root": 0}


def step(n: Any, **fields: Any) -> dict[str, Any]:
    return {"ev": "step", "step": n, "terms": {"kv": {"free": 8}}, **fields}


def log(*evs: dict[str, Any]) -> list[str]:
    return [HEAD, *(json.dumps(ev) for ev in evs)]


# ---------------------------------------------------------------------------------------------- steps
@pytest.mark.fires("I-EVENT-LOG")
@pytest.mark.parametrize(
    ("steps", "pattern"),
    [
        ([1, 2, 2], r"event 5: step 2 after step 2: step numbers strictly increase"),
        ([1, 5, 3], r"event 5: step 3 after step 5: step numbers strictly increase"),
        ([-1], r"event 3: step: step must be in \[0, \d+\], got -1"),
        ([10**30], r"event 3: step: step must be in \[0, \d+\], got a 100-bit integer"),
        ([2**63], r"event 3: step: step must be in \[0, 9223372036854775807\], got 9223372036854775808"),
        ([True], r"event 3: step: step must be an integer, got True"),
        ([1.0], r"event 3: step: step must be an integer, got 1.0"),
        (["1"], r"event 3: step: step must be an integer, got '1'"),
        ([None], r"event 3: step: step must be an integer, got None"),
    ],
    ids=["repeat", "backwards", "negative", "1e30", "2^63", "bool", "float", "str", "null"],
)
def test_step_numbers_are_ints_in_bounds_that_strictly_increase(steps: list[Any], pattern: str) -> None:
    with pytest.raises(EventLogError, match=pattern):
        audit_lines(log(POOL, *(step(n) for n in steps)))


def test_a_missing_step_number_is_refused() -> None:
    ev = step(1)
    del ev["step"]
    with pytest.raises(EventLogError, match=r"event 3: step: step must be an integer, got None \(missing\)"):
        audit_lines(log(POOL, ev))


def test_increasing_steps_from_zero_up_to_the_bound_are_accepted() -> None:
    end = {"ev": "end", "events": 5, "outcome": "completed"}
    report = audit_lines(log(POOL, step(0), step(7), step(E.MAX_NUMBER), end))
    assert report.clean and report.steps == 3, report.violation


# ---------------------------------------------------------------------------------------------- pools
@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        ({"size": 2**40}, r"pool: size must be in \[1, 67108864\], got 1099511627776"),
        ({"size": 10**30}, r"pool: size must be in \[1, 67108864\], got a 100-bit integer"),
        ({"size": 0}, r"pool: size must be in \[1, 67108864\], got 0"),
        ({"size": True}, r"pool: size must be an integer, got True"),
        ({"size": 8.0}, r"pool: size must be an integer, got 8.0"),
        ({"first": 2**40}, r"pool: first must be in \[0, 67108863\], got 1099511627776"),
        ({"first": -1}, r"pool: first must be in \[0, 67108863\], got -1"),
        ({"first": 2**26 - 4}, r"the pools' ids would reach 67108868 .* over the format's bound of 67108864"),
        ({"unit": 2**40}, r"pool: unit must be in \[1, 65536\], got 1099511627776"),
        ({"unit": 0}, r"pool: unit must be in \[1, 65536\], got 0"),
        ({"unit": "4"}, r"pool: unit must be an integer, got '4'"),
        ({"unit_name": 5}, r"pool: unit_name must be a string of 1 to 256 characters, got 5"),
        ({"pool": ""}, r"pool: pool must be a string of 1 to 256 characters, got ''"),
        ({"pool": ["kv"]}, r"pool: pool must be a string of 1 to 256 characters, got \['kv'\]"),
    ],
    ids=[
        "size-2^40",
        "size-1e30",
        "size-0",
        "size-bool",
        "size-float",
        "first-2^40",
        "first-negative",
        "end-over-bound",
        "unit-2^40",
        "unit-0",
        "unit-str",
        "unit-name-int",
        "name-empty",
        "name-list",
    ],
)
def test_a_pool_beyond_the_bounds_is_refused_before_anything_is_allocated(
    fields: dict[str, Any], pattern: str
) -> None:
    lines = log({**POOL, **fields})
    tracemalloc.start()
    try:
        with pytest.raises(EventLogError, match=pattern):
            audit_lines(lines)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated to refuse {fields}"


def test_the_pools_together_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(E, "MAX_LEDGER_IDS", 100)
    req = {"ev": "pool", "pool": "req", "first": 0, "size": 40, "unit": 1, "unit_name": "rows"}
    mamba = {"ev": "pool", "pool": "mamba", "first": 1, "size": 51, "unit": 1, "unit_name": "slots"}
    end = {"ev": "end", "events": 4, "outcome": "completed"}
    assert audit_lines(log(POOL, req, {**mamba, "size": 50}, end)).clean  # 9 + 40 + 51 = 100: at the bound
    with pytest.raises(EventLogError, match=r"event 4: pool 'mamba': the pools' ids would reach 101"):
        audit_lines(log(POOL, req, mamba))


# ---------------------------------------------------------------------------------------------- fields
ALLOC = {"ev": "alloc", "pool": "kv", "ids": [1], "to": "req#1"}
INSERT = {"ev": "insert", "node": 1, "parent": 0}


@pytest.mark.fires("I-EVENT-LOG")
@pytest.mark.parametrize(
    ("evs", "pattern"),
    [
        ([{**ALLOC, "ids": [10**30]}], r"event 3: ids must be a list of ints in \[0, \d+\], got \[1000"),
        ([{**ALLOC, "ids": [2**63]}], r"event 3: ids must be a list of ints in \[0, \d+\]"),
        ([{**ALLOC, "ids": [1, True]}], r"event 3: ids must be a list of ints, got \[1, True\]"),
        ([{**ALLOC, "ids": [1.0]}], r"event 3: ids must be a list of ints, got \[1.0\]"),
        ([{**ALLOC, "ids": [[1]]}], r"event 3: ids must be a list of ints, got \[\[1\]\]"),
        ([{**ALLOC, "ids": 1}], r"event 3: ids must be a list of ints, got 1"),
        ([{**ALLOC, "to": 7}], r"event 3: an owner is named by a string of 1 to 256 characters, got 7"),
        ([{**ALLOC, "to": "req#" + "9" * 300}], r"event 3: an owner is named by a string of 1 to 256"),
        ([{**ALLOC, "to": ["req#1", None]}], r"event 3: alloc: 1 ids for 2 owners"),
        (
            [{**ALLOC, "ids": [1, 2], "to": ["req#1", None]}],
            r"event 3: an owner is named by a string .* got None",
        ),
        ([{**ALLOC, "pool": 3}], r"event 3: alloc: pool must be a string of 1 to 256 characters, got 3"),
        (
            [ALLOC, {"ev": "move", "pool": "kv", "ids": [1], "from": "req#1", "to": "req#2", "op": 5}],
            r"op must",
        ),
        ([{"ev": "free_group", "pool": "kv", "open": 1}], r"event 3: free_group: open must be true or false"),
        ([TREE, {**INSERT, "node": True}], r"event 4: insert: node must be an integer, got True"),
        ([TREE, {**INSERT, "node": 10**30}], r"event 4: insert: node must be in \[0, \d+\], got a 100-bit"),
        ([TREE, {**INSERT, "parent": 0.0}], r"event 4: insert: parent must be an integer, got 0.0"),
        (
            [TREE, INSERT, {"ev": "lock", "node": "1", "state": False}],
            r"event 5: lock: node must be an integer",
        ),
        (
            [TREE, INSERT, {"ev": "lock", "node": 1, "state": 0}],
            r"event 5: lock: state must be true or false",
        ),
        (
            [TREE, INSERT, {"ev": "unlock", "node": 1, "state": "no"}],
            r"event 5: unlock: state must be true or",
        ),
        ([TREE, INSERT, {"ev": "split", "node": 1, "upper": -2}], r"event 5: split: upper must be in \[0, "),
        ([TREE, INSERT, {"ev": "evict", "node": [1]}], r"event 5: evict: node must be an integer, got \[1\]"),
        (
            [TREE, INSERT, {"ev": "cow", "node": 1, "pool": "kv", "src": 1, "dst": 10**30}],
            r"event 5: cow: dst must be in \[0, \d+\], got a 100-bit integer",
        ),
        ([{**TREE, "root": -1}], r"event 3: tree: root must be in \[0, \d+\], got -1"),
        (
            [{"ev": "req", "rid": True, "state": "waiting"}],
            r"event 3: req: rid must be an int in \[0, \d+\] or",
        ),
        ([{"ev": "req", "rid": -1, "state": "waiting"}], r"event 3: req: rid must be an int .* got -1"),
        ([{"ev": "req", "rid": 10**30, "state": "waiting"}], r"event 3: req: rid .* got a 100-bit integer"),
        ([{"ev": "req", "rid": 1.5, "state": "waiting"}], r"event 3: req: rid must be an int .* got 1.5"),
        ([{"ev": "req", "rid": "", "state": "waiting"}], r"event 3: req: rid must be an int .* got ''"),
        ([{"ev": "req", "rid": 1, "state": ["waiting"]}], r"event 3: req: state must be a string"),
        ([{"ev": "account", "owner": 5, "account": "x"}], r"event 3: account: owner must be a string"),
        (
            [{"ev": "account", "owner": "pd#1", "account": None}],
            r"event 3: account: account must be a string",
        ),
        ([step(1, quiescent="false")], r"event 3: step: quiescent must be true or false, got 'false'"),
        ([step(1, terms=[8])], r"event 3: step: terms must be an object per pool"),
        ([step(1, terms={"kv": {"free": True}})], r"event 3: step: terms of 'kv' must map accounts to ints"),
        ([step(1, terms={"kv": {"free": 8.0}})], r"event 3: step: terms of 'kv' must map accounts to ints"),
        (
            [step(1, terms={"kv": {"free": 10**30}})],
            r"event 3: step: terms of 'kv' must map accounts to ints",
        ),
        (
            [step(1, terms={"kv": {"free": 8, **{f"a{i}": 0 for i in range(29)}}})],
            r"name 29 accounts besides",
        ),
        ([step(1, terms={"kv": {"free": 8, "x" * 300: 0}})], r"name 1 accounts besides"),
    ],
)
def test_a_mistyped_or_unbounded_field_is_refused_naming_the_line(
    evs: list[dict[str, Any]], pattern: str
) -> None:
    with pytest.raises(EventLogError, match=pattern) as info:
        audit_lines(log(POOL, *evs))
    assert "I-EVENT-LOG" in str(info.value)


@pytest.mark.fires("I-DIAG-DOMAIN")
def test_an_id_within_the_format_but_outside_the_pool_is_a_violation() -> None:
    """Negative or past the pool, but an int64: the log says something false, not something unreadable."""
    for bad in (-1, 9, E.MAX_NUMBER):
        report = audit_lines(log(POOL, {**ALLOC, "ids": [bad]}))
        assert report.verdict == "violation" and report.violation_event == 3
        assert f"I-DIAG-DOMAIN: [kv] alloc: ids [{bad}] outside the pool's ids [1, 8]" in (
            report.violation or ""
        )
