"""``PrefillAdder``: SGLang's admission budgets, plus the row and Mamba demand SGLang left out.

Budgets are computed live, not frozen (``sglang-memory-model.md`` §2.2):

* ``rem_total_tokens = available + evictable - offset``, the offset reserving each running request's
  clipped remaining decode tokens times ``new_token_ratio`` and each admitted request's extend plus
  clipped ``max_new_tokens``;
* ``rem_input_tokens`` (``max_prefill_tokens``) and ``rem_chunk_tokens`` (``chunked_prefill_size``).

Results are CONTINUE, NO_TOKEN and OTHER, and a request may be *appended and still* get NO_TOKEN or
OTHER from ``budget_state`` (cases (d)/(e) of the table): ``last_appended`` tells which, so the COW
cleanup of the request that stopped the round frees a slot only when the request was not appended
(PR #21404; freeing it anyway was #16067's reverted bug).

Atomic admission (I-ATOMIC-ADMISSION, bug B17): before a request is appended its whole demand — a row
(unless it has one), a Mamba working slot (unless its COW slot becomes one), under Mamba V2 its ``k``
tracking slots (unless it still has them) and its KV — is checked against what this round has left, so
the allocations in ``prepare_for_extend`` cannot fail (prediction == commitment).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kvledger.contracts.arith import ceil_to_page, floor_to_page, remaining_new_tokens_clipped
from kvledger.contracts.mamba_track import mamba_slot_demand
from kvledger.contracts.owners import REQ_CHUNKED, REQ_RUNNING
from kvledger.contracts.pool_kinds import MAMBA
from kvledger.contracts.protocols import (
    AnyPrefixCache,
    KVAllocator,
    MambaStatePool,
    NodeLike,
    ReqRowPool,
    caches_kind,
)
from kvledger.reference.scheduler.cache_paths.base import lock
from kvledger.reference.scheduler.config import SchedulerConfig
from kvledger.reference.scheduler.counters import Counters
from kvledger.reference.scheduler.request import Req

# The budget arithmetic is pure and contract-checked (proved by CrossHair): each distinct input is
# checked once, then looked up; a decode-heavy step asks for the same few values for every request.
_remaining_clipped = functools.lru_cache(maxsize=4096)(remaining_new_tokens_clipped)
_ceil_to_page = functools.lru_cache(maxsize=4096)(ceil_to_page)


class AddReqResult(enum.Enum):
    CONTINUE = "continue"  # appended, and the budgets have room for more
    NO_TOKEN = "no_token"  # out of KV (or Mamba / row) memory
    OTHER = "other"  # an input, chunk or count limit


class PrefillAdder:
    """Builds one prefill batch. ``tree`` may be None (radix cache disabled)."""

    def __init__(
        self,
        config: SchedulerConfig,
        *,
        tree: AnyPrefixCache | None,
        kv_allocator: KVAllocator,
        req_to_token_pool: ReqRowPool,
        mamba_pool: MambaStatePool | None,
        running: Sequence[Req],
        new_token_ratio: float,
        counters: Counters | None = None,
    ) -> None:
        self.config = config
        # Budgets read the pools' and tree's counters directly (see ``counters``).
        self.counters = counters or Counters(
            kv_allocator=kv_allocator, req_to_token_pool=req_to_token_pool, mamba_pool=mamba_pool, tree=tree
        )
        self.page_size = config.page_size
        self.tree = tree
        self.kv_allocator = kv_allocator
        self.req_to_token_pool = req_to_token_pool
        self.mamba_pool = mamba_pool
        self.rem_input_tokens = config.max_prefill_tokens
        self.rem_chunk_tokens = config.chunked_prefill_size
        self.rem_total_token_offset = 0.0
        self.cur_rem_token_offset = 0
        for r in running:
            remaining = _remaining_clipped(r.max_new_tokens, len(r.output_ids), config.clip_max_new_tokens)
            self.rem_total_token_offset += remaining * new_token_ratio
        self.rows_reserved = 0
        self.mamba_reserved = 0
        # Tracking slots an admitted request needs (Mamba V2 with the Mamba radix cache), else 0.
        self.ping_pong = config.mamba_ping_pong_size if caches_kind(tree, MAMBA.name) else 0
        self.can_run_list: list[Req] = []
        self.new_chunked_req: Req | None = None
        self.last_appended = False
        self.log_hit_tokens = 0
        self.log_input_tokens = 0

    # ------------------------------------------------------------------ budgets
    def _evictable_tokens(self) -> int:
        return self.counters.kv_evictable()

    @property
    def rem_total_tokens(self) -> float:
        return self.counters.kv_available() + self.counters.kv_evictable() - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> int:
        return self.counters.kv_available() + self.counters.kv_evictable() - self.cur_rem_token_offset

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_prefill_budget(self, prefix_len: int, extend_input_len: int, max_new_tokens: int) -> None:
        extend_input_len = _ceil_to_page(extend_input_len, self.page_size)
        self.rem_total_token_offset += extend_input_len + max_new_tokens
        self.cur_rem_token_offset += extend_input_len
        self.rem_input_tokens -= extend_input_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_input_len
        self.log_hit_tokens += prefix_len
        self.log_input_tokens += extend_input_len

    def _mamba_headroom(self) -> int:
        if self.mamba_pool is None:
            return 0
        return self.counters.mamba_available() + self.counters.mamba_evictable() - self.mamba_reserved

    def _side_demand_fits(self, req: Req) -> bool:
        """Row and Mamba demand of ``req`` against what this round has not yet promised.

        Checked even when ``req`` needs no new Mamba slot: its copy-on-write slot came off the free list
        at match time and its lock protects a state, so admitting it may eat into slots already promised
        to requests appended before it (a livelock of admit-and-roll-back found by the oracle machine).
        """
        if req.req_pool_idx is None and self.counters.rows_available() - self.rows_reserved < 1:
            return False
        if self.mamba_pool is None:
            return True
        return self._mamba_headroom() >= self._mamba_demand(req)

    def room_to_match(self, req: Req, *, cow: bool) -> bool:
        """Checked before ``req`` is matched: does the round still have, unpromised, a row (unless it has
        one) and, when the match may copy a state, the request's whole Mamba demand?

        SGLang caps the requests a round may take by the free rows before any match
        (``get_num_allocatable_reqs``). The Mamba side needs the same guard: a copy-on-write match takes
        its slot off the free list outside this round's budget, so matching a request the round cannot
        admit anyway would take a slot already promised to one appended before it; that admission then
        fails in ``prepare_extend`` and, with ``keep``, both requests wait holding copies no eviction can
        reach (the V2 livelock of issue 13). A request that still holds its copy takes nothing new.
        """
        if req.req_pool_idx is None and self.counters.rows_available() - self.rows_reserved < 1:
            return False
        if not cow or self.mamba_pool is None or req.mamba_pool_idx is not None:
            return True
        return self._mamba_headroom() >= mamba_slot_demand(True, True, self.ping_pong)

    def _mamba_demand(self, req: Req) -> int:
        return mamba_slot_demand(
            req.mamba_pool_idx is None, req.mamba_ping_pong_track_buffer is None, self.ping_pong
        )

    def _reserve_side_demand(self, req: Req) -> None:
        if req.req_pool_idx is None:
            self.rows_reserved += 1
        if self.mamba_pool is not None:
            self.mamba_reserved += self._mamba_demand(req)

    @contextmanager
    def _lock_node(self, node: NodeLike | None) -> Iterator[None]:
        """A temporary lock while re-checking: locking can shrink what is evictable."""
        if self.tree is None or node is None:
            yield
            return
        lock = self.tree.inc_lock_ref(node)
        try:
            yield
        finally:
            self.tree.dec_lock_ref(lock)

    # ------------------------------------------------------------------ admission
    def add_chunked_req(self, req: Req) -> Req | None:
        """The chunked request goes first; returns it again if it is still truncated after this chunk."""
        self.last_appended = False
        rem = min(
            self.rem_chunk_tokens if self.rem_chunk_tokens is not None else req.extend_input_len,
            int(self.rem_total_tokens),
        )
        truncated = req.extend_input_len > rem
        if truncated:
            rem = floor_to_page(max(rem, 0), self.page_size)
            if rem <= 0:
                return req  # no room for even one page this round; it stays chunked and holds what it has
            req.extend_input_len = rem
            req.fill_ids = req.fill_ids[: req.kv_committed_len + rem]
        self.can_run_list.append(req)
        self.last_appended = True
        max_new = 0 if truncated else self._clipped_max_new(req)
        self._update_prefill_budget(0, req.extend_input_len, max_new)
        return req if truncated else None

    def add_one_req(self, req: Req) -> AddReqResult:
        """Try to append ``req`` (already matched: ``prefix_indices``, ``last_node`` set)."""
        self.last_appended = False
        prefix_len = req.kv_committed_len  # the matched prefix; nothing else is computed yet
        total_tokens = req.extend_input_len + self._clipped_max_new(req)
        real_input_tokens = _ceil_to_page(req.extend_input_len, self.page_size)
        if total_tokens >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if real_input_tokens >= self.rem_input_tokens and self.can_run_list:
            return AddReqResult.OTHER
        if len(self.can_run_list) >= self.config.max_running_requests:
            return AddReqResult.OTHER
        with self._lock_node(req.last_node):
            if total_tokens >= self.rem_total_tokens:
                return AddReqResult.NO_TOKEN
            if not self._side_demand_fits(req):
                return AddReqResult.NO_TOKEN
            chunk = self.rem_chunk_tokens
            if chunk is None or req.extend_input_len <= chunk:
                self._append(req)
                self._update_prefill_budget(prefix_len, real_input_tokens, self._clipped_max_new(req))
            else:
                trunc_len = floor_to_page(chunk, self.page_size)
                if trunc_len <= 0:
                    return AddReqResult.OTHER
                req.extend_input_len = trunc_len
                req.fill_ids = req.fill_ids[: prefix_len + trunc_len]
                self._append(req)
                self.new_chunked_req = req
                req.owner.set_account(REQ_CHUNKED, op="admit(chunked)")
                self._update_prefill_budget(prefix_len, trunc_len, 0)
        return self.budget_state()

    def _append(self, req: Req) -> None:
        """Admission: the request locks its prefix and leaves the waiting account at once, so a cleanup
        that treats it as still waiting (the #16067 reverted bug) is caught."""
        if self.tree is not None and req.last_node is not None:
            lock(self.tree, req, req.last_node)
        req.owner.set_account(REQ_RUNNING, op="admit")
        self._reserve_side_demand(req)
        self.can_run_list.append(req)
        self.last_appended = True

    def _clipped_max_new(self, req: Req) -> int:
        return _remaining_clipped(req.max_new_tokens, len(req.output_ids), self.config.clip_max_new_tokens)
