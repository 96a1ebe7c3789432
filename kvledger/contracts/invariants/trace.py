"""The traceability check: registry, code, tests and spec agree about every invariant ID.

It fails on
* an ID defined twice in the registry;
* an invariant without a check that raises (a check of kind other than ``proof``), or a check or
  ``exercised_by`` location that does not resolve (the file is missing or does not define the symbol);
* an invariant without a test that makes it fire: a test carrying ``@pytest.mark.fires("I-...")``
  that runs in the default suite (not marked ``deep`` or ``gpu``). The conftest verifies during the run
  that such a test really saw a ContractViolation or KVLedgerError naming the ID;
* an ID written anywhere in the code, tests, scripts, benchmarks, spec or README that the registry does
  not know, or a ``fires`` marker naming one;
* a ``proof`` check that ``proofs.PROOFS`` does not list, or a proof target that does not resolve;
* a committed ``spec/invariants.md`` that differs from what ``render`` generates;
* a contract in ``kvledger/`` whose message names no invariant ID (an icontract condition without an ID
  in its description, a ``ContractViolation`` without one in its text), beyond the per-file allowance of
  ``unnamed.KNOWN_UNNAMED`` (see ``unnamed.py``).

Everything is read with ``ast`` and plain text: nothing under ``kvledger/reference`` or ``tests`` is
imported, so the check is fast and keeps ``contracts/`` independent of the implementation.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvledger.contracts.errors import INVARIANT_ID
from kvledger.contracts.invariants.model import CheckKind, Invariant
from kvledger.contracts.invariants.proofs import Proof
from kvledger.contracts.invariants.unnamed import unnamed_problems

SCANNED_DIRS = ("kvledger", "tests", "scripts", "benchmarks", "spec", "docs")
SCANNED_FILES = ("README.md",)
SCANNED_SUFFIXES = (".py", ".md", ".sh", ".toml", ".txt", ".yml", ".yaml")
NOT_DEFAULT_RUN = frozenset({"deep", "gpu"})  # tests under these markers do not run in CI's default suite
SPEC_PATH = "spec/invariants.md"


# ---------------------------------------------------------------------- locations
@functools.cache
def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _defined_in(body: list[ast.stmt], name: str) -> ast.AST | None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
    return None


def resolve(location: str, root: Path) -> str | None:
    """None if ``"path.py:A.b"`` names a file under ``root`` that defines ``A`` (and ``A.b``); else why not."""
    path_text, _, symbol = location.partition(":")
    path = root / path_text
    if not path.is_file():
        return f"{location}: no file {path_text}"
    if not symbol:
        return None
    tree = _parse(path)
    if tree is None:
        return f"{location}: {path_text} does not parse"
    body: list[ast.stmt] = tree.body
    for part in symbol.split("."):
        node = _defined_in(body, part)
        if node is None:
            return f"{location}: {path_text} defines no {symbol}"
        body = node.body if isinstance(node, (ast.ClassDef, ast.FunctionDef)) else []
    return None


# ---------------------------------------------------------------------- fires markers
@dataclass(frozen=True)
class FiringTest:
    """A test (function, method or class) whose decorators carry ``pytest.mark.fires``."""

    path: str
    name: str
    ids: tuple[str, ...]
    marks: frozenset[str]  # other marker names on the test and its module
    some_parameters: bool  # the marker sits on ``pytest.param(...)``: only those parameters fire

    @property
    def node(self) -> str:
        return f"{self.path}::{self.name}"

    @property
    def default_run(self) -> bool:
        return not (self.marks & NOT_DEFAULT_RUN)


def _mark_name(expr: ast.expr) -> str | None:
    """``pytest.mark.X`` / ``mark.X`` (called or not) -> ``X``."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Attribute):
        base = expr.value
        if (isinstance(base, ast.Attribute) and base.attr == "mark") or (
            isinstance(base, ast.Name) and base.id == "mark"
        ):
            return expr.attr
    return None


