"""The cache path a request's memory takes: one ``CachePath`` object per prefix-cache variant.

:class:`~kvledger.reference.scheduler.memory.ReqMemory` allocates and frees what requests hold; what the
prefix cache does with a request (match, adopt a prefix, give back a lock) differs by variant, and each
variant is one small object here, chosen once when the scheduler is built (:func:`cache_path_for`):

* :class:`~.plain.NoCachePath`: no prefix cache (SGLang's ``ChunkCache``): nothing matched, nothing kept;
* :class:`~.plain.RadixPath`: the plain radix cache (KV only);
* :class:`~.mamba_v1.MambaV1Path`: the Mamba radix cache, ``no_buffer`` (states at token granularity);
* :class:`~.mamba_v2.MambaV2Path`: the Mamba radix cache, ``extra_buffer`` (tracking slots, captures, the
  tracked-length insert; spec/mamba-v2.md).

The hooks only Mamba V2 fills in (tracking slots at admission, captures, the check after a finish) are
no-ops in :class:`NoTracking`, which the other three share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.protocols import AnyPrefixCache, KVAllocator, MambaStatePool, NodeLike, ReqRowPool
from kvledger.reference.scheduler.request import Req

if TYPE_CHECKING:  # pragma: no cover
    from kvledger.reference.scheduler.tracking import MambaTracking


class MemoryPools(NamedTuple):
    """The pools a scheduler's requests draw from, and the KV page size."""

    kv_allocator: KVAllocator
    req_to_token_pool: ReqRowPool
    mamba_pool: MambaStatePool | None
    page_size: int


class Matched(NamedTuple):
    """A match for one request: the tree-owned KV ids of its prefix and the node they end at (None without
    a cache); ``stale_cow``: the request's waiting copy-on-write slot is no longer backed by the match;
    ``cow_slot``: the slot the match copied the cached state into, which the request side records (the one
    place a request's holdings are written: ``holdings.MambaSlotHoldings.set_cow``)."""

    prefix: torch.Tensor
    last_node: NodeLike | None
    stale_cow: bool = False
    cow_slot: torch.Tensor | None = None


class CachePath(Protocol):
    """What the request side asks of the prefix cache, one implementation per variant (module doc)."""

    @property
    def tracking(self) -> MambaTracking | None:
        """Mamba V2's tracking rules (None on every other path)."""
        ...

    def match(self, req: Req, key: list[int], *, cow: bool) -> Matched:
        """Match ``key``; with ``cow`` (Mamba cache) copy the matched state into the request's slot."""
        ...

    def evict_kv(self, tokens: int) -> None:
        """Evict ``tokens`` of cached KV (nothing to evict without a cache)."""
        ...

    def evict_states(self, slots: int) -> None:
        """Evict ``slots`` cached Mamba states (nothing to evict without a Mamba cache)."""
        ...

    def needs_tracking_slots(self, req: Req) -> bool:
        """Whether admission must take tracking slots for ``req`` (Mamba V2)."""
        ...

    def alloc_tracking_slots(self, req: Req) -> torch.Tensor | None:
        """``req``'s tracking slots, or None when the pool is short (the admission rolls back)."""
        ...

    def plan_extend(self, req: Req, start: int, end: int) -> None:
        """An extend of ``[start, end)`` is about to run (Mamba V2 plans its capture)."""
        ...

    def plan_decode(self, req: Req) -> None:
        """A decode step is about to run (Mamba V2 plans its capture)."""
        ...

    def after_decode_result(self, req: Req) -> None:
        """A decode result was appended (Mamba V2 flips its tracking half)."""
        ...

    def cache_unfinished(self, req: Req) -> None:
        """After a chunk or a finished prefill: the tree adopts what it can and the lock moves to it."""
        ...

    def cache_finished(self, req: Req) -> int:
        """At finish, the tree adopts what it can; returns where the KV the request frees starts."""
        ...

    def release(self, req: Req) -> None:
        """The cache's part of a release: tracking slots (Mamba V2) and the request's lock."""
        ...

    def check_released(self, req: Req) -> None:
        """After a finish released everything: check nothing is left (Mamba V2's I-V2-CACHE-LEN)."""
        ...


class NoTracking:
    """The hooks only Mamba V2 fills in, as no-ops; and no states to evict (no Mamba cache)."""

    tracking: MambaTracking | None = None

    def evict_states(self, slots: int) -> None:
        return None

    def needs_tracking_slots(self, req: Req) -> bool:
        return False

    def alloc_tracking_slots(self, req: Req) -> torch.Tensor | None:
        raise ContractViolation(f"I-REQ-MAMBA: {req.owner!r}: tracking slots asked for on a path without Mamba V2")

    def plan_extend(self, req: Req, start: int, end: int) -> None:
        return None

    def plan_decode(self, req: Req) -> None:
        return None

    def after_decode_result(self, req: Req) -> None:
        return None

    def check_released(self, req: Req) -> None:
        return None


def row_of(req: Req) -> int:
    """The request's row; a cache path only ever runs for a request that holds one."""
    row = req.req_pool_idx
    if row is None:
        raise ContractViolation(f"I-HANDLE-OWNED: {req.owner!r} has no row where its prefix is cached: {req!r}")
    return row


def lock(tree: AnyPrefixCache, req: Req, node: NodeLike) -> None:
    """Lock ``node``, the request's matched node (``last_node``), for as long as it needs its prefix.
    Pre: the request holds no lock yet (a second would never be given back)."""
    req.lock = tree.inc_lock_ref(node)


def unlock(tree: AnyPrefixCache, req: Req) -> None:
    """Give back the request's lock on the tree, if it holds one."""
    if req.lock is not None:
        tree.dec_lock_ref(req.lock)
        req.lock = None


def hand_over_lock(tree: AnyPrefixCache, rows: ReqRowPool, req: Req, tokens: list[int], cache_len: int) -> None:
    """Re-match what was just inserted, point the row at the tree's ids, move the lock to the new node."""
    match = tree.match_prefix(tokens)
    if int(match.device_indices.numel()) != cache_len:
        raise ContractViolation(
            f"{req.owner!r}: re-match after insert returned {int(match.device_indices.numel())} tokens, "
            f"expected {cache_len} (the inserted path must be matchable)"
        )
    new_lock = tree.inc_lock_ref(match.last_node)
    if req.lock is not None:
        tree.dec_lock_ref(req.lock)
    req.lock, req.last_node = new_lock, match.last_node
    protected = req.cache_protected_len
    rows.write(row_of(req), protected, match.device_indices[protected:])
    req.prefix_indices = match.device_indices
    req.cache_protected_len = cache_len
