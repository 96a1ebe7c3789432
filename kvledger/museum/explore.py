"""``kvledger explore``: every schedule up to depth ``k`` on a tiny scope, breadth first, with state hashing.

A *scope* is one tiny engine (8 KV tokens, 2 Mamba slots, 2 rows, 3 requests with shared prefixes) and
the alphabet of actions: the next request arrives, one scheduler step, abort request ``r`` (any of
those that arrived, ended ones included), one forced retraction, the next allocation of a kind fails.
Each schedule is replayed from a fresh engine through the generic scheduler machine's own rules, so the
checks are the machine's: after every action its invariant (identities, ledger, audits, handles,
in-flight rows, prediction == commitment); at every new state, the drain to quiescence with the checks
after every step, the idle identity, liveness and the output oracle. A state is identified by an
abstraction of the engine (requests' states and lengths, queues, in-flight batches, free counts, the
tree's keys and locks, pending faults) that leaves out slot numbers: two schedules that differ only in
which ids they got are explored once. A clean scope at depth ``k`` is a bounded proof: no schedule of
at most ``k`` actions from this alphabet, on this engine, breaks any of those checks (up to the
abstraction).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvledger.museum.machines.scheduler import SchedulerMachine
from kvledger.reference.engine import EngineSpec

PROMPTS = ([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6])
MAX_NEW = 2
FAULTS = ("kv", "mamba", "row")

Action = tuple[str, int]  # ("arrive", 0) | ("step", 1) | ("abort", rid) | ("retract", 0) | ("fail", i)


@dataclass(frozen=True)
class Scope:
    name: str
    spec: EngineSpec

    def describe(self) -> str:
        s = self.spec
        return (
            f"{self.name}: page {s.page_size}, tree {s.tree}{' (hybrid)' if s.hybrid else ''}, {s.kv_tokens} KV tokens,"
            f" {s.mamba_slots if s.hybrid else 0} Mamba slots, {s.rows} rows, chunk {s.chunk},"
            f" overlap {s.overlap}, {len(PROMPTS)} requests x {MAX_NEW} new tokens"
        )


def _spec(**kw: Any) -> EngineSpec:
    base: dict[str, Any] = dict(
        kv_tokens=8, rows=2, mamba_slots=2, max_running=2, chunk=2, max_prefill=8, max_context_len=16,
        mamba_strategy="no_buffer",  # the scopes explore Mamba V1 (EngineSpec's default is V2)
    )
    base.update(kw)
    return EngineSpec(**base)


SCOPES = (
    Scope("p1-mamba", _spec(page_size=1, tree="mamba_radix", overlap=False)),
    Scope("p1-mamba-overlap", _spec(page_size=1, tree="mamba_radix", overlap=True)),
    Scope("p2-radix-overlap", _spec(page_size=2, tree="radix", hybrid=False, overlap=True)),
    Scope("p2-none-hybrid", _spec(page_size=2, tree="none", hybrid=True, chunk=None, overlap=False)),
)


@dataclass
class ExploreResult:
    scope: str
    depth: int  # the bound
    depth_reached: int  # the deepest level that had a new state
    states: int  # distinct abstract states
    schedules: int  # schedules replayed
    seconds: float
    violation: str | None = None
    invariant: str | None = None
    path: list[Action] = field(default_factory=list)
    complete: bool = True  # False: stopped by max_states before the bound


def _actions(machine: SchedulerMachine, arrived: int) -> Iterator[Action]:
    if arrived < len(PROMPTS):
        yield ("arrive", arrived)
    yield ("step", 1)
    for rid in sorted(machine.sched.requests):
        yield ("abort", rid)
    if machine.sched.running:
        yield ("retract", 0)
    for i in range(len(FAULTS)):
        yield ("fail", i)


def _apply(machine: SchedulerMachine, action: Action) -> None:
    kind, arg = action
    if kind == "arrive":
        machine.next_rid = arg
        machine.arrive(family=0, suffix=PROMPTS[arg], max_new=MAX_NEW)
    elif kind == "step":
        machine.step(n=1)
    elif kind == "abort":
        machine.abort_request(machine.sched.requests[arg])
    elif kind == "retract":
        machine.force_retract()
    else:
        machine.inject_allocation_failure(kind=FAULTS[arg])
    machine.identities_hold()


def _replay(scope: Scope, path: list[Action]) -> SchedulerMachine:
    machine = SchedulerMachine()
    machine.init(setup=scope.spec, faults=list(FAULTS))
    machine.identities_hold()
    for action in path:
        _apply(machine, action)
    return machine


def abstract_state(machine: SchedulerMachine) -> tuple[Any, ...]:
    """The engine's state without slot numbers (see the module docstring)."""
    s = machine.sched
    reqs = tuple(
        (
            r.rid,
            r.state.value,
            r.owner.account.name,
            r.kv_allocated_len,
            r.kv_committed_len,
            r.cache_protected_len,
            len(r.output_ids),
            r.req_pool_idx is None,
            r.mamba_pool_idx is None,
            r.lock is not None,
            r.released,
            r.abort_requested,
        )
        for r in sorted(s.requests.values(), key=lambda r: r.rid)
    )
    queues = (
        tuple(r.rid for r in s.waiting),
        tuple(r.rid for r in s.running),
        None if s.chunked_req is None else s.chunked_req.rid,
        tuple((b.is_decode, tuple(r.rid for r in b.reqs)) for b in s.inflight),
        None if s.last_prefill is None else tuple(r.rid for r in s.last_prefill.reqs),
    )
    pools = tuple(pool.available_size() for pool in s.accounting.pools())
    tree = () if s.tree is None else tuple(sorted(_tree_nodes(s.tree)))
    return (reqs, queues, pools, tree, tuple(sorted(s.faults.pending.items())), s.stats.retractions > 0)


