"""Contracts that name no invariant: found by reading the code, tolerated only where listed (issue 25).

A failure the hunt, the simulator or a test reports is named by the first invariant ID in its message
(``kvledger.museum.hunt.invariant_of``); a contract whose message names none surfaces as a bare
``ContractViolation``. The rule, checkable by reading ``kvledger/`` with ``ast``:

* **icontract conditions**: every ``@require``, ``@ensure`` or ``@invariant`` decorator given a condition
  has a description (its second argument, or ``description=``) whose text names an ID. Hypothesis's
  ``@invariant()`` takes no condition and is not a contract.
* **explicit violations**: every ``ContractViolation(...)`` (or ``IdentityFailure(...)``) call has an ID
  in the literal text of its message (an f-string's or a helper's literal parts count). A message built
  elsewhere and passed in (``ContractViolation(message)``, ``f"{inv}: ..."``) cannot be read here and
  counts as unnamed: its builder is the place to list.

``KNOWN_UNNAMED`` is the debt: per file, how many unnamed contracts it may still have and why. The
traceability check fails on a file with more than its allowance (so a new contract without an ID fails
at once) and names every unnamed contract of that file. Lower an allowance when its file is fixed; a
file fixed to zero leaves the list.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvledger.contracts.errors import INVARIANT_ID

SCANNED = "kvledger"
CONDITIONS = frozenset({"require", "ensure", "invariant"})
VIOLATIONS = frozenset({"ContractViolation", "IdentityFailure"})

_PROOF_SPECS = "CrossHair proof specs (proofs.PROOFS names the invariants each proof supports)"
_BUILT_ELSEWHERE = "the message is built from an ID passed in, which cannot be read statically"
KNOWN_UNNAMED: dict[str, tuple[int, str]] = {
    "kvledger/audit/replay.py": (1, _BUILT_ELSEWHERE),
    "kvledger/contracts/arith.py": (32, _PROOF_SPECS),
    "kvledger/contracts/identity.py": (2, "conditions without a description"),
    "kvledger/contracts/ledger.py": (10, "ledger self-checks: messages name the pool and the slots, no ID"),
    "kvledger/contracts/mamba_track.py": (26, _PROOF_SPECS),
    "kvledger/contracts/sizing.py": (14, _PROOF_SPECS),
    "kvledger/contracts/tree_checks.py": (2, _BUILT_ELSEWHERE),
    "kvledger/museum/machines/checks.py": (1, _BUILT_ELSEWHERE + " (checked: violation() rejects a non-ID)"),
    "kvledger/reference/disagg/channel.py": (2, "PD channel checks without an ID"),
    "kvledger/reference/disagg/decode.py": (1, "a configuration check without an ID"),
    "kvledger/reference/disagg/instance.py": (2, "PD queue checks without an ID"),
    "kvledger/reference/disagg/landing.py": (1, "a KV landing check without an ID"),
    "kvledger/reference/disagg/system.py": (1, "wraps an instance's violation, whose ID follows"),
    "kvledger/reference/model/runner.py": (3, "forward-batch checks without an ID"),
    "kvledger/reference/pools/id_free_list.py": (5, "free-list self-checks without an ID"),
    "kvledger/reference/pools/kv_buffer.py": (1, "conditions without a description"),
    "kvledger/reference/pools/mamba_pool.py": (5, "conditions without a description"),
    "kvledger/reference/pools/metadata_pool.py": (4, "conditions without a description"),
    "kvledger/reference/pools/paged_allocator.py": (9, "conditions without an ID in their description"),
    "kvledger/reference/pools/req_to_token.py": (6, "conditions without an ID in their description"),
    "kvledger/reference/pools/token_allocator.py": (7, "conditions without an ID in their description"),
    "kvledger/reference/radix/radix_cache.py": (15, "conditions without an ID in their description"),
    "kvledger/reference/scheduler/accounting.py": (2, _BUILT_ELSEWHERE),
    "kvledger/reference/scheduler/cache_paths/base.py": (1, "the re-match after an insert, without an ID"),
    "kvledger/reference/scheduler/scheduler.py": (2, "conditions without an ID in their description"),
    "kvledger/reference/scheduler/tracking.py": (1, _BUILT_ELSEWHERE),
    "kvledger/sim/simulate.py": (1, "the simulator's drain bound (liveness) without an ID"),
}


@dataclass(frozen=True)
class Unnamed:
    """One contract whose message names no invariant ID."""

    path: str
    line: int
    kind: str  # "condition" (icontract) or "violation" (an explicit raise)
    text: str  # the description or message as written, shortened

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind} without an invariant ID: {self.text}"


def _called(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _names_an_id(node: ast.AST | None) -> bool:
    """Whether the literal text inside ``node`` (strings, f-string parts) contains an invariant ID."""
    if node is None:
        return False
    texts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return INVARIANT_ID.search(" ".join(texts)) is not None


def _description(call: ast.Call) -> ast.expr | None:
    if len(call.args) > 1:
        return call.args[1]
    return next((k.value for k in call.keywords if k.arg == "description"), None)


def _short(node: ast.AST | None) -> str:
    return "(none)" if node is None else ast.unparse(node)[:90]


def unnamed_in(tree: ast.Module, path: str) -> Iterator[Unnamed]:
    """The unnamed contracts of one parsed module."""
    for node in ast.walk(tree):
        for dec in getattr(node, "decorator_list", ()):
            if isinstance(dec, ast.Call) and _called(dec) in CONDITIONS and dec.args:
                desc = _description(dec)
                if not _names_an_id(desc):
                    yield Unnamed(path, dec.lineno, "condition", _short(desc))
        if isinstance(node, ast.Call) and _called(node) in VIOLATIONS:
            message = node.args[0] if node.args else None
            if not _names_an_id(message):
                yield Unnamed(path, node.lineno, "violation", _short(message))


def unnamed_contracts(root: Path) -> list[Unnamed]:
    """Every unnamed contract under ``root/kvledger``, in path and line order."""
    out: list[Unnamed] = []
    for file in sorted((root / SCANNED).rglob("*.py")):
        if "__pycache__" in file.parts:
            continue
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        out += sorted(unnamed_in(tree, file.relative_to(root).as_posix()), key=lambda u: u.line)
    return out


def unnamed_problems(root: Path, known: dict[str, tuple[int, str]] | None = None) -> list[str]:
    """One problem per unnamed contract of every file over its allowance (``KNOWN_UNNAMED`` by default)."""
    allowed = KNOWN_UNNAMED if known is None else known
    found = unnamed_contracts(root)
    per_file = Counter(u.path for u in found)
    problems: list[str] = []
    for path, count in sorted(per_file.items()):
        allowance = allowed.get(path, (0, ""))[0]
        if count > allowance:
            problems += [
                f"{u} ({count} unnamed in this file, {allowance} allowed by unnamed.KNOWN_UNNAMED)"
                for u in found
                if u.path == path
            ]
    return problems
