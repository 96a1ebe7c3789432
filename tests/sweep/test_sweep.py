"""The bad-input sweep: every public member of the pools, caches, scheduler and engine builder, each class
of bad input, a typed error and nothing changed (``tests/sweep/``; ``scripts/bad_input_sweep.py`` prints
the counts). CI runs this module at more than one checking level (the main run at ``full``, and its own
process at each other level, see ``scripts/test.sh``): nothing is forced on, and every row the level
claims (``claimed``: all of them from ``owners`` up, the rows that need no owner at ``release``) must be
refused, typed, with nothing changed.

* ``test_bad_call``: one row of the table. It must raise a ``KVLedgerError`` (of the class the row names),
  leave the full snapshot of every object the scene holds unchanged, and leave the pools and caches
  passing their audits. Returning normally is the "accepted although bad" failure.
* ``test_no_argument_member``: a member that takes no argument and is allowed in every state succeeds on
  its busy scene and changes nothing observable (reads validate like writes: they must not write).
* ``test_every_public_member_has_a_row``: the surface, found by introspection, against the table.
"""

from __future__ import annotations

import pytest

from kvledger.contracts.switch import LEVEL
from tests.sweep import snapshot
from tests.sweep.cases import CASES, NO_BAD_CALL, NOT_ENTRY_POINTS, QUERIES
from tests.sweep.scenes import SCENES, Scene
from tests.sweep.table import (
    CATEGORIES,
    Case,
    Query,
    build_scene,
    claimed,
    public_members,
    run_case,
    run_query,
    takes_arguments,
)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_call(case: Case) -> None:
    if not claimed(case):
        pytest.skip(f"the level {LEVEL.label} does not know who holds an id (README: checking levels)")
    outcome = run_case(case)
    assert outcome.raised is not None, f"accepted although bad: {outcome.describe()}"
    assert outcome.kind == "typed", f"untyped error: {outcome.describe()}"
    assert not outcome.changed, f"state changed: {outcome.describe()}"
    assert outcome.audit_error is None, f"audit failed after the refusal: {outcome.describe()}"
    assert outcome.expected_class, f"expected {case.error}: {outcome.describe()}"


@pytest.mark.parametrize("query", QUERIES, ids=[q.member for q in QUERIES])
def test_no_argument_member(query: Query) -> None:
    raised, changed = run_query(query)
    assert raised is None, f"{query.member} failed on a busy scene: {raised!r}"
    assert not changed, f"{query.member} ({query.reason}) changed {changed}"


def test_every_public_member_has_a_row() -> None:
    rows = {c.member for c in CASES} | {q.member for q in QUERIES} | set(NO_BAD_CALL)
    members = public_members()
    exempt = set(NOT_ENTRY_POINTS)
    assert not exempt & rows, f"members both swept and exempt: {sorted(exempt & rows)}"
    rows |= exempt
    missing = [m for m in members if m not in rows]
    assert not missing, f"public members with no row in the sweep: {missing}"
    stale = sorted(rows - set(members))
    assert not stale, f"rows for members that are not public (renamed or removed?): {stale}"
    with_args = {c.member for c in CASES}
    untried = [m for m in members if takes_arguments(m) and m not in with_args and m not in exempt]
    assert not untried, f"members with arguments and no bad call: {untried}"
    argless = [m for m in NO_BAD_CALL if takes_arguments(m)]
    assert not argless, f"members that take arguments cannot be exempt from bad calls: {argless}"


def test_rows_are_well_formed() -> None:
    assert {c.category for c in CASES} <= set(CATEGORIES)
    assert {c.scene for c in CASES} | {q.scene for q in QUERIES} <= set(SCENES)
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "two rows share a label"


@pytest.mark.parametrize("name", sorted(SCENES))
def test_snapshot_sees_a_change(name: str) -> None:
    """Guard for the whole sweep: the snapshot of every scene notices a legitimate change."""
    scene = build_scene(name)
    if not scene.roots:
        pytest.skip("a constructor scene holds nothing")
    before = snapshot.take(*scene.roots)
    _change(scene)
    assert snapshot.differences(before, snapshot.take(*scene.roots))


def _change(scene: Scene) -> None:
    if hasattr(scene, "system"):
        scene.system.step()
    elif hasattr(scene, "sched"):
        scene.sched.step()
    elif hasattr(scene, "cache"):
        scene.cache.inc_lock_ref(scene.a_node)
    elif hasattr(scene, "kv"):
        scene.pool.zero_slots([1])
    elif isinstance(scene.a_ids[0], int) and not hasattr(scene, "unit"):  # the metadata pool: one slot
        scene.pool.free(scene.a_ids[0], scene.a)
    else:
        scene.pool.free(scene.a_ids[:1], scene.a)


@pytest.mark.fires("I-CALL-STATE")
def test_retracting_a_waiting_request_is_refused_and_changes_nothing() -> None:
    from kvledger.contracts.errors import InvalidState

    scene = build_scene("sched")
    before = snapshot.take(*scene.roots)
    with pytest.raises(InvalidState, match="I-CALL-STATE"):
        scene.sched.retract(scene.waiting)
    assert not snapshot.differences(before, snapshot.take(*scene.roots))


@pytest.mark.fires("I-RESULTS-ONCE")
def test_a_processed_batch_is_not_processed_again() -> None:
    from kvledger.contracts.errors import BatchNotInFlight

    scene = build_scene("sched_overlap")
    before = snapshot.take(*scene.roots)
    with pytest.raises(BatchNotInFlight, match="I-RESULTS-ONCE"):
        scene.sched.process_batch_result(scene.processed[-1])
    assert not snapshot.differences(before, snapshot.take(*scene.roots))
