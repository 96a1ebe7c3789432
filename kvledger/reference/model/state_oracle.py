"""The state oracle: every Mamba state the tree caches is the state of its own prefix, bit for bit.

A node of the Mamba radix cache claims that its slot holds the recurrent state after the tokens from the
root to its end. :func:`prefix_state` computes that state with the tiny model run alone from zero states
(the same arithmetic the pooled runner uses, and chunk-invariant), and :func:`cached_state_mismatches`
compares it with the slot's conv and temporal state for every node that has one. Under Mamba V2 the
states arrive by captures and donations (spec/mamba-v2.md), so this is where a capture at the wrong
length, into the wrong half, or never carried out shows directly, before any output differs.

Test-time only: O(cached tokens) model work per call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvledger.reference.model.tiny_hybrid import (
    Extend,
    TinyHybridWeights,
    compute_mode,
    extend_after_store,
    project,
)
from kvledger.reference.pools.mamba_pool import MambaPool
from kvledger.reference.radix.mamba_radix_cache import MambaRadixCache
from kvledger.reference.radix.tree_node import TreeNode


def prefix_state(weights: TinyHybridWeights, tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv and temporal states after ``tokens`` (no pools, no cache), each without the batch dim."""
    c = weights.config
    device = weights.embed.device
    with compute_mode():
        conv = torch.zeros((1, *c.conv_state_shape), dtype=torch.float32, device=device)
        ssm = torch.zeros((1, *c.temporal_state_shape), dtype=torch.float32, device=device)
        if not tokens:
            return conv[0], ssm[0]
        ids = torch.tensor(list(tokens), dtype=torch.int64, device=device)
        x, q, k, v = project(weights, ids)
        slot_table = torch.arange(len(tokens), device=device)[None]
        _, conv, ssm = extend_after_store(
            weights, x, q, Extend.build([0], [len(tokens)], device), slot_table, k, v, conv, ssm
        )
        return conv[0], ssm[0]


def _path_tokens(node: TreeNode | None) -> list[int]:
    parts: list[tuple[int, ...]] = []
    while node is not None and node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return [t for part in reversed(parts) for t in part]


def cached_state_mismatches(tree: MambaRadixCache, mamba_pool: MambaPool, weights: TinyHybridWeights) -> list[str]:
    """Every node whose cached state differs from its prefix's state (empty: all agree)."""
    conv_all, ssm_all = mamba_pool.conv_state, mamba_pool.temporal_state  # applies scheduled writes
    out: list[str] = []
    stack = list(tree.root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node.mamba_value is None:
            continue
        slot = int(node.mamba_value[0])
        conv, ssm = prefix_state(weights, _path_tokens(node))
        if not (torch.equal(conv_all[0, slot], conv) and torch.equal(ssm_all[0, slot], ssm)):
            out.append(f"{node!r} (slot {slot}, {node.depth()} tokens) does not hold its prefix's state")
    return out
