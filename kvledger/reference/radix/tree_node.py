"""``TreeNode``: one edge of a radix tree, with the KV ids (and, in the Mamba tree, the state) it owns.

One class serves both trees; the Mamba fields stay ``None``/0 in the plain tree. ``__slots__`` keeps a
node small and attribute access fast (a cache holds thousands). Ownership is explicit: ``kv_owner``
holds the node's KV ids in the allocator's ledger and sits in ``CACHE_PROTECTED`` while
``lock_ref > 0``, ``CACHE_EVICTABLE`` otherwise; ``mamba_owner`` does the same for the state slot in
the Mamba pool's ledger, driven by ``mamba_lock_ref``.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from kvledger.contracts.owners import CACHE_EVICTABLE, Owner

_node_ids = itertools.count()


class TreeNode:
    """A radix-tree node. ``key``: a tuple of token ids; ``value``: int64 KV slot ids, one per token."""

    __slots__ = (
        "children",
        "id",
        "key",
        "kv_owner",
        "last_access_time",
        "links",
        "live",
        "lock_ref",
        "mamba_access_time",
        "mamba_lock_ref",
        "mamba_owner",
        "mamba_value",
        "parent",
        "tree_id",
        "value",
    )

    def __init__(
        self, tree_id: int, key: tuple[int, ...], value: torch.Tensor, parent: TreeNode | None
    ) -> None:
        self.id = next(_node_ids)
        self.tree_id = tree_id
        self.key = key
        self.value = value
        self.parent = parent
        # Children keyed by the first page of their key (a tuple even at page size 1).
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.lock_ref = 0  # the full lock: live holders locked at this node or below it
        self.last_access_time = 0  # orders the full (KV) list
        self.mamba_access_time = 0  # orders the state list (Mamba tree): the two recencies are independent
        self.live = True  # False once deleted from the tree: a handle to it is stale
        # LRU links: [full prev, full next, mamba prev, mamba next]; see lru.LRUList.
        self.links: list[Any] = [None, None, None, None]
        self.kv_owner = Owner("node", self.id, CACHE_EVICTABLE)
        # Mamba tree only: the state slot (a 1-element tensor), None for a tombstone.
        self.mamba_value: torch.Tensor | None = None
        self.mamba_lock_ref = 0
        self.mamba_owner: Owner | None = None

    @property
    def is_tombstone(self) -> bool:
        """No state at this node's end (Mamba tree); the root counts as one."""
        return self.mamba_value is None

    def depth(self) -> int:
        """Tokens on the path from the root to the end of this node (O(depth))."""
        n = 0
        node: TreeNode | None = self
        while node is not None:
            n += len(node.key)
            node = node.parent
        return n

    def __repr__(self) -> str:
        state = "" if self.mamba_value is None else f" m={self.mamba_value.tolist()}"
        return (
            f"Node#{self.id}(len={len(self.key)},"
            f" key={list(self.key[:4])}{'...' if len(self.key) > 4 else ''},"
            f" lock={self.lock_ref}/{self.mamba_lock_ref}, t={self.last_access_time}{state}"
            f"{'' if self.mamba_value is None else f'@{self.mamba_access_time}'}"
            f"{'' if self.live else ', deleted'})"
        )
