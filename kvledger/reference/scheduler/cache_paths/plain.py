"""The two paths without Mamba states: no prefix cache, and the plain radix cache (KV only)."""

from __future__ import annotations

import torch

from kvledger.contracts.arith import floor_to_page
from kvledger.contracts.protocols import PrefixCache
from kvledger.reference.scheduler.cache_paths.base import (
    Matched,
    MemoryPools,
    NoTracking,
    hand_over_lock,
    row_of,
    unlock,
)
from kvledger.reference.scheduler.request import Req


class NoCachePath(NoTracking):
    """No prefix cache (SGLang's ``ChunkCache``): every match is empty, a request keeps its whole KV until
    it is released and frees all of it then."""

    def __init__(self, pools: MemoryPools) -> None:
        self._empty = torch.empty(0, dtype=torch.int64, device=pools.kv_allocator.device)

    def match(self, req: Req, key: list[int], *, cow: bool) -> Matched:
        return Matched(self._empty, None)

    def evict_kv(self, tokens: int) -> None:
        return None  # nothing cached

    def cache_unfinished(self, req: Req) -> None:
        return None

    def cache_finished(self, req: Req) -> int:
        return req.cache_protected_len

    def release(self, req: Req) -> None:
        return None  # no tree, no lock


class RadixPath(NoTracking):
    """The plain radix cache: the tree adopts the computed prefix up to the last page boundary."""

    def __init__(self, pools: MemoryPools, tree: PrefixCache) -> None:
        self.tree = tree
        self.rows = pools.req_to_token_pool
        self.page_size = pools.page_size

    def match(self, req: Req, key: list[int], *, cow: bool) -> Matched:
        res = self.tree.match_prefix(key)
        return Matched(res.device_indices, res.last_node)

    def evict_kv(self, tokens: int) -> None:
        self.tree.evict(tokens)

    def cache_unfinished(self, req: Req) -> None:
        cache_len = floor_to_page(req.kv_committed_len, self.page_size)
        if cache_len <= req.cache_protected_len:
            return  # nothing new: never insert an empty key (ghost nodes, B16)
        tokens = req.context_ids()[:cache_len]
        kv = self.rows.read(row_of(req), 0, cache_len)
        self.tree.insert(tokens, kv, req.owner, protected_len=req.cache_protected_len)
        hand_over_lock(self.tree, self.rows, req, tokens, cache_len)

    def cache_finished(self, req: Req) -> int:
        cache_len = floor_to_page(req.kv_committed_len, self.page_size)
        if cache_len <= req.cache_protected_len:
            return req.cache_protected_len
        tokens = req.all_ids()[:cache_len]
        kv = self.rows.read(row_of(req), 0, cache_len)
        self.tree.insert(tokens, kv, req.owner, protected_len=req.cache_protected_len)
        return cache_len

    def release(self, req: Req) -> None:
        unlock(self.tree, req)
