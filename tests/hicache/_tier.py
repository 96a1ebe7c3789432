"""A small host tier for the tests: a KV allocator, its buffer (tagged per prefix), a tree, the component."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvledger.contracts import data_tags
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.reference.hicache import HostKVComponent, HostPool, LoadBack, WritePolicy
from kvledger.reference.pools import TokenToKVPoolAllocator
from kvledger.reference.radix import RadixCache

LEDGER = CheckLevel.LEDGER


@dataclass
class Tier:
    kv: TokenToKVPoolAllocator
    buffer: torch.Tensor
    host: HostPool
    comp: HostKVComponent
    tree: RadixCache
    loads: LoadBack

    def cache(self, tokens: list[int], rid: int = 0) -> Owner:
        """A request computes ``tokens`` (tagged KV) and inserts them, as a finished request does."""
        owner = Owner("req", rid, REQ_RUNNING)
        match = self.tree.match_prefix(tokens)
        done = match.device_indices.numel()
        ids = self.kv.alloc(len(tokens) - done, owner)
        assert ids is not None
        write_tags(self.buffer, ids, tokens, done)
        lock = self.tree.inc_lock_ref(match.last_node)
        self.tree.insert(tokens, torch.cat([match.device_indices, ids]), owner, done)
        self.tree.dec_lock_ref(lock)
        return owner


def write_tags(buffer: torch.Tensor, ids: torch.Tensor, tokens: list[int], start: int) -> None:
    """Slot of position p holds the tag of the prefix through p (as the tagged runner writes KV)."""
    tags = data_tags.fold(tokens)[start : start + ids.numel()]
    values = torch.tensor([float(t & data_tags.HALF_MASK) for t in tags], dtype=buffer.dtype)
    buffer[:, ids] = values.view(1, -1, 1).expand(buffer.shape[0], -1, buffer.shape[2])


def tier(
    host_size: int = 32, policy: str = "write_through", *, kv_size: int = 64, delay: int = 1, fails=None
) -> Tier:
    kv = TokenToKVPoolAllocator(kv_size, checks=LEDGER)
    buffer = torch.zeros((2, kv_size + 1, 4), dtype=torch.float32)
    host = HostPool(host_size, buffer, checks=LEDGER)
    comp = HostKVComponent(host, buffer, WritePolicy(policy))
    tree = RadixCache(kv, components=[comp])
    return Tier(kv, buffer, host, comp, tree, LoadBack(tree, comp, delay=delay, fails=fails))
