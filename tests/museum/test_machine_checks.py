"""Every check a hunt machine makes names a registered invariant (issue 25, item 3).

The cache machine's own checks compare the caches with an abstract model. Here the model (or what the
machine is told) is made inconsistent on purpose, and the check that catches it must raise a
``ContractViolation`` whose ID ``kvledger hunt`` reports (``hunt.invariant_of``) and the registry knows.
A static test keeps plain ``assert`` out of the machines (a failing one would reach the hunt as an
unnamed ``AssertionError``); only type-narrowing ``assert x is not None`` stays.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvledger.contracts.errors import INVARIANT_ID, ContractViolation
from kvledger.contracts.invariants import by_id
from kvledger.museum.hunt import invariant_of
from kvledger.museum.machines import pd as pd_machine
from kvledger.museum.machines.cache import CacheMachine
from kvledger.museum.machines.cache_model import CacheModel
from kvledger.museum.machines.cache_support import new_owner, nodes_of, write_tag
from kvledger.museum.machines.checks import model_check, violation
from kvledger.museum.machines.scheduler import SchedulerMachine

MACHINES_DIR = Path(__file__).resolve().parents[2] / "kvledger" / "museum" / "machines"
KINDS = {kind: i for i, kind in enumerate(CacheMachine.KINDS)}
KEY = ([1, 2], None, 0)  # two fresh pages


def machine(kind: str) -> CacheMachine:
    """A cache machine set up outside Hypothesis (its rules are plain methods), page size 1."""
    m = CacheMachine()
    m.setup(kind=KINDS[kind], page=0, pool_pages=8, mamba_slots=4)
    return m


def reported(call: Callable[[], Any]) -> str:
    """The ID the hunt would report for the violation ``call`` raises; it must be registered."""
    with pytest.raises(ContractViolation) as caught:
        call()
    found = invariant_of(caught.value)
    assert found in by_id(), f"{found} ({caught.value}) is not a registered invariant"
    return found


# ---------------------------------------------------------------------- the model's own checks
@pytest.mark.fires("I-MODEL-SHRINK", "I-EVICT-LOCKED")
def test_the_model_refuses_anything_but_removal() -> None:
    model = CacheModel(1, pages={(1,): [5], (1, 2): [6]}, states={(1,): 7})
    assert reported(lambda: model.check_shrink({(3,): [9]}, {}, [])) == "I-MODEL-SHRINK"  # appeared
    assert reported(lambda: model.check_shrink({(1,): [8]}, {}, [])) == "I-MODEL-SHRINK"  # ids changed
    assert reported(lambda: model.check_shrink({(1,): [5]}, {(1,): 8}, [])) == "I-MODEL-SHRINK"  # state
    assert reported(lambda: model.check_shrink({(1,): [5]}, {}, [((1, 2), False)])) == "I-EVICT-LOCKED"
    assert reported(lambda: model.check_shrink({(1,): [5]}, {}, [((1,), True)])) == "I-EVICT-LOCKED"
    model.check_shrink({(1,): [5]}, {}, [((1,), False)])  # a lawful eviction passes


# ---------------------------------------------------------------------- the machine against a perturbed model
@pytest.mark.parametrize("kind", ["plain", "mamba"])
@pytest.mark.fires("I-MODEL-TREE")
def test_a_tree_that_differs_from_the_model_is_named(kind: str) -> None:
    m = machine(kind)
    m.serve(KEY, cow=False)
    m.refines_the_model()  # consistent so far
    m.model.pages.pop(max(m.model.pages, key=len))
    assert reported(m.refines_the_model) == "I-MODEL-TREE"


@pytest.mark.fires("I-MODEL-TREE")
def test_a_state_that_differs_from_the_model_is_named() -> None:
    m = machine("mamba")
    m.serve(KEY, cow=False)
    path = next(iter(m.model.states))
    m.model.states[path] += 1
    assert reported(m.refines_the_model) == "I-MODEL-TREE"


@pytest.mark.fires("I-MODEL-MATCH")
def test_a_match_longer_than_the_model_is_named() -> None:
    m = machine("plain")
    m.serve(KEY, cow=False)
    m.model.pages.clear()  # the model believes nothing is cached
    assert reported(lambda: m.match_only(([], 0, 5), tail=0)) == "I-MODEL-MATCH"


@pytest.mark.fires("I-MODEL-INSERT")
def test_an_insert_that_finds_more_duplicates_than_the_model_is_named() -> None:
    m = machine("plain")
    m.serve(KEY, cow=False)
    m.model.pages.clear()
    assert reported(lambda: m.insert_unmatched(([], 0, 5))) == "I-MODEL-INSERT"


@pytest.mark.fires("I-MODEL-EVICT")
def test_an_eviction_that_reports_less_than_left_is_named() -> None:
    m = machine("plain")
    m.serve(KEY, cow=False)
    m.model.pages[(99,)] = [0]  # the model counts a page the tree never had: it "left" on the next evict
    assert reported(lambda: m.evict(0)) == "I-MODEL-EVICT"


@pytest.mark.fires("I-COPY")
def test_a_copy_on_write_of_the_wrong_state_is_named() -> None:
    m = machine("mamba")
    m.serve(KEY, cow=False)
    match = m.cache.match_prefix

    def copies_garbage(key: Any, **kw: Any) -> Any:  # a copy-on-write that lands the wrong contents
        found = match(key, **kw)
        if found.cow_slot is not None:
            write_tag(m.pool, found.cow_slot, 10_000)
        return found

    m.cache.match_prefix = copies_garbage
    assert reported(lambda: m.admit(([], 0, 5), cow=True)) == "I-COPY"


@pytest.mark.fires("I-MODEL-COW")
def test_a_copy_on_write_nobody_asked_for_is_named() -> None:
    m = machine("mamba")
    m.serve(KEY, cow=False)
    match = m.cache.match_prefix
    intruder = new_owner()  # any owner: the machine never uses the slot
    m.cache.match_prefix = lambda key, **_: match(key, cow_owner=intruder)
    assert reported(lambda: m.admit(([], 0, 5), cow=False)) == "I-MODEL-COW"


@pytest.mark.fires("I-IDLE-IDENTITY")
def test_a_lock_left_at_teardown_is_named() -> None:
    m = machine("plain")
    m.serve(KEY, cow=False)
    m.admit(([], 0, 5), cow=False)  # matches KEY: its lock sits on a cached node
    m.cache.inc_lock_ref(m.reqs[0].lock.node)  # a lock nobody will release
    assert reported(m.teardown) == "I-IDLE-IDENTITY"


@pytest.mark.fires("I-COUNT")
def test_kv_the_machine_lost_track_of_is_named() -> None:
    m = machine("plain")
    m.admit(KEY, cow=False)
    m.reqs.clear()  # the request's own ids are now held by nobody the machine knows
    assert reported(m.refines_the_model) == "I-COUNT"


# ---------------------------------------------------------------------- the helper
def test_a_check_names_its_id_first_and_keeps_the_evidence() -> None:
    model_check(True, "I-COUNT", lambda: pytest.fail("a passing check formats no message"))
    with pytest.raises(ContractViolation, match=r"^I-COUNT: 3 != 4$"):
        model_check(1 + 2 == 4, "I-COUNT", lambda: "3 != 4")
    with pytest.raises(ValueError, match="not an invariant ID"):
        violation("count", "no ID")


# ---------------------------------------------------------------------- static: no unnamed check left
def _type_narrowing(node: ast.Assert) -> bool:
    """``assert x is not None`` (and ``x.y``): it tells mypy something, it checks nothing the model says."""
    test = node.test
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, (ast.Name, ast.Attribute))
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.IsNot)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    )


def test_the_machines_make_no_plain_assert() -> None:
    files = sorted(MACHINES_DIR.glob("*.py"))
    assert files
    plain = [
        f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}"
        for path in files
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if (isinstance(node, ast.Assert) and not _type_narrowing(node))
        or (isinstance(node, ast.Raise) and "AssertionError" in ast.unparse(node))
    ]
    assert not plain, "checks that would reach the hunt without an invariant ID:\n" + "\n".join(plain)


def test_every_violation_a_machine_raises_names_a_registered_id() -> None:
    """Each ``ContractViolation(...)``, ``violation(...)`` or ``model_check(...)`` in the machines writes
    an ID the registry knows, as a literal (the hunt reports the first ID of the message)."""
    known = by_id()
    unnamed: list[str] = []
    for path in sorted(MACHINES_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name not in ("ContractViolation", "violation", "model_check"):
                continue
            literal = [
                n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
            first = INVARIANT_ID.search(" ".join(literal))
            if path.name != "checks.py" and (first is None or first.group(0) not in known):
                unnamed.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not unnamed, "violations without a registered ID:\n" + "\n".join(unnamed)


# ---------------------------------------------------------------------- the scheduler and PD machines
# Their checks were written as ``ContractViolation("I-...")`` from the start (the static test above keeps
# it so); here each machine runs against a wrong oracle, and what the hunt would report is a registered ID.
FEW = settings(
    max_examples=10,
    stateful_step_count=8,
    phases=[Phase.generate],
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def wrong_output(*_: Any) -> list[int]:
    return [-1]  # no model generates a negative token id


@pytest.mark.fires("I-OUTPUT-ORACLE")
def test_the_scheduler_machine_names_what_it_finds() -> None:
    class WrongOracle(SchedulerMachine):
        def expected(self, prompt: list[int], max_new_tokens: int) -> list[int]:
            return wrong_output()

    assert reported(lambda: run_state_machine_as_test(WrongOracle, settings=FEW)) == "I-OUTPUT-ORACLE"


@pytest.mark.fires("I-OUTPUT-ORACLE")
def test_the_pd_machine_names_what_it_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pd_machine, "expected", wrong_output)
    assert reported(lambda: run_state_machine_as_test(pd_machine.PDMachine, settings=FEW)) == "I-OUTPUT-ORACLE"


# ---------------------------------------------------------------------- I-UNLOCK-PATH (issue 25, item 2)
@pytest.mark.parametrize("kind", ["plain", "mamba"])
@pytest.mark.fires("I-UNLOCK-PATH")
def test_a_release_that_misses_part_of_the_locked_path_is_named(kind: str) -> None:
    """The lock's node is unlocked (its own postcondition holds) but not the nodes above it."""
    m = machine(kind)
    m.serve(KEY, cow=False)  # one node (1, 2)
    m.serve(([0], 0, 1), cow=False)  # (1, 0): splits it into (1) -> (2) and (1) -> (0)
    m.admit(([], 0, 2), cow=False)  # matches (1, 2): the lock takes (2) and (1)
    req = m.reqs[0]
    assert len(req.lock_path) == 2 and req.lock.node.parent is not m.cache.root
    m.cache._unlock_path = lambda node: setattr(node, "lock_ref", node.lock_ref - 1)
    assert reported(lambda: m.finish(0, 0)) == "I-UNLOCK-PATH"


