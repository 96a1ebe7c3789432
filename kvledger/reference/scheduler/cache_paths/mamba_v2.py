"""The Mamba radix cache under ``extra_buffer`` (V2): tracking slots, captures, the tracked-length insert.

Everything V2 does on the request side goes through this one object (spec/mamba-v2.md): admission takes
the ``k`` tracking slots, each extend and decode step plans its capture, and the tree is given exactly
``tokens[:mamba_last_track_seqlen]`` with the state tracked there:

* ``cache_unfinished``: the keep half is *donated* (the request gets a fresh slot in its place) and
  inserted; the KV above the tracked length stays the request's;
* ``cache_finished``: the keep half itself is inserted, and the KV above the tracked length is freed;
* nothing tracked beyond the cached prefix: nothing is inserted (no ghost node, B16).

Both inserts go through :meth:`MambaV2Path._insert_tracked`, which checks that the state lands at the
node that ends at the tracked length (I-V2-CACHE-LEN). The slot bookkeeping (which half is kept, the
donation's replacement, the release that clears every handle) is :class:`MambaTracking`'s.
"""

from __future__ import annotations

import torch

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.protocols import InsertLike, KVAllocator, MambaPrefixCache, MambaStatePool
from kvledger.contracts.seams import seam
from kvledger.contracts.switch import ENABLED
from kvledger.reference.scheduler.cache_paths.base import MemoryPools, hand_over_lock, row_of, unlock
from kvledger.reference.scheduler.cache_paths.mamba_v1 import MambaV1Path
from kvledger.reference.scheduler.request import Req, track_point_holds
from kvledger.reference.scheduler.tracking import MambaTracking


class MambaV2Path(MambaV1Path):
    """V1's match and eviction; V2's admission, captures, inserts and release (module doc)."""

    def __init__(
        self, pools: MemoryPools, tree: MambaPrefixCache, mamba_pool: MambaStatePool, tracking: MambaTracking
    ) -> None:
        super().__init__(pools, tree, mamba_pool)
        self.kv_allocator: KVAllocator = pools.kv_allocator
        self.tracking: MambaTracking = tracking  # the tests swap in a broken variant

    # ------------------------------------------------------------------ admission and captures
    def needs_tracking_slots(self, req: Req) -> bool:
        return self.tracking.needs_slots(req)

    def alloc_tracking_slots(self, req: Req) -> torch.Tensor | None:
        return self.tracking.alloc(req)

    def plan_extend(self, req: Req, start: int, end: int) -> None:
        self.tracking.plan_extend(req, start, end)

    def plan_decode(self, req: Req) -> None:
        self.tracking.plan_decode(req)

    def after_decode_result(self, req: Req) -> None:
        self.tracking.after_decode_result(req)

    # ------------------------------------------------------------------ the tree adopts the tracked prefix
    def cache_unfinished(self, req: Req) -> None:
        """Insert ``tokens[:mamba_last_track_seqlen]`` with the donated keep half; the KV above stays the
        request's. Nothing tracked since the last insert: nothing to do (no ghost node, B16)."""
        tracked = self._tracked_beyond_protected(req)
        if tracked is None:
            return
        donated = self.tracking.donate(req)
        if donated is None:
            return  # no replacement slot: the request keeps its tracked state and tries again later
        tokens, cache_len, res = self._insert_tracked(req, req.context_ids(), donated, tracked)
        if not res.mamba_adopted:
            self.mamba_pool.free(donated, req.owner)
        hand_over_lock(self.tree, self.rows, req, tokens, cache_len)
        self.tracking.cached(req)

    @seam
    def cache_finished(self, req: Req) -> int:
        """Insert ``tokens[:mamba_last_track_seqlen]`` with the keep half; returns where the request's own
        KV starts (everything from there is freed). Nothing tracked: nothing inserted (B16)."""
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

    def _tracked_beyond_protected(self, req: Req) -> int | None:
        """The tracked length if it lies beyond the cached prefix (I-TRACK-POINT checked), else None:
        nothing tracked since the last insert, so nothing to insert (no ghost node, B16)."""
        self._check_track_point(req)
        tracked = req.mamba_last_track_seqlen
        return None if tracked is None or tracked <= req.cache_protected_len else tracked

    def _insert_tracked(
        self, req: Req, ids: list[int], slot: torch.Tensor, tracked: int
    ) -> tuple[list[int], int, InsertLike]:
        """V2's one insert: ``ids[:tracked]`` with the tracking slot ``slot`` (ledger op ``donate``), checked
        to land at the node that ends at the tracked length (I-V2-CACHE-LEN). Returns the key, its length
        and the insert's result; the caller decides what becomes of the slot if the tree had a state."""
        cache_len = self._tracked_insert_len(req)
        tokens = ids[:cache_len]
        kv = self.rows.read(row_of(req), 0, cache_len)
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

    def _check_tracked_insert(self, req: Req, res: InsertLike, slot: torch.Tensor, tracked: int) -> None:
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
        value = node.mamba_value
        if res.mamba_adopted and (value is None or not torch.equal(value, slot)):
            raise ContractViolation(f"I-V2-CACHE-LEN: {node!r} did not take {req.owner!r}'s slot {slot.tolist()}")

    # ------------------------------------------------------------------ release
    def release(self, req: Req) -> None:
        """Free the tracking slots and clear their handles (the #26941 fix), then give back the lock."""
        self.tracking.release(req)
        unlock(self.tree, req)

    def check_released(self, req: Req) -> None:
        """I-V2-CACHE-LEN at finish: with the tracked prefix cached, the KV above it went back too."""
        for pool in (self.kv_allocator, self.mamba_pool, self.rows):
            ledger = pool.ledger
            if ledger.enabled and ledger.held_count(req.owner):
                held = sorted(ledger.holdings(req.owner))[:8]
                raise ContractViolation(
                    ledger.describe(held[:4], f"I-V2-CACHE-LEN: {req.owner!r} still holds {held} after finishing")
                )
