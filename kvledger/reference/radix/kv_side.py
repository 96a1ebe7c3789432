"""The cache's view of the KV allocator: ids in ledger units, ownership checks, adopt and free.

The allocator's ledger counts token slots (page size 1) or pages (paged allocator). A tree only owns
whole pages, laid out in order (``page * P + 0 .. P-1``), so a node's ledger ids are the first token
of each page divided by the allocator's page size: no ``unique`` needed. Everything that needs the
ledger is skipped when the ledger is the no-op one (contracts off), which keeps that path lean: the ids a
caller hands to the tree are checked at every level (whole pages, in range, distinct, not free; held by
the caller from ``owners`` up).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kvledger.contracts.errors import InvalidArgument
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
        "_ones",
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
        self._ones = np.ones(1024, dtype=np.int64).tobytes()  # what in-page steps of 1,024 tokens read as
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
        """Input validation of the ids a caller hands to the tree, at every checking level: whole pages in
        slot order, of the pool, distinct, and none of them free (the allocator's per-id state); with a
        ledger (``owners`` and up) every one held by ``owner``. Typed errors, O(n), nothing changed.

        Release checks what the free list knows, as the pools' own free does: a repeated id, an id out of
        range, a partial page or an id already free would corrupt the pool once the tree frees it (two
        hand-outs of one id, an ``IndexError`` at the next eviction, more free pages than the pool has).
        Who holds an id is the ledger's knowledge; release cannot tell a foreign id from one's own."""
        if not tokens.numel():
            return
        ids = self._ids
        if ids is None:  # an adapter not built on an IdFreeList: its own ledger, if any, is the check
            self._check_adapter_ids(tokens, owner, op)
            return
        a = host_ids(tokens)
        p = self.alloc_page
        if p > 1:
            a = self._whole_pages(a, op)
        # range, repeats and free-list state (DoubleFree names a free id); the owner when a ledger is on
        ids.check_release(a, owner, op, "page" if p > 1 else "slot")

    def _whole_pages(self, a: np.ndarray, op: str) -> np.ndarray:
        """The page ids of ``a`` if it is whole pages, each in slot order; else InvalidArgument.

        Release's insert path runs it for every request (issue 42), so it is a few numpy calls and byte
        comparisons (``.any()`` and ``np.diff`` cost more than the rest together): inside a page
        consecutive ids differ by one (the steps across page boundaries are set aside), and each page
        starts on a multiple of the page size."""
        p, n = self.alloc_page, a.size
        if n % p:
            raise InvalidArgument(f"{op}: {n} KV ids are not whole pages of {p} slots")
        steps = a[1:] - a[:-1]
        steps[p - 1 :: p] = 1  # from one page to the next: any jump
        if len(self._ones) < steps.nbytes:
            self._ones = np.ones(n, dtype=np.int64).tobytes()
        firsts = a[::p]
        pages = firsts // p
        if steps.tobytes() != self._ones[: steps.nbytes] or (pages * p).tobytes() != firsts.tobytes():
            raise InvalidArgument(f"{op}: KV ids are not whole pages of {p} slots in order")
        return pages

    def _check_adapter_ids(self, tokens: torch.Tensor, owner: Owner, op: str) -> None:
        if not self.page_structured(tokens):
            raise InvalidArgument(f"{op}: KV ids are not whole pages of {self.alloc_page} slots in order")
        if self.checked:
            self.ledger.require_held_by(self.ledger_ids(tokens), owner, op, distinct=True)  # DuplicateIds first

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