def _tree_nodes(tree: Any) -> Iterator[tuple[Any, ...]]:
    stack = [(tree.root, ())]
    while stack:
        node, prefix = stack.pop()
        for child in node.children.values():
            key = prefix + tuple(child.key)
            yield (key, child.lock_ref, getattr(child, "mamba_value", None) is not None)
            stack.append((child, key))


def explore(
    scope: Scope,
    depth: int,
    *,
    max_states: int = 20_000,
    on_level: Callable[[int, int], None] = lambda level, states: None,
) -> ExploreResult:
    """Breadth first over schedules of at most ``depth`` actions; stops at the first violation."""
    start = time.monotonic()
    result = ExploreResult(scope.name, depth, 0, 0, 0, 0.0)
    seen: set[tuple[Any, ...]] = set()
    frontier: deque[tuple[list[Action], int]] = deque([([], 0)])
    try:
        root = _replay(scope, [])
        seen.add(abstract_state(root))
        _drain(root)
    except Exception as exc:
        return _violation(result, [], exc, start)
    result.states = 1
    level = 0
    while frontier:
        path, arrived = frontier.popleft()
        if len(path) >= depth:
            continue
        if len(path) > level:
            level = len(path)
            on_level(level, result.states)
        parent = _replay(scope, path)
        for action in list(_actions(parent, arrived)):
            child_path = [*path, action]
            result.schedules += 1
            try:
                machine = _replay(scope, child_path)
                state = abstract_state(machine)
                if state in seen:
                    continue
                seen.add(state)
                result.states += 1
                result.depth_reached = len(child_path)
                _drain(machine)
            except Exception as exc:
                return _violation(result, child_path, exc, start)
            if result.states >= max_states:
                result.complete = False
                result.seconds = time.monotonic() - start
                return result
            frontier.append((child_path, arrived + (action[0] == "arrive")))
    result.seconds = time.monotonic() - start
    return result


def _drain(machine: SchedulerMachine) -> None:
    """The machine's teardown: drain under the checks, idle identity, liveness, oracle."""
    machine.teardown()


def _violation(result: ExploreResult, path: list[Action], exc: BaseException, start: float) -> ExploreResult:
    from kvledger.museum.hunt import invariant_of

    result.violation = str(exc).split("\n")[0][:300]
    result.invariant = invariant_of(exc)
    result.path = path
    result.seconds = time.monotonic() - start
    return result
