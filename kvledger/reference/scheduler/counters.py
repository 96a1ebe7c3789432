"""Read-only access to the pools' and the tree's own counters, for scheduling decisions and the identity.

The scheduler reads ``available`` and ``evictable`` many times per step (admission budgets, decode
room, eviction shortfalls, the identity's terms). Through the pools' and caches' public accessors each
read would also evaluate their class invariants before and after (icontract), although a read cannot
break them: they are checked around every call that changes those objects, and the busy identity checks
these very counters against the ledger after every step. So the scheduler reads the counters here.

Objects that are not kvledger's own pools or trees (test doubles, adapters) are read through their
public accessors, so nothing depends on the private attributes being there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvledger.contracts.pool_kinds import CacheSide
from kvledger.contracts.protocols import AnyPrefixCache, KVAllocator, MambaStatePool, ReqRowPool
from kvledger.reference.pools.id_free_list import free_list_of


def free_reader(pool: Any) -> tuple[Callable[[], int], Callable[[], int]]:
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
        self._tree: Any = tree  # kvledger's own trees are read through their counters (see the module doc)
        self._own_tree = tree is not None and hasattr(tree, "_evictable") and hasattr(tree, "_protected")
        self._mamba_tree = tree is not None and hasattr(tree, "mamba_evictable_size")

    def tree_counters(self) -> tuple[int, int, int, int]:
        """(KV evictable, KV protected, Mamba evictable, Mamba protected) of the tree; zeros without one."""
        tree = self._tree
        if tree is None:
            return 0, 0, 0, 0
        if self._own_tree:
            return tree._evictable, tree._protected, getattr(tree, "_m_evictable", 0), getattr(tree, "_m_protected", 0)
        if self._mamba_tree:
            return (
                tree.evictable_size(),
                tree.protected_size(),
                tree.mamba_evictable_size(),
                tree.mamba_protected_size(),
            )
        return tree.evictable_size(), tree.protected_size(), 0, 0

    def cache_terms(self) -> dict[CacheSide, tuple[int, int]]:
        """(evictable, protected) per side of the tree (``PoolKind.cached``); zeros without a tree."""
        kv_e, kv_p, m_e, m_p = self.tree_counters()
        return {"kv": (kv_e, kv_p), "mamba": (m_e, m_p)}

    def kv_evictable(self) -> int:
        tree = self._tree
        if tree is None:
            return 0
        return tree._evictable if self._own_tree else tree.evictable_size()

    def mamba_evictable(self) -> int:
        if not self._mamba_tree:
            return 0
        return self._tree._m_evictable if self._own_tree else self._tree.mamba_evictable_size()


def _zero() -> int:
    return 0
