"""The host tier's recounts (run by the tree's audit through the component, and by the load-back).

* I-HOST-RESIDENCY: each copy backing a node is that live node's, covers exactly its segment, and sits
  in ``cache.protected``; a host-only copy backs no node and sits in ``cache.evictable`` unless a load
  pins it; the counters equal a recount; each copy's slots are held by its owner in the host ledger.
* I-HOST-IDENTITY: free + pending + evictable + protected == the host pool's size (the tier is the
  host pool's only holder: a load-back holds device slots, never host ones).
* I-HOST-DATA: a copy backing a node holds, slot for slot, the device node's data (fingerprints of the
  raw bits, so a data tag copied to the wrong slot or in the wrong direction shows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from kvledger import kernels
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, Account
from kvledger.reference.radix.tree_node import TreeNode

if TYPE_CHECKING:  # pragma: no cover
    from kvledger.reference.hicache.component import HostKVComponent
    from kvledger.reference.hicache.copies import HostCopy


def audit_host_tier(comp: HostKVComponent, nodes: Sequence[TreeNode]) -> None:
    """Every recount of the module docstring; raises ContractViolation naming the invariant."""
    check_residency(comp, nodes)
    check_identity(comp)
    check_data(comp)


def check_residency(comp: HostKVComponent, nodes: Sequence[TreeNode]) -> None:
    from kvledger.reference.hicache.component import path_key

    live = {n.id: n for n in nodes}
    evictable = protected = 0
    for node_id, copy in comp.by_node.items():
        node = live.get(node_id)
        if node is None or copy.node is not node or not node.live:
            _fail("I-HOST-RESIDENCY", f"{copy!r} backs node #{node_id}, which is not in the tree", copy)
        if len(copy) != len(node.key) or copy.ids.numel() != len(copy) or copy.key != path_key(node):
            _fail("I-HOST-RESIDENCY", f"{copy!r} does not cover {node!r}'s segment", copy)
        protected += len(copy)
        _account(copy, CACHE_PROTECTED)
    for copy in comp.host_only:
        if copy.node is not None or copy.ids.numel() != len(copy):
            _fail("I-HOST-RESIDENCY", f"host-only {copy!r} names a device node or has the wrong length", copy)
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
                _fail("I-HOST-RESIDENCY", f"{copy!r}'s slots are not all held by its owner", copy)


def check_identity(comp: HostKVComponent) -> None:
    pool, counts = comp.pool, comp.counts
    total = pool.available_size() + pool.pending_free_size() + counts.evictable + counts.protected
    if total != pool.size:
        raise ContractViolation(
            f"I-HOST-IDENTITY: host pool {pool.name}: free {pool.available_size()} + pending"
            f" {pool.pending_free_size()} + evictable {counts.evictable} + protected {counts.protected}"
            f" = {total} != size {pool.size}"
        )


def check_data(comp: HostKVComponent) -> None:
    for copy in comp.by_node.values():
        node = copy.node
        assert node is not None
        host = kernels.fingerprint_slots(comp.pool.buffer, copy.ids)
        device = kernels.fingerprint_slots(comp.device_buffer, node.value)
        bad = (host != device.to(host.device)).nonzero().flatten().tolist()
        if bad:
            pairs = [(int(copy.ids[i]), int(node.value[i])) for i in bad[:4]]
            _fail("I-HOST-DATA", f"host slots differ from the device's (host, device): {pairs}", copy)


def _account(copy: HostCopy, want: Account) -> None:
    if copy.owner.account is not want:
        _fail("I-HOST-RESIDENCY", f"{copy!r}'s owner is in {copy.owner.account.name}, expected {want}", copy)


def _fail(inv: str, what: str, copy: HostCopy) -> NoReturn:
    raise ContractViolation(f"{inv}: {what} (owner {copy.owner.kind}:{copy.owner.key})")
