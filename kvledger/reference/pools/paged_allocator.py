"""``PagedTokenToKVPoolAllocator``: KV pages of ``page_size`` token slots, owned page by page.

Page ids run ``1..size // page_size`` (page 0 is padding); token slot ``t`` lives in page
``t // page_size``. The unit of ownership is the page: a request may own a partially filled last page,
a radix tree only ever owns whole pages. ``alloc_extend`` / ``alloc_decode`` first fill a request's
partial last page and take new pages only after it, all or nothing across the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kvledger.contracts.arith import decode_needs_new_page, extend_page_plan
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import FREE, Owner
from kvledger.contracts.switch import ensure, invariant, snapshot
from kvledger.reference.pools.base import IdPool
from kvledger.reference.pools.id_free_list import FreeListSnapshot, IdFreeList, host_ids
from kvledger.reference.pools.kv_buffer import check_kv_buffer
from kvledger.reference.pools.validate import (
    as_index_tensor,
    check_count,
    check_decode_batch,
    check_in_range,
    check_int_sequence,
    check_owner,
    check_owners,
    check_snapshot,
)


def _ledger_agrees(ids: IdFreeList) -> bool:
    return not ids.ledger.enabled or ids.ledger.count(FREE) == ids.available()


@invariant(
    lambda self: _ledger_agrees(self._pages),
    "I-COUNT: ledger free pages == free list length",
    error=lambda self: self._pages.ledger_disagreement("I-COUNT: ledger free pages != free list length"),
)
@invariant(lambda self: self.available_size() % self.page_size == 0, "available_size is whole pages")
@invariant(lambda self: 0 <= self._pages.available() + self._pages.pending_count() <= self.num_pages, "I-CAP")
class PagedTokenToKVPoolAllocator(IdPool):
    """``size`` token slots in pages of ``page_size``; the KV buffer needs ``(num_pages + 1) * page_size`` rows."""

    def __init__(
        self,
        size: int,
        page_size: int,
        *,
        device: str | torch.device = "cpu",
        name: str = "kv",
        checks: CheckLevel | None = None,
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
        self._pages = self._init_pool(name, device, 1, self.num_pages, unit=page_size, reuse="lifo", checks=checks)
        self._on_cpu = self.device.type == "cpu"  # read on every alloc (``device.type`` costs 0.2 us)
        self._offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        self._offsets_np = np.arange(page_size, dtype=np.int64)
        self._free_what = f"{name}.free"
        self._scratch = np.zeros(self.num_pages + 1, dtype=np.int64)  # for pages_of's first-seen scatter
        self._positions = np.arange(self.num_pages + 1, dtype=np.int64)

    def pages_of(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The distinct pages the token ids fall in, in first-seen order (a new int64 tensor).

        The tokens must be slots of the pool (padding page 0 excluded), as for ``free``."""
        tokens = as_index_tensor(token_ids, self.device, f"{self.name}.pages_of")
        self._check_tokens(tokens)
        return self._pages_of(tokens)

    def _check_tokens(self, tokens: torch.Tensor) -> None:
        check_in_range(tokens, self.page_size, (self.num_pages + 1) * self.page_size - 1, self.name, "token slot")

    def _pages_of(self, token_ids: torch.Tensor) -> torch.Tensor:
        """:meth:`pages_of` without validation (internal callers, and the unchecked release path)."""
        tokens = host_ids(token_ids)
        pages = self._distinct_pages(tokens)
        if pages is None:  # pages outside the pool (only an invalid _free_unchecked call has those)
            uniq, first = np.unique(tokens // self.page_size, return_index=True)
            pages = uniq[np.argsort(first)]
        return self._page_tensor(pages)

    def _distinct_pages(self, tokens: np.ndarray) -> np.ndarray | None:
        """The distinct pages of host token ids in first-seen order; None if a page is outside ``1..num_pages``.

        O(n), no sort: each token's page index is scattered into a per-page scratch array in reverse
        order, so the first occurrence's position is the one left; a position that reads back its own
        index is a first occurrence. A token is in the pool's range exactly when its page is in
        ``1..num_pages``, so one unsigned reduction on the pages is also the range check.
        """
        pages = tokens // self.page_size
        n = pages.size
        if n == 0:
            return pages
        if int((pages - 1).view(np.uint64).max()) >= self.num_pages:
            return None
        if n == 1:
            return pages
        if n > self._positions.size:  # more tokens than pages: some repeat; dedupe the general way
            uniq, first = np.unique(pages, return_index=True)
            return uniq[np.argsort(first)]
        pos = self._positions[:n]
        self._scratch[pages[::-1]] = pos[::-1]
        first_seen: np.ndarray = pages[self._scratch[pages] == pos]
        return first_seen

    def _whole_pages(self, tokens: np.ndarray) -> np.ndarray | None:
        """The pages, in order, when ``tokens`` are whole pages each listed in slot order (what ``alloc``
        hands out and what a request gives back); None for anything else, which the general path takes.

        Free's fast path (issue 24): a handful of numpy calls instead of the first-seen deduplication.
        The pages may still repeat, lie outside the pool or not be held: ``release_if_clean`` checks.
        """
        ps = self.page_size
        n = tokens.size
        if n == 0 or n % ps or tokens.dtype != np.int64:
            return None
        if n == ps:  # one page: Python ints
            start = int(tokens[0])
            if start % ps or (self._offsets_np + start).tobytes() != tokens.tobytes():
                return None
            return np.array([start // ps], dtype=np.int64)
        pages = tokens[::ps] // ps
        slots = (pages * ps)[:, None] + self._offsets_np
        return pages if slots.tobytes() == tokens.tobytes() else None

    def _page_tensor(self, pages: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(pages, dtype=np.int64))
        return t if self._on_cpu else t.to(self.device)

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
        if type(owner) is not Owner:  # one comparison on the fast path
            check_owner(owner)
        if need_size % self.page_size:
            raise InvalidArgument(
                f"[{self.name}] alloc({need_size}) is not a multiple of page_size {self.page_size}"
            )
        pages = self._pages.alloc_host(need_size // self.page_size, owner)
        if pages is None:
            return None
        tokens = (pages[:, None] * self.page_size + self._offsets_np).reshape(-1)
        t = torch.from_numpy(tokens)
        return t if self._on_cpu else t.to(self.device)

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
        check_int_sequence(prefix_lens, f"[{self.name}] alloc_extend: prefix_lens")
        check_int_sequence(seq_lens, f"[{self.name}] alloc_extend: seq_lens")
        check_int_sequence(last_loc, f"[{self.name}] alloc_extend: last_loc")
        check_owners(owners, f"[{self.name}] alloc_extend: owners")
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
    @ensure(
        lambda self, owners, result: (
            result is None
            or not self._pages.ledger.enabled
            or self._pages.ledger.all_held_each(torch.div(result, self.page_size, rounding_mode="floor"), owners)
        ),
        "each request owns the page of the slot handed to it",
    )
    def alloc_decode(
        self, seq_lens: Sequence[int], last_loc: Sequence[int], owners: Sequence[Owner]
    ) -> torch.Tensor | None:
        """One slot per request whose length grows to ``seq_lens[i]`` (the new token included).

        A new page only when the new token opens one; otherwise the slot after ``last_loc[i]``, in a
        page the request must own. All requests or none; the new pages come in one allocation.
        """
        check_decode_batch(seq_lens, last_loc, owners, self.name)
        ps = self.page_size
        opens = [decode_needs_new_page(s, ps) for s in seq_lens]
        cont = [i for i, o in enumerate(opens) if not o]
        if cont:
            self._check_partial_pages(
                [last_loc[i] for i in cont], [seq_lens[i] - 1 for i in cont], [owners[i] for i in cont], "alloc_decode"
            )
        new_owners = [o for o, new in zip(owners, opens, strict=True) if new]
        if len(new_owners) > self._pages.available():
            return None
        out = np.empty(len(seq_lens), dtype=np.int64)
        if cont:
            out[cont] = np.asarray([last_loc[i] for i in cont], dtype=np.int64) + 1
        if new_owners:
            pages = self._pages.alloc_each(new_owners, "alloc_decode")
            assert pages is not None
            out[np.flatnonzero(opens)] = host_ids(pages) * ps
        t = torch.from_numpy(out)
        return t if self._on_cpu else t.to(self.device)

    def _check_distinct_partial_pages(self, locs: list[Any], op: str) -> None:
        """Two batch entries continuing the same partial page would be handed the same slots."""
        pages = [loc // self.page_size for loc in locs]
        if len(set(pages)) != len(pages):
            raise InvalidArgument(f"[{self.name}] {op}: several requests continue the same partial page")

    def _check_partial_page(self, loc: int, filled_len: int, owner: Owner, op: str) -> None:
        """``loc`` must be the last used slot of a page ``owner`` holds, consistent with the length."""
        self._check_partial_pages([loc], [filled_len], [owner], op)

    def _check_partial_pages(
        self, locs: Sequence[Any], filled_lens: Sequence[int], owners: Sequence[Owner], op: str
    ) -> None:
        """Each ``locs[i]`` is the last used slot of a page ``owners[i]`` holds, at the offset its length says,
        and no two continue the same page. One ledger check for the batch."""
        ps = self.page_size
        pages = []
        for loc, filled_len in zip(locs, filled_lens, strict=True):
            if isinstance(loc, bool) or not isinstance(loc, int):
                raise InvalidArgument(f"[{self.name}] {op}: last_loc must be an int, got {loc!r}")
            if loc < ps or loc >= (self.num_pages + 1) * ps:
                raise InvalidArgument(f"[{self.name}] {op}: last_loc {loc} outside the pool")
            if (loc + 1) % ps != filled_len % ps:
                raise InvalidArgument(
                    f"[{self.name}] {op}: last_loc {loc} is not at offset {(filled_len - 1) % ps} of its page"
                )
            page = loc // ps
            if not self._pages.is_held(page):
                raise InvalidArgument(f"[{self.name}] {op}: the partial page {page} of last_loc {loc} is not held")
            pages.append(page)
        self._pages.ledger.require_held_each(np.asarray(pages, dtype=np.int64), owners, op)  # ForeignSlot first
        self._check_distinct_partial_pages(list(locs), op)

    # ------------------------------------------------------------------ free
    @snapshot(lambda self: self._pages.available() + self._pages.pending_count(), name="reclaimable")
    @ensure(
        lambda self, ids, OLD: (
            self._pages.available() + self._pages.pending_count()
            == OLD.reclaimable + self._pages_of(as_index_tensor(ids, self.device, "free")).numel()
        ),
        "I-PAGE-UNIT: each distinct page is freed exactly once",
    )
    def free(self, ids: Any, owner: Owner) -> None:
        """Free the pages the token ids fall in; a page named by several of its tokens is freed once."""
        tokens = as_index_tensor(ids, self.device, self._free_what)
        if type(owner) is not Owner:  # one comparison on the fast path
            check_owner(owner)
        a = host_ids(tokens)
        whole = self._whole_pages(a)
        if whole is not None and self._pages.release_if_clean(whole, owner, "free"):
            return
        pages = self._distinct_pages(a)
        if pages is None:
            self._check_tokens(tokens)  # raises SlotOutOfRange naming the tokens
            raise AssertionError("unreachable: a page outside the pool means a token outside it")
        self._pages.free_distinct(pages, owner, "free", "page")

    def _free_unchecked(self, ids: torch.Tensor, owner: Owner, op: str = "free") -> None:
        """Release the pages of ``ids`` without validation (see TokenToKVPoolAllocator._free_unchecked)."""
        self._pages.release(self._pages_of(ids), owner, op)

    def attach_kv_buffer(self, buffer: Any) -> None:
        """Debug builds (a real ledger): zero a page's KV slots when handed out, poison them when given back."""
        check_kv_buffer(buffer, (self.num_pages + 1) * self.page_size, self.device, self.name)
        if self._pages.ledger.debug:
            self._pages.on_alloc = lambda pages: buffer.zero_slots(self._tokens_of(pages))
            self._pages.on_release = lambda pages: buffer.poison_slots(self._tokens_of(pages))

    def free_group_begin(self) -> None:
        self._pages.free_group_begin()

    def free_group_end(self) -> None:
        self._pages.free_group_end()

    def backup_state(self) -> FreeListSnapshot:
        return self._pages.backup()

    def restore_state(self, state: FreeListSnapshot) -> None:
        self._pages.restore(check_snapshot(state, self.name))

    def __repr__(self) -> str:
        return (
            f"PagedTokenToKVPoolAllocator({self.name}, pages={self.num_pages}x{self.page_size},"
            f" available={self.available_size()})"
        )
