"""``MambaRadixCache``: the hybrid tree where a node may also own a Mamba state slot (§1.8, V1 semantics).

A node's state is the recurrent state after its last token; a node without one is a *tombstone* (its
KV stays usable as part of a longer match, but no request can start from its end). Two locks, two
LRU lists, four counters, two ledgers (KV: ``node.kv_owner``; state: ``node.mamba_owner``).

Recency follows SGLang's MambaRadixCache 0.5.20 (spec/mamba-cache-vs-sglang.md, rules R1-R3): the full
list is refreshed as in the plain tree; a state is refreshed only when it is used or arrives:

* R1: a split leaves the state list alone (the lower node keeps its state and its state's place);
* R2: ``match_prefix`` refreshes only the returned node's state (PR #31643), not every state on the path;
* R3: the insert walk refreshes no state, not even the end node's when it already has one; a state
  enters the list at its most recent end when a node adopts it (new leaf or revived tombstone).

Differences from SGLang that are deliberate (each is a rule D1-D5 of that spec):

* ``inc_lock_ref`` returns a :class:`LockRef` recording whether it took the state; ``dec_lock_ref``
  undoes exactly that (I-LOCK-SYMMETRY, the B14 fix, PR #27147), never re-reading ``mamba_value``;
* copy-on-write is scheduled at once (the pool applies it with its next data-plane batch) and the
  pool-empty retry never asserts: it returns ``cow_slot=None``;
* releasing the last lock on a tombstone *leaf* deletes it (and its tombstone parents that become unlocked
  leaves): it can never be matched, and I-TOMBSTONE forbids an unlocked tombstone leaf. SGLang only
  reaches that state through the lock-a-tombstone path it never takes in V1;
* ``evict_mamba`` tombstones a leaf whose KV is still full-locked instead of asserting;
* page sizes > 1 work as in the plain tree (V1 asserts page size 1).

Mamba V2 (``extra_buffer``, SGLang PR #14792; spec/mamba-v2.md): built with ``mamba_cache_chunk_size``,
``match_prefix`` also reports the branching point (``MatchResult.mamba_branching_seqlen``). Everything
else is the same tree: in V2 a node's state arrives by donation (the request's tracking slot, inserted
with ``state_op="donate"``) instead of a fork or the working slot, and no insert is ever state-less, so
I-TOMBSTONE holds in both modes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch

from kvledger.contracts import tree_checks
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, Owner
from kvledger.contracts.protocols import KVAllocator, MambaStatePool
from kvledger.contracts.seams import seam
from kvledger.contracts.switch import ensure, invariant, require, snapshot
from kvledger.reference.pools.validate import check_count
from kvledger.reference.radix.base import InsertPlan, RadixTreeBase
from kvledger.reference.radix.mamba_component import (
    ExtraBuffer,
    MambaComponent,
    NoBuffer,
    check_mamba_pool,
)
from kvledger.reference.radix.radix_cache import kv_counters_agree
from kvledger.reference.radix.results import InsertResult, LockRef, MatchResult
from kvledger.reference.radix.tree_node import TreeNode


def mamba_counters_agree(cache: MambaRadixCache) -> bool:
    """The cheap form of I-MAMBA-DEF: state counters == the Mamba ledger's CACHE_* accounts."""
    comp = cache.mamba
    led = comp.ledger
    if not led.enabled:
        return True
    return bool(
        led.count(CACHE_EVICTABLE) == comp.counts.evictable and led.count(CACHE_PROTECTED) == comp.counts.protected
    )


def _attr_of_node(lock_or_node: object, attr: str) -> int | None:
    node = getattr(lock_or_node, "node", lock_or_node)
    return getattr(node, attr) if isinstance(node, TreeNode) else None


def _branching_is_v2s(cache: MambaRadixCache, result: MatchResult) -> bool:
    """I-BRANCHING: V1 never reports a branching point; V2 reports one on its chunk grid. (It may lie at or
    below the returned state, as in SGLang: the scheduler only uses one inside the request's extend.)"""
    b = result.mamba_branching_seqlen
    if cache.mamba_cache_chunk_size is None or b is None:
        return b is None
    return b > 0 and b % cache.mamba_cache_chunk_size == 0


