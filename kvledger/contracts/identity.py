"""The per-pool identities a scheduler must satisfy, and SGLang's late-2025 checker for comparison.

* The busy identity (I-COUNT with every holder term), checked after every scheduler step::

      free + pending + evictable + protected + held-by-waiting + held-by-chunked + held-by-running
           + held-by-inflight-batches == size

  The terms come from the implementation's own counters (allocator free lists, tree counters,
  request bookkeeping), not from the ledger; the ledger then says *which* slot or owner is wrong.
* The idle identity (I-IDLE-IDENTITY), only at quiescence (I-QUIESCENT): nothing is held by a
  request or a batch and nothing is locked.
* :func:`legacy_check_memory`: SGLang's late-2025 ``_check_mamba_memory``, which assumes request-held
  slots are zero whenever no batch was produced. Kept as a named legacy checker so the seed false
  positive (PR #16067) can be reproduced next to the ledger's verdict.

Torch-free: pure arithmetic over counts, so CrossHair can analyse it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from kvledger.contracts.arith import MAX_TERMS
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.switch import ensure, require


@dataclass(frozen=True)
class PoolTerms:
    """The identity's terms for one pool, in ``unit`` (tokens for KV, slots, rows)."""

    pool: str
    unit: str
    size: int
    free: int
    evictable: int = 0
    protected: int = 0
    pending: int = 0
    held: dict[str, int] = field(default_factory=dict)  # account name -> units held by requests/batches

    def total(self) -> int:
        return self.free + self.evictable + self.protected + self.pending + sum(self.held.values())

    def table(self) -> str:
        parts = [
            f"free={self.free}",
            f"pending={self.pending}",
            f"evictable={self.evictable}",
            f"protected={self.protected}",
        ]
        parts += [f"{k}={v}" for k, v in sorted(self.held.items())]
        return f"[{self.pool}] " + " + ".join(parts) + f" = {self.total()} vs size {self.size} ({self.unit})"


@require(lambda parts: len(parts) <= MAX_TERMS)
@ensure(lambda parts, size, result: result == sum(parts) - size)
def identity_gap(parts: list[int], size: int) -> int:
    """How far the terms are from the size: > 0 means counted twice (over-free), < 0 means a leak."""
    total = 0
    for p in parts:
        total += p
    return total - size


@functools.lru_cache(maxsize=512)
def _gap(parts: tuple[int, ...], size: int) -> int:
    """:func:`identity_gap`, contract-checked once per distinct input (it is pure; a scheduler's pools
    revisit the same few states step after step). A small cache: its memory must not grow in a long run."""
    return identity_gap(list(parts), size)


def check_busy_identity(terms: PoolTerms, culprit: Callable[[str], str] | None = None) -> None:
    """I-COUNT with every holder term; raises ContractViolation with the full table.

    ``culprit(pool)``, called only when the identity fails, resolves which ids are unaccounted for (and
    whose they are): its report is appended, so the violation names ids and owners, not only a count.
    """
    parts = (terms.free, terms.evictable, terms.protected, terms.pending, *terms.held.values())
    if min(parts) < 0:
        negative = {
            k: v
            for k, v in [
                ("free", terms.free),
                ("evictable", terms.evictable),
                ("protected", terms.protected),
                ("pending", terms.pending),
                *terms.held.items(),
            ]
            if v < 0
        }
        raise ContractViolation(_with_culprit(f"I-CAP: negative terms {negative}: {terms.table()}", terms, culprit))
    gap = _gap(parts, terms.size)
    if gap:
        kind = "counted twice (over-free)" if gap > 0 else "unaccounted (leak)"
        raise ContractViolation(
            _with_culprit(f"I-COUNT: {abs(gap)} {terms.unit} {kind}: {terms.table()}", terms, culprit)
        )


def _with_culprit(message: str, terms: PoolTerms, culprit: Callable[[str], str] | None) -> str:
    return message if culprit is None else f"{message}\n{culprit(terms.pool)}"


def check_idle_identity(terms: PoolTerms, culprit: Callable[[str], str] | None = None) -> None:
    """I-IDLE-IDENTITY: at quiescence every id is free or cached unlocked."""
    check_busy_identity(terms, culprit)
    held = {k: v for k, v in terms.held.items() if v}
    if held or terms.protected or terms.pending:
        raise ContractViolation(
            _with_culprit(
                f"I-IDLE-IDENTITY: quiescent but held={held}, protected={terms.protected},"
                f" pending={terms.pending}: {terms.table()}",
                terms,
                culprit,
            )
        )


class LegacyLeakDetected(ValueError):
    """What SGLang's late-2025 idle check raised (``ValueError: ... memory leak detected!``)."""


@dataclass(frozen=True)
class LegacyCounters:
    full_available_size: int
    full_evictable_size: int
    full_size: int
    full_protected_size: int
    mamba_available_size: int
    mamba_evictable_size: int
    mamba_size: int
    mamba_protected_size: int
    free_mamba_slots: frozenset[int] = frozenset()
    tree_mamba_slots: frozenset[int] = frozenset()
    mamba_first_slot: int = 1  # the checker's id domain; 2026 pools reserve slot 0 (B18)


def legacy_check_memory(c: LegacyCounters) -> None:
    """SGLang's ``_check_mamba_memory`` (late 2025): leak iff used != protected, for KV and Mamba.

    ``used = size - (available + evictable)``: every slot must be free, evictable or protected, so a
    slot that a waiting request holds legitimately (its copy-on-write slot) is reported as leaked.
    """
    full_used = c.full_size - (c.full_available_size + c.full_evictable_size)
    mamba_used = c.mamba_size - (c.mamba_available_size + c.mamba_evictable_size)
    if full_used != c.full_protected_size or mamba_used != c.mamba_protected_size:
        domain = set(range(c.mamba_first_slot, c.mamba_first_slot + c.mamba_size))
        leaked = sorted(domain - set(c.free_mamba_slots) - set(c.tree_mamba_slots))
        raise LegacyLeakDetected(
            "token_to_kv_pool_allocator memory leak detected! "
            f"full_available_size={c.full_available_size}, full_evictable_size={c.full_evictable_size}, "
            f"self.token_to_kv_pool_allocator.size={c.full_size}, "
            f"self.tree_cache.full_protected_size()={c.full_protected_size}\n"
            f"mamba_available_size={c.mamba_available_size}, mamba_evictable_size={c.mamba_evictable_size}, "
            f"self.req_to_token_pool.mamba_pool.size={c.mamba_size}, "
            f"self.tree_cache.mamba_protected_size()={c.mamba_protected_size}, "
            f"leaked_mamba_pages={set(leaked) if leaked else None}"
        )
