"""The machinery both radix caches share: walk, split, touch, insert planning, full locks, deletion.

A tree is its full component (kind ``kv``, :mod:`.full_component`: the KV every node owns) plus one tree
component per other cached kind (:mod:`.component`), called at each point where what a node holds
matters: a node made, split or deleted, a match's length, an insert's argument, a lock and its release,
a leaf that may not stay (a tombstone), the counters and the audit.

Public methods (and their contracts) live in ``RadixCache`` and ``MambaRadixCache``; this base only has
private helpers (and the read-only views, ``cached_kinds`` and ``component``), so icontract's class
invariants (checked around public methods only) may be broken temporarily inside them. Control plane
only: tensors are sliced, concatenated and compared, never written; KV ids return to the allocator
through its free path with the owning node's ``Owner``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvledger.contracts import tree_checks
from kvledger.contracts.errors import (
    ContractViolation,
    ForeignNode,
    InvalidArgument,
    InvalidKey,
    LockNotHeld,
    PrefixMismatch,
)
from kvledger.contracts.ledger_by_level import AnyLedger
from kvledger.contracts.owners import Owner
from kvledger.contracts.protocols import CacheCounts, KVAllocator
from kvledger.contracts.switch import require
from kvledger.reference.pools.validate import as_index_tensor, check_count, check_name, check_owner
from kvledger.reference.radix.component import TreeComponent
from kvledger.reference.radix.full_component import FullComponent
from kvledger.reference.radix.keys import as_key, common_prefix_len
from kvledger.reference.radix.results import LockRef
from kvledger.reference.radix.tree_node import TreeNode

_tree_ids = itertools.count(1)


@dataclass
class InsertPlan:
    """A validated insert, computed before anything changes (so bad input leaves everything as it was)."""

    key: tuple[int, ...]
    value: torch.Tensor
    owner: Owner
    protected_len: int
    path: list[tuple[TreeNode, int]]  # (node, tokens of it the key matches), root excluded
    prefix_len: int

    @property
    def creates_leaf(self) -> bool:
        return self.prefix_len < len(self.key)


OBSERVABLE_STEPS = frozenset({"new_leaf", "split", "unlink_leaf", "copy_state"})
"""Every step an observer may name (``copy_state``: the Mamba tree only; another tree skips it)."""

StepWrapper = Callable[[Callable[..., Any]], Callable[..., Any]]
"""An observer's wrapper of one structural step (:meth:`RadixTreeBase.observe_steps`)."""


