"""What the caches hand back: match results, lock handles, insert results."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvledger.reference.radix.tree_node import TreeNode


@dataclass
class MatchResult:
    """``device_indices``: tree-owned KV ids of the matched prefix (int64); ``last_node``: where it ends.

    Mamba tree: ``last_node`` is the deepest node on the matched path with a state (or the root), and
    ``cow_slot`` the slot the caller now holds with a copy of that state (None when none was made).
    Mamba V2 (``extra_buffer``): ``mamba_branching_seqlen`` is the branching point, the matched KV
    length rounded down to the chunk when the match went past ``last_node`` (None otherwise, and always
    in V1): where the request can capture a state for the KV it matched but cannot start from.
    """

    device_indices: torch.Tensor
    last_node: TreeNode
    cow_slot: torch.Tensor | None = None
    mamba_branching_seqlen: int | None = None

    def __len__(self) -> int:
        return int(self.device_indices.numel())


@dataclass(eq=False)
class LockRef:
    """A live lock on ``node`` (and its path to the root), returned by ``inc_lock_ref``.

    ``took`` records the kinds whose component lock it also took on the node (``{"mamba"}`` when it pinned
    the node's state), so ``dec_lock_ref`` undoes exactly that (I-LOCK-SYMMETRY, B14) instead of re-reading
    the node. A bool is read as the Mamba record (the historical form: ``True`` is ``{"mamba"}``).
    ``tree_id`` names the cache that issued it; ``released`` turns a second release into a typed error.
    """

    node: TreeNode
    took: frozenset[str]
    tree_id: int
    released: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.took, bool):
            self.took = frozenset({"mamba"}) if self.took else frozenset()

    @property
    def took_mamba(self) -> bool:
        """Whether the lock pinned the node's Mamba state (the B14 record)."""
        return "mamba" in self.took

    def __repr__(self) -> str:
        others = sorted(self.took - {"mamba"})
        return (
            f"LockRef({self.node!r}, took_mamba={self.took_mamba},{f' took={others},' if others else ''}"
            f" tree={self.tree_id}, released={self.released})"
        )


@dataclass(frozen=True)
class InsertResult:
    """Mamba insert: ``prefix_len`` tokens were already cached; ``mamba_adopted``: the tree took the slot;
    ``node``: the node that ends at the key's length (None for an empty key; not compared)."""

    prefix_len: int
    mamba_adopted: bool
    node: TreeNode | None = field(default=None, compare=False)
