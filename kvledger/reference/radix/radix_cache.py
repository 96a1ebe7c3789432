"""``RadixCache``: SGLang's plain prefix cache over a KV allocator, with owners and contracts.

Behaviour follows SGLang's ``RadixCache`` (§1.7 of the memory-model notes): page-aligned keys, a match
that splits a node when it ends inside it, locks propagated to the root, LRU eviction of unlocked
leaves cascading to parents that become unlocked leaves. Differences that are deliberate:

* ``insert`` takes the caller's ``owner`` and ``protected_len`` and frees the caller's duplicate ids
  itself (the 2026 behaviour), exactly once, through the allocator's free path;
* locks are handles (:class:`LockRef`): a double release, a foreign handle or a count going below zero is
  a typed error instead of SGLang's assertion (or, in legacy versions, a silent -1).

Recency as SGLang's: a split makes the new upper node, then the unmatched suffix, the most recent (SGLang
refreshes the child before it splits it). Only the unified tree's auxiliary lists keep the suffix's
place (#38482); the Mamba tree's state list does too (spec/mamba-cache-vs-sglang.md, R1).

Cheap identities run around every public call (class invariants); the O(tree) recounts of §5.2 run in
:meth:`audit`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kvledger.contracts import tree_checks
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, Owner
from kvledger.contracts.protocols import KVAllocator
from kvledger.contracts.switch import ensure, invariant, require, snapshot
from kvledger.reference.radix.base import RadixTreeBase
from kvledger.reference.radix.component import TreeComponent
from kvledger.reference.radix.results import LockRef, MatchResult
from kvledger.reference.radix.tree_node import TreeNode


def kv_counters_agree(cache: RadixTreeBase) -> bool:
    """The cheap form of I-PROTECTED-DEF: token counters == the ledger's CACHE_* accounts x unit.

    Only cache nodes ever hold ids in CACHE_EVICTABLE/CACHE_PROTECTED, so the ledger's account sizes are
    an independent count of the tree's KV.
    """
    led = cache.kv_ledger
    if not led.enabled:
        return True
    return bool(
        led.count(CACHE_EVICTABLE) * led.unit == cache.counts.evictable
        and led.count(CACHE_PROTECTED) * led.unit == cache.counts.protected
    )


def _lock_ref_of(node: Any) -> int | None:
    return node.lock_ref if isinstance(node, TreeNode) else None


def _locked_lock_ref(lock: Any) -> int | None:
    return _lock_ref_of(getattr(lock, "node", None))


@invariant(
    lambda self: kv_counters_agree(self),
    "I-PROTECTED-DEF (cheap form): evictable/protected token counters equal the ledger's CACHE_* accounts",
)
@invariant(
    lambda self: self._evictable >= 0 and self._protected >= 0, "I-CAP: token counters are non-negative"
)
@invariant(lambda self: self.root.lock_ref == 1, "I-LOCK-TREE: the root stays locked exactly once")
class RadixCache(RadixTreeBase):
    """Prefix cache of KV ids keyed by token ids; every node's KV is owned by ``node.kv_owner``."""

    def __init__(
        self,
        token_to_kv_pool_allocator: KVAllocator,
        *,
        page_size: int | None = None,
        name: str = "radix",
        components: Sequence[TreeComponent] = (),
    ) -> None:
        """``components``: the tree components of the other kinds it caches at its nodes (one per kind)."""
        super().__init__(token_to_kv_pool_allocator, page_size, name, components)

    # ------------------------------------------------------------------ match
    @ensure(lambda result: result.device_indices.dtype == torch.int64)
    @ensure(
        lambda self, key, result: (
            result.device_indices.numel() % self.page_size == 0 and result.device_indices.numel() <= len(key)
        ),
        "a match is whole pages of the key",
    )
    @ensure(
        lambda result: result.device_indices.numel() == result.last_node.depth(),
        "the matched KV ends exactly at the returned node",
    )
    @ensure(
        lambda self, result: tree_checks.check_path_recency(self.root, result.last_node),
        "I-LRU-ORDER: after a match every node on the path is more recent than its parent",
    )
    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """The longest cached page-aligned prefix of ``key``: its KV ids and its last node.

        ``key`` is truncated to whole pages. A match ending inside a node splits it; the matched path is
        refreshed in the LRU list, child more recent than parent.
        """
        _, nodes = self._match_key(key)
        if self._extra:
            nodes = nodes[: self._match_len(nodes)]
        self._touch_path(nodes)
        return MatchResult(self._concat(nodes), nodes[-1] if nodes else self.root)

    # ------------------------------------------------------------------ insert
    @snapshot(lambda self: self._evictable, name="evictable")
    @snapshot(lambda self: self._protected, name="protected")
    @ensure(lambda self, key, result: 0 <= result <= len(key) and result % self.page_size == 0)
    @ensure(
        lambda self, key, OLD, result: self._evictable == OLD.evictable + len(key) - result,
        "the tree grows by exactly the tokens that were not cached yet (an unlocked new leaf)",
    )
    @ensure(lambda self, OLD: self._protected == OLD.protected, "insert never changes what is locked")
    def insert(
        self,
        key: Sequence[int],
        value: torch.Tensor,
        owner: Owner,
        protected_len: int = 0,
        *,
        component_args: Mapping[str, object] | None = None,
    ) -> int:
        """Cache ``key -> value``; returns the length that was already cached (``prefix_len``).

        ``value[:protected_len]``: the tree's own ids that the caller matched and still locks (checked).
        ``value[protected_len:prefix_len]``: the caller's duplicates of cached tokens, freed here.
        ``value[prefix_len:]``: adopted by a new leaf (ledger transfer from ``owner``).
        Bad input (unaligned key, length mismatch, wrong protected ids, ids ``owner`` does not hold)
        raises a typed error before anything changes.
        ``component_args``: kind -> what that component's node at the key's end adopts (checked first).
        """
        plan = self._plan_insert(key, value, owner, protected_len)
        args = self._component_args(component_args, plan.creates_leaf, owner)
        if plan.key:
            end, _ = self._apply_insert(plan)
            for comp in self._extra:
                comp.commit_insert(end, args.get(comp.kind), owner, "insert")
        return plan.prefix_len

    def _component_args(
        self, given: Mapping[str, object] | None, creates_leaf: bool, owner: Owner
    ) -> dict[str, object]:
        given = {} if given is None else given
        if not isinstance(given, Mapping) or any(kind not in self._components for kind in given):
            raise InvalidArgument(f"{self.name}.insert: component_args must name kinds of {self.cached_kinds()}")
        return {comp.kind: comp.check_insert(given.get(comp.kind), owner, creates_leaf) for comp in self._extra}

    # ------------------------------------------------------------------ locks
    @snapshot(lambda self, node: _lock_ref_of(node), name="lock_ref")
    @snapshot(lambda self: self._total(), name="total")
    @ensure(lambda self, node, result: result.node is node and not result.released and result in self._locks)
    @ensure(lambda self, node, OLD: node is self.root or node.lock_ref == OLD.lock_ref + 1)
    @ensure(lambda self, OLD: self._total() == OLD.total, "locking moves tokens between accounts only")
    def inc_lock_ref(self, node: TreeNode) -> LockRef:
        """Lock ``node`` and its path to the root against eviction; returns the handle to release."""
        self._check_node(node, "inc_lock_ref")
        took = self._lock_components(node) if self._extra else frozenset()
        self._lock_path(node)
        lock = LockRef(node, took, self._tree_id)
        self._locks.add(lock)
        return lock

    @snapshot(lambda self, lock: _locked_lock_ref(lock), name="lock_ref")
    @snapshot(lambda self: self._total(), name="total")
    @ensure(lambda self, lock: lock.released and lock not in self._locks)
    @ensure(lambda self, lock, OLD: lock.node is self.root or lock.node.lock_ref == OLD.lock_ref - 1)
    @ensure(lambda self, OLD: self._total() == OLD.total, "unlocking moves tokens between accounts only")
    def dec_lock_ref(self, lock: LockRef) -> None:
        """Release a lock from :meth:`inc_lock_ref`; a stale, foreign or doubled release is a typed error."""
        self._check_lock(lock, "dec_lock_ref")
        if lock.took:
            self._unlock_components(lock)
        self._unlock_path(lock.node)
        lock.released = True
        self._locks.discard(lock)
        node = lock.node
        if self._extra and node is not self.root and node.lock_ref == 0 and not node.children:
            self._prune_tombstones(node)

    # ------------------------------------------------------------------ evict
    @snapshot(lambda self: self._evictable, name="evictable")
    @snapshot(lambda self: self._protected, name="protected")
    @ensure(
        lambda self, num_tokens, OLD, result: result >= min(num_tokens, OLD.evictable),
        "evict frees what was asked whenever enough is unlocked",
    )
    @ensure(lambda self, OLD, result: self._evictable == OLD.evictable - result)
    @ensure(
        lambda self, OLD: self._protected == OLD.protected, "I-EVICT-LOCKED: eviction never frees locked KV"
    )
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` tokens (if that many are unlocked), LRU leaves first.

        Returns the tokens freed. A component's tombstone leaves left behind go too (their tokens count).
        """
        return self._evict_lru(num_tokens)

    @require(lambda node: node.lock_ref == 0, "I-EVICT-LOCKED: eviction never touches a locked node")
    @require(lambda node: not node.children, "only leaves are evicted")
    def _evict_leaf(self, node: TreeNode) -> int:
        return self._unlink_leaf(node)

    # ------------------------------------------------------------------ audit
    def audit(self) -> None:
        """The O(tree) recounts of §5.2 (I-NODE-NONEMPTY/I-KEYS, I-LOCK-TREE, I-PROTECTED-DEF,
        I-NO-TREE-ALIAS, I-LRU-ORDER).

        Raises ContractViolation naming the invariant and the evidence.
        """
        self._audit_tree()

    def __repr__(self) -> str:
        return (
            f"RadixCache({self.name}, page={self.page_size}, evictable={self._evictable},"
            f" protected={self._protected}, locks={len(self._locks)})"
        )
