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

from collections.abc import Sequence
from typing import Any

import torch

from kvledger.contracts.arith import ceil_to_page, extend_page_plan, floor_to_page, pages_needed
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import REQ_CHUNKED, REQ_RUNNING, REQ_WAITING, Account
from kvledger.contracts.protocols import AnyPrefixCache, KVAllocator, MambaStatePool, ReqRowPool
from kvledger.contracts.seams import seam
from kvledger.contracts.switch import ENABLED, ensure, snapshot
from kvledger.reference.scheduler.counters import Counters
from kvledger.reference.scheduler.request import Req, track_point_holds
from kvledger.reference.scheduler.tracking import MambaTracking

_EMPTY = torch.empty(0, dtype=torch.int64)


class AllocationFailed(Exception):
    """Raised inside ``prepare_*`` to trigger the rollback; never escapes this module."""


class ReqMemory:
    """The pools and the tree, seen from requests."""

    def __init__(
        self,
        *,
        kv_allocator: KVAllocator,
        req_to_token_pool: ReqRowPool,
        mamba_pool: MambaStatePool | None = None,
        tree: AnyPrefixCache | None = None,
        page_size: int = 1,
        fault_injector: Any = None,
        tracking: MambaTracking | None = None,
    ) -> None:
        # Typed at the boundary (the protocols of kvledger.contracts); inside, each branch knows the
        # variant it talks to (``is_mamba_tree``, ``page_size``), so the attributes stay dynamic.
        self.kv_allocator: Any = kv_allocator
        self.req_to_token_pool: Any = req_to_token_pool
        self.mamba_pool: Any = mamba_pool
        self.tree: Any = tree
        self.page_size = page_size
        self.is_mamba_tree = tree is not None and tree.caches_mamba
        self.fault_injector = fault_injector
        self.tracking = tracking  # Mamba V2 (extra_buffer); None: V1 or no Mamba cache
        self.device = kv_allocator.device
        self.counters = Counters(
            kv_allocator=kv_allocator, req_to_token_pool=req_to_token_pool, mamba_pool=mamba_pool, tree=tree
        )
        # ceil_to_page is pure and contract-checked: each distinct length is checked once, then looked
        # up (the per-step identity asks for it for every request that changed).
        self._ceil_memo: dict[int, int] = {}

    # ------------------------------------------------------------------ match
    def init_next_round_input(self, req: Req, *, cow: bool) -> None:
        """Re-match the request's prefix for this round (SGLang ``init_next_round_input``).

        At least one token is always computed (the last one gives the logits), so the key is
        ``fill_ids[:-1]``. With the Mamba cache the match stops at the deepest node with a state and,
        when ``cow``, that state is copied into a slot the waiting request holds.
        """
        req.fill_ids = req.all_ids()
        key = req.fill_ids[:-1]
        if self.tree is None:
            prefix, last_node = _EMPTY.to(self.device), None
        elif self.is_mamba_tree:
            res = self.tree.match_prefix(
                key, cow_owner=req.owner if cow else None, cow_slot=req.mamba_pool_idx if cow else None
            )
            prefix, last_node = res.device_indices, res.last_node
            if res.mamba_branching_seqlen is not None:  # kept until a later match reports another (SGLang)
                req.mamba_branching_seqlen = res.mamba_branching_seqlen
            if res.cow_slot is not None:
                req.mamba_pool_idx = res.cow_slot
            elif req.mamba_pool_idx is not None and req.req_pool_idx is None:
                # The slot holds a state copied in an earlier round that the new match no longer
                # backs (the node lost its state): give it back; admission allocates a zeroed one.
                self.release_cow_slot(req)
        else:
            res = self.tree.match_prefix(key)
            prefix, last_node = res.device_indices, res.last_node
        req.prefix_indices = prefix
        req.last_node = last_node
        req.cache_protected_len = req.kv_committed_len = req.kv_allocated_len = int(prefix.numel())
        req.extend_input_len = len(req.fill_ids) - req.kv_committed_len

    def release_cow_slot(self, req: Req) -> None:
        """A waiting request gives back its copy-on-write slot (not admitted, or aborted while waiting).

        I-COW-STOPPER: only a request that is still waiting may do this; for an admitted one the slot is
        its working slot, and freeing it is the #16067 reverted bug.
        """
        if req.mamba_pool_idx is None:
            return
        if req.owner.account is not REQ_WAITING or req.req_pool_idx is not None:
            ledger = self.mamba_pool.ledger
            slot = int(req.mamba_pool_idx[0])
            detail = ledger.describe([slot], "") if ledger.enabled else ""
            raise ContractViolation(
                f"I-COW-STOPPER: COW slot {slot} released while {req.owner!r} holds it as an admitted request"
                f" (the #16067 reverted bug){detail}"
            )
        self.mamba_pool.free(req.mamba_pool_idx, req.owner)
        req.mamba_pool_idx = None

    # ------------------------------------------------------------------ allocation
    def _inject(self, what: str) -> None:
        if self.fault_injector is not None and self.fault_injector(what):
            raise AllocationFailed(what)

    def _evict_kv_for(self, tokens: int) -> None:
        short = tokens - self.counters.kv_available()
        if short > 0 and self.tree is not None:
            self.tree.evict(short)

    def _evict_mamba_for(self, slots: int) -> None:
        short = slots - self.counters.mamba_available()
        if short > 0 and self.is_mamba_tree:
            self.tree.evict_mamba(short)

    def holdings(self, reqs: Sequence[Req]) -> list[tuple[Any, ...]]:
        """Per request: row, Mamba slot, allocated length and its ledger holdings in every pool."""
        pools = [self.kv_allocator, self.req_to_token_pool]
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
        undo: list[tuple[Any, torch.Tensor | list[int], Req]] = []
        saved = [
            (r.req_pool_idx, r.mamba_pool_idx, r.kv_allocated_len, r.mamba_ping_pong_track_buffer) for r in reqs
        ]
        pieces: list[torch.Tensor] = []
        try:
            for req in reqs:
                pieces.append(self._extend_one(req, undo))
        except AllocationFailed:
            for pool, ids, owner_req in reversed(undo):
                pool.free(ids, owner_req.owner)
            for req, (row, slot, allocated, track) in zip(reqs, saved, strict=True):
                req.req_pool_idx, req.mamba_pool_idx, req.kv_allocated_len = row, slot, allocated
                req.mamba_ping_pong_track_buffer = track
            return None
        for req in reqs:
            if self.tracking is not None:
                self.tracking.plan_extend(req, req.kv_committed_len, req.kv_allocated_len)
            req.kv_committed_len = req.kv_allocated_len
            account = admit_account or (REQ_CHUNKED if req is chunked else REQ_RUNNING)
            req.owner.set_account(account, op="admit")
        return torch.cat(pieces) if pieces else _EMPTY.to(self.device)

    @seam
    def _extend_one(self, req: Req, undo: list[tuple[Any, Any, Req]]) -> torch.Tensor:
        if req.req_pool_idx is None:
            self._inject("row")
            rows = self.req_to_token_pool.alloc(1, req.owner)
            if rows is None:
                raise AllocationFailed("row")
            undo.append((self.req_to_token_pool, rows, req))
            req.req_pool_idx = rows[0]
            if req.prefix_indices is not None and req.prefix_indices.numel():
                self.req_to_token_pool.write(req.req_pool_idx, 0, req.prefix_indices)
        if self.mamba_pool is not None and req.mamba_pool_idx is None:
            self._inject("mamba")
            self._evict_mamba_for(1)
            slot = self.mamba_pool.alloc(1, req.owner)
            if slot is None:
                raise AllocationFailed("mamba")
            undo.append((self.mamba_pool, slot, req))
            req.mamba_pool_idx = slot
        if self.tracking is not None and self.tracking.needs_slots(req):
            self._inject("mamba")
            track = self.tracking.alloc(req)
            if track is None:
                raise AllocationFailed("mamba tracking")
            undo.append((self.mamba_pool, track, req))
        start, end = req.kv_allocated_len, req.kv_committed_len + req.extend_input_len
        self._inject("kv")
        if self.page_size == 1:
            self._evict_kv_for(end - start)
            loc = self.kv_allocator.alloc(end - start, req.owner)
            new_part = loc
        else:
            fill, new_pages = extend_page_plan(start, end, self.page_size)
            self._evict_kv_for(new_pages * self.page_size)
            last_loc = (
                int(self.req_to_token_pool.read(req.req_pool_idx, start - 1, start)[0]) if start else -1
            )
            loc = self.kv_allocator.alloc_extend([start], [end], [last_loc], [req.owner])
            new_part = None if loc is None else loc[fill:]
        if loc is None:
            raise AllocationFailed("kv")
        if new_part is not None and new_part.numel():
            undo.append((self.kv_allocator, new_part, req))
        self.req_to_token_pool.write(req.req_pool_idx, start, loc)
        req.kv_allocated_len = end
        return loc

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
        rows = [r.req_pool_idx for r in reqs]
        positions = [r.kv_allocated_len for r in reqs]
        if self.page_size == 1:
            last_locs = [-1] * len(reqs)  # every decode token opens its own "page": nothing to continue
        else:
            last_locs = self.req_to_token_pool.read_each(rows, [p - 1 for p in positions]).tolist()
        out = self.kv_allocator.alloc_decode([p + 1 for p in positions], last_locs, [r.owner for r in reqs])
        if out is None:
            return None
        self.req_to_token_pool.write_each(rows, positions, out)
        for req in reqs:
            req.kv_allocated_len += 1
            req.kv_committed_len = req.kv_allocated_len
            if self.tracking is not None:
                self.tracking.plan_decode(req)
        return out

    def after_decode_result(self, req: Req) -> None:
        """A decode result was appended (SGLang's ``_mamba_prefix_cache_update``)."""
        if self.tracking is not None:
            self.tracking.after_decode_result(req)

    # ------------------------------------------------------------------ caching (tree adopts)
    def cache_unfinished(self, req: Req) -> None:
        """After a chunk or a finished prefill: insert the computed prefix and move the lock to it.

        V1 caches up to the last page boundary it computed (the Mamba tree: exactly what it computed, with
        a fork of the working slot); V2 caches exactly the tracked length with the donated tracking slot.
        """
        if self.tree is None:
            return
        if self.tracking is not None:
            self._cache_unfinished_tracked(req)
            return
        committed = req.kv_committed_len
        cache_len = floor_to_page(committed, self.page_size)
        if cache_len <= req.cache_protected_len:
            return  # nothing new: never insert an empty key (ghost nodes, B16)
        tokens = req.context_ids()[:cache_len]
        kv = self.req_to_token_pool.read(req.req_pool_idx, 0, cache_len)
        if self.is_mamba_tree:
            if cache_len != committed:
                return  # the working state is at `committed`, not at a page boundary: nothing to cache
            tree_slot = self._fork_for_tree(req)
            if tree_slot is None:
                return  # every state is locked: skip caching this round, the request keeps its KV
            res = self.tree.insert(
                tokens, kv, req.owner, mamba_slot=tree_slot, protected_len=req.cache_protected_len
            )
            if not res.mamba_adopted:
                self.mamba_pool.free(tree_slot, req.owner)
        else:
            self.tree.insert(tokens, kv, req.owner, protected_len=req.cache_protected_len)
        self._hand_over_lock(req, tokens, cache_len)

    def _cache_unfinished_tracked(self, req: Req) -> None:
        """V2: insert ``tokens[:mamba_last_track_seqlen]`` with the donated keep half; the KV above stays the
        request's. Nothing tracked since the last insert: nothing to do (no ghost node, B16)."""
        assert self.tracking is not None
        tracked = self._tracked_beyond_protected(req)
        if tracked is None:
            return
        donated = self.tracking.donate(req)
        if donated is None:
            return  # no replacement slot: the request keeps its tracked state and tries again later
        tokens, cache_len, res = self._insert_tracked(req, req.context_ids(), donated, tracked)
        if not res.mamba_adopted:
            self.mamba_pool.free(donated, req.owner)
        self._hand_over_lock(req, tokens, cache_len)
        req.mamba_last_track_seqlen = None

    def _tracked_beyond_protected(self, req: Req) -> int | None:
        """V2: the tracked length if it lies beyond the cached prefix (I-TRACK-POINT checked), else None:
        nothing tracked since the last insert, so nothing to insert (no ghost node, B16)."""
        self._check_track_point(req)
        tracked = req.mamba_last_track_seqlen
        return None if tracked is None or tracked <= req.cache_protected_len else tracked

    def _insert_tracked(
        self, req: Req, ids: list[int], slot: torch.Tensor, tracked: int
    ) -> tuple[list[int], int, Any]:
        """V2's one insert: ``ids[:tracked]`` with the tracking slot ``slot`` (ledger op ``donate``), checked
        to land at the node that ends at the tracked length (I-V2-CACHE-LEN). Returns the key, its length
        and the insert's result; the caller decides what becomes of the slot if the tree had a state."""
        cache_len = self._tracked_insert_len(req)
        tokens = ids[:cache_len]
        kv = self.req_to_token_pool.read(req.req_pool_idx, 0, cache_len)
        res = self.tree.insert(
            tokens, kv, req.owner, mamba_slot=slot, protected_len=req.cache_protected_len, state_op="donate"
        )
        self._check_tracked_insert(req, res, slot, tracked)
        return tokens, cache_len, res

    def _check_track_point(self, req: Req) -> None:
        """I-TRACK-POINT where the tracked length is used: a page boundary in (protected, committed]."""
        if ENABLED and not track_point_holds(req, self.page_size):
            raise ContractViolation(
                f"I-TRACK-POINT: {req.owner!r} tracked {req.mamba_last_track_seqlen} tokens, not a page"
                f" ({self.page_size}) boundary in (cache_protected_len, kv_committed_len]: {req!r}"
            )

    @staticmethod
    def _tracked_insert_len(req: Req) -> int:
        """V2's insert length: the tracked length (the state the keep half holds belongs exactly there)."""
        assert req.mamba_last_track_seqlen is not None
        return req.mamba_last_track_seqlen

    def _check_tracked_insert(self, req: Req, res: Any, slot: torch.Tensor, tracked: int) -> None:
        """I-V2-CACHE-LEN: a tracked state lands at the node that ends at the tracked length."""
        if not ENABLED:
            return
        node = res.node
        if node is None or node.depth() != tracked:
            got = None if node is None else node.depth()
            raise ContractViolation(
                f"I-V2-CACHE-LEN: {req.owner!r} inserted the state tracked at {tracked} tokens (slot"
                f" {slot.tolist()}) at a node ending at {got}"
            )
        if res.mamba_adopted and not torch.equal(node.mamba_value, slot):
            raise ContractViolation(f"I-V2-CACHE-LEN: {node!r} did not take {req.owner!r}'s slot {slot.tolist()}")

    def _hand_over_lock(self, req: Req, tokens: list[int], cache_len: int) -> None:
        """Re-match what was just inserted, point the row at the tree's ids, move the lock to the new node."""
        match = self.tree.match_prefix(tokens)
        if int(match.device_indices.numel()) != cache_len:
            raise ContractViolation(
                f"{req.owner!r}: re-match after insert returned {int(match.device_indices.numel())} tokens, "
                f"expected {cache_len} (the inserted path must be matchable)"
            )
        new_lock = self.tree.inc_lock_ref(match.last_node)
        if req.lock is not None:
            self.tree.dec_lock_ref(req.lock)
        req.lock, req.last_node = new_lock, match.last_node
        protected = req.cache_protected_len
        self.req_to_token_pool.write(req.req_pool_idx, protected, match.device_indices[protected:])
        req.prefix_indices = match.device_indices
        req.cache_protected_len = cache_len

    def _fork_for_tree(self, req: Req) -> torch.Tensor | None:
        assert req.mamba_pool_idx is not None
        slot = self.mamba_pool.fork_from(req.mamba_pool_idx, req.owner)
        if slot is None:
            self.tree.evict_mamba(1)
            slot = self.mamba_pool.fork_from(req.mamba_pool_idx, req.owner)
        return slot

    def cache_finished(self, req: Req) -> None:
        """Finish: the tree adopts the committed prefix (and the working slot), the request frees the rest.

        V2: the tree adopts the tracked prefix with the kept tracking slot; the KV above it is freed.
        """
        self._guard_release(req)
        inserted_len = req.cache_protected_len
        if self.tree is not None and req.req_pool_idx is not None:
            if self.tracking is not None:
                inserted_len = self._cache_finished_tracked(req)
            else:
                inserted_len = self._cache_finished_untracked(req)
        self._free_owned(req, inserted_len)
        if self.tracking is not None:
            self._check_released(req)

    def _cache_finished_untracked(self, req: Req) -> int:
        committed = req.kv_committed_len
        cache_len = floor_to_page(committed, self.page_size)
        if cache_len <= req.cache_protected_len:
            return req.cache_protected_len
        tokens = req.all_ids()[:cache_len]
        kv = self.req_to_token_pool.read(req.req_pool_idx, 0, cache_len)
        if not self.is_mamba_tree:
            self.tree.insert(tokens, kv, req.owner, protected_len=req.cache_protected_len)
            return cache_len
        if cache_len != committed or req.mamba_pool_idx is None:
            return req.cache_protected_len
        res = self.tree.insert(
            tokens, kv, req.owner, mamba_slot=req.mamba_pool_idx, protected_len=req.cache_protected_len
        )
        if res.mamba_adopted:
            req.mamba_pool_idx = None
        return cache_len

    @seam
    def _cache_finished_tracked(self, req: Req) -> int:
        """V2: insert ``tokens[:mamba_last_track_seqlen]`` with the keep half; returns where the request's
        own KV starts (everything from there is freed). Nothing tracked: nothing inserted (B16)."""
        assert self.tracking is not None
        tracked = self._tracked_beyond_protected(req)
        if tracked is None:
            return req.cache_protected_len
        pp = req.mamba_ping_pong_track_buffer
        assert pp is not None
        keep = self.tracking.keep_idx(req)
        _, cache_len, res = self._insert_tracked(req, req.all_ids(), pp[keep : keep + 1], tracked)
        if res.mamba_adopted:
            self.tracking.forget_kept(req)
        return cache_len

    def _check_released(self, req: Req) -> None:
        """I-V2-CACHE-LEN at finish: with the tracked prefix cached, the KV above it went back too."""
        for pool in (self.kv_allocator, self.mamba_pool, self.req_to_token_pool):
            ledger = pool.ledger
            if ledger.enabled and ledger.held_count(req.owner):
                held = sorted(ledger.holdings(req.owner))[:8]
                raise ContractViolation(
                    ledger.describe(held[:4], f"I-V2-CACHE-LEN: {req.owner!r} still holds {held} after finishing")
                )

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
        """Free KV ``[kv_from, kv_allocated_len)`` (page-ceiled), the Mamba slot, the lock and the row."""
        if req.req_pool_idx is not None and req.kv_allocated_len > kv_from:
            tail = self.req_to_token_pool.read(req.req_pool_idx, kv_from, req.kv_allocated_len)
            self.kv_allocator.free(tail, req.owner)
        if req.mamba_pool_idx is not None:
            self.mamba_pool.free(req.mamba_pool_idx, req.owner)
            req.mamba_pool_idx = None
        if self.tracking is not None:
            self.tracking.release(req)
        if req.lock is not None:
            self.tree.dec_lock_ref(req.lock)
            req.lock = None
        if req.req_pool_idx is not None:
            self.req_to_token_pool.free(req.req_pool_idx, req.owner)
            req.req_pool_idx = None
        req.last_node = None
        req.prefix_indices = None
        req.cache_protected_len = req.kv_committed_len = req.kv_allocated_len = 0

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
