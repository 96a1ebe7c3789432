"""The Mamba component (pool kind ``mamba``): a state slot at a node's end, its lock, list and counters.

A node's state is the recurrent state after its last token; a node without one is a *tombstone* (its KV
stays usable inside a longer match, but no request can start from its end, and an unlocked tombstone leaf
may not stay: I-TOMBSTONE). The state has its own lock (on the node only, not the path), its own LRU list
(refreshed only when a state is used or arrives: rules R1-R3 of spec/mamba-cache-vs-sglang.md) and its
own ledger (``node.mamba_owner`` in the Mamba pool's). Its two policies are SGLang's two buffer modes:
:class:`NoBuffer` (V1, ``no_buffer``) and :class:`ExtraBuffer` (V2, ``extra_buffer``, which reports the
branching point on its chunk grid). :class:`~.mamba_radix_cache.MambaRadixCache` is the tree built with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from kvledger.contracts import tree_checks
from kvledger.contracts.errors import InvalidArgument, LockNotHeld
from kvledger.contracts.mamba_track import branching_seqlen
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, Owner
from kvledger.contracts.protocols import MambaStatePool
from kvledger.reference.pools.id_free_list import free_list_of
from kvledger.reference.pools.validate import as_index_tensor, check_count, check_in_range
from kvledger.reference.radix.component import TreeComponent, register_component
from kvledger.reference.radix.lru import LRUList
from kvledger.reference.radix.results import LockRef
from kvledger.reference.radix.tree_node import TreeNode

MAMBA_POOL_API = ("device", "size", "ledger", "alloc", "free", "_free_unchecked", "_copy_unchecked")
"""What the Mamba tree calls on its state pool (kvledger's ``MambaPool``, or an adapter with the same)."""


def check_mamba_pool(pool: Any, self_device: torch.device | None) -> Any:
    missing = [name for name in MAMBA_POOL_API if not hasattr(pool, name)]
    if pool is None or missing:
        raise InvalidArgument(
            f"mamba_pool: expected a MambaPool, got {type(pool).__name__} (missing {missing})"
        )
    if self_device is not None and pool.device != self_device:
        raise InvalidArgument(f"mamba_pool is on {pool.device}, the KV allocator on {self_device}")
    return pool


class NoBuffer:
    """Mamba V1 (``no_buffer``): states at token granularity, no branching point is ever reported."""

    chunk_size: int | None = None
    label = "V1"

    def branching(self, matched: int, served: int) -> int | None:
        """The branching point of a match that went ``matched`` tokens deep but serves ``served``."""
        return None


class ExtraBuffer:
    """Mamba V2 (``extra_buffer``, SGLang PR #14792): a match through tombstones (or into a split node)
    reports the branching point, the matched length rounded down to the chunk grid (spec/mamba-v2.md)."""

    def __init__(self, chunk_size: int, page_size: int, name: str) -> None:
        check_count(chunk_size, "mamba_cache_chunk_size")
        if chunk_size < 1 or chunk_size % page_size:
            raise InvalidArgument(
                f"{name}: mamba_cache_chunk_size {chunk_size} must be a positive multiple of"
                f" the page size {page_size}"
            )
        self.chunk_size: int | None = chunk_size
        self.label = f"V2 chunk={chunk_size}"

    def branching(self, matched: int, served: int) -> int | None:
        return branching_seqlen(matched, served, cast(int, self.chunk_size))


MambaPolicy = NoBuffer | ExtraBuffer


@register_component
class MambaComponent(TreeComponent):
    """One state slot per non-tombstone node, locked on the node alone, in its own LRU list.

    Invariant: ``counts.evictable`` / ``counts.protected`` are the states of nodes with ``mamba_lock_ref``
    0 / > 0 (I-MAMBA-DEF); a tombstone carries no state lock (I-MAMBA-LOCK)."""

    kind = "mamba"

    def __init__(self, pool: MambaStatePool, name: str, policy: MambaPolicy) -> None:
        super().__init__()
        self.pool = pool
        self.policy = policy
        try:  # the pool's per-id state: what a release build checks a caller's slot against
            self.ids: Any = free_list_of(pool)
        except TypeError:  # an adapter that is not built on an IdFreeList
            self.ids = None
        self.ledger = pool.ledger
        self.checked = bool(self.ledger.enabled)
        self.lru = LRUList(2, f"{name}.mamba")
        self.name = name
        self._evict_states: Callable[[int], int] | None = None

    def bind_eviction(self, evict_states: Callable[[int], int]) -> None:
        """The tree's state eviction (``MambaRadixCache.evict_mamba``: a state goes with its leaf, or its node
        becomes a tombstone, which is the tree's structure): what :meth:`evict_component` runs."""
        self._evict_states = evict_states

    def evict_component(self, amount: int) -> int:
        """Free ``amount`` unlocked states, state-LRU first (the tree's ``evict_mamba``)."""
        if self._evict_states is None:
            raise InvalidArgument(f"{self.name}: the Mamba component's eviction runs through its tree")
        return self._evict_states(amount)

    # ------------------------------------------------------------------ nodes
    def on_new_node(self, node: TreeNode) -> None:
        node.mamba_owner = Owner("node.mamba", node.id, CACHE_EVICTABLE)

    def keeps_leaf(self, node: TreeNode) -> bool:
        return node.mamba_value is not None

    def held(self, node: TreeNode) -> tuple[list[int], Owner] | None:
        if node.mamba_value is None or node.mamba_owner is None:
            return None
        return [int(node.mamba_value[0])], node.mamba_owner

    def free_node(self, node: TreeNode, op: str) -> None:
        if node.mamba_value is not None:
            self.free_state(node, op)

    def free_state(self, node: TreeNode, op: str) -> None:
        """Give the node's state back to the pool (the node stays, a tombstone, unless the tree deletes it)."""
        slot = node.mamba_value
        assert slot is not None and node.mamba_owner is not None
        self.pool._free_unchecked(slot, node.mamba_owner, op)
        self.lru.remove(node)
        node.mamba_value = None
        self.counts.evictable -= 1

    # ------------------------------------------------------------------ match
    def match_len(self, nodes: Sequence[TreeNode]) -> int:
        """Up to the deepest matched node with a state."""
        n = len(nodes)
        while n and nodes[n - 1].mamba_value is None:
            n -= 1
        return n

    def touch(self, node: TreeNode) -> None:
        """Mark ``node``'s state most recently used in the state list (its own stamp: I-LRU-ORDER)."""
        node.mamba_access_time = self._tick()
        self.lru.move_to_mru(node)

    def copy_state(self, src: TreeNode, dst: torch.Tensor) -> None:
        """Copy ``src``'s state into ``dst`` (trusted: dst validated or just allocated for the caller, src a
        tree slot, I-MAMBA-VALUE). The pool schedules it; its batch reads src before src can change."""
        self.pool._copy_unchecked(cast(torch.Tensor, src.mamba_value), dst)

    def check_slot(self, slot: Any, owner: Owner, op: str) -> torch.Tensor:
        """One slot of the pool, handed out, held by ``owner`` (with a ledger): typed errors otherwise."""
        pool = self.pool
        t = slot
        if not (  # the common case (a pool's own 1-slot int64 tensor) checked without a tensor reduction
            isinstance(t, torch.Tensor)
            and t.dtype == torch.int64
            and t.device == pool.device
            and t.dim() == 1
            and t.numel() == 1
            and 1 <= int(t) <= pool.size
        ):
            t = as_index_tensor(slot, pool.device, f"{self.name}.{op}")
            if t.numel() != 1:
                raise InvalidArgument(f"{self.name}.{op}: one state slot expected, got {t.numel()}")
            check_in_range(t, 1, pool.size, pool.name, "slot")
        if self.ids is not None and not self.ids.is_held(int(t)):
            raise InvalidArgument(f"{self.name}.{op}: state slot {int(t)} is not handed out (free)")
        if self.checked:
            self.ledger.require_held_by(t, owner, f"{self.name}.{op}")
        return t

    # ------------------------------------------------------------------ insert
    def check_insert(self, arg: object, owner: Owner, creates_leaf: bool) -> object:
        if arg is None:
            if creates_leaf:
                raise InvalidArgument(
                    f"{self.name}.insert: new tokens need a state (a new leaf without one would be a tombstone"
                    " leaf, I-TOMBSTONE)"
                )
            return None
        return self.check_slot(arg, owner, "insert(mamba_slot)")

    def commit_insert(self, node: TreeNode, arg: object, owner: Owner, op: str) -> bool:
        """``node`` adopts the slot if it has no state (new, or a tombstone revived), as the most recent
        state; the tree gives the node's KV the same fresh time (one time for both lists)."""
        if arg is None or node.mamba_value is not None:
            return False
        self.adopt(node, cast(torch.Tensor, arg), owner, op)
        self.push_recent(node, self._tick())
        return True

    def adopt(self, node: TreeNode, slot: torch.Tensor, owner: Owner, op: str) -> None:
        """``node`` (new, or a tombstone being revived) takes ``slot`` from ``owner``; the caller then makes
        it the most recent state (:meth:`push_recent`)."""
        assert node.mamba_owner is not None
        if self.checked:
            self.ledger.transfer(slot, owner, node.mamba_owner, op)
        node.mamba_value = slot.clone()
        if node.mamba_lock_ref == 0:  # always true: tombstones carry no state lock (I-MAMBA-LOCK)
            self.counts.evictable += 1

    def push_recent(self, node: TreeNode, time: int) -> None:
        """A state that just arrived enters the state list at its most recent end."""
        node.mamba_access_time = time
        self.lru.push_mru(node)

    # ------------------------------------------------------------------ locks
    def lock(self, node: TreeNode) -> bool:
        """The state lock, on ``node`` only, if it has a state now."""
        if node.mamba_value is None:
            return False
        if node.mamba_lock_ref == 0:
            self.counts.evictable -= 1
            self.counts.protected += 1
            node.mamba_owner.set_account(CACHE_PROTECTED, "lock")  # type: ignore[union-attr]
        node.mamba_lock_ref += 1
        return True

    def check_unlock(self, lock: LockRef, op: str) -> None:
        if lock.node.mamba_lock_ref < 1:
            raise LockNotHeld(f"{self.name}.{op}: {lock.node!r} mamba_lock_ref would go below zero")

    def unlock(self, node: TreeNode) -> None:
        if node.mamba_lock_ref == 1:
            self.counts.evictable += 1
            self.counts.protected -= 1
            node.mamba_owner.set_account(CACHE_EVICTABLE, "unlock")  # type: ignore[union-attr]
        node.mamba_lock_ref -= 1

    # ------------------------------------------------------------------ eviction order and audit
    def unlocked_from(self, node: TreeNode | None) -> TreeNode | None:
        """The first state at ``node`` or more recent whose state lock is free."""
        lru = self.lru
        while node is not None and node.mamba_lock_ref > 0:
            node = lru.newer(node)
        return node

    def audit(self, root: TreeNode, nodes: Sequence[TreeNode], own_locks: Counter[int]) -> None:
        """I-MAMBA-DEF, I-MAMBA-LOCK, I-TOMBSTONE, I-MAMBA-VALUE, the state list's I-LRU-ORDER."""
        tree_checks.check_mamba_counters(nodes, self.counts.evictable, self.counts.protected)
        tree_checks.check_mamba_lock(nodes, own_locks)
        tree_checks.check_tombstones(root, nodes)
        tree_checks.check_mamba_values(nodes, self.ledger.holdings if self.checked else None)
        tree_checks.check_lru(
            "mamba",
            self.lru.oldest_first(),
            [n for n in nodes if n.mamba_value is not None],
            time_of=lambda n: n.mamba_access_time,
        )
