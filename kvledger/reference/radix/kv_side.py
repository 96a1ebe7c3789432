"""The cache's view of the KV allocator: ids in ledger units, ownership checks, adopt and free.

The allocator's ledger counts token slots (page size 1) or pages (paged allocator). A tree only owns
whole pages, laid out in order (``page * P + 0 .. P-1``), so a node's ledger ids are the first token
of each page divided by the allocator's page size: no ``unique`` needed. Everything that needs the
ledger is skipped when the ledger is the no-op one (contracts off), which keeps that path lean: the ids a
caller hands to the tree are checked (whole pages, in range, distinct, held by the caller) in debug builds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kvledger.contracts.errors import ForeignSlot, InvalidArgument, SlotOutOfRange
from kvledger.contracts.owners import Owner
from kvledger.contracts.protocols import KVAllocator
from kvledger.reference.pools.id_free_list import IdFreeList, free_list_of, host_ids

ALLOCATOR_API = ("page_size", "device", "ledger", "alloc", "free", "_free_unchecked")
"""What a radix tree calls on its KV allocator (kvledger's two allocators, or an adapter with the same)."""


def check_allocator(allocator: Any, what: str) -> Any:
    missing = [name for name in ALLOCATOR_API if not hasattr(allocator, name)]
    if allocator is None or missing:
        raise InvalidArgument(
            f"{what}: expected a KV allocator (TokenToKVPoolAllocator or PagedTokenToKVPoolAllocator),"
            f" got {type(allocator).__name__} (missing {missing})"
        )
    return allocator


class KVSide:
    """Wraps ``TokenToKVPoolAllocator`` or ``PagedTokenToKVPoolAllocator`` for a radix tree."""

    __slots__ = (
        "_free_pages",
        "_ids",
        "_offsets",
        "_offsets_np",
        "alloc_page",
        "allocator",
        "checked",
        "device",
        "ledger",
    )

    def __init__(self, allocator: KVAllocator) -> None:
        check_allocator(allocator, "token_to_kv_pool_allocator")
        self.allocator = allocator
        self.alloc_page = int(getattr(allocator, "page_size", 1))
        self.device: torch.device = allocator.device
        self.ledger = allocator.ledger
        self.checked: bool = bool(self.ledger.enabled)
        self._offsets = torch.arange(self.alloc_page, dtype=torch.int64, device=self.device)
        self._offsets_np = np.arange(self.alloc_page, dtype=np.int64)
        try:  # the allocator's per-id state: what caller ids are checked against
            self._ids: IdFreeList | None = free_list_of(allocator)
        except TypeError:  # an adapter that is not built on an IdFreeList
            self._ids = None
        # A paged kvledger allocator's pages can be released by page id directly through its free list
        # (tree ids are whole pages in order): no token-to-page dedup. The ledger still checks the owner.
        self._free_pages = self._ids.release if self._ids is not None and self.alloc_page > 1 else None

    def ledger_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """The ledger's ids (tokens, or pages) for page-structured token ids."""
        if self.alloc_page == 1:
            return tokens
        return torch.div(tokens[:: self.alloc_page], self.alloc_page, rounding_mode="floor")

    def page_structured(self, tokens: torch.Tensor) -> bool:
        """Whether ``tokens`` are whole allocator pages, each in slot order (what a node may own)."""
        p = self.alloc_page
        if p == 1:
            return True
        if tokens.numel() % p:
            return False
        rows = tokens.view(-1, p)
        return bool(((rows - rows[:, :1]) == self._offsets).all()) and bool((rows[:, 0] % p == 0).all())

    def check_caller_ids(self, tokens: torch.Tensor, owner: Owner, op: str) -> None:
        """Input validation of the ids a caller hands to the tree (debug builds: a ledger): whole pages in
        slot order, of the pool, distinct, and every one held by ``owner``. Typed errors, O(n).

        Release builds (no ledger) trust them, as SGLang does: who holds an id is the ledger's knowledge,
        and an O(n) host check of every id a request hands over would cost the release hot path a
        fifth of an insert (measured: benchmarks/radix_cache.py)."""
        if not self.checked or not tokens.numel():
            return
        if self._ids is None:  # an adapter with a ledger but no IdFreeList
            if not self.page_structured(tokens):
                raise InvalidArgument(f"{op}: KV ids are not whole pages of {self.alloc_page} slots in order")
            self.ledger.require_held_by(self.ledger_ids(tokens), owner, op, distinct=True)  # DuplicateIds first
            return
        ids = self._ids
        a = host_ids(tokens)
        p = self.alloc_page
        if p > 1:
            if a.size % p:
                raise InvalidArgument(f"{op}: {a.size} KV ids are not whole pages of {p} slots")
            rows = a.reshape(-1, p)
            first = rows[:, 0]
            if bool((first % p).any()) or not bool((rows == first[:, None] + self._offsets_np).all()):
                raise InvalidArgument(f"{op}: KV ids are not whole pages of {p} slots in order")
            a = first // p
        unit = "page" if p > 1 else "slot"
        if int((a - ids.first).view(np.uint64).max()) > ids.last - ids.first:
            bad = a[(a < ids.first) | (a > ids.last)][:8].tolist()
            raise SlotOutOfRange(
                f"[{ids.name}] {op}: {unit}(s) {bad} outside the usable range [{ids.first}, {ids.last}]"
            )
        try:
            self.ledger.require_held_by(a, owner, op, distinct=True)  # DuplicateIds first
        except ForeignSlot:
            ids.check_release(a, owner, op, unit)  # names a free id DoubleFree (as the pool's free does)
            raise

    def adopt(self, tokens: torch.Tensor, src: Owner, dst: Owner, op: str) -> None:
        """Ledger move of ``tokens`` from ``src`` to ``dst`` (no pool change: the ids stay allocated)."""
        if self.checked and tokens.numel():
            p = self.alloc_page
            if p > 1 and tokens.is_cpu:  # the page ids in numpy, which the ledger takes as they are (half
                self.ledger.transfer(tokens.numpy()[::p] // p, src, dst, op)  # the cost of torch's divide)
            else:
                self.ledger.transfer(self.ledger_ids(tokens), src, dst, op)

    def free(self, tokens: torch.Tensor, owner: Owner, op: str) -> None:
        """Return ``owner``'s page-structured ids through the allocator's free path (the ledger checks)."""
        if not tokens.numel():
            return
        if self._free_pages is not None:
            self._free_pages(self.ledger_ids(tokens), owner, op)
        else:
            self.allocator._free_unchecked(tokens, owner, op)