def test_a_release_after_a_split_of_the_locked_path_passes() -> None:
    """A node split off the locked path after the lock carries it, and the release takes it off too."""
    m = machine("plain")
    m.serve(KEY, cow=False)
    m.admit(([], 0, 2), cow=False)  # locks the single node (1, 2)
    m.serve(([0], 0, 1), cow=False)  # splits it: (1) now carries the lock as well
    assert m.cache.root.children and next(iter(m.cache.root.children.values())).lock_ref == 1
    m.finish(0, 0)
    assert all(node.lock_ref == 0 for node in nodes_of(m.cache))


@pytest.mark.fires("I-UNLOCK-PATH")
def test_a_release_that_takes_a_state_lock_off_another_node_is_named() -> None:
    """The Mamba tree: the lock's own node is released as recorded (its postcondition holds), but the
    release also takes a state lock off a node above it, which only the machine's path check sees."""
    m = machine("mamba")
    m.serve(KEY, cow=False)  # one node (1, 2) with a state
    m.serve(([0], 0, 1), cow=False)  # (1, 0): splits it into (1) -> (2) and (1) -> (0)
    m.admit(([], 0, 2), cow=False)  # matches (1, 2): the lock takes (2) and (1), and the state of (2)
    req = m.reqs[0]
    assert req.lock.took_mamba
    above = req.lock.node.parent
    unlock = m.cache._unlock_path

    def unlock_and_more(node: Any) -> None:
        unlock(node)
        above.mamba_lock_ref -= 1

    m.cache._unlock_path = unlock_and_more
    assert reported(lambda: m.finish(0, 0)) == "I-UNLOCK-PATH"
