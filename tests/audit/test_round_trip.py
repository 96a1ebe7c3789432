"""The audit round trip (issue 10): a recorded run audits clean; a planted bug stops it at its event.

Logs come from the reference engine through the recorder (``kvledger.audit.Recorder``); bugs are
planted by editing the log's lines (a duplicated ``free``, a deleted ``free``, a duplicated ``unlock``,
a ``free`` by the wrong owner), so the audit sees exactly what an engine with that bug would have written.
The audit must name the right invariant at the right event (its line number), with the ids and owners.
"""

from __future__ import annotations

import json
import re

import pytest

from kvledger.audit import audit_lines
from tests.audit._logs import MAMBA, PAGED, PLAIN, events, first, lock_count_before, record


@pytest.fixture(scope="module")
def mamba_log() -> list[str]:
    return record(MAMBA)


@pytest.mark.parametrize(
    ("spec", "abort"),
    [(MAMBA, None), (MAMBA, 3), (PAGED, None), (PLAIN, 2)],
    ids=["mamba-radix", "mamba-radix-abort", "paged-radix-overlap", "no-cache-abort"],
)
def test_a_recorded_run_audits_clean(spec: object, abort: int | None) -> None:
    lines = record(spec, abort=abort)  # type: ignore[arg-type]
    report = audit_lines(lines)
    assert report.clean, report.violation
    assert report.events == len(lines) and report.requests == 8
    kinds = report.by_kind
    assert kinds["alloc"] and kinds["free"] and kinds["step"] and kinds["req"]
    if spec is not PLAIN:
        assert kinds["insert"] and kinds["lock"] == kinds["unlock"] and kinds.get("evict", 0) >= 0
    *_, last_step, end = events(lines)
    assert last_step["ev"] == "step" and last_step["quiescent"] is True  # the idle identity was checked too
    assert end == {"ev": "end", "events": len(lines) - 1, "outcome": "completed"}
    assert report.verdict == "clean" and report.outcome == "completed"


def test_the_mamba_log_covers_copy_on_write_and_splits(mamba_log: list[str]) -> None:
    kinds = {ev["ev"] for ev in events(mamba_log)}
    assert {"cow", "split", "move", "insert", "lock", "unlock"} <= kinds


@pytest.mark.fires("I-NODUP-FREE")
def test_a_planted_double_free_stops_at_the_second_free(mamba_log: list[str]) -> None:
    i = first(mamba_log, ev="free", pool="req")
    planted = [*mamba_log[: i + 1], mamba_log[i], *mamba_log[i + 1 :]]
    report = audit_lines(planted)
    assert report.violation_event == i + 2, report.violation  # the duplicate's line
    ev = json.loads(mamba_log[i])
    assert "I-NODUP-FREE" in report.violation and "already free (a double free)" in report.violation
    assert f"ids {ev['ids']}" in report.violation and f"by {ev['from']}[" in report.violation
    assert re.search(rf"event {i + 1}: free: {ev['from']}\[", report.violation), report.violation


@pytest.mark.fires("I-OWNER-RELEASE")
def test_a_planted_leak_stops_where_the_request_is_released(mamba_log: list[str]) -> None:
    i = first(mamba_log, ev="free", pool="req")
    ev = json.loads(mamba_log[i])
    rid = int(ev["from"].split("#")[1])
    planted = mamba_log[:i] + mamba_log[i + 1 :]  # the row is never given back
    released = first(planted, ev="req", rid=rid, state="released")
    report = audit_lines(planted)
    assert report.violation_event == released + 1, report.violation
    assert "I-OWNER-RELEASE" in report.violation and "a leak" in report.violation
    assert re.search(
        rf"leaked {re.escape(str(ev['ids']))} \(1\): ledger owner req#{rid}\[req\.\w+\]; the log says no holder"
        rf" \(req#{rid} was released at event {released + 1}\)",
        report.violation,
    ), report.violation
    assert re.search(rf"event \d+: alloc: free_list\[free\] -> req#{rid}\[", report.violation), (
        report.violation
    )


@pytest.mark.fires("I-LOCK-TREE")
def test_a_planted_lock_underflow_stops_at_the_extra_unlock(mamba_log: list[str]) -> None:
    root = events(mamba_log)[first(mamba_log, ev="tree")]["root"]
    unlocks = [i for i, ev in enumerate(events(mamba_log)) if ev["ev"] == "unlock" and ev["node"] != root]
    i = next(i for i in unlocks if lock_count_before(mamba_log, i, json.loads(mamba_log[i])["node"]) == 1)
    node = json.loads(mamba_log[i])["node"]
    extra = json.dumps({"ev": "unlock", "node": node, "state": False})
    planted = [*mamba_log[: i + 1], extra, *mamba_log[i + 1 :]]
    report = audit_lines(planted)
    assert report.violation_event == i + 2, report.violation
    assert re.search(
        rf"I-LOCK-TREE: unlock of node {node} would take node \d+'s lock_ref below zero", report.violation
    )


@pytest.mark.fires("I-EXCLUSIVE")
def test_a_planted_foreign_free_names_the_real_owner(mamba_log: list[str]) -> None:
    i = first(mamba_log, ev="free", pool="kv")
    ev = json.loads(mamba_log[i])
    real = ev["from"]
    ev["from"] = "req#7" if real != "req#7" else "req#6"
    planted = [*mamba_log[:i], json.dumps(ev), *mamba_log[i + 1 :]]
    report = audit_lines(planted)
    assert report.violation_event == i + 1, report.violation
    assert "I-EXCLUSIVE" in report.violation and "(a foreign free)" in report.violation
    slot = ev["ids"][0]
    assert re.search(
        rf"slot {slot}: owner {re.escape(real)}\[[\w.]+\]; the log says {ev['from']} holds it",
        report.violation,
    ), report.violation


@pytest.mark.fires("I-LEDGER-AGREES")
def test_terms_that_disagree_with_the_events_are_named(mamba_log: list[str]) -> None:
    i = first(mamba_log, ev="step")
    ev = json.loads(mamba_log[i])
    kv = ev["terms"]["kv"]
    moved = min(kv["free"], 4)
    kv["free"] -= moved
    kv["cache.evictable"] = kv.get("cache.evictable", 0) + moved  # still sums to the size
    report = audit_lines([*mamba_log[:i], json.dumps(ev), *mamba_log[i + 1 :]])
    assert report.violation_event == i + 1
    assert "I-LEDGER-AGREES: [kv] the engine's terms and the replayed events disagree" in report.violation
