"""The host tier's recounts (run by the tree's audit through the component, and by the load-back).

* I-HOST-RESIDENCY: each copy backing a node is that live node's and covers exactly its segment; a
  host-only copy backs no node; a copy sits in ``cache.protected`` while a load pins it, in
  ``cache.evictable`` otherwise; the counters equal a recount; each copy's slots are held by its owner
  in the host ledger.
* I-HOST-IDENTITY: free + pending + evictable + protected == the host pool's size (the tier is the
  host pool's only holder: a load-back holds device slots, never host ones).
* I-HOST-DATA: a copy backing a node holds, slot for slot, the device node's data (fingerprints of the
  raw bits, so a data tag copied to the wrong slot or in the wrong direction shows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from kvledger import kernels
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, Account
from kvledger.contracts.protocols import KindCounts
from kvledger.reference.hicache.copies import HostCopy, HostIndex, path_key
from kvledger.reference.hicache.host_pool import HostPool
from kvledger.reference.radix.tree_node import TreeNode


class HostTierView(Protocol):
    """What the recounts read of the host component (which imports this module, so not by its class)."""

    by_node: dict[int, HostCopy]
    host_only: HostIndex
    counts: KindCounts
    pool: HostPool
    device_buffer: torch.Tensor

    def copies(self) -> list[HostCopy]: ...


def audit_host_tier(comp: HostTierView, nodes: Sequence[TreeNode]) -> None:
    """Every recount of the module docstring; raises ContractViolation naming the invariant."""
    check_residency(comp, nodes)
    check_identity(comp)
    check_data(comp)


def check_residency(comp: HostTierView, nodes: Sequence[TreeNode]) -> None:
    live = {n.id: n for n in nodes}
    evictable = protected = 0
    for node_id, copy in comp.by_node.items():
        node = live.get(node_id)
        if node is None or copy.node is not node or not node.live:
            raise ContractViolation(
                f"I-HOST-RESIDENCY: {copy!r} backs node #{node_id}, which is not in the tree {_by(copy)}"
            )
        if len(copy) != len(node.key) or copy.ids.numel() != len(copy) or copy.key != path_key(node):
            raise ContractViolation(
                f"I-HOST-RESIDENCY: {copy!r} does not cover {node!r}'s segment {_by(copy)}"
            )
        evictable += len(copy)
        _account(copy, CACHE_EVICTABLE)
    for copy in comp.host_only:
        if copy.node is not None or copy.ids.numel() != len(copy):
            raise ContractViolation(
                f"I-HOST-RESIDENCY: host-only {copy!r} names a device node or has the wrong length {_by(copy)}"
            )
        if copy.loading:
            protected += len(copy)
        else:
            evictable += len(copy)
        _account(copy, CACHE_PROTECTED if copy.loading else CACHE_EVICTABLE)
    counts = comp.counts
    if (evictable, protected) != (counts.evictable, counts.protected):
        raise ContractViolation(
            f"I-HOST-RESIDENCY: host counters evictable={counts.evictable} protected={counts.protected},"
            f" recount {evictable}/{protected}"
        )
    ledger = comp.pool.ledger
    if isinstance(ledger, Ledger):
        for copy in comp.copies():
            if not ledger.all_held_by(copy.ids, copy.owner):
                raise ContractViolation(
                    f"I-HOST-RESIDENCY: {copy!r}'s slots are not all held by its owner {_by(copy)}"
                )


def check_identity(comp: HostTierView) -> None:
    pool, counts = comp.pool, comp.counts
    total = pool.available_size() + pool.pending_free_size() + counts.evictable + counts.protected
    if total != pool.size:
        raise ContractViolation(
            f"I-HOST-IDENTITY: host pool {pool.name}: free {pool.available_size()} + pending"
            f" {pool.pending_free_size()} + evictable {counts.evictable} + protected {counts.protected}"
            f" = {total} != size {pool.size}"
        )


def check_data(comp: HostTierView) -> None:
    for copy in comp.by_node.values():
        node = copy.node
        assert node is not None
        host = kernels.fingerprint_slots(comp.pool.buffer, copy.ids)
        device = kernels.fingerprint_slots(comp.device_buffer, node.value)
        bad = (host != device.to(host.device)).nonzero().flatten().tolist()
        if bad:
            pairs = [(int(copy.ids[i]), int(node.value[i])) for i in bad[:4]]
            raise ContractViolation(
                f"I-HOST-DATA: host slots differ from the device's (host, device): {pairs} {_by(copy)}"
            )


def _account(copy: HostCopy, want: Account) -> None:
    if copy.owner.account is not want:
        raise ContractViolation(
            f"I-HOST-RESIDENCY: {copy!r}'s owner is in {copy.owner.account.name}, expected {want} {_by(copy)}"
        )


def _by(copy: HostCopy) -> str:
    return f"(owner {copy.owner.kind}:{copy.owner.key})"
