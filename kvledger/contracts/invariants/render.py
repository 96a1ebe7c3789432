"""Markdown from the registry: ``spec/invariants.md`` (and, later, the pages of a documentation site).

Deterministic: the same registry and tests give the same bytes, so CI can compare the committed file
with a fresh rendering. The pieces (one area's table, one proof table) are separate functions so a site
generator can lay them out differently.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from kvledger.contracts.invariants.model import Area, Check, Invariant
from kvledger.contracts.invariants.proofs import Proof, ProofStatus
from kvledger.contracts.invariants.trace import FiringTest, fired_by

HEADER = (
    "<!-- Generated from kvledger/contracts/invariants/ by"
    " `python -m kvledger.contracts.invariants render`. Do not edit by hand. -->\n"
)

INTRO = """\
# kvledger invariants

Every invariant has a stable ID, one statement, the checks that enforce it and the tests that make it
fire on purpose (a test that breaks it and sees its check raise an error naming the ID). The registry in
`kvledger/contracts/invariants/` is the source of this page; `scripts/test.sh` fails when the two
differ, when an ID is defined twice, when an invariant lacks a check or a firing test, or when code or
tests use an ID the registry does not know. Model and vocabulary: [model.md](model.md).

**Severity** says what the caller sees when the check fires:

* **bug**: a `ContractViolation` (an `AssertionError`) with the evidence: pool, ids, owner, their last
  moves. The implementation, or the engine under check, is wrong; it is never caught in production code.
* **operating error**: a typed `KVLedgerError` subclass, raised before anything changes: the caller's
  input would have broken the invariant. Callers may catch it. Every operating error names the
  invariant its refusal protects (e.g. `DoubleFree: ... [I-NODUP-FREE]`).

An invariant guarded both ways (an input check in front of a contract) is a bug: its checks list the
input check with kind *input*.

**Origin**: *SGLang* marks an identity of SGLang's own memory bookkeeping, written down from its code
and bug history (upstream issues and PRs are cited in the rows); *kvledger* marks one introduced here.

