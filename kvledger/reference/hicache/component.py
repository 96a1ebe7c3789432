"""The host tier's tree component (pool kind ``host_kv``): each cached node's host copy and its residency.

Registered by kind like the Mamba component; a ``RadixCache`` built with it (``components=``) calls it at
the points where a node's host copy matters:

* a match (:meth:`HostKVComponent.match_len`) counts a hit on every matched node and, under a write-through
  policy, backs up the nodes whose hit count reached ``write_through_threshold`` (SGLang's
  ``_inc_hit_count`` then ``write_backup``);
* an insert (:meth:`~HostKVComponent.commit_insert`) counts a hit on the node ending at the key; a node
  whose whole segment is on the host already (a load-back, or a recompute of an evicted prefix) adopts
  those copies instead of writing new ones;
* a split cuts the copy with the node (the upper part changes owner in the host ledger);
* a device eviction (:meth:`~HostKVComponent.free_node`, before the tree frees the device KV) keeps the
  node's copy as host-only, writing it first under ``write_back`` (SGLang's ``_evict_backuped`` /
  ``write_backup`` on eviction);
* :meth:`~HostKVComponent.evict_component` is SGLang's ``evict_host``: host-only copies, least recently
  used first, leaves of the host tier only, never one a load-back is reading.

Counters, in the house's sense (held by a live holder or not): ``protected`` = tokens of host-only copies
a load-back pins; ``evictable`` = every other copy's tokens (host eviction takes only the host-only ones,
as SGLang's ``evict_host``; a copy backing a node goes when the node's device copy is evicted and then its
host copy is). With the pool's free slots they add up to the host pool's size (I-HOST-IDENTITY), and at
quiescence nothing is protected (I-IDLE-IDENTITY). Contents move through :mod:`kvledger.kernels` only.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import torch

from kvledger import kernels
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, Account, Owner
from kvledger.reference.hicache.checks import audit_host_tier
from kvledger.reference.hicache.copies import HostCopy, HostHit, HostIndex, path_key
from kvledger.reference.hicache.host_pool import HostPool
from kvledger.reference.hicache.policy import WritePolicy
from kvledger.reference.radix.component import TreeComponent, register_component
from kvledger.reference.radix.tree_node import TreeNode

_copy_serials = itertools.count(1)


@register_component
class HostKVComponent(TreeComponent):
    """Host copies of the tree's KV: one per backed-up node, the host-only ones in an index.

    Invariant: ``counts.protected`` / ``counts.evictable`` are the tokens of copies a load pins / of every
    other copy (I-HOST-RESIDENCY), and ``pool`` free + both == pool size
    (I-HOST-IDENTITY); each copy's slots hold its device node's data (I-HOST-DATA)."""

    kind = "host_kv"

    def __init__(
        self, pool: HostPool, device_buffer: torch.Tensor, policy: WritePolicy | None = None
    ) -> None:
        super().__init__()
        if not isinstance(pool, HostPool):
            raise InvalidArgument(f"host_kv: expected a HostPool, got {type(pool).__name__}")
        if pool.buffer.shape[0] != device_buffer.shape[0] or pool.buffer.shape[2:] != device_buffer.shape[2:]:
            raise InvalidArgument(
                f"host_kv: host buffer {tuple(pool.buffer.shape)} does not match {tuple(device_buffer.shape)}"
            )
        self.pool = pool
        self.device_buffer = device_buffer
        self.policy = policy or WritePolicy()
        self.by_node: dict[int, HostCopy] = {}
        self.host_only = HostIndex()
        self.hits: Counter[int] = Counter()
        self.page = 1
        self.stats: Counter[str] = Counter()

    # ------------------------------------------------------------------ backup (device -> host)
    def _new_copy(self, key: tuple[int, ...], start: int, ids: torch.Tensor, account: Account) -> HostCopy:
        owner = Owner("host_kv.copy", next(_copy_serials), account)
        return HostCopy(key, start, ids, owner, last_access=self._tick())

    def write_backup(self, node: TreeNode) -> HostCopy | None:
        """Copy ``node``'s device KV to fresh host slots (host eviction first if short); None if the host
        tier cannot hold it (the node stays device-only). The copy backs the node."""
        if node.id in self.by_node or not node.key:
            return self.by_node.get(node.id)
        n = len(node.key)
        copy = self._new_copy(path_key(node), 0, torch.empty(0, dtype=torch.int64), CACHE_EVICTABLE)
        copy.start = len(copy.key) - n
        ids = self.pool.alloc(n, copy.owner, "write_backup")
        if ids is None:  # make room: host-only copies, least recently used first (SGLang's evict_host)
            self.evict_component(n - self.pool.available_size())
            ids = self.pool.alloc(n, copy.owner, "write_backup")
        if ids is None:
            self.stats["backup_refused"] += 1
            return None
        kernels.transfer_slots(self.device_buffer, node.value, self.pool.buffer, ids)
        copy.ids, copy.node = ids, node
        self.by_node[node.id] = copy
        self.counts.evictable += n
        self.stats["backups"] += 1
        return copy

    # ------------------------------------------------------------------ tree hooks
    def match_len(self, nodes: Sequence[TreeNode]) -> int:
        threshold = self.policy.write_through_threshold
        for node in nodes:
            self.hits[node.id] += 1
            if threshold is not None and self.hits[node.id] >= threshold:
                self.write_backup(node)
            copy = self.by_node.get(node.id)
            if copy is not None:
                copy.last_access = self._tick()
        return len(nodes)

    def commit_insert(self, node: TreeNode, arg: object, owner: Owner, op: str) -> bool:
        if not node.key:
            return False
        self.hits[node.id] += 1
        if node.id not in self.by_node and self._adopt_host_only(node):
            return True
        threshold = self.policy.write_through_threshold
        if threshold is not None and self.hits[node.id] >= threshold:
            return self.write_backup(node) is not None
        return False

    def _adopt_host_only(self, node: TreeNode) -> bool:
        """``node``'s whole segment is a chain of unpinned host-only copies: it takes them as its backup."""
        key = path_key(node)
        start = len(key) - len(node.key)
        parts = self.host_only.walk(key, start, 1)
        whole = all(off == 0 and n == len(c) and not c.loading for c, off, n in parts)
        if not whole or sum(n for _, _, n in parts) != len(node.key):
            return False
        merged = self._new_copy(key, start, torch.cat([c.ids for c, _, _ in parts]), CACHE_EVICTABLE)
        for copy, _, _ in parts:
            self.host_only.remove(copy)
            self._move(copy.ids, copy.owner, merged.owner, "adopt")
        merged.node = node
        self.by_node[node.id] = merged
        self.stats["adopted"] += 1
        return True

    def _move(self, ids: torch.Tensor, src: Owner, dst: Owner, op: str) -> None:
        if self.pool.ledger.enabled and ids.numel():
            self.pool.ledger.transfer(ids, src, dst, op)

    def on_split(self, upper: TreeNode, child: TreeNode) -> None:
        """The child's copy is cut with it: ``upper`` takes the first ``len(upper.key)`` host slots."""
        self.hits[upper.id] = self.hits[child.id]
        copy = self.by_node.get(child.id)
        if copy is None:
            return
        n = len(upper.key)
        top = self._new_copy(copy.key[: copy.start + n], copy.start, copy.ids[:n], CACHE_EVICTABLE)
        self._move(top.ids, copy.owner, top.owner, "split")
        top.node, top.last_access = upper, copy.last_access
        copy.ids, copy.start = copy.ids[n:], copy.start + n
        self.by_node[upper.id] = top

    def held(self, node: TreeNode) -> tuple[list[int], Owner] | None:
        copy = self.by_node.get(node.id)
        return None if copy is None else (copy.ids.tolist(), copy.owner)

    def free_node(self, node: TreeNode, op: str) -> None:
        """The node's device KV is about to be freed: its copy stays as host-only (written first under
        write-back). Called before the tree frees the device slots, so the copy reads live data."""
        self.hits.pop(node.id, None)
        copy = self.by_node.get(node.id)
        if copy is None and self.policy.is_write_back:
            copy = self.write_backup(node)
        if copy is None:
            return
        del self.by_node[node.id]
        copy.node = None  # residency host; still evictable (no holder pins it)
        self.host_only.add(copy)
        self.stats["device_evictions_kept"] += 1

    # ------------------------------------------------------------------ the host-only tier
    def match_host(self, key: Sequence[int], device_len: int, page: int) -> HostHit:
        """The host-only copies continuing a device match of ``device_len`` tokens of ``key``."""
        hit = HostHit(device_len, self.host_only.walk(key, device_len, page))
        for copy in hit.copies():
            copy.last_access = self._tick()
        return hit

    def pin(self, copy: HostCopy) -> None:
        """A load-back reads ``copy``: host eviction may not free it (evictable -> protected)."""
        if copy.node is not None:
            raise InvalidArgument(f"pin: {copy!r} backs a device node; only host-only copies are loaded")
        if not copy.loading:
            copy.owner.set_account(CACHE_PROTECTED, "load_back")
            self.counts.evictable -= len(copy)
            self.counts.protected += len(copy)
        copy.loading += 1

    def unpin(self, copy: HostCopy) -> None:
        if copy.loading < 1:
            raise InvalidArgument(f"unpin: {copy!r} is not pinned")
        copy.loading -= 1
        if not copy.loading and copy.node is None:
            copy.owner.set_account(CACHE_EVICTABLE, "load_back_done")
            self.counts.evictable += len(copy)
            self.counts.protected -= len(copy)

    def evict_component(self, amount: int) -> int:
        """SGLang's ``evict_host``: free at least ``amount`` tokens of host-only copies, least recently used
        first, leaves of the host tier only (a copy another continues is freed after it). Returns tokens."""
        freed = 0
        while freed < amount:
            leaves = [c for c in self.host_only if not c.loading and not self.host_only.continues(c)]
            if not leaves:
                break
            freed += self._evict_copy(min(leaves, key=lambda c: c.last_access))
        return freed

    def _evict_copy(self, copy: HostCopy) -> int:
        if copy.loading or copy.node is not None:
            raise ContractViolation(
                f"I-HOST-EVICT-PINNED: host eviction chose {copy!r}, which a load-back or a device node needs"
            )
        self.host_only.remove(copy)
        self.pool.free(copy.ids, copy.owner, "evict_host")
        self.counts.evictable -= len(copy)
        self.stats["host_evictions"] += 1
        return len(copy)

    def copies(self) -> list[HostCopy]:
        """Every host copy: those backing a node, then the host-only ones."""
        return [*self.by_node.values(), *self.host_only]

    def audit(self, root: TreeNode, nodes: Sequence[TreeNode], own_locks: Counter[int]) -> None:
        audit_host_tier(self, nodes)