def _fires_in(expr: ast.expr) -> tuple[list[str], bool]:
    """The IDs of every ``mark.fires(...)`` inside ``expr``, and whether one sits in ``pytest.param``."""
    ids: list[str] = []
    in_param = False
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and _mark_name(node) == "fires":
            ids += [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "param":
            in_param = in_param or any(
                isinstance(n, ast.Call) and _mark_name(n) == "fires" for n in ast.walk(node)
            )
    return ids, in_param


def _module_marks(tree: ast.Module) -> tuple[list[str], set[str]]:
    ids: list[str] = []
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            for v in values:
                if (name := _mark_name(v)) is not None:
                    names.add(name)
                ids += _fires_in(v)[0]
    return ids, names


def _scan_test_file(path: Path, rel: str) -> Iterator[FiringTest]:
    tree = _parse(path)
    if tree is None:
        return
    module_ids, module_marks = _module_marks(tree)

    def visit(node: ast.AST, prefix: str, inherited: list[str], marks: set[str]) -> Iterator[FiringTest]:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        is_test = node.name.startswith("test") or (
            isinstance(node, ast.ClassDef) and node.name.startswith("Test")
        )
        ids = list(inherited)
        own_marks = set(marks)
        some = False
        for dec in node.decorator_list:
            found, in_param = _fires_in(dec)
            ids += found
            some = some or in_param
            if (name := _mark_name(dec)) is not None and name != "fires":
                own_marks.add(name)
        name = f"{prefix}{node.name}"
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                yield from visit(child, f"{name}::", ids, own_marks)
            return
        if is_test and ids:
            yield FiringTest(rel, name, tuple(dict.fromkeys(ids)), frozenset(own_marks), some)

    for node in tree.body:
        yield from visit(node, "", module_ids, module_marks)


def scan_fires(root: Path) -> list[FiringTest]:
    """Every test under ``root/tests`` that declares ``fires``, in path order."""
    out: list[FiringTest] = []
    tests = root / "tests"
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        out += _scan_test_file(path, rel)
    return out


def fired_by(root: Path) -> dict[str, list[FiringTest]]:
    """ID -> the default-run tests that declare they make it fire."""
    out: dict[str, list[FiringTest]] = {}
    for test in scan_fires(root):
        if test.default_run:
            for i in test.ids:
                out.setdefault(i, []).append(test)
    return out


# ---------------------------------------------------------------------- IDs used anywhere
def _scanned_files(root: Path) -> Iterator[Path]:
    for d in SCANNED_DIRS:
        base = root / d
        if base.is_dir():
            for path in sorted(base.rglob("*")):
                if path.is_file() and path.suffix in SCANNED_SUFFIXES and "__pycache__" not in path.parts:
                    yield path
    for f in SCANNED_FILES:
        if (root / f).is_file():
            yield root / f


def ids_used(root: Path) -> dict[str, list[str]]:
    """ID -> ``"path:line"`` of every place it is written."""
    out: dict[str, list[str]] = {}
    for path in _scanned_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        rel = path.relative_to(root).as_posix()
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in INVARIANT_ID.finditer(line):
                out.setdefault(m.group(0), []).append(f"{rel}:{lineno}")
    return out


# ---------------------------------------------------------------------- the check
@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    invariants: int = 0
    checks: int = 0
    firing_tests: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        status = "PASS" if self.ok else f"FAIL ({len(self.problems)} problem(s))"
        return (
            f"invariant traceability: {status}: {self.invariants} invariants, {self.checks} check locations,"
            f" {self.firing_tests} tests that make them fire"
        )


def check(
    root: Path,
    invariants: list[Invariant],
    proofs: tuple[Proof, ...],
    rendered_spec: str | None = None,
) -> Report:
    """Every rule of the module docstring. ``rendered_spec``: what ``spec/invariants.md`` must contain."""
    report = Report(invariants=len(invariants))
    problems = report.problems
    seen: dict[str, Invariant] = {}
    for inv in invariants:
        if inv.id in seen:
            problems.append(f"{inv.id}: defined twice ({seen[inv.id].title!r} and {inv.title!r})")
        seen[inv.id] = inv
    known = set(seen)
    proof_locations = {f"{p.path}:{p.function}" for p in proofs}

    for inv in invariants:
        if not any(c.kind is not CheckKind.PROOF for c in inv.checks):
            problems.append(f"{inv.id}: no check that raises (only proofs or nothing)")
        for c in inv.checks:
            report.checks += 1
            if (why := resolve(c.location, root)) is not None:
                problems.append(f"{inv.id}: check {why}")
            if c.kind is CheckKind.PROOF and c.location not in proof_locations:
                problems.append(
                    f"{inv.id}: {c.location} is called a proof but proofs.PROOFS does not list it"
                )
        for loc in inv.exercised_by:
            if (why := resolve(loc, root)) is not None:
                problems.append(f"{inv.id}: exercised_by {why}")

    firing = fired_by(root)
    report.firing_tests = len({t.node for tests in firing.values() for t in tests})
    for inv in invariants:
        if inv.id not in firing:
            problems.append(
                f"{inv.id}: no test makes it fire (mark one with @pytest.mark.fires({inv.id!r}),"
                " outside the deep/gpu markers)"
            )
    for test in scan_fires(root):
        for i in test.ids:
            if i not in known:
                problems.append(f"{test.node}: fires {i}, which the registry does not know")

    for proof_entry in proofs:
        if (why := resolve(f"{proof_entry.path}:{proof_entry.function}", root)) is not None:
            problems.append(f"proof {proof_entry.target}: {why}")
        for i in proof_entry.invariants:
            if i not in known:
                problems.append(f"proof {proof_entry.target}: supports {i}, which the registry does not know")

    for i, places in sorted(ids_used(root).items()):
        if i not in known:
            shown = ", ".join(places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3 else "")
            problems.append(f"{i}: used in {shown} but not registered")

    problems += unnamed_problems(root)

    if rendered_spec is not None:
        spec = root / SPEC_PATH
        current = spec.read_text(encoding="utf-8") if spec.is_file() else None
        if current != rendered_spec:
            problems.append(
                f"{SPEC_PATH} is not up to date with the registry:"
                " run `python -m kvledger.contracts.invariants render` and commit it"
            )
    return report
