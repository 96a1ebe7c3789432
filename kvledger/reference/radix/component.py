"""Tree components: one per cached pool kind, registered by the kind's name (issue 36, item 2).

A radix tree's nodes always own KV (the full component, kind ``kv``: the tree's base, which its keys and
page structure are made of). Every other kind a tree caches at its nodes (a Mamba state; next, a
sliding window's pages or a host copy) is one :class:`TreeComponent`, and the tree calls each of its
components at the points where what a node holds matters:

* a node is made (:meth:`~TreeComponent.on_new_node`), split (:meth:`~TreeComponent.on_split`) or deleted
  (:meth:`~TreeComponent.free_node`), and whether an unlocked leaf without the kind's data may stay
  (:meth:`~TreeComponent.keeps_leaf`: a Mamba tombstone leaf may not, I-TOMBSTONE);
* a match: how many matched nodes the kind can serve (:meth:`~TreeComponent.match_len`);
* an insert: the kind's argument checked before anything changes (:meth:`~TreeComponent.check_insert`),
  then adopted by the node that ends at the key (:meth:`~TreeComponent.commit_insert`);
* a lock: the kind's own lock on the node (:meth:`~TreeComponent.lock`, recorded in the handle by kind
  name) and exactly that undone (:meth:`~TreeComponent.unlock`, I-LOCK-SYMMETRY);
* its counters (:attr:`~TreeComponent.counts`, in the cache's ``counts.kinds`` under the kind's name),
  its own eviction (:meth:`~TreeComponent.evict_component`) and its audit.

The registry maps a pool kind's name to its component class (:func:`register_component`,
:func:`component_class`); a cache answers "which kinds do you cache" (``cached_kinds()``) and hands out
"the component for kind X" (``component(kind)``), which is what callers ask instead of a per-kind switch.
SGLang 0.5.23 has the same shape (``unified_cache/components``: a base class, one type per attention kind);
the names here are kvledger's.

Control plane only; a component changes its own counters and its kind's ledger (through its pool), never
the tree's structure: the tree deletes nodes, the component gives back what a node held of its kind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, TypeVar

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.owners import Owner
from kvledger.contracts.protocols import KindCounts

if TYPE_CHECKING:  # pragma: no cover
    from kvledger.reference.radix.results import LockRef
    from kvledger.reference.radix.tree_node import TreeNode


class TreeComponent:
    """One cached kind's part of a radix tree: what its nodes hold of the kind, its locks and counters.

    Invariant: ``counts.evictable`` / ``counts.protected`` are the kind's units held by unlocked / locked
    nodes of the tree it is attached to (the root excluded), both >= 0.
    Every hook is a no-op here, so a component overrides only what its kind does.
    """

    kind: ClassVar[str] = ""
    """The pool kind's name (``PoolKind.name``) this component caches."""

    def __init__(self) -> None:
        self.counts = KindCounts()
        self._tick: Callable[[], int] = _no_clock

    def attach(self, tick: Callable[[], int]) -> None:
        """Bound to a tree: ``tick()`` hands out the tree's next recency time (one clock for every list)."""
        self._tick = tick

    # ------------------------------------------------------------------ nodes
    def on_new_node(self, node: TreeNode) -> None:
        """``node`` was just made (the root included). Post: the node can hold this kind's data."""

    def on_split(self, upper: TreeNode, child: TreeNode) -> None:
        """``child`` was cut: ``upper`` took its first tokens. The kind's data stays at the child's end."""

    def keeps_leaf(self, node: TreeNode) -> bool:
        """Whether an unlocked leaf may stay in the tree as it is (False: the tree deletes it)."""
        return True

    def free_node(self, node: TreeNode, op: str) -> None:
        """``node`` (unlocked, a leaf) is being deleted: give back what it holds of this kind."""

    def held(self, node: TreeNode) -> tuple[list[int], Owner] | None:
        """The ledger ids ``node`` holds of this kind and their owner, for the census (None: nothing)."""
        return None

    # ------------------------------------------------------------------ match and insert
    def match_len(self, nodes: Sequence[TreeNode]) -> int:
        """How many nodes of a matched root-to-leaf path this kind can serve a request from."""
        return len(nodes)

    def check_insert(self, arg: object, owner: Owner, creates_leaf: bool) -> object:
        """Validate the kind's insert argument (typed error, nothing changed); returns it normalised."""
        return arg

    def commit_insert(self, node: TreeNode, arg: object, owner: Owner, op: str) -> bool:
        """``node`` ends at the inserted key: adopt ``arg`` if it needs it. Returns whether it adopted."""
        return False

    # ------------------------------------------------------------------ locks
    def lock(self, node: TreeNode) -> bool:
        """Take the kind's lock on ``node`` if it applies now; returns whether it did (the handle records)."""
        return False

    def check_unlock(self, lock: LockRef, op: str) -> None:
        """A release of ``lock`` must be able to undo the kind's lock (typed error otherwise)."""

    def unlock(self, node: TreeNode) -> None:
        """Undo one lock this kind took on ``node`` (only called when the handle recorded it)."""

    # ------------------------------------------------------------------ eviction and audit
    def evict_component(self, amount: int) -> int:
        """Free ``amount`` units of this kind the tree's own way; returns the units freed."""
        return 0

    def audit(self, root: TreeNode, nodes: Sequence[TreeNode], own_locks: Counter[int]) -> None:
        """The kind's O(tree) recounts over ``nodes`` (the root's tree, root included); ``own_locks``: node id
        -> live handles that took the kind's lock. Raises ContractViolation naming the invariant."""


def _no_clock() -> int:
    raise InvalidArgument("a tree component used before it was attached to a tree")


C = TypeVar("C", bound=type[TreeComponent])

TREE_COMPONENTS: dict[str, type[TreeComponent]] = {}
"""The registry: pool kind name -> its tree component class."""


def register_component(cls: C) -> C:
    """Class decorator: record ``cls`` as the tree component of pool kind ``cls.kind``.

    Pre: ``cls.kind`` is a non-empty name no other component class has (InvalidArgument otherwise)."""
    kind = cls.kind
    if not isinstance(kind, str) or not kind:
        raise InvalidArgument(f"{cls.__name__}: a tree component names its pool kind (kind = '...')")
    known = TREE_COMPONENTS.get(kind)
    if known is not None and known is not cls:
        raise InvalidArgument(f"pool kind {kind!r} already has the tree component {known.__name__}")
    TREE_COMPONENTS[kind] = cls
    return cls


def component_class(kind: str) -> type[TreeComponent]:
    """The tree component registered for pool kind ``kind`` (InvalidArgument naming the known ones)."""
    cls = TREE_COMPONENTS.get(kind)
    if cls is None:
        raise InvalidArgument(f"no tree component for pool kind {kind!r} (known: {sorted(TREE_COMPONENTS)})")
    return cls
