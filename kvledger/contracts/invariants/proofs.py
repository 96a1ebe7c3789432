"""The pure functions CrossHair checks in CI, and what the spec may claim about each.

``scripts/crosshair_gate.py`` runs CrossHair on every target below and fails unless each postcondition
of a ``PROVED`` target is "Confirmed over all paths" (a proof within the target's preconditions, which
the spec prints as the domain). A ``BOUNDED`` target is only explored: CrossHair found no counterexample
within ``--per_condition_timeout`` but did not exhaust the paths, and the spec lists it with ``bound``
saying how far it was checked. Nothing is called proved that the gate has not confirmed.

Why some preconditions bound a length: CrossHair exhausts a loop over a symbolic list only when the
list's length is bounded (``len(parts) <= 32``), and a quantified precondition such as
``all(p >= 0 for p in parts)`` keeps it from ever confirming. The bounds are far above what the callers
pass (an identity has fewer than a dozen terms).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ProofStatus(enum.Enum):
    PROVED = "proved"  # every postcondition confirmed over all paths within the preconditions
    BOUNDED = "bounded"  # explored without a counterexample, not exhausted: checked only up to `bound`


@dataclass(frozen=True)
class Proof:
    target: str  # dotted name of a function: what ``crosshair check`` is given
    invariants: tuple[str, ...]
    status: ProofStatus = ProofStatus.PROVED
    bound: str = ""  # for BOUNDED: how far it is checked, in words

    @property
    def module(self) -> str:
        return self.target.rpartition(".")[0]

    @property
    def function(self) -> str:
        return self.target.rpartition(".")[2]

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"


ARITH = "kvledger.contracts.arith"
TRACK = "kvledger.contracts.mamba_track"

PROOFS: tuple[Proof, ...] = (
    Proof(f"{ARITH}.pages_needed", ("I-PAGE-UNIT",)),
    Proof(f"{ARITH}.floor_to_page", ("I-PAGE-UNIT", "I-REQ-LADDER")),
    Proof(f"{ARITH}.ceil_to_page", ("I-PAGE-UNIT", "I-COUNT")),
    Proof(f"{ARITH}.extend_page_plan", ("I-PAGE-UNIT",)),
    Proof(f"{ARITH}.decode_needs_new_page", ("I-PAGE-UNIT",)),
    Proof(f"{ARITH}.accounts_sum_to_size", ("I-COUNT",)),
    Proof(f"{ARITH}.matched_prefix_len", ("I-NODE-NONEMPTY",)),
    Proof(f"{ARITH}.remaining_new_tokens_clipped", ("I-ATOMIC-ADMISSION",)),
    Proof("kvledger.contracts.identity.identity_gap", ("I-COUNT",)),
    Proof("kvledger.contracts.sizing.default_pre_alloc_size", ("I-SIZING",)),
    Proof("kvledger.contracts.sizing.decode_rows", ("I-SIZING",)),
    Proof("kvledger.contracts.sizing.decode_mamba_slots", ("I-SIZING",)),
    Proof(f"{TRACK}.mamba_cache_chunk_size", ("I-TRACK-POINT",)),
    Proof(f"{TRACK}.ping_pong_size", ("I-REQ-MAMBA",)),
    Proof(f"{TRACK}.other_track_idx", ("I-DONATION",)),
    Proof(f"{TRACK}.extend_track_seqlen", ("I-TRACK-POINT",)),
    Proof(f"{TRACK}.branching_seqlen", ("I-BRANCHING",)),
    Proof(f"{TRACK}.mamba_slot_demand", ("I-ATOMIC-ADMISSION", "I-STATE-BOUND")),
)
