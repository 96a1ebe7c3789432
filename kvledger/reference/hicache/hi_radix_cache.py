"""``HiRadixCache``: a plain radix cache with the host tier, loading a host hit back inside its match.

SGLang's ``HiRadixCache`` reports a host hit from ``match_prefix`` and the prefill adder loads it back at
admission (``init_load_back``): device KV allocated for the tree, the host -> device copy queued, and the
batch's forward waiting for it. kvledger's scheduler asks its tree only for a match, so this tree does
both in one call: the device match, the host tail beyond it, the tail's device KV (device eviction first
when short), the transfer (``LoadBack``: the match waits for it, as SGLang's forward does; ``delay`` polls
then land or fail), and the commit into the tree. The caller gets the longer match; a failed or refused
load leaves the device match as it was. Nothing of the load outlives the call: the load's owner holds the
device slots only inside it, so every step's identity sees them in the tree or free.

Deviation, on purpose: SGLang loads only for a request being admitted; this tree loads for every match
(the scheduler matches waiting requests each round). What it loads stays cached, evictable as any KV.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.contracts.protocols import KVAllocator
from kvledger.reference.hicache.component import HostKVComponent
from kvledger.reference.hicache.copies import HostHit
from kvledger.reference.hicache.host_pool import HostPool
from kvledger.reference.hicache.load_back import FAILED, LANDED, PENDING, LoadBack, PendingLoad
from kvledger.reference.hicache.policy import WritePolicy
from kvledger.reference.radix import RadixCache
from kvledger.reference.radix.results import MatchResult

_load_owners = itertools.count(1)


class HiRadixCache(RadixCache):
    """A ``RadixCache`` whose host component (kind ``host_kv``) backs its nodes up and whose match loads
    a host hit back. Invariant: no load is in flight between public calls (``loads.loads`` is empty)."""

    def __init__(
        self,
        token_to_kv_pool_allocator: KVAllocator,
        host_pool: HostPool,
        device_buffer: torch.Tensor,
        *,
        policy: WritePolicy | None = None,
        delay: int = 0,
        fails: Callable[[PendingLoad], bool] | None = None,
        name: str = "hiradix",
    ) -> None:
        if getattr(token_to_kv_pool_allocator, "page_size", 1) != 1:
            raise InvalidArgument(f"{name}: the host tier is modelled at page size 1")
        self.host = HostKVComponent(host_pool, device_buffer, policy)
        super().__init__(token_to_kv_pool_allocator, name=name, components=[self.host])
        self.loads = LoadBack(self, self.host, delay=delay, fails=fails)
        self.load_stats: Counter[str] = Counter()

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """The device match, extended by a host hit loaded back (see the module docstring)."""
        result = super().match_prefix(key)
        hit = self.host.match_host(key, result.device_indices.numel(), self.page_size)
        if not hit.host_len:
            return result
        lock = self.inc_lock_ref(result.last_node)  # the device prefix stays while the tail loads
        try:
            landed = self._load_back(key, result, hit.host_len, hit)
        finally:
            self.dec_lock_ref(lock)
        return super().match_prefix(key) if landed else result

    def _load_back(self, key: Sequence[int], result: MatchResult, n: int, hit: HostHit) -> bool:
        allocator = self.token_to_kv_pool_allocator
        short = n - allocator.available_size()
        if short > 0:
            self.evict(short)
        owner = Owner("hicache.load", next(_load_owners), REQ_RUNNING)
        ids = allocator.alloc(n, owner)
        if ids is None:
            self.load_stats["refused"] += 1
            return False
        load = self.loads.start(key, hit, ids, owner)
        for _ in range(self.loads.delay + 1):  # the forward waits for the transfer
            self.loads.poll()
        if load.state == LANDED:
            self.loads.commit(load, result.device_indices, result.device_indices.numel())
            self.load_stats["loaded_tokens"] += n
            return True
        if load.state == PENDING:
            self.loads.abort(load)
        self.load_stats["failed" if load.state == FAILED else "aborted"] += 1
        allocator.free(ids, owner)
        return False
