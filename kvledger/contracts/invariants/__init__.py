"""The registry of invariants: every ID, its statement, severity, origin, the parts it concerns and the
checks that enforce it. ``spec/invariants.md`` is generated from it, and the traceability check
(``python -m kvledger.contracts.invariants check``, run by ``scripts/test.sh``) keeps it honest.

Layout: ``model.py`` says what an entry is; ``areas/`` has one module per area of the system (pools,
caches, scheduler, data plane, ...), each defining ``AREA``; ``proofs.py`` lists the CrossHair targets;
``trace.py`` is the traceability check (with ``unnamed.py``: no contract in ``kvledger/`` without an
ID, beyond a listed per-file debt); ``render.py`` writes the spec.

How to add an invariant: add an ``Invariant(...)`` to the ``AREA`` of the area module it belongs to (a
new area is a new module in ``areas/`` with its own ``AREA``), with at least one check location
``"path.py:Symbol"`` that raises a ``ContractViolation`` (bug) or a typed ``KVLedgerError`` (operating
error) whose message names the ID; mark a test that makes it fire with ``@pytest.mark.fires("I-...")``;
run ``python -m kvledger.contracts.invariants render`` and commit the regenerated ``spec/invariants.md``.
"""

from __future__ import annotations

import importlib
import pkgutil

from kvledger.contracts.invariants import areas as _areas_pkg
from kvledger.contracts.invariants.model import (
    PARTS,
    Area,
    Check,
    CheckKind,
    Invariant,
    Origin,
    Severity,
)
from kvledger.contracts.invariants.proofs import PROOFS, Proof, ProofStatus

__all__ = [
    "PARTS",
    "PROOFS",
    "Area",
    "Check",
    "CheckKind",
    "Invariant",
    "Origin",
    "Proof",
    "ProofStatus",
    "Severity",
    "all_areas",
    "all_invariants",
    "by_id",
]


def all_areas() -> list[Area]:
    """Every area module's ``AREA``, in spec order."""
    found: list[Area] = []
    for info in pkgutil.iter_modules(_areas_pkg.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{_areas_pkg.__name__}.{info.name}")
        area = getattr(module, "AREA", None)
        if not isinstance(area, Area):
            raise TypeError(f"{module.__name__} defines no AREA")
        found.append(area)
    return sorted(found, key=lambda a: (a.order, a.key))


def all_invariants() -> list[Invariant]:
    """Every registered invariant, in spec order (an ID defined twice appears twice: see ``trace``)."""
    return [inv for area in all_areas() for inv in area.invariants]


def by_id() -> dict[str, Invariant]:
    """ID -> invariant. Raises if an ID is defined twice."""
    out: dict[str, Invariant] = {}
    for inv in all_invariants():
        if inv.id in out:
            raise ValueError(f"{inv.id} is defined twice")
        out[inv.id] = inv
    return out
