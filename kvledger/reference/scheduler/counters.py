"""Read-only access to the pools' and the tree's own counters, for scheduling decisions and the identity.

The scheduler reads ``available`` and ``evictable`` many times per step (admission budgets, decode
room, eviction shortfalls, the identity's terms). Through the pools' and caches' public accessors each
read would also evaluate their class invariants before and after (icontract), although a read cannot
break them: they are checked around every call that changes those objects, and the busy identity checks
these very counters against the ledger after every step. So the scheduler reads the counters here.

A kvledger pool's counters are read from its public ``free_list``, a tree's from its public ``counts``
(:class:`~kvledger.contracts.protocols.CacheCounts`); a pool that is not kvledger's own (a test double,
an adapter) is read through its public accessors.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from kvledger.contracts.pool_kinds import CacheSide
from kvledger.contracts.protocols import AnyPrefixCache, IdPool, KVAllocator, MambaStatePool, ReqRowPool
from kvledger.reference.pools.id_free_list import free_list_of


def free_reader(pool: IdPool) -> tuple[Callable[[], int], Callable[[], int]]:
    """(free units, pending units) of ``pool``: from its free list, or its public accessors."""
    try:
        ids = free_list_of(pool)
    except TypeError:
        return pool.available_size, pool.pending_free_size
    unit = ids.unit
    if unit == 1:
        return ids.available, ids.pending_count
    return (lambda: ids.available() * unit), (lambda: ids.pending_count() * unit)


class Counters:
    """The counters of one engine's pools and tree (any of ``mamba_pool`` and ``tree`` may be None)."""

    def __init__(
        self,
        *,
        kv_allocator: KVAllocator,
        req_to_token_pool: ReqRowPool,
        mamba_pool: MambaStatePool | None = None,
        tree: AnyPrefixCache | None = None,
    ) -> None:
        self.kv_available, self.kv_pending = free_reader(kv_allocator)
        self.rows_available, self.rows_pending = free_reader(req_to_token_pool)
        if mamba_pool is not None:
            self.mamba_available, self.mamba_pending = free_reader(mamba_pool)
        else:
            self.mamba_available = self.mamba_pending = _zero
        # The tree's counters record (every prefix cache keeps one: ``CacheSizes.counts``), read directly.
        self._counts = None if tree is None else tree.counts

    def tree_counters(self) -> tuple[int, int, int, int]:
        """(KV evictable, KV protected, Mamba evictable, Mamba protected) of the tree; zeros without one."""
        c = self._counts
        if c is None:
            return 0, 0, 0, 0
        return c.evictable, c.protected, c.mamba_evictable, c.mamba_protected

    def cache_terms(self) -> dict[CacheSide, tuple[int, int]]:
        """(evictable, protected) per kind the tree caches (``PoolKind.cached``, read from each tree
        component's counters); zeros for a kind it does not cache, and without a tree."""
        terms: dict[CacheSide, tuple[int, int]] = defaultdict(_zeros)
        c = self._counts
        if c is not None:
            terms["kv"] = (c.evictable, c.protected)
            for kind, k in c.kinds.items():
                terms[kind] = (k.evictable, k.protected)
        return terms

    def kv_evictable(self) -> int:
        return 0 if self._counts is None else self._counts.evictable

    def mamba_evictable(self) -> int:
        return 0 if self._counts is None else self._counts.mamba_evictable


def _zero() -> int:
    return 0


def _zeros() -> tuple[int, int]:
    return 0, 0