def _cow_slot_is_callers(cache: MambaRadixCache, cow_owner: object, result: MatchResult) -> bool:
    if result.cow_slot is None:
        return True
    if cow_owner is None or result.cow_slot.numel() != 1:
        return False
    return not cache.mamba.checked or cache.mamba.ledger.owner_of(int(result.cow_slot)) is cow_owner


@invariant(
    lambda self: kv_counters_agree(self),
    "I-PROTECTED-DEF (cheap form): full token counters equal the KV ledger's CACHE_* accounts",
)
@invariant(
    lambda self: mamba_counters_agree(self),
    "I-MAMBA-DEF (cheap form): state counters equal the Mamba ledger's CACHE_* accounts",
)
@invariant(
    lambda self: min(self._evictable, self._protected, self._m_evictable, self._m_protected) >= 0,
    "I-CAP: counters are non-negative",
)
@invariant(
    lambda self: self.root.lock_ref == 1 and self.root.mamba_value is None, "I-LOCK-TREE: the root: locked, no state"
)
class MambaRadixCache(RadixTreeBase):
    """Prefix cache of KV ids plus Mamba state slots at node ends."""

    STRUCTURE_STEPS: ClassVar[Mapping[str, str]] = {**RadixTreeBase.STRUCTURE_STEPS, "copy_state": "_copy_state"}

    def __init__(
        self,
        token_to_kv_pool_allocator: KVAllocator,
        mamba_pool: MambaStatePool,
        *,
        page_size: int | None = None,
        mamba_cache_chunk_size: int | None = None,
        name: str = "mamba_radix",
    ) -> None:
        check_mamba_pool(mamba_pool, self_device=None)
        # The V2 policy checks its chunk against the tree's page size (the allocator's when page_size is
        # None): the component starts as V1 and takes its policy once the base has checked the page size.
        self.mamba = MambaComponent(mamba_pool, name, NoBuffer())
        super().__init__(token_to_kv_pool_allocator, page_size, name, (self.mamba,))
        check_mamba_pool(mamba_pool, self_device=self.device)
        if mamba_cache_chunk_size is not None:  # V2 (extra_buffer): the grid of branching points
            self.mamba.policy = ExtraBuffer(mamba_cache_chunk_size, self.page_size, name)
        self.mamba_pool = mamba_pool
        self._mamba_lru = self.mamba.lru
        self.mamba.bind_eviction(lambda n: self.evict_mamba(n))  # component("mamba").evict_component(n)
        # counts.kinds["mamba"]: state slots of non-tombstone nodes with mamba_lock_ref == 0 (evictable)
        # and > 0 (protected), kept by the component.

    @property
    def mamba_cache_chunk_size(self) -> int | None:
        """None: V1 (no_buffer). Set: V2 (extra_buffer), the chunk grid of branching points."""
        return self.mamba.policy.chunk_size

    def mamba_lru_order(self) -> tuple[TreeNode, ...]:
        """The nodes of the Mamba (state) LRU list, least recently used first (a read-only view)."""
        return tuple(self._mamba_lru.oldest_first())

    # The component's counters by their historical private names (the tests that break them).
    @property
    def _m_evictable(self) -> int:
        return self.mamba.counts.evictable

    @_m_evictable.setter
    def _m_evictable(self, n: int) -> None:
        self.mamba.counts.evictable = n

    @property
    def _m_protected(self) -> int:
        return self.mamba.counts.protected

    @_m_protected.setter
    def _m_protected(self, n: int) -> None:
        self.mamba.counts.protected = n

    def _touch_state(self, node: TreeNode) -> None:
        """Mark ``node``'s state most recently used in the state list (its own stamp: I-LRU-ORDER)."""
        self.mamba.touch(node)

    # ------------------------------------------------------------------ match
    @ensure(
        lambda self, result: result.last_node is self.root or result.last_node.mamba_value is not None,
        "I-MATCH-STATE: match_prefix returns a node with a state, or the root",
    )
    @ensure(
        lambda result: result.device_indices.numel() == result.last_node.depth(),
        "I-MATCH-STATE: the returned KV prefix ends exactly at the returned node",
    )
    @ensure(
        lambda self, result: _branching_is_v2s(self, result),
        "I-BRANCHING: a branching point only in V2, and on its chunk grid",
    )
    @ensure(
        lambda self, cow_owner, result: _cow_slot_is_callers(self, cow_owner, result),
        "I-MAMBA-VALUE: a COW slot is one slot held by the caller, never the tree's",
    )
    @ensure(
        lambda self, result: tree_checks.check_path_recency(self.root, result.last_node),
        "I-LRU-ORDER: after a match every node on the path is more recent than its parent",
    )
    def match_prefix(
        self, key: Sequence[int], *, cow_owner: Owner | None = None, cow_slot: torch.Tensor | None = None
    ) -> MatchResult:
        """The longest cached prefix of ``key`` that ends at a node with a state (or the root).

        With ``cow_owner``: copy that state into ``cow_slot`` (a slot ``cow_owner`` holds) or into a new
        slot allocated for ``cow_owner``; if the pool is empty, evict one state with the source pinned
        and retry, else give up (``cow_slot=None``: the caller cannot admit now). With no state on the
        path ``cow_slot`` is None and the caller's slot, if any, is left untouched (its contents are
        stale for this match).

        V2: ``mamba_branching_seqlen`` is set when the matched KV goes past the returned node (through
        tombstones, or into a node the match split) and reaches the first chunk boundary.
        """
        dst = self._check_cow_args(cow_owner, cow_slot)
        _, nodes = self._match_key(key)
        path = nodes[: self._best_prefix(nodes)]
        self._touch_path(path)  # full list: root..best node; a tombstone tail below it is not used
        last = path[-1] if path else self.root
        if last.mamba_value is not None:
            self._touch_state(last)  # R2: only the state this match hands out (PR #31643)
        slot = None
        if cow_owner is not None and last.mamba_value is not None:
            slot = self._copy_on_write(last, cow_owner, dst)
        value = self._concat(path)
        branching = None
        if len(nodes) > len(path):
            branching = self.mamba.policy.branching(sum(len(n.key) for n in nodes), int(value.numel()))
        return MatchResult(value, last, slot, branching)

    @ensure(
        lambda self, result: tree_checks.check_path_recency(self.root, result.last_node),
        "I-LRU-ORDER: after a match every node on the path is more recent than its parent",
    )
    def match_prefix_kv(self, key: Sequence[int]) -> MatchResult:
        """The longest cached page-aligned KV prefix of ``key``, whatever states its nodes hold (SGLang's
        ``skip_mamba_match``, used by a PD decode instance whose states arrive by transfer).

        No copy-on-write and no state touched: the returned node may be a tombstone, and a lock on it then
        protects the KV only (``LockRef.took_mamba`` is False).
        """
        _, nodes = self._match_key(key)
        self._touch_path(nodes)
        return MatchResult(self._concat(nodes), nodes[-1] if nodes else self.root)

    def _best_prefix(self, nodes: Sequence[TreeNode]) -> int:
        """How many nodes of the matched path to keep: up to the deepest one with a state."""
        return self.mamba.match_len(nodes)

    def _check_cow_args(self, cow_owner: object, cow_slot: object) -> torch.Tensor | None:
        if cow_owner is None:
            if cow_slot is not None:
                raise InvalidArgument(f"{self.name}.match_prefix: cow_slot given without cow_owner")
            return None
        if not isinstance(cow_owner, Owner):
            raise InvalidArgument(f"{self.name}.match_prefix: cow_owner must be an Owner")
        if cow_slot is None:
            return None
        return self._check_slot(cow_slot, cow_owner, "match_prefix(cow_slot)")

    def _check_slot(self, slot: object, owner: Owner, op: str) -> torch.Tensor:
        return self.mamba.check_slot(slot, owner, op)

    def _copy_on_write(self, src: TreeNode, owner: Owner, dst: torch.Tensor | None) -> torch.Tensor | None:
        if dst is not None:
            self._copy_state(src, dst)
            return dst
        slot = self.mamba_pool.alloc(1, owner)
        if slot is not None:
            self._copy_state(src, slot)
            return slot
        # Pool empty: evict one state, with the source pinned so it cannot be the victim (I-COW-SOURCE).
        lock = self._pin_for_cow(src)
        try:
            self.evict_mamba(1)
            slot = self.mamba_pool.alloc(1, owner)
            if slot is not None:
                self._copy_state(src, slot)
        finally:
            self._unpin(lock)
        return slot

    def _pin_for_cow(self, node: TreeNode) -> LockRef:
        return self.inc_lock_ref(node)

    def _unpin(self, lock: LockRef) -> None:
        self.dec_lock_ref(lock)

    @require(
        lambda self, src: src is not self.root and src.live and len(src.key) > 0,
        "I-COW-SOURCE: the copy source is a non-empty node still in the tree (B16 ghost node)",
    )
    @require(
        lambda src: src.mamba_value is not None,
        "I-COW-SOURCE: the copy source still holds its state (it must stay pinned until the copy)",
    )
    def _copy_state(self, src: TreeNode, dst: torch.Tensor) -> None:
        self.mamba.copy_state(src, dst)

    # ------------------------------------------------------------------ insert
    @snapshot(lambda self: self._evictable, name="evictable")
    @snapshot(lambda self: self._protected, name="protected")
    @snapshot(lambda self: self._m_evictable, name="m_evictable")
    @snapshot(lambda self: self._m_protected, name="m_protected")
    @ensure(
        lambda self, key, result: (
            0 <= result.prefix_len <= len(key) and result.prefix_len % self.page_size == 0
        ),
        "I-PAGE-UNIT: insert reports a page-aligned prefix length within the key",
    )
    @ensure(
        lambda self, key, OLD, result: self._evictable == OLD.evictable + len(key) - result.prefix_len,
        "I-PROTECTED-DEF: the tree grows by exactly the tokens that were not cached yet",
    )
    @ensure(
        lambda self, OLD, result: self._m_evictable == OLD.m_evictable + int(result.mamba_adopted),
        "I-MAMBA-DEF: the tree gains a state only by adopting the caller's slot",
    )
    @ensure(
        lambda self, OLD: self._protected == OLD.protected and self._m_protected == OLD.m_protected,
        "I-LOCK-TREE: insert never changes what is locked",
    )
    def insert(
        self,
        key: Sequence[int],
        value: torch.Tensor,
        owner: Owner,
        *,
        mamba_slot: torch.Tensor | None,
        protected_len: int = 0,
        state_op: str = "insert",
    ) -> InsertResult:
        """KV as :meth:`RadixCache.insert`; the node ending at ``len(key)`` adopts ``mamba_slot`` if it is new
        or a tombstone (revival). If it already has a state, ``mamba_adopted`` is False and the caller
        frees its slot. ``mamba_slot=None`` is allowed only when no new leaf is needed (a new leaf without
        a state would be a tombstone leaf, I-TOMBSTONE). ``state_op`` names the slot's ledger move
        (``donate``: a V2 request hands its tracking slot over).
        """
        if not isinstance(state_op, str) or state_op not in ("insert", "donate"):
            raise InvalidArgument(f"{self.name}.insert: state_op must be 'insert' or 'donate', got {state_op!r}")
        plan = self._plan_insert(key, value, owner, protected_len)
        slot = self._check_insert_slot(mamba_slot, owner, plan)
        if not plan.key:
            return InsertResult(0, False)
        end, _ = self._apply_insert(plan)
        if not self.mamba.commit_insert(end, slot, owner, state_op):
            return InsertResult(plan.prefix_len, False, end)
        # SGLang: insert_mru into the state list, reset_node_mru in the full one, at one fresh time
        end.last_access_time = end.mamba_access_time
        self._full_lru.move_to_mru(end)
        return InsertResult(plan.prefix_len, True, end)

    def _check_insert_slot(self, mamba_slot: object, owner: Owner, plan: InsertPlan) -> torch.Tensor | None:
        if mamba_slot is None:
            if plan.creates_leaf:
                raise InvalidArgument(
                    f"{self.name}.insert: {len(plan.key) - plan.prefix_len} new tokens need a state"
                    " (a new leaf without one would be a tombstone leaf, I-TOMBSTONE)"
                )
            return None
        return self._check_slot(mamba_slot, owner, "insert(mamba_slot)")

    # ------------------------------------------------------------------ locks
    @snapshot(lambda self, node: _attr_of_node(node, "lock_ref"), name="lock_ref")
    @snapshot(lambda self, node: _attr_of_node(node, "mamba_lock_ref"), name="mamba_lock_ref")
    @ensure(
        lambda self, node, result: result.node is node and not result.released and result in self._locks,
        "I-LOCK-SYMMETRY: inc returns a live handle on the node, recorded by the tree",
    )
    @ensure(
        lambda self, node, OLD: node is self.root or node.lock_ref == OLD.lock_ref + 1,
        "I-LOCK-TREE: inc adds one lock to the node",
    )
    @ensure(
        lambda node, OLD, result: (
            node.mamba_lock_ref == OLD.mamba_lock_ref + int(result.took_mamba)
            and result.took_mamba == (node.mamba_value is not None)
        ),
        "I-MAMBA-LOCK: the state is locked iff the node has one now, and the handle records it",
    )
    def inc_lock_ref(self, node: TreeNode) -> LockRef:
        """Full lock from ``node`` to the root; state lock on ``node`` only, if it has a state now."""
        self._check_node(node, "inc_lock_ref")
        took = self._lock_components(node)
        self._lock_path(node)
        lock = LockRef(node, took, self._tree_id)
        self._locks.add(lock)
        return lock

    @snapshot(lambda self, lock: _attr_of_node(lock, "lock_ref"), name="lock_ref")
    @snapshot(lambda self, lock: _attr_of_node(lock, "mamba_lock_ref"), name="mamba_lock_ref")
    @ensure(
        lambda self, lock: lock.released and lock not in self._locks,
        "I-LOCK-SYMMETRY: dec marks the handle released and the tree forgets it",
    )
    @ensure(
        lambda self, lock, OLD: lock.node is self.root or lock.node.lock_ref == OLD.lock_ref - 1,
        "I-LOCK-TREE: dec removes one lock from the node",
    )
    @ensure(
        lambda lock, OLD: lock.node.mamba_lock_ref == OLD.mamba_lock_ref - int(lock.took_mamba),
        "I-LOCK-SYMMETRY: dec undoes exactly the state lock inc took (B14), whatever mamba_value is now",
    )
    def dec_lock_ref(self, lock: LockRef) -> None:
        """Release ``lock``: exactly the components it recorded. A tombstone leaf left unlocked is deleted."""
        self._check_lock(lock, "dec_lock_ref")
        node = lock.node
        if self._mamba_component_to_release(lock):
            self.mamba.unlock(node)
        self._unlock_path(node)
        lock.released = True
        self._locks.discard(lock)
        if node is not self.root and node.lock_ref == 0 and node.mamba_value is None and not node.children:
            self._prune_tombstones(node)

    @seam
    def _mamba_component_to_release(self, lock: LockRef) -> bool:
        """The B14 decision point: the record taken at inc time, never the node's current state."""
        return lock.took_mamba

    # ------------------------------------------------------------------ eviction
    @snapshot(lambda self: self._evictable, name="evictable")
    @snapshot(lambda self: (self._protected, self._m_protected), name="protected")
    @ensure(
        lambda self, num_tokens, OLD, result: result >= min(num_tokens, OLD.evictable),
        "I-MODEL-EVICT: evict frees what was asked whenever enough is unlocked",
    )
    @ensure(
        lambda self, OLD, result: self._evictable == OLD.evictable - result,
        "I-PROTECTED-DEF: the evictable count drops by what evict reports",
    )
    @ensure(
        lambda self, OLD: (self._protected, self._m_protected) == OLD.protected,
        "I-EVICT-LOCKED: eviction never frees locked KV or a locked state",
    )
    def evict_full(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` KV tokens: unlocked leaves (with their states) in full-LRU order,
        cascading to tombstone parents that become unlocked leaves. Returns tokens freed."""
        return self._evict_lru(num_tokens)

    def evict(self, num_tokens: int) -> int:
        """Same as :meth:`evict_full` (the scheduler's KV eviction)."""
        return self.evict_full(num_tokens)

    @snapshot(lambda self: self._m_evictable, name="m_evictable")
    @snapshot(lambda self: (self._protected, self._m_protected), name="protected")
    @ensure(
        lambda self, num_slots, OLD, result: result >= min(num_slots, OLD.m_evictable),
        "I-MODEL-EVICT: evict_mamba frees what was asked whenever enough states are unlocked",
    )
    @ensure(
        lambda self, OLD, result: self._m_evictable == OLD.m_evictable - result,
        "I-MAMBA-DEF: the evictable state count drops by what evict_mamba reports",
    )
    @ensure(
        lambda self, OLD: (self._protected, self._m_protected) == OLD.protected,
        "I-EVICT-LOCKED: eviction never frees locked KV or a locked state",
    )
    def evict_mamba(self, num_slots: int) -> int:
        """Free ``num_slots`` states in state-LRU order. An internal node (or a leaf whose KV is still locked)
        becomes a tombstone, keeping its KV; an unlocked leaf is evicted whole (+ cascade).
        Returns slots freed."""
        check_count(num_slots, "num_slots")
        freed = 0
        x = self._state_unlocked_from(self._mamba_lru.oldest())
        while freed < num_slots and x is not None:
            nxt = self._state_unlocked_from(self._mamba_lru.newer(x))
            if x.children or x.lock_ref > 0:
                self._tombstone(x)
            else:
                parent = x.parent
                assert parent is not None
                self._evict_leaf(x)
                self._prune_tombstones(parent)
            freed += 1
            x = nxt
        return freed

    def _state_unlocked_from(self, node: TreeNode | None) -> TreeNode | None:
        return self.mamba.unlocked_from(node)

    @require(lambda node: node.mamba_lock_ref == 0, "I-EVICT-LOCKED: a locked state is never tombstoned")
    def _tombstone(self, node: TreeNode) -> None:
        self.mamba.free_state(node, "evict_mamba")

    @require(
        lambda node: node.lock_ref == 0 and node.mamba_lock_ref == 0,
        "I-EVICT-LOCKED: eviction never touches a locked node",
    )
    @require(lambda node: not node.children, "I-MODEL-SHRINK: only leaves are evicted")
    def _evict_leaf(self, node: TreeNode) -> int:
        """Delete an unlocked leaf: its state (if any) and its KV go back to their pools. Returns tokens."""
        return self._unlink_leaf(node)

    # ------------------------------------------------------------------ sizes and audit
    def full_evictable_size(self) -> int:
        return self._evictable

    def full_protected_size(self) -> int:
        return self._protected

    def mamba_evictable_size(self) -> int:
        return self._m_evictable

    def mamba_protected_size(self) -> int:
        return self._m_protected

    def mamba_total_size(self) -> int:
        """State slots in the tree."""
        return self._m_evictable + self._m_protected

    def audit(self) -> None:
        """§5.2 recounts + I-MAMBA-DEF, I-MAMBA-LOCK, I-TOMBSTONE, I-MAMBA-VALUE, state-list I-LRU-ORDER."""
        self._audit_tree()

    def __repr__(self) -> str:
        mode = self.mamba.policy.label
        return (
            f"MambaRadixCache({self.name}, {mode}, page={self.page_size},"
            f" full E/P={self._evictable}/{self._protected},"
            f" mamba E/P={self._m_evictable}/{self._m_protected}, locks={len(self._locks)})"
        )
