"""The Mamba radix cache under ``no_buffer`` (V1): a state at a node end, cached at token granularity.

A match copies the deepest cached state into the request's slot (copy-on-write); ``cache_unfinished``
inserts exactly what was computed with a fork of the working slot; ``cache_finished`` hands the working
slot itself to the tree. :class:`~.mamba_v2.MambaV2Path` shares the match and the eviction.
"""

from __future__ import annotations

import torch

from kvledger.contracts.arith import floor_to_page
from kvledger.contracts.protocols import MambaPrefixCache, MambaStatePool
from kvledger.reference.scheduler.cache_paths.base import (
    Matched,
    MemoryPools,
    NoTracking,
    hand_over_lock,
    row_of,
    unlock,
)
from kvledger.reference.scheduler.request import Req


class MambaV1Path(NoTracking):
    """KV plus a Mamba state at node ends; the working state itself is what gets cached."""

    def __init__(self, pools: MemoryPools, tree: MambaPrefixCache, mamba_pool: MambaStatePool) -> None:
        self.tree = tree
        self.mamba_pool = mamba_pool
        self.rows = pools.req_to_token_pool
        self.page_size = pools.page_size

    def match(self, req: Req, key: list[int], *, cow: bool) -> Matched:
        """Stops at the deepest node with a state; with ``cow`` that state is copied into a slot the waiting
        request holds (its own, or a new one)."""
        res = self.tree.match_prefix(
            key, cow_owner=req.owner if cow else None, cow_slot=req.mamba_pool_idx if cow else None
        )
        if res.mamba_branching_seqlen is not None:  # kept until a later match reports another (SGLang)
            req.mamba_branching_seqlen = res.mamba_branching_seqlen
        # The slot holds a state copied in an earlier round that the new match no longer backs (the node
        # lost its state): the caller gives it back; admission allocates a zeroed one.
        stale = res.cow_slot is None and req.mamba_pool_idx is not None and req.req_pool_idx is None
        return Matched(res.device_indices, res.last_node, stale, res.cow_slot)

    def evict_kv(self, tokens: int) -> None:
        self.tree.evict(tokens)

    def evict_states(self, slots: int) -> None:
        self.tree.evict_mamba(slots)

    def cache_unfinished(self, req: Req) -> None:
        """Cache exactly what was computed, with a fork of the working slot (the request keeps its own)."""
        committed = req.kv_committed_len
        cache_len = floor_to_page(committed, self.page_size)
        if cache_len <= req.cache_protected_len:
            return  # nothing new: never insert an empty key (ghost nodes, B16)
        tokens = req.context_ids()[:cache_len]
        kv = self.rows.read(row_of(req), 0, cache_len)
        if cache_len != committed:
            return  # the working state is at `committed`, not at a page boundary: nothing to cache
        tree_slot = self._fork_for_tree(req)
        if tree_slot is None:
            return  # every state is locked: skip caching this round, the request keeps its KV
        res = self.tree.insert(tokens, kv, req.owner, mamba_slot=tree_slot, protected_len=req.cache_protected_len)
        if not res.mamba_adopted:
            self.mamba_pool.free(tree_slot, req.owner)
        hand_over_lock(self.tree, self.rows, req, tokens, cache_len)

    def _fork_for_tree(self, req: Req) -> torch.Tensor | None:
        assert req.mamba_pool_idx is not None
        slot = self.mamba_pool.fork_from(req.mamba_pool_idx, req.owner)
        if slot is None:
            self.tree.evict_mamba(1)
            slot = self.mamba_pool.fork_from(req.mamba_pool_idx, req.owner)
        return slot

    def cache_finished(self, req: Req) -> int:
        """The tree adopts the committed prefix with the working slot (if the state is exactly there)."""
        committed = req.kv_committed_len
        cache_len = floor_to_page(committed, self.page_size)
        if cache_len <= req.cache_protected_len:
            return req.cache_protected_len
        tokens = req.all_ids()[:cache_len]
        kv = self.rows.read(row_of(req), 0, cache_len)
        if cache_len != committed or req.mamba_pool_idx is None:
            return req.cache_protected_len
        res = self.tree.insert(
            tokens, kv, req.owner, mamba_slot=req.mamba_pool_idx, protected_len=req.cache_protected_len
        )
        if res.mamba_adopted:
            req.mamba_pool_idx = None
        return cache_len

    def release(self, req: Req) -> None:
        unlock(self.tree, req)
