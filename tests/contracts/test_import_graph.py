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