**Kinds of check**: *contract* (icontract pre/postcondition, class invariant or explicit check, after
every operation when contracts are on), *input* (validation before any change), *recount* (a full
`audit()`, at quiescence and after every rule of the state machines), *oracle* (a comparison with a
model or a reference, run by the tests), *proof* (pure arithmetic proved by CrossHair, see
[Proofs](#proofs-crosshair)). Paths are relative to the repository root.
"""


@dataclass(frozen=True)
class Domain:
    """What CrossHair is told about a proof target: preconditions, and the number of postconditions."""

    preconditions: tuple[str, ...]
    postconditions: int


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_check(check: Check) -> str:
    how = f": {check.how}" if check.how else ""
    return f"{check.kind.value} `{check.location}`{how}"


def render_tests(inv: Invariant, tests: list[FiringTest]) -> str:
    parts = [f"`{t.node}`" + (" (some parameters)" if t.some_parameters else "") for t in tests]
    if inv.exercised_by:
        parts.append("checked on every step by " + ", ".join(f"`{loc}`" for loc in inv.exercised_by))
    return "<br>".join(parts)


def render_statement(inv: Invariant) -> str:
    text = inv.statement
    if inv.upstream:
        text += " Upstream: " + "; ".join(inv.upstream) + "."
    if inv.notes:
        text += " " + inv.notes
    return text


def render_area(area: Area, firing: dict[str, list[FiringTest]]) -> str:
    lines = [f"## {area.title}", ""]
    if area.intro:
        lines += [area.intro, ""]
    lines += [
        "| ID | statement | severity | origin | parts | checked by | made to fire by |",
        "|---|---|---|---|---|---|---|",
    ]
    for inv in area.invariants:
        cells = [
            f"**{inv.id}**",
            render_statement(inv),
            inv.severity.value,
            inv.origin.value,
            ", ".join(inv.parts),
            "<br>".join(render_check(c) for c in inv.checks),
            render_tests(inv, firing.get(inv.id, [])),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def render_invariant_page(inv: Invariant, tests: list[FiringTest]) -> str:
    """One invariant on a page of its own (for a documentation site): the same facts as its table row."""
    lines = [
        f"# {inv.id}: {inv.title}",
        "",
        render_statement(inv),
        "",
        f"* severity: **{inv.severity.value}**",
        f"* origin: {inv.origin.value}",
        f"* parts: {', '.join(inv.parts)}",
        "",
        "## Checked by",
        "",
        *(f"* {render_check(c)}" for c in inv.checks),
        "",
        "## Made to fire by",
        "",
        *(f"* `{t.node}`" + (" (some parameters)" if t.some_parameters else "") for t in tests),
        *(f"* checked on every step by `{loc}`" for loc in inv.exercised_by),
    ]
    return "\n".join(lines) + "\n"


def _int_constants(root: Path, path: str, follow_imports: bool = True) -> dict[str, int]:
    """Module-level ``NAME = <int>`` of ``path``, and of the kvledger modules it imports names from."""
    tree = ast.parse((root / path).read_text(encoding="utf-8"))
    out: dict[str, int] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and type(node.value.value) is int
        ):
            out[node.targets[0].id] = node.value.value
        elif (
            follow_imports
            and isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("kvledger.")
        ):
            module_path = str(node.module).replace(".", "/") + ".py"
            imported = _int_constants(root, module_path, follow_imports=False)
            out.update({a.name: imported[a.name] for a in node.names if a.name in imported})
    return out


def proof_domain(root: Path, proof: Proof) -> Domain:
    """The preconditions (source text, named constants replaced by their values) and the postcondition count."""
    tree = ast.parse((root / proof.path).read_text(encoding="utf-8"))
    source = (root / proof.path).read_text(encoding="utf-8")
    constants = _int_constants(root, proof.path)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == proof.function:
            pre: list[str] = []
            post = 0
            for dec in node.decorator_list:
                if not isinstance(dec, ast.Call) or not isinstance(dec.func, ast.Name):
                    continue
                if dec.func.id == "require" and dec.args and isinstance(dec.args[0], ast.Lambda):
                    text = ast.get_source_segment(source, dec.args[0].body) or "?"
                    for name, value in constants.items():
                        text = re.sub(rf"\b{name}\b", str(value), text)
                    pre.append(text)
                elif dec.func.id == "ensure":
                    post += 1
            return Domain(tuple(pre), post)
    raise LookupError(f"{proof.path} defines no {proof.function}")


def render_proofs(root: Path, proofs: tuple[Proof, ...]) -> str:
    domains = [proof_domain(root, p) for p in proofs]
    total = sum(d.postconditions for d in domains)
    proved = sum(
        d.postconditions for p, d in zip(proofs, domains, strict=True) if p.status is ProofStatus.PROVED
    )
    lines = [
        "## Proofs (CrossHair)",
        "",
        "Pure, torch-free arithmetic that the pools, caches and scheduler call instead of re-deriving it"
        " inline. `scripts/crosshair_gate.py` runs `crosshair check --analysis_kind=icontract` on every"
        " function below and fails on a counterexample, on a vacuous run, and on any postcondition of a"
        ' *proved* function that is not "Confirmed over all paths". A proof holds within the function\'s'
        " preconditions (its domain). List lengths are bounded where CrossHair needs a bound to exhaust a"
        " loop: identities of up to 32 terms (the pools have about a dozen), and keys of up to 8 tokens for"
        " `matched_prefix_len`, which states the page-granular match and is not called by the implementation."
        " A *bounded* function would be one explored without a counterexample but not exhaustively, checked"
        " only as far as its bound says; there is none today.",
        "",
        f"{proved} of {total} postconditions are proved over all paths.",
        "",
        "| function | supports | status | domain (preconditions) | postconditions |",
        "|---|---|---|---|---|",
    ]
    for p, d in zip(proofs, domains, strict=True):
        status = p.status.value + (f" ({p.bound})" if p.bound else "")
        domain = "<br>".join(f"`{c}`" for c in d.preconditions) or "any input"
        lines.append(
            "| "
            + " | ".join(
                _cell(c)
                for c in (f"`{p.target}`", ", ".join(p.invariants), status, domain, str(d.postconditions))
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def render_spec(root: Path, areas: list[Area], proofs: tuple[Proof, ...]) -> str:
    firing = fired_by(root)
    sections = [HEADER + INTRO, *(render_area(a, firing) for a in areas), render_proofs(root, proofs)]
    return "\n".join(sections)
