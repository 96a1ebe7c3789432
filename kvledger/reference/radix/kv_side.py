"""The cache's view of the KV allocator: ids in ledger units, ownership checks, adopt and free.

The allocator's ledger counts token slots (page size 1) or pages (paged allocator). A tree only owns
whole pages, laid out in order (``page * P + 0 .. P-1``), so a node's ledger ids are the first token
of each page divided by the allocator's page size: no ``unique`` needed. Everything that needs the
ledger is skipped when the ledger is the no-op one (contracts off), which keeps that path lean.
"""

from __future__ import annotations

import torch

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.owners import Owner
from kvledger.contracts.protocols import KVAllocator


class KVSide:
    """Wraps ``TokenToKVPoolAllocator`` or ``PagedTokenToKVPoolAllocator`` for a radix tree."""

    __slots__ = ("_free_pages", "_offsets", "alloc_page", "allocator", "checked", "device", "ledger")

    def __init__(self, allocator: KVAllocator) -> None:
        self.allocator = allocator
        self.alloc_page = int(getattr(allocator, "page_size", 1))
        self.device: torch.device = allocator.device
        self.ledger = allocator.ledger
        self.checked: bool = bool(self.ledger.enabled)
        self._offsets = torch.arange(self.alloc_page, dtype=torch.int64, device=self.device)
        # Paged allocators can free by page id directly (tree ids are whole pages in order).
        self._free_pages = getattr(allocator, "_free_pages_unchecked", None) if self.alloc_page > 1 else None

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
        """Input validation (ledger on): whole pages, no repeats, all held by ``owner``; typed errors."""
        if not self.page_structured(tokens):
            raise InvalidArgument(f"{op}: KV ids are not whole pages of {self.alloc_page} slots in order")
        self.ledger.require_held_by(self.ledger_ids(tokens), owner, op, distinct=True)  # DuplicateIds first

    def adopt(self, tokens: torch.Tensor, src: Owner, dst: Owner, op: str) -> None:
        """Ledger move of ``tokens`` from ``src`` to ``dst`` (no pool change: the ids stay allocated)."""
        if self.checked and tokens.numel():
            self.ledger.transfer(self.ledger_ids(tokens), src, dst, op)

    def free(self, tokens: torch.Tensor, owner: Owner, op: str) -> None:
        """Return ``owner``'s page-structured ids through the allocator's free path (the ledger checks)."""
        if not tokens.numel():
            return
        if self._free_pages is not None:
            self._free_pages(self.ledger_ids(tokens), owner, op)
        else:
            self.allocator._free_unchecked(tokens, owner, op)
