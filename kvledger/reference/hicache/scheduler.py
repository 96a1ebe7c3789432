"""A scheduler with the host tier: the plain scheduler over a :class:`HiRadixCache`, with ``host_kv`` among
its pool kinds, so the per-step identity, the ledger cross-check and the event log's terms cover the host
pool (its evictable / protected terms are the host component's counters: ``HOST_KV.cached``)."""

from __future__ import annotations

from collections.abc import Callable

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.pool_kinds import HOST_KV, POOL_KINDS
from kvledger.contracts.protocols import KVAllocator, MambaStatePool, ReqRowPool
from kvledger.reference.hicache.hi_radix_cache import HiRadixCache
from kvledger.reference.hicache.host_pool import HostPool
from kvledger.reference.scheduler import Scheduler, SchedulerConfig
from kvledger.reference.scheduler.runner import ModelRunner


class HiCacheScheduler(Scheduler):
    """``Scheduler`` + the host tier. Pre: ``tree`` is a :class:`HiRadixCache` over ``kv_allocator``."""

    pool_kinds = (*POOL_KINDS, HOST_KV)

    def __init__(
        self,
        config: SchedulerConfig,
        *,
        kv_allocator: KVAllocator,
        req_to_token_pool: ReqRowPool,
        tree: HiRadixCache,
        mamba_pool: MambaStatePool | None = None,
        runner: ModelRunner | None = None,
        on_step: Callable[[Scheduler], None] | None = None,
    ) -> None:
        if not isinstance(tree, HiRadixCache):
            raise InvalidArgument(f"HiCacheScheduler: tree must be a HiRadixCache, got {type(tree).__name__}")
        self.host_kv_pool: HostPool = tree.host.pool  # before the accounting is built: it reads the pools
        super().__init__(
            config,
            kv_allocator=kv_allocator,
            req_to_token_pool=req_to_token_pool,
            mamba_pool=mamba_pool,
            tree=tree,
            runner=runner,
            on_step=on_step,
        )
