"""The package's import graph: no cycles (TYPE_CHECKING imports included), and the layering rules.

Read with ``ast``, nothing imported: every ``import kvledger...`` / ``from kvledger... import ...`` at any
depth of a module counts (imports inside ``if TYPE_CHECKING:`` too), resolved to the module it names.
Issue 10 removed the two cycles there were (``contracts.owners`` <-> ``contracts.ledger`` and the
scheduler <-> its accounting); this keeps them out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kvledger

ROOT = Path(kvledger.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps.update(resolve(a.name) for a in node.names if a.name.startswith("kvledger"))
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                module = (
                    (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
                )
                if module.startswith("kvledger"):
                    for alias in node.names:
                        full = f"{module}.{alias.name}"
                        deps.add(full if full in modules else resolve(module))
        deps.discard(None)
        deps.discard(name)
        graph[name] = {d for d in deps if d is not None}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_detector_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_spec_and_the_audit_import_no_implementation() -> None:
    graph = _graph()
    offenders = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        if m.startswith(("kvledger.contracts", "kvledger.audit.replay", "kvledger.audit.events"))
        for d in deps
        if d.startswith(("kvledger.reference", "kvledger.sim"))
    )
    assert offenders == []


# The floors of the house, lowest first: a module imports its own room freely and any room on a lower
# floor, never one on its own floor or above. The spec and the data plane know nothing (contracts,
# kernels); the reference is built pools -> caches -> scheduler -> model -> engine -> PD; tools stand on
# it (sim, museum), engines' adapters on the tools, the CLI on top. A new package must be given a floor
# here (the test names it), which is the moment to decide what it may import.
FLOORS: dict[str, int] = {
    "kvledger.contracts": 0,
    "kvledger.kernels": 0,
    "kvledger.process": 0,
    "kvledger.argtypes": 0,  # argparse value types: a leaf every command line may use
    "kvledger.audit": 1,
    "kvledger.campaign": 1,
    "kvledger.reference.config_fields": 1,
    "kvledger.reference.pools": 2,
    "kvledger.reference.radix": 3,
    "kvledger.reference.scheduler": 4,
    "kvledger.reference.model": 5,
    "kvledger.reference.hicache": 5,  # the host tier: a tree component (radix) and a scheduler over it
    "kvledger.reference.engine": 6,
    "kvledger.reference.disagg": 7,
    "kvledger.reference": 7,  # the package's own __init__ (a docstring)
    "kvledger.sim": 8,
    "kvledger.museum": 9,
    "kvledger.engines": 10,
    "kvledger": 11,  # the package's __init__: the public API, over the rooms below
    "kvledger.cli": 12,
    "kvledger.__main__": 13,
}


PACKAGE_INITS = {"kvledger", "kvledger.reference"}
"""Entries that are one ``__init__`` each, not rooms: a new module below them needs its own entry."""


def _room(module: str) -> str | None:
    """The longest FLOORS entry ``module`` is in (itself or a package above it)."""
    name = module
    while name:
        if name in FLOORS and (name == module or name not in PACKAGE_INITS):
            return name
        name = name.rpartition(".")[0]
    return None


def _against_the_floors(graph: dict[str, set[str]]) -> list[str]:
    """Every import that stays on its floor in another room, or runs up a floor."""
    bad = []
    for module, deps in sorted(graph.items()):
        room = _room(module)
        for dep in sorted(deps):
            dep_room = _room(dep)
            if room is None or dep_room is None or dep_room == room:
                continue
            if FLOORS[dep_room] >= FLOORS[room]:
                bad.append(f"{module} (floor {FLOORS[room]}) -> {dep} (floor {FLOORS[dep_room]})")
    return bad


def test_every_module_has_a_floor() -> None:
    assert _room("kvledger.new_room.module") is None and _room("kvledger.reference.new_part") is None
    assert sorted(m for m in _graph() if _room(m) is None) == []


def test_the_floor_check_finds_an_import_up_and_one_across() -> None:
    graph = {
        "kvledger.museum.hunt": {"kvledger.cli.output", "kvledger.museum.exhibit", "kvledger.reference.engine"},
        "kvledger.kernels.reference": {"kvledger.contracts.errors"},
        "kvledger.reference.pools.base": {"kvledger.reference.radix.kv_side"},
    }
    assert _against_the_floors(graph) == [
        "kvledger.kernels.reference (floor 0) -> kvledger.contracts.errors (floor 0)",
        "kvledger.museum.hunt (floor 9) -> kvledger.cli.output (floor 12)",
        "kvledger.reference.pools.base (floor 2) -> kvledger.reference.radix.kv_side (floor 3)",
    ]


def test_no_import_runs_up_the_floors_or_across_a_floor() -> None:
    assert _against_the_floors(_graph()) == []
