"""``PagedTokenToKVPoolAllocator``: KV pages of ``page_size`` token slots, owned page by page.

Page ids run ``1..size // page_size`` (page 0 is padding); token slot ``t`` lives in page
``t // page_size``. The unit of ownership is the page: a request may own a partially filled last page,
a radix tree only ever owns whole pages. ``alloc_extend`` / ``alloc_decode`` first fill a request's
partial last page and take new pages only after it, all or nothing across the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvledger.contracts.arith import decode_needs_new_page, extend_page_plan
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.owners import FREE, Owner
from kvledger.contracts.switch import ensure, invariant, snapshot
from kvledger.reference.pools.id_free_list import FreeListSnapshot, IdFreeList
from kvledger.reference.pools.validate import as_index_tensor, check_count, check_in_range, resolve_device


def _ledger_agrees(ids: IdFreeList) -> bool:
    return not ids.ledger.enabled or ids.ledger.count(FREE) == ids.available()


@invariant(lambda self: _ledger_agrees(self._pages), "I-COUNT: ledger free pages == free list length")
@invariant(lambda self: self.available_size() % self.page_size == 0, "available_size is whole pages")
@invariant(lambda self: 0 <= self._pages.available() + self._pages.pending_count() <= self.num_pages, "I-CAP")
class PagedTokenToKVPoolAllocator:
    """``size`` token slots in pages of ``page_size``; the KV buffer needs ``(num_pages + 1) * page_size`` rows."""

    def __init__(
        self, size: int, page_size: int, *, device: str | torch.device = "cpu", name: str = "kv"
    ) -> None:
        check_count(size, "size")
        check_count(page_size, "page_size")
        if page_size < 1 or size < page_size:
            raise InvalidArgument(
                f"need page_size >= 1 and size >= page_size, got size={size}, page_size={page_size}"
            )
        self.page_size = page_size
        self.num_pages = size // page_size
        self.size = self.num_pages * page_size
        self.name = name
        self.device = resolve_device(device)
        self._pages = IdFreeList(name, 1, self.num_pages, self.device, unit=page_size, reuse="lifo")
        self._offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)

    @property
    def ledger(self) -> Any:
        """The page-level ledger (``unit`` = page_size tokens per id)."""
        return self._pages.ledger

    def available_size(self) -> int:
        """Free tokens, i.e. free pages x page_size."""
        return self._pages.available() * self.page_size

    def pending_free_size(self) -> int:
        """Tokens of the pages freed inside the open free group."""
        return self._pages.pending_count() * self.page_size

    def pages_of(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The distinct pages the token ids fall in, in first-seen order."""
        pages = torch.div(token_ids, self.page_size, rounding_mode="floor")
        if pages.numel() < 2:
            return pages
        uniq, inverse = torch.unique(pages, return_inverse=True)
        first_seen = torch.full((uniq.numel(),), pages.numel(), dtype=torch.int64, device=pages.device)
        first_seen.scatter_reduce_(
            0, inverse, torch.arange(pages.numel(), device=pages.device), reduce="amin"
        )
        return uniq[torch.argsort(first_seen)]

    def _tokens_of(self, pages: torch.Tensor) -> torch.Tensor:
        return (pages[:, None] * self.page_size + self._offsets).reshape(-1)

    # ------------------------------------------------------------------ alloc
    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(lambda self, need_size, result: result is None or result.numel() == need_size)
    @ensure(
        lambda self, need_size, OLD, result: (
            result is None or self.available_size() == OLD.available - need_size
        )
    )
    @ensure(lambda self, OLD, result: result is not None or self.available_size() == OLD.available)
    def alloc(self, need_size: int, owner: Owner) -> torch.Tensor | None:
        """Whole pages for ``need_size`` tokens (a multiple of page_size), as token ids; None when short."""
        check_count(need_size, "need_size")
        if need_size % self.page_size:
            raise InvalidArgument(
                f"[{self.name}] alloc({need_size}) is not a multiple of page_size {self.page_size}"
            )
        pages = self._pages.alloc(need_size // self.page_size, owner)
        return None if pages is None else self._tokens_of(pages)

    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(lambda self, OLD, result: result is not None or self.available_size() == OLD.available)
    @ensure(
        lambda self, prefix_lens, seq_lens, result: (
            result is None or result.numel() == sum(s - p for p, s in zip(prefix_lens, seq_lens, strict=True))
        )
    )
    def alloc_extend(
        self,
        prefix_lens: Sequence[int],
        seq_lens: Sequence[int],
        last_loc: Sequence[int],
        owners: Sequence[Owner],
    ) -> torch.Tensor | None:
        """Token slots for extending each request ``i`` from ``prefix_lens[i]`` to ``seq_lens[i]``.

        ``last_loc[i]`` is the slot of the request's token ``prefix_lens[i] - 1`` (-1 or any value when the
        prefix is empty). Tokens up to the end of that page are filled in place (the page must be
        ``owners[i]``'s); new pages come off the free list for the rest. All requests or none.
        """
        n = len(prefix_lens)
        if not (len(seq_lens) == len(last_loc) == len(owners) == n):
            raise InvalidArgument(f"[{self.name}] alloc_extend: argument lengths differ")
        plans = []
        for p, s, loc, owner in zip(prefix_lens, seq_lens, last_loc, owners, strict=True):
            check_count(p, "prefix_len")
            check_count(s, "seq_len")
            if p > s:
                raise InvalidArgument(f"[{self.name}] alloc_extend: prefix_len {p} > seq_len {s}")
            fill, new_pages = extend_page_plan(p, s, self.page_size)
            if fill:
                self._check_partial_page(loc, p, owner, "alloc_extend")
            plans.append((fill, new_pages))
        self._check_distinct_partial_pages(
            [loc for (fill, _), loc in zip(plans, last_loc, strict=True) if fill], "alloc_extend"
        )
        total_new = sum(new for _, new in plans)
        if total_new > self._pages.available():
            return None
        pieces: list[torch.Tensor] = []
        for (fill, new_pages), p, s, loc, owner in zip(
            plans, prefix_lens, seq_lens, last_loc, owners, strict=True
        ):
            if fill:
                pieces.append(torch.arange(loc + 1, loc + 1 + fill, dtype=torch.int64, device=self.device))
            if new_pages:
                pages = self._pages.alloc(new_pages, owner, "alloc_extend")
                assert pages is not None  # total_new was checked above
                pieces.append(self._tokens_of(pages)[: s - p - fill])  # the last new page may be partial
        if not pieces:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        return torch.cat(pieces)

    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(lambda self, seq_lens, result: result is None or result.numel() == len(seq_lens))
    @ensure(lambda self, OLD, result: result is not None or self.available_size() == OLD.available)
    def alloc_decode(
        self, seq_lens: Sequence[int], last_loc: Sequence[int], owners: Sequence[Owner]
    ) -> torch.Tensor | None:
        """One slot per request whose length grows to ``seq_lens[i]`` (the new token included).

        A new page only when the new token opens one; otherwise the slot after ``last_loc[i]``, in a
        page the request must own. All requests or none.
        """
        if not (len(seq_lens) == len(last_loc) == len(owners)):
            raise InvalidArgument(f"[{self.name}] alloc_decode: argument lengths differ")
        opens: list[bool] = []
        for s, loc, owner in zip(seq_lens, last_loc, owners, strict=True):
            check_count(s, "seq_len")
            if s < 1:
                raise InvalidArgument(f"[{self.name}] alloc_decode: seq_len must be >= 1")
            new_page = decode_needs_new_page(s, self.page_size)
            if not new_page:
                self._check_partial_page(loc, s - 1, owner, "alloc_decode")
            opens.append(new_page)
        self._check_distinct_partial_pages(
            [loc for new_page, loc in zip(opens, last_loc, strict=True) if not new_page], "alloc_decode"
        )
        if sum(opens) > self._pages.available():
            return None
        out = torch.empty(len(seq_lens), dtype=torch.int64, device=self.device)
        for i, (new_page, loc, owner) in enumerate(zip(opens, last_loc, owners, strict=True)):
            if new_page:
                page = self._pages.alloc(1, owner, "alloc_decode")
                assert page is not None
                out[i] = page[0] * self.page_size
            else:
                out[i] = loc + 1
        return out

    def _check_distinct_partial_pages(self, locs: list[Any], op: str) -> None:
        """Two batch entries continuing the same partial page would be handed the same slots."""
        pages = [loc // self.page_size for loc in locs]
        if len(set(pages)) != len(pages):
            raise InvalidArgument(f"[{self.name}] {op}: several requests continue the same partial page")

    def _check_partial_page(self, loc: int, filled_len: int, owner: Owner, op: str) -> None:
        """``loc`` must be the last used slot of a page ``owner`` holds, consistent with the length."""
        if isinstance(loc, bool) or not isinstance(loc, int):
            raise InvalidArgument(f"[{self.name}] {op}: last_loc must be an int, got {loc!r}")
        if loc < self.page_size or loc >= (self.num_pages + 1) * self.page_size:
            raise InvalidArgument(f"[{self.name}] {op}: last_loc {loc} outside the pool")
        if (loc + 1) % self.page_size != filled_len % self.page_size:
            raise InvalidArgument(
                f"[{self.name}] {op}: last_loc {loc} is not at offset {(filled_len - 1) % self.page_size} of its page"
            )
        page = torch.tensor([loc // self.page_size], dtype=torch.int64, device=self.device)
        if int(self._pages.state[page]) != 0:
            raise InvalidArgument(
                f"[{self.name}] {op}: the partial page {int(page)} of last_loc {loc} is not held"
            )
        self._pages.ledger.require_held_by(page, owner, op)

    # ------------------------------------------------------------------ free
    @snapshot(lambda self: self._pages.available() + self._pages.pending_count(), name="reclaimable")
    @ensure(
        lambda self, ids, OLD: (
            self._pages.available() + self._pages.pending_count()
            == OLD.reclaimable + self.pages_of(as_index_tensor(ids, self.device, "free")).numel()
        ),
        "I-PAGE-UNIT: each distinct page is freed exactly once",
    )
    def free(self, ids: Any, owner: Owner) -> None:
        """Free the pages the token ids fall in; a page named by several of its tokens is freed once."""
        tokens = as_index_tensor(ids, self.device, f"{self.name}.free")
        check_in_range(
            tokens, self.page_size, (self.num_pages + 1) * self.page_size - 1, self.name, "token slot"
        )
        pages = self.pages_of(tokens)
        self._pages.validate_release(pages, owner, "free", "page")
        self._pages.release(pages, owner, "free")

    def _free_unchecked(self, ids: torch.Tensor, owner: Owner, op: str = "free") -> None:
        """Release the pages of ``ids`` without validation (see TokenToKVPoolAllocator._free_unchecked)."""
        self._pages.release(self.pages_of(ids), owner, op)

    def _free_pages_unchecked(self, pages: torch.Tensor, owner: Owner, op: str = "free") -> None:
        """Release page ids (not token ids) without validation: for callers that already know the pages.

        A radix tree owns whole pages in order, so its page ids are ``tokens[::page_size] // page_size``;
        this skips ``pages_of``'s unique/sort. The ledger still checks the owner.
        """
        self._pages.release(pages, owner, op)

    def attach_kv_buffer(self, buffer: Any) -> None:
        """Debug builds (a real ledger): zero a page's KV slots when handed out, poison them when given back."""
        if self._pages.ledger.enabled:
            self._pages.on_alloc = lambda pages: buffer.zero_slots(self._tokens_of(pages))
            self._pages.on_release = lambda pages: buffer.poison_slots(self._tokens_of(pages))

    def free_group_begin(self) -> None:
        self._pages.free_group_begin()

    def free_group_end(self) -> None:
        self._pages.free_group_end()

    def backup_state(self) -> FreeListSnapshot:
        return self._pages.backup()

    def restore_state(self, state: FreeListSnapshot) -> None:
        self._pages.restore(state)

    def audit(self) -> None:
        self._pages.audit()

    def __repr__(self) -> str:
        return (
            f"PagedTokenToKVPoolAllocator({self.name}, pages={self.num_pages}x{self.page_size},"
            f" available={self.available_size()})"
        )