class RadixTreeBase:
    """State and private helpers common to the plain and the Mamba radix cache."""

    def __init__(
        self,
        token_to_kv_pool_allocator: KVAllocator,
        page_size: int | None,
        name: str,
        components: Sequence[TreeComponent] = (),
    ) -> None:
        check_name(name)
        full = FullComponent(token_to_kv_pool_allocator, name)
        kv = full.kv
        ps = kv.alloc_page if page_size is None else check_count(page_size, "page_size")
        if ps < 1 or ps % kv.alloc_page:
            raise InvalidArgument(
                f"{name}: page_size {ps} must be a positive multiple of the allocator's {kv.alloc_page}"
            )
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size: int = ps
        self.name = name
        self.device = kv.device
        self._on_cpu = kv.device.type == "cpu"
        self._full = full
        self._kv = kv
        self._full_lru = full.lru
        self._extra = self._check_components(components)
        self._components: dict[str, TreeComponent] = {"kv": full}
        # evictable: tokens of non-root nodes with lock_ref == 0; protected: ... with lock_ref > 0; every
        # other kind's counters in counts.kinds. Public: the scheduler reads them every step (CacheCounts).
        self.counts: CacheCounts = full.counts
        self._clock = 0
        for comp in self._extra:
            self._components[comp.kind] = comp
            self.counts.kinds[comp.kind] = comp.counts
            comp.attach(self._next_time)
        self._tree_id = next(_tree_ids)
        self._empty = torch.empty((0,), dtype=torch.int64, device=self.device)
        self.root = self._make_node((), self._empty, None)
        self.root.lock_ref = 1  # the root is permanently locked and never counted (SGLang)
        self._locks: set[LockRef] = set()  # live lock handles: I-LOCK-TREE recounts own(n) from them

    def _check_components(self, components: Sequence[TreeComponent]) -> tuple[TreeComponent, ...]:
        kinds = [getattr(c, "kind", None) for c in components]
        if not all(isinstance(c, TreeComponent) for c in components):
            raise InvalidArgument(f"{self.name}: components must be TreeComponents, got {kinds}")
        if len(set(kinds)) != len(kinds) or "kv" in kinds:
            raise InvalidArgument(f"{self.name}: one component per kind besides the full one (kv), got {kinds}")
        return tuple(components)

    # ------------------------------------------------------------------ components by kind
    def cached_kinds(self) -> tuple[str, ...]:
        """The pool kinds this tree holds at its nodes, by name: ``kv`` first, then its components'."""
        return tuple(self._components)

    def component(self, kind: str) -> TreeComponent:
        """The tree component of pool kind ``kind``; InvalidArgument if this tree does not cache that kind."""
        comp = self._components.get(kind)
        if comp is None:
            raise InvalidArgument(f"{self.name} caches {list(self._components)}, not {kind!r}")
        return comp

    def _next_time(self) -> int:
        """The next recency time (one clock for every list of this tree: the full one and its components')."""
        self._clock += 1
        return self._clock

    # The counters by their historical private names (the tree's own code and the tests that break them).
    @property
    def _evictable(self) -> int:
        return self.counts.evictable

    @_evictable.setter
    def _evictable(self, n: int) -> None:
        self.counts.evictable = n

    @property
    def _protected(self) -> int:
        return self.counts.protected

    @_protected.setter
    def _protected(self, n: int) -> None:
        self.counts.protected = n

    @property
    def kv_ledger(self) -> AnyLedger:
        """The ledger the tree's KV ids are recorded in (the allocator's: tokens, or pages when paged)."""
        return self._kv.ledger

    # ------------------------------------------------------------------ read-only views
    # For tools that record or compare a tree without taking part in it (the audit recorder, the museum's
    # and the sweep's snapshots): what they read, by public names.
    STRUCTURE_STEPS: ClassVar[Mapping[str, str]] = {
        "new_leaf": "_new_leaf",
        "split": "_split",
        "unlink_leaf": "_unlink_leaf",
    }
    """The structural steps :meth:`observe_steps` can wrap, by public name (the Mamba tree adds one)."""

    @property
    def clock(self) -> int:
        """The recency clock: the last access time handed out (full and Mamba lists share it)."""
        return self._clock

    def live_locks(self) -> tuple[LockRef, ...]:
        """The lock handles ``inc_lock_ref`` returned that are not yet released (no particular order)."""
        return tuple(self._locks)

    def lru_order(self) -> tuple[TreeNode, ...]:
        """The nodes of the full (KV) LRU list, least recently used first."""
        return tuple(self._full_lru.oldest_first())

    def observe_steps(self, wrappers: Mapping[str, StepWrapper]) -> Callable[[], None]:
        """Wrap this tree's structural steps on the instance, for an observer (the audit recorder):
        ``wrappers[step]`` receives the bound step and returns what runs in its place. Steps this tree
        does not have (:data:`STRUCTURE_STEPS`) are skipped. Returns the function that removes the wrappers.

        The steps are where a node comes into being, splits or goes (and, for the Mamba tree, where a state
        is copied on a match): an observer that wants to record them in order has no public call to wrap.
        Bad input (not a mapping, an unknown step, a wrapper that is not callable) is ``InvalidArgument``
        before anything is wrapped.
        """
        if not isinstance(wrappers, Mapping):
            got = type(wrappers).__name__
            raise InvalidArgument(f"{self.name}.observe_steps: wrappers must be a mapping, got {got}")
        for step, wrap in wrappers.items():
            if step not in OBSERVABLE_STEPS:
                raise InvalidArgument(f"{self.name}.observe_steps: unknown step {step!r}")
            if not callable(wrap):
                raise InvalidArgument(f"{self.name}.observe_steps: the wrapper of {step!r} is not callable")
        wrapped: list[str] = []
        for step, attr in self.STRUCTURE_STEPS.items():
            if step in wrappers:
                setattr(self, attr, wrappers[step](getattr(self, attr)))
                wrapped.append(attr)

        def undo() -> None:
            for attr in reversed(wrapped):
                if attr in vars(self):
                    delattr(self, attr)

        return undo

    # ------------------------------------------------------------------ sizes
    def _total(self) -> int:
        return self._evictable + self._protected

    # ------------------------------------------------------------------ nodes and recency
    def _make_node(self, key: tuple[int, ...], value: torch.Tensor, parent: TreeNode | None) -> TreeNode:
        node = TreeNode(self._tree_id, key, value, parent)
        for comp in self._extra:
            comp.on_new_node(node)
        return node

    def _keeps_leaf(self, node: TreeNode) -> bool:
        """Whether every component lets the unlocked leaf ``node`` stay (False: a tombstone leaf)."""
        return all(comp.keeps_leaf(node) for comp in self._extra)

    def _match_len(self, nodes: Sequence[TreeNode]) -> int:
        """How many nodes of a matched path every component can serve a request from."""
        n = len(nodes)
        for comp in self._extra:
            n = min(n, comp.match_len(nodes[:n]))
        return n

    def _touch(self, node: TreeNode) -> None:
        """Mark ``node``'s KV most recently used in the full list (position and time move together:
        I-LRU-ORDER). Never the state list: which operations refresh a Mamba state is the Mamba tree's
        own rule (``MambaRadixCache._touch_state``)."""
        self._clock += 1
        node.last_access_time = self._clock
        self._full_lru.move_to_mru(node)

    def _touch_path(self, nodes: Sequence[TreeNode]) -> None:
        """Refresh a root-to-leaf path so each node is more recent than its parent."""
        for node in nodes:
            self._touch(node)

    # ------------------------------------------------------------------ walking
    def _walk(self, key: tuple[int, ...]) -> tuple[list[tuple[TreeNode, int]], int]:
        """Read-only walk: the matched nodes with the tokens matched in each, and the matched length."""
        ps = self.page_size
        node = self.root
        pos = 0
        n = len(key)
        path: list[tuple[TreeNode, int]] = []
        while pos < n:
            child = node.children.get(key[pos : pos + ps])
            if child is None:
                break
            m = common_prefix_len(key, pos, child.key, ps)
            path.append((child, m))
            pos += m
            if m < len(child.key):
                break
            node = child
        return path, pos

    def _materialise(self, path: list[tuple[TreeNode, int]]) -> list[TreeNode]:
        """The walked path as nodes, splitting the last one where the match ends inside it."""
        nodes = [child for child, _ in path]
        if path:
            last, m = path[-1]
            if m < len(last.key):
                nodes[-1] = self._split(last, m)
        return nodes

    def _split(self, child: TreeNode, m: int) -> TreeNode:
        """Cut ``child`` after ``m`` tokens: a new upper node takes the first ``m``, ``child`` keeps the rest.

        The upper node inherits the full lock count (every holder below ``child`` is below it too). Its KV
        ids move to it by a ledger transfer (op ``split``); the parent re-keys it under the same first
        page, and it keys ``child`` by the first page of the child's *new* key (#36696).

        Recency, full list only, as SGLang's ``_split_node`` (RadixCache and MambaRadixCache 0.5.20): the
        upper node, then the child, become the most recent, so the unmatched suffix is refreshed. The
        state list is left alone: a split moves no state (rule R1 of spec/mamba-cache-vs-sglang.md).
        """
        ps = self.page_size
        parent = child.parent
        assert parent is not None
        # Views, not copies: tree values are never written in place, and both halves stay tree-owned.
        upper = self._make_node(child.key[:m], child.value[:m], parent)
        upper.lock_ref = child.lock_ref
        self._full.on_split(upper, child)
        for comp in self._extra:
            comp.on_split(upper, child)
        child.key = child.key[m:]
        child.value = child.value[m:]
        parent.children[upper.key[:ps]] = upper
        upper.children[child.key[:ps]] = child
        child.parent = upper
        self._clock += 1
        upper.last_access_time = self._clock
        self._full_lru.push_mru(upper)
        self._touch(child)
        return upper

    @require(lambda key: len(key) > 0, "I-NODE-NONEMPTY: never create an empty node (B16 ghost node, #35821)")
    def _new_leaf(
        self, parent: TreeNode, key: tuple[int, ...], value: torch.Tensor, owner: Owner
    ) -> TreeNode:
        """A new unlocked leaf that adopts ``value`` from ``owner`` (ledger transfer, op ``insert``)."""
        leaf = self._make_node(key, value, parent)
        self._kv.adopt(value, owner, leaf.kv_owner, "insert")
        parent.children[key[: self.page_size]] = leaf
        self._clock += 1
        leaf.last_access_time = self._clock
        self._full_lru.push_mru(leaf)
        self._evictable += len(key)
        return leaf

    # ------------------------------------------------------------------ match
    def _match_key(self, key: object) -> tuple[tuple[int, ...], list[TreeNode]]:
        """The page-truncated key and the matched path (split where the match ends inside a node)."""
        k = as_key(key)
        extra = len(k) % self.page_size
        if extra:
            k = k[: len(k) - extra]
        path, _ = self._walk(k)
        return k, self._materialise(path)

    def _concat(self, nodes: Sequence[TreeNode]) -> torch.Tensor:
        if not nodes:
            return self._empty
        return torch.cat([n.value for n in nodes])

    # ------------------------------------------------------------------ insert
    def _plan_insert(self, key: object, value: object, owner: object, protected_len: object) -> InsertPlan:
        """Validate an insert completely (typed errors) and compute its path, changing nothing."""
        k = as_key(key)
        holder = check_owner(owner, f"{self.name}.insert: owner")
        v = value
        if not (
            isinstance(v, torch.Tensor)
            and v.dtype == torch.int64
            and v.dim() == 1
            and v.device == self.device
        ):
            v = as_index_tensor(value, self.device, f"{self.name}.insert")
        if len(k) != v.numel():
            raise InvalidKey(f"{self.name}.insert: len(key) {len(k)} != len(value) {v.numel()}")
        if len(k) % self.page_size:
            raise InvalidKey(
                f"{self.name}.insert: key length {len(k)} is not a multiple of page {self.page_size}"
            )
        protected = check_count(protected_len, "protected_len")
        if protected > len(k) or protected % self.page_size:
            raise InvalidArgument(
                f"{self.name}.insert: protected_len {protected_len} must be page-aligned"
                f" and <= len(key) {len(k)}"
            )
        path, prefix_len = self._walk(k)
        if protected > prefix_len:
            raise PrefixMismatch(
                f"{self.name}.insert: protected_len {protected_len}"
                f" but only {prefix_len} tokens of the key are cached"
            )
        pos = 0
        host = v.numpy() if self._on_cpu and protected else None  # CPU: compare bytes, no tensor ops
        for node, m in path:
            if pos >= protected:
                break
            take = min(m, protected - pos)
            if (
                host[pos : pos + take].tobytes() != node.value.numpy()[:take].tobytes()
                if host is not None
                else not torch.equal(v[pos : pos + take], node.value[:take])
            ):
                raise PrefixMismatch(
                    f"{self.name}.insert: value[{pos}:{pos + take}] is not the tree's ids at {node!r}"
                    " (the protected prefix must be the ids match_prefix returned)"
                )
            pos += take
        if protected < len(k):  # the caller's ids: pages, range, repeats, free-list state (the owner: ledger)
            self._kv.check_caller_ids(v[protected:], holder, f"{self.name}.insert")
        return InsertPlan(k, v, holder, protected, path, prefix_len)

    def _apply_insert(self, plan: InsertPlan) -> tuple[TreeNode, bool]:
        """Carry out a validated plan; returns the node ending at ``len(key)`` and whether it is new."""
        nodes: list[TreeNode] = []
        for child, m in plan.path:
            # Root to leaf, each node more recent than its parent (SGLang touches before it splits). The
            # full list only: the insert walk refreshes no state (rule R3, PR #31643).
            self._touch(child)
            if m < len(child.key):
                child = self._split(child, m)
            nodes.append(child)
        if plan.prefix_len > plan.protected_len:
            # The caller's duplicates of tokens already cached: freed here, exactly once.
            self._kv.free(plan.value[plan.protected_len : plan.prefix_len], plan.owner, "insert.dup")
        end = nodes[-1] if nodes else self.root
        if not plan.creates_leaf:
            return end, False
        rest = plan.value[plan.prefix_len :].clone()
        return self._new_leaf(end, plan.key[plan.prefix_len :], rest, plan.owner), True

    # ------------------------------------------------------------------ locks
    def _check_node(self, node: object, op: str) -> TreeNode:
        if not isinstance(node, TreeNode):
            raise InvalidArgument(f"{self.name}.{op}: expected a TreeNode, got {type(node).__name__}")
        if node.tree_id != self._tree_id:
            raise ForeignNode(f"{self.name}.{op}: {node!r} belongs to another tree")
        if not node.live:
            raise ForeignNode(f"{self.name}.{op}: {node!r} is no longer in the tree")
        return node

    def _check_lock(self, lock: object, op: str) -> LockRef:
        """A release must name a live lock of this tree whose counts can all go down by one."""
        if not isinstance(lock, LockRef):
            raise InvalidArgument(
                f"{self.name}.{op}: expected the LockRef inc_lock_ref returned, got {type(lock).__name__}"
            )
        if lock.tree_id != self._tree_id:
            raise ForeignNode(f"{self.name}.{op}: {lock!r} was issued by another tree")
        if lock.released or lock not in self._locks:
            raise LockNotHeld(f"{self.name}.{op}: {lock!r} is not a live lock (double release or forged)")
        node: TreeNode | None = lock.node
        if not lock.node.live:
            raise ContractViolation(f"I-EVICT-LOCKED: the node of live {lock!r} was deleted")
        while node is not None and node is not self.root:
            if node.lock_ref < 1:
                raise LockNotHeld(
                    f"{self.name}.{op}: {node!r} would go below zero (lock_ref {node.lock_ref})"
                )
            node = node.parent
        for comp in self._extra:
            if comp.kind in lock.took:
                comp.check_unlock(lock, op)
        return lock

    def _lock_path(self, node: TreeNode) -> None:
        """Full lock from ``node`` to the root (root excluded); 0 -> 1 moves the KV to protected."""
        self._full.lock_path(node, self.root)

    def _unlock_path(self, node: TreeNode) -> None:
        self._full.unlock_path(node, self.root)

    def _lock_components(self, node: TreeNode) -> frozenset[str]:
        """Each component's own lock on ``node``, where it applies now: the kinds a handle records."""
        return frozenset(comp.kind for comp in self._extra if comp.lock(node))

    def _unlock_components(self, lock: LockRef) -> None:
        """Undo exactly the component locks ``lock`` recorded (I-LOCK-SYMMETRY)."""
        for comp in self._extra:
            if comp.kind in lock.took:
                comp.unlock(lock.node)

    # ------------------------------------------------------------------ deletion
    def _unlink_leaf(self, node: TreeNode) -> int:
        """Remove an unlocked leaf from its parent and the full list; free its KV. Returns its tokens."""
        parent = node.parent
        assert parent is not None
        popped = parent.children.pop(node.key[: self.page_size], None)
        if popped is not node:
            raise ContractViolation(
                f"I-KEYS: {parent!r} does not hold {node!r} under its first page (#36696)"
            )
        for comp in self._extra:
            comp.free_node(node, "evict")
        n = len(node.key)
        self._full.free_node(node, "evict")
        node.live = False
        node.parent = None  # break the reference to the tree (B13-style host-memory hygiene)
        return n

    def _prune_tombstones(self, node: TreeNode) -> tuple[TreeNode, int]:
        """Delete ``node`` and its ancestors while each is an unlocked leaf some component does not let stay
        (a tombstone leaf: I-TOMBSTONE). Returns the first node kept and the tokens freed."""
        freed = 0
        root = self.root
        while node is not root and not node.children and node.lock_ref == 0 and not self._keeps_leaf(node):
            parent = node.parent
            assert parent is not None
            freed += self._evict_leaf(node)
            node = parent
        return node, freed

    def _evict_leaf(self, node: TreeNode) -> int:
        return self._unlink_leaf(node)

    def _evict_lru(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` KV tokens: unlocked leaves in full-LRU order, each with what its
        components hold, cascading to parents that become unlocked tombstone leaves. Returns tokens freed."""
        check_count(num_tokens, "num_tokens")
        freed = 0
        root = self.root
        x = self._oldest_unlocked_leaf()
        while freed < num_tokens and x is not None:
            nxt = self._unlocked_leaf_from(self._full_lru.newer(x))
            parent = x.parent
            assert parent is not None
            freed += self._evict_leaf(x)
            top, cascaded = self._prune_tombstones(parent)
            freed += cascaded
            if top is not root and not top.children and top.lock_ref == 0:
                nxt = self._oldest_unlocked_leaf()  # a new candidate leaf, possibly older than nxt
            x = nxt
        return freed

    def _oldest_unlocked_leaf(self) -> TreeNode | None:
        return self._unlocked_leaf_from(self._full_lru.oldest())

    def _unlocked_leaf_from(self, node: TreeNode | None) -> TreeNode | None:
        """The first unlocked leaf at ``node`` or more recent."""
        lru = self._full_lru
        while node is not None and (node.lock_ref > 0 or node.children):
            node = lru.newer(node)
        return node

    # ------------------------------------------------------------------ audit
    def _own_locks(self) -> tuple[Counter[int], dict[str, Counter[int]]]:
        own: Counter[int] = Counter()
        by_kind: dict[str, Counter[int]] = {comp.kind: Counter() for comp in self._extra}
        for lock in self._locks:
            if lock.released or not lock.node.live or lock.node.tree_id != self._tree_id:
                raise ContractViolation(f"I-LOCK-TREE: the live-lock registry holds a stale {lock!r}")
            own[id(lock.node)] += 1
            for kind in lock.took:
                by_kind[kind][id(lock.node)] += 1
        return own, by_kind

    def _audit_tree(self) -> None:
        """The full-KV recounts (§5.2), then each component's own."""
        nodes = tree_checks.collect_nodes(self.root)
        for node in nodes:
            if not node.live or node.tree_id != self._tree_id:
                raise ContractViolation(f"I-KEYS: {node!r} is reachable but marked deleted or foreign")
        tree_checks.check_node_keys(self.root, nodes, self.page_size)
        own, by_kind = self._own_locks()
        tree_checks.check_lock_tree(self.root, nodes, own)
        tree_checks.check_size_counters(nodes, self._evictable, self._protected)
        self._full.audit(self.root, nodes, own)
        for comp in self._extra:
            comp.audit(self.root, nodes, by_kind[comp.kind])

    # ------------------------------------------------------------------ sizes (SGLang's names)
    def evictable_size(self) -> int:
        """KV tokens of unlocked nodes."""
        return self._evictable

    def protected_size(self) -> int:
        """KV tokens of locked nodes (root excluded)."""
        return self._protected

    def total_size(self) -> int:
        """KV tokens in the tree."""
        return self._evictable + self._protected
