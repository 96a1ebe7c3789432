"""The full component (pool kind ``kv``): the KV ids every node owns, the tree's base kind.

Every node holds KV (its ``value``), so this component is the one the tree is made of: its keys are the
KV's tokens, its pages the allocator's. It keeps the KV side (the allocator and its ledger), the full LRU
list and the full counters (``counts.evictable`` / ``counts.protected``, which are the cache's
:class:`~kvledger.contracts.protocols.CacheCounts` itself), and the full lock, which runs from a node to
the root (every holder below a node needs the node's KV too).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kvledger.contracts import tree_checks
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED
from kvledger.contracts.protocols import CacheCounts, KVAllocator
from kvledger.reference.radix.component import TreeComponent, register_component
from kvledger.reference.radix.kv_side import KVSide
from kvledger.reference.radix.lru import LRUList
from kvledger.reference.radix.tree_node import TreeNode


@register_component
class FullComponent(TreeComponent):
    """KV ids per node, the full lock along the path to the root, the full LRU list.

    Invariant: ``counts.evictable`` / ``counts.protected`` are the KV tokens of unlocked / locked non-root
    nodes (I-PROTECTED-DEF), and each node's ``kv_owner`` sits in the matching CACHE_* account."""

    kind = "kv"

    def __init__(self, allocator: KVAllocator, name: str) -> None:
        super().__init__()
        self.kv = KVSide(allocator)
        self.lru = LRUList(0, f"{name}.full")
        self.counts: CacheCounts = CacheCounts()

    def on_split(self, upper: TreeNode, child: TreeNode) -> None:
        """``upper`` takes the KV of the child's first tokens (ledger transfer, op ``split``); it inherits the
        child's lock count, so its account follows."""
        if child.lock_ref > 0:
            upper.kv_owner.set_account(CACHE_PROTECTED, "split")
        self.kv.adopt(upper.value, child.kv_owner, upper.kv_owner, "split")

    def lock_path(self, node: TreeNode, root: TreeNode) -> None:
        """Full lock from ``node`` to ``root`` (excluded); 0 -> 1 moves the KV to protected."""
        counts = self.counts
        while node is not root:
            if node.lock_ref == 0:
                n = len(node.key)  # == len(value); a tuple's len is cheaper than a tensor's
                counts.evictable -= n
                counts.protected += n
                node.kv_owner.set_account(CACHE_PROTECTED, "lock")
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock_path(self, node: TreeNode, root: TreeNode) -> None:
        """Undo :meth:`lock_path`; 1 -> 0 moves the KV back to evictable."""
        counts = self.counts
        while node is not root:
            if node.lock_ref == 1:
                n = len(node.key)  # == len(value); a tuple's len is cheaper than a tensor's
                counts.evictable += n
                counts.protected -= n
                node.kv_owner.set_account(CACHE_EVICTABLE, "unlock")
            node.lock_ref -= 1
            node = node.parent  # type: ignore[assignment]

    def free_node(self, node: TreeNode, op: str) -> None:
        """An unlocked leaf goes: off the full list, its KV back through the allocator's free path."""
        self.lru.remove(node)
        self.counts.evictable -= len(node.key)
        self.kv.free(node.value, node.kv_owner, op)

    def audit(self, root: TreeNode, nodes: Sequence[TreeNode], own_locks: Counter[int]) -> None:
        """I-NODE-NONEMPTY (whole pages), I-NO-TREE-ALIAS, the full list's I-LRU-ORDER."""
        kv = self.kv
        for node in nodes:
            if not kv.page_structured(node.value):
                raise ContractViolation(f"I-NODE-NONEMPTY: {node!r} does not own whole allocator pages")
        if kv.checked:
            tree_checks.check_no_alias(nodes, lambda n: kv.ledger_ids(n.value).tolist(), kv.ledger.holdings)
        else:
            tree_checks.check_no_alias(nodes, lambda n: n.value.tolist())
        tree_checks.check_lru("full", self.lru.oldest_first(), nodes)
