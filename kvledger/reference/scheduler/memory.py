"""Request-side memory operations: match, allocate for extend/decode, cache, and the release paths.

The scheduler decides *when*; this module decides *what moves where*, one function per transition
(I-OWNER-RELEASE):

* :meth:`ReqMemory.init_next_round_input`: match the prefix (copy-on-write the Mamba state into a slot
  the waiting request holds);
* :meth:`ReqMemory.prepare_extend` / :meth:`ReqMemory.prepare_decode`: all-or-nothing allocation of
  rows, Mamba working slots and KV (I-ATOMIC-ADMISSION);
* :meth:`ReqMemory.cache_unfinished`: after a chunk or a finished prefill, the tree adopts the computed
  prefix and the request's lock moves to the new node (the lock hand-over);
* :meth:`ReqMemory.cache_finished`: the tree adopts the committed sequence (and, for the Mamba cache,
  the working slot); the request frees the rest;
* :meth:`ReqMemory.release_without_insert`: retraction and abort; :meth:`ReqMemory.release_cow_slot`:
  a waiting request's copy-on-write slot.

Mamba V2 (``extra_buffer``, ``tracking`` set; spec/mamba-v2.md): admission also takes the ``k`` tracking
slots, each extend and decode step plans its capture, ``cache_unfinished`` inserts only the tracked
length with the donated tracking slot (the request gets a replacement), ``cache_finished`` inserts the
tracked length with the kept tracking slot and frees the KV above it, and every release frees the
tracking slots and clears their handle (:mod:`~kvledger.reference.scheduler.tracking`).

Each release is guarded by ``req.released`` so a second release is a ContractViolation, not a double
free that a later check has to infer (bugs B1, B2, B9).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvledger.contracts.arith import ceil_to_page, pages_needed
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import REQ_CHUNKED, REQ_RUNNING, REQ_WAITING, Account
from kvledger.contracts.pool_kinds import MAMBA
from kvledger.contracts.protocols import (
    AnyPrefixCache,
    KVAllocator,
    MambaStatePool,
    ReqRowPool,
    caches_kind,
)
from kvledger.contracts.seams import seam
from kvledger.contracts.switch import ensure, snapshot
from kvledger.reference.scheduler.cache_paths import CachePath, MemoryPools, cache_path_for
from kvledger.reference.scheduler.counters import Counters
from kvledger.reference.scheduler.holdings import (
    AllocationFailed,
    HoldingsCoordinator,
    KVHoldings,
    MambaSlotHoldings,
    PathHoldings,
    RowHoldings,
    Undo,
)
from kvledger.reference.scheduler.request import Req
from kvledger.reference.scheduler.tracking import MambaTracking

_EMPTY = torch.empty(0, dtype=torch.int64)

Holding = tuple[int | None, tuple[int, ...], int, tuple[int, ...]]
"""One request's row, Mamba slots, allocated length and ledger counts per pool (``holdings``)."""


