"""An intrusive doubly linked LRU list over tree nodes (head = most recent, tail = least recent).

Intrusive (the links live in the node's ``links`` list) so that removal and "the next more recent
node" cost no dict lookup, and a victim search can continue from where it stopped, as SGLang's does.
One node can sit in two lists (the Mamba tree's full and state lists) at offsets 0 and 2. Removing a
node clears its links, so evicted nodes do not keep each other alive (B13).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from kvledger.contracts.errors import ContractViolation

if TYPE_CHECKING:  # pragma: no cover
    from kvledger.reference.radix.tree_node import TreeNode


class _Sentinel:
    __slots__ = ("links",)

    def __init__(self) -> None:
        # Intrusive links hold nodes, the two sentinels or None (typed where they leave the list).
        self.links: list[Any] = [None, None, None, None]


class LRUList:
    """Nodes ordered by recency. ``offset`` 0: the full (KV) list; 2: the Mamba state list."""

    __slots__ = ("_head", "_n", "_p", "_size", "_tail", "label")

    def __init__(self, offset: int, label: str) -> None:
        self.label = label
        self._p = offset  # links[_p]: the neighbour towards the head (more recent)
        self._n = offset + 1  # links[_n]: the neighbour towards the tail (less recent)
        self._head = _Sentinel()
        self._tail = _Sentinel()
        self._head.links[self._n] = self._tail
        self._tail.links[self._p] = self._head
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __contains__(self, node: TreeNode) -> bool:
        return node.links[self._p] is not None

    def _link_after(self, before: TreeNode | _Sentinel, node: TreeNode) -> None:
        p, n = self._p, self._n
        after = before.links[n]
        node.links[p] = before
        node.links[n] = after
        before.links[n] = node
        after.links[p] = node

    def _unlink(self, node: TreeNode) -> None:
        p, n = self._p, self._n
        links = node.links
        links[p].links[n] = links[n]
        links[n].links[p] = links[p]
        links[p] = None
        links[n] = None

    def push_mru(self, node: TreeNode) -> None:
        """Add a node not in the list as the most recent."""
        if node.links[self._p] is not None:
            raise ContractViolation(f"I-LRU-ORDER: {node!r} is already in the {self.label} list")
        self._link_after(self._head, node)
        self._size += 1

    def move_to_mru(self, node: TreeNode) -> None:
        """Make a listed node the most recent."""
        self._unlink(node)
        self._link_after(self._head, node)

    def remove(self, node: TreeNode) -> None:
        self._unlink(node)
        self._size -= 1

    def oldest(self) -> TreeNode | None:
        """The least recent node, or None when empty."""
        node = self._tail.links[self._p]
        return None if node is self._head else cast("TreeNode", node)

    def newer(self, node: TreeNode) -> TreeNode | None:
        """The next more recent node than a listed ``node``, or None."""
        nxt = node.links[self._p]
        return None if nxt is self._head else cast("TreeNode", nxt)

    def oldest_first(self) -> list[TreeNode]:
        """The members, least recent first; checks that the links agree both ways (audit)."""
        out: list[TreeNode] = []
        node = self._tail.links[self._p]
        prev_seen = self._tail
        while node is not self._head:
            if node is None or node.links[self._n] is not prev_seen:
                raise ContractViolation(f"I-LRU-ORDER: broken links in the {self.label} list at {node!r}")
            out.append(node)
            if len(out) > self._size + 1:
                break
            prev_seen = node
            node = node.links[self._p]
        if len(out) != self._size:
            raise ContractViolation(
                f"I-LRU-ORDER: {self.label} list walks {len(out)} nodes but counts {self._size}"
            )
        return out

    def __iter__(self) -> Iterator[TreeNode]:
        return iter(self.oldest_first())
