"""Each pool kind a scheduler's identity covers, described once, as data.

A :class:`PoolKind` says everything the accounting, the census, the counters and the event log need to
know about one kind of pool, so none of them spells pool names:

* ``name``: the name of its identity terms (``PoolTerms.pool``), of its reports and of its ``pool``
  events in the event log (``kvledger/audit``);
* ``unit``: what its terms count (``tokens``, ``rows``, ``slots``);
* ``attr``: the scheduler attribute that holds the pool (``None`` there: the engine has no such pool);
* its accounts: the free list and the open free group (every kind), ``cache.evictable`` and
  ``cache.protected`` when a prefix cache holds ids of it (``cached``: the tree side whose counters and
  nodes give those terms), and the request accounts, from each live request's bookkeeping;
* its census and counter terms: ``held_units`` (what one request holds by its own bookkeeping, in
  ``unit``) and ``held_ids`` (the same as ledger ids), reading only the request fields ``handles`` (a
  request with all of them ``None`` holds nothing of this kind) and ``fields`` (every field they read:
  a write to one marks the request for the incremental identity);
* its free list: the pool's own, read through the pool's public ``free_list`` (kvledger's pools) or its
  ``available_size``/``pending_free_size``/``free_ids`` (any other implementation).

Adding a pool kind is one :class:`PoolKind` here (or next to the scheduler that has it) plus its pool
class (``kvledger/reference/pools/``, on :class:`~kvledger.reference.pools.base.IdPool`); the scheduler
lists the kinds it has in ``pool_kinds`` (spec/pool-kinds.md).

The request-side readers take the scheduler and the request as the reference passes them (typed there):
this module imports no implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, FREE, PENDING_FREE, Account

CacheSide = str
"""Which part of a prefix cache holds ids of a kind: the name of the kind its tree component caches
(``kv``: the full component, the nodes' KV; ``mamba``: the Mamba component's states; any registered kind).
Open: a new kind with a tree component names itself here and needs no edit of this module."""

HeldUnits = Callable[[Any, Any], int]
"""``(scheduler, request) -> units`` the request holds by its own bookkeeping."""

HeldIds = Callable[[Any, Any], set[int]]
"""``(scheduler, request) -> ledger ids`` the request holds by its own bookkeeping."""


@dataclass(frozen=True)
class PoolKind:
    """One kind of pool, as the scheduler's identity, census, counters and event log see it."""

    name: str
    unit: str
    attr: str
    held_units: HeldUnits
    held_ids: HeldIds
    handles: tuple[str, ...]
    fields: tuple[str, ...]
    cached: CacheSide | None = None

    @property
    def accounts(self) -> tuple[Account, ...]:
        """The non-request accounts ids of this kind can be in (requests add theirs)."""
        cache = (CACHE_EVICTABLE, CACHE_PROTECTED) if self.cached is not None else ()
        return (FREE, PENDING_FREE, *cache)


# ---------------------------------------------------------------------------------- the built-in kinds
def _kv_units(s: Any, r: Any) -> int:
    return int(s.memory.kv_held_tokens(r))


def _kv_ids(s: Any, r: Any) -> set[int]:
    """The KV ledger ids (token slots, or pages) of ``[cache_protected_len, kv_allocated_len)``."""
    if r.req_pool_idx is None or r.kv_allocated_len <= r.cache_protected_len:
        return set()
    slots = s.req_to_token_pool.read(r.req_pool_idx, r.cache_protected_len, r.kv_allocated_len)
    page = s.config.page_size
    return {t // page for t in slots.tolist()}


def _row_units(s: Any, r: Any) -> int:
    return int(r.req_pool_idx is not None)


def _row_ids(s: Any, r: Any) -> set[int]:
    return set() if r.req_pool_idx is None else {int(r.req_pool_idx)}


def _mamba_units(s: Any, r: Any) -> int:
    return len(r.mamba_slots())


def _mamba_ids(s: Any, r: Any) -> set[int]:
    return set(r.mamba_slots())  # the working (or COW) slot and, under V2, the tracking slots


KV = PoolKind(
    name="kv",
    unit="tokens",
    attr="kv_allocator",
    held_units=_kv_units,
    held_ids=_kv_ids,
    handles=("req_pool_idx",),
    fields=("req_pool_idx", "cache_protected_len", "kv_allocated_len"),
    cached="kv",
)
REQ = PoolKind(
    name="req",
    unit="rows",
    attr="req_to_token_pool",
    held_units=_row_units,
    held_ids=_row_ids,
    handles=("req_pool_idx",),
    fields=("req_pool_idx",),
)
MAMBA = PoolKind(
    name="mamba",
    unit="slots",
    attr="mamba_pool",
    held_units=_mamba_units,
    held_ids=_mamba_ids,
    handles=("mamba_pool_idx", "mamba_ping_pong_track_buffer"),
    fields=("mamba_pool_idx", "mamba_ping_pong_track_buffer"),
    cached="mamba",
)


def _metadata_units(s: Any, r: Any) -> int:
    return int(getattr(r, "metadata_idx", None) is not None)


def _metadata_ids(s: Any, r: Any) -> set[int]:
    idx = getattr(r, "metadata_idx", None)
    return set() if idx is None else {int(idx)}


METADATA = PoolKind(
    name="metadata",
    unit="slots",
    attr="metadata_pool",
    held_units=_metadata_units,
    held_ids=_metadata_ids,
    handles=("metadata_idx",),
    fields=("metadata_idx",),
)
"""PD's metadata slots (a PD instance's accounting adds them; a plain request has no ``metadata_idx``)."""


def _holds_none(s: Any, r: Any) -> int:
    return 0


def _ids_none(s: Any, r: Any) -> set[int]:
    return set()


HOST_KV = PoolKind(
    name="host_kv",
    unit="tokens",
    attr="host_kv_pool",
    held_units=_holds_none,
    held_ids=_ids_none,
    handles=(),
    fields=(),
    cached="host_kv",
)
"""The host tier's KV slots (``kvledger/reference/hicache``): held by the tree's host copies only (a
load-back holds device slots, so a request holds none of these)."""

HOST_MAMBA = PoolKind(
    name="host_mamba",
    unit="slots",
    attr="host_mamba_pool",
    held_units=_holds_none,
    held_ids=_ids_none,
    handles=(),
    fields=(),
)
"""The host tier's Mamba states (SGLang's ``MambaPoolHost``): the pool only, no tree component yet."""

POOL_KINDS: tuple[PoolKind, ...] = (KV, REQ, MAMBA)
"""The kinds a plain scheduler has, in the order of its identity terms (Mamba only with a Mamba pool)."""

UNITS: dict[str, str] = {k.name: k.unit for k in (*POOL_KINDS, METADATA, HOST_KV, HOST_MAMBA)}
"""What each known kind's identity terms count."""