class ReqMemory:
    """The pools and the tree, seen from requests; what the tree does is the cache path's (``path``)."""

    def __init__(
        self,
        *,
        kv_allocator: KVAllocator,
        req_to_token_pool: ReqRowPool,
        mamba_pool: MambaStatePool | None = None,
        tree: AnyPrefixCache | None = None,
        page_size: int = 1,
        fault_injector: Callable[[str], bool] | None = None,
        tracking: MambaTracking | None = None,
    ) -> None:
        self.kv_allocator = kv_allocator
        self.req_to_token_pool = req_to_token_pool
        self.mamba_pool = mamba_pool
        self.tree = tree
        self.page_size = page_size
        self.is_mamba_tree = caches_kind(tree, MAMBA.name)
        self.fault_injector = fault_injector
        # One object per cache variant (no cache, plain radix, Mamba V1, Mamba V2), chosen here once.
        self.path: CachePath = cache_path_for(
            MemoryPools(kv_allocator, req_to_token_pool, mamba_pool, page_size), tree, tracking
        )
        self.device = kv_allocator.device
        self.counters = Counters(
            kv_allocator=kv_allocator, req_to_token_pool=req_to_token_pool, mamba_pool=mamba_pool, tree=tree
        )
        # ceil_to_page is pure and contract-checked: each distinct length is checked once, then looked
        # up (the per-step identity asks for it for every request that changed).
        self._ceil_memo: dict[int, int] = {}
        # One manager per pool kind; they alone write a request's memory fields (module holdings).
        mamba = MambaSlotHoldings(mamba_pool, self._inject, self._evict_mamba_for)
        self.holdings_of = HoldingsCoordinator(
            RowHoldings(req_to_token_pool, self._inject),
            mamba,
            PathHoldings(self.path, mamba, self._inject),
            KVHoldings(kv_allocator, req_to_token_pool, page_size, self._inject, self._evict_kv_for),
        )

    @property
    def tracking(self) -> MambaTracking | None:
        """Mamba V2's tracking rules (None: V1, or no Mamba cache)."""
        return self.path.tracking

    # ------------------------------------------------------------------ match
    def init_next_round_input(self, req: Req, *, cow: bool) -> None:
        """Re-match the request's prefix for this round (SGLang ``init_next_round_input``).

        At least one token is always computed (the last one gives the logits), so the key is
        ``fill_ids[:-1]``. With the Mamba cache the match stops at the deepest node with a state and,
        when ``cow``, that state is copied into a slot the waiting request holds.
        """
        req.fill_ids = req.all_ids()
        matched = self.path.match(req, req.fill_ids[:-1], cow=cow)
        if matched.cow_slot is not None:
            self.holdings_of.mamba.set_cow(req, matched.cow_slot)
        if matched.stale_cow:
            self.release_cow_slot(req)
        self.holdings_of.kv.set_matched(req, matched.prefix, matched.last_node)
        req.extend_input_len = len(req.fill_ids) - req.kv_committed_len

    def release_cow_slot(self, req: Req) -> None:
        """A waiting request gives back its copy-on-write slot (not admitted, or aborted while waiting).

        I-COW-STOPPER: only a request that is still waiting may do this; for an admitted one the slot is
        its working slot, and freeing it is the #16067 reverted bug.
        """
        if req.mamba_pool_idx is None:
            return
        pool = self.holdings_of.mamba.pool_for(req)
        if req.owner.account is not REQ_WAITING or req.req_pool_idx is not None:
            ledger = pool.ledger
            slot = int(req.mamba_pool_idx[0])
            detail = ledger.describe([slot], "") if ledger.enabled else ""
            raise ContractViolation(
                f"I-COW-STOPPER: COW slot {slot} released while {req.owner!r} holds it as an admitted request"
                f" (the #16067 reverted bug){detail}"
            )
        self.holdings_of.mamba.release(req, 0)

    # ------------------------------------------------------------------ allocation
    def _inject(self, what: str) -> None:
        if self.fault_injector is not None and self.fault_injector(what):
            raise AllocationFailed(what)

    def _evict_kv_for(self, tokens: int) -> None:
        short = tokens - self.counters.kv_available()
        if short > 0:
            self.path.evict_kv(short)

    def _evict_mamba_for(self, slots: int) -> None:
        short = slots - self.counters.mamba_available()
        if short > 0:
            self.path.evict_states(short)

    def holdings(self, reqs: Sequence[Req]) -> list[Holding]:
        """Per request: row, Mamba slot, allocated length and its ledger holdings in every pool."""
        pools: list[KVAllocator | ReqRowPool | MambaStatePool] = [self.kv_allocator, self.req_to_token_pool]
        if self.mamba_pool is not None:
            pools.append(self.mamba_pool)
        return [
            (
                r.req_pool_idx,
                tuple(r.mamba_slots()),
                r.kv_allocated_len,
                tuple(p.ledger.held_count(r.owner) for p in pools),
            )
            for r in reqs
        ]

    @snapshot(lambda self, reqs: self.holdings(reqs), name="held")
    @ensure(
        lambda self, reqs, result, OLD: result is not None or self.holdings(reqs) == OLD.held,
        "I-ATOMIC-ADMISSION: a failed admission leaves every request holding exactly what it held",
    )
    def prepare_extend(
        self, reqs: Sequence[Req], chunked: Req | None, *, admit_account: Account | None = None
    ) -> torch.Tensor | None:
        """Rows, working slots and KV for this round's extends, all or none; returns ``out_cache_loc``.

        On failure everything allocated here is freed again and the requests are as before the call.
        On success the requests move to ``req.chunked`` / ``req.running``, or to ``admit_account`` (a PD
        decode instance pre-allocating into its transfer queue).
        """
        reservation = self.holdings_of.reserve(reqs)
        try:
            pieces = [self._extend_one(req, reservation.undo) for req in reqs]
        except AllocationFailed:
            reservation.rollback()
            return None
        reservation.commit()
        for req in reqs:
            self.path.plan_extend(req, req.kv_committed_len, req.kv_allocated_len)
            self.holdings_of.kv.commit_all(req)
            account = admit_account or (REQ_CHUNKED if req is chunked else REQ_RUNNING)
            req.owner.set_account(account, op="admit")
        return torch.cat(pieces) if pieces else _EMPTY.to(self.device)

    @seam
    def _extend_one(self, req: Req, undo: Undo) -> torch.Tensor:
        """Admit one request of the batch: every kind it lacks, each take recorded in ``undo``."""
        return self.holdings_of.take(req, undo)

    @seam
    def decode_demand_tokens(self, reqs: Sequence[Req]) -> int:
        """KV tokens the next decode step takes off the free list (whole pages)."""
        opens = sum(1 for r in reqs if r.kv_allocated_len % self.page_size == 0)
        return opens * self.page_size

    def prepare_decode(self, reqs: Sequence[Req]) -> torch.Tensor | None:
        """One KV slot per request (a new page when the token opens one), all or none."""
        if not reqs:
            return _EMPTY.to(self.device)
        try:
            self._inject("kv")
        except AllocationFailed:
            return None
        self._evict_kv_for(self.decode_demand_tokens(reqs))
        out = self.holdings_of.kv.decode(reqs)
        if out is not None:
            for req in reqs:
                self.path.plan_decode(req)
        return out

    def after_decode_result(self, req: Req) -> None:
        """A decode result was appended (SGLang's ``_mamba_prefix_cache_update``)."""
        self.path.after_decode_result(req)

    # ------------------------------------------------------------------ caching (tree adopts)
    def cache_unfinished(self, req: Req) -> None:
        """After a chunk or a finished prefill: insert the computed prefix and move the lock to it.

        V1 caches up to the last page boundary it computed (the Mamba tree: exactly what it computed, with
        a fork of the working slot); V2 caches exactly the tracked length with the donated tracking slot.
        """
        self.path.cache_unfinished(req)

    def cache_finished(self, req: Req) -> None:
        """Finish: the tree adopts the committed prefix (and the working slot), the request frees the rest.

        V2: the tree adopts the tracked prefix with the kept tracking slot; the KV above it is freed.
        """
        self._guard_release(req)
        inserted_len = req.cache_protected_len
        if req.req_pool_idx is not None:
            inserted_len = self.path.cache_finished(req)
        self._free_owned(req, inserted_len)
        self.path.check_released(req)

    @seam
    def release_without_insert(self, req: Req) -> None:
        """Retraction and abort: free what the request owns; the tree keeps (unlocked) what it had."""
        self._guard_release(req)
        if req.req_pool_idx is None:
            self.release_cow_slot(req)
            return
        self._free_owned(req, req.cache_protected_len)

    def _guard_release(self, req: Req) -> None:
        if req.released:
            raise ContractViolation(f"{req.owner!r} released twice (I-OWNER-RELEASE / I-NODUP-FREE): {req!r}")

    def _free_owned(self, req: Req, kv_from: int) -> None:
        """Free KV ``[kv_from, kv_allocated_len)`` (page-ceiled), the Mamba slot, the tracking slots and the
        lock, any added kind's holdings, then the row (the coordinator's release order)."""
        self.holdings_of.release(req, kv_from)

    # ------------------------------------------------------------------ what a request holds
    def kv_held_units(self, req: Req) -> int:
        """KV ids (tokens, or pages for a paged pool) the request owns by its bookkeeping."""
        if req.req_pool_idx is None:
            return 0
        if self.page_size == 1:
            return req.kv_allocated_len - req.cache_protected_len
        return pages_needed(req.kv_allocated_len, self.page_size) - req.cache_protected_len // self.page_size

    def kv_held_tokens(self, req: Req) -> int:
        """SGLang's busy-check term: ``ceil_page(kv_allocated_len) - cache_protected_len``."""
        if req.req_pool_idx is None:
            return 0
        n = req.kv_allocated_len
        ceiled = self._ceil_memo.get(n)
        if ceiled is None:
            ceiled = self._ceil_memo[n] = ceil_to_page(n, self.page_size)
        return ceiled - req.cache_protected_len

