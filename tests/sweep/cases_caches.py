"""Bad calls on the radix caches: every public member of ``RadixCache`` and ``MambaRadixCache``.

Scenes (``tests/sweep/scenes.py``): a tree with a split, request ``a`` holding a live lock on the path it
matched plus its own KV (``a_own``) and, in the Mamba tree, a working slot; ``b`` holding KV and a slot
the tree does not know; a released lock, a deleted node, and a node and a lock of another cache.

The reference call for ``insert`` is ``a``'s: ``p1 + one page`` with the matched prefix protected and
``a_own`` adopted. Each bad call changes exactly one argument of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kvledger.reference.pools import MambaPool, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvledger.reference.radix import LockRef, MambaRadixCache, RadixCache
from tests.sweep.scenes import Scene
from tests.sweep.table import (
    DEGENERATE,
    DOUBLE,
    DUPLICATE,
    FOREIGN,
    NEGATIVE,
    OUT_OF_RANGE,
    WRONG_STATE,
    WRONG_TYPE,
    Case,
    Query,
    Row,
    method_cases,
)

Plain: Any = RadixCache  # typed as Any: the wrong-type arguments below are deliberate
Mamba: Any = MambaRadixCache

KEEP = object()


def _key(s: Scene) -> list[int]:
    return list(s.p1) + [7] * s.ps


def _value(s: Scene) -> torch.Tensor:
    return torch.cat((s.a_prefix, s.a_own))


def _insert(
    s: Scene, key: Any = KEEP, value: Any = KEEP, owner: Any = KEEP, protected: Any = KEEP, slot: Any = KEEP
) -> object:
    """``a``'s insert with the given arguments replaced."""
    key = _key(s) if key is KEEP else key
    value = _value(s) if value is KEEP else value
    owner = s.a if owner is KEEP else owner
    protected = len(s.a_prefix) if protected is KEEP else protected
    if isinstance(s.cache, MambaRadixCache):
        slot = s.a_slot if slot is KEEP else slot
        return s.cache.insert(key, value, owner, mamba_slot=slot, protected_len=protected)
    return s.cache.insert(key, value, owner, protected_len=protected)


def _with_id(v: torch.Tensor, i: int, new: int) -> torch.Tensor:
    out = v.clone()
    out[i] = new
    return out


BAD_KEYS: list[tuple[str, str, Any]] = [  # (category, label, key); the scene's page size fills in nothing
    (WRONG_TYPE, "a nested list key", [[1], [2]]),
    (WRONG_TYPE, "a float token", [1.0, 2.0]),
    (WRONG_TYPE, "a str token", ["a", "b"]),
    (WRONG_TYPE, "a None token", [1, None]),
    (WRONG_TYPE, "a None key", None),
    (WRONG_TYPE, "an int key", 5),
    (WRONG_TYPE, "a str key", "12"),
    (WRONG_TYPE, "a dict key", {1: 2}),
    (WRONG_TYPE, "a generator key", (t for t in [1, 2])),
    (WRONG_TYPE, "a float tensor key", torch.tensor([1.0, 2.0])),
    (WRONG_TYPE, "a bool tensor key", torch.tensor([True, False])),
    (WRONG_TYPE, "a 2-D tensor key", torch.tensor([[1, 2]])),
    (WRONG_TYPE, "a float array key", np.array([1.0, 2.0])),
    (WRONG_TYPE, "numpy scalar tokens", [np.int64(1), np.float32(2)]),
]


def _key_rows(method: str) -> list[Row]:
    rows = []
    for cat, label, key in BAD_KEYS:
        if method == "match_prefix":
            rows.append(Row(cat, label, "InvalidKey", lambda s, k=key: s.cache.match_prefix(k)))
        elif method == "match_prefix_kv":
            rows.append(Row(cat, label, "InvalidKey", lambda s, k=key: s.cache.match_prefix_kv(k)))
        else:
            rows.append(Row(cat, label, "InvalidKey", lambda s, k=key: _insert(s, key=k)))
    return rows


INSERT: list[Row] = [
    *_key_rows("insert"),
    Row(
        DEGENERATE,
        "a key longer than the value",
        "InvalidKey",
        lambda s: _insert(s, key=[*_key(s), *[8] * s.ps]),
    ),
    Row(WRONG_TYPE, "a float value", "InvalidArgument", lambda s: _insert(s, value=_value(s).float())),
    Row(WRONG_TYPE, "a 2-D value", "InvalidArgument", lambda s: _insert(s, value=_value(s)[None])),
    Row(WRONG_TYPE, "a None value", "InvalidArgument", lambda s: _insert(s, value=None)),
    Row(
        WRONG_TYPE,
        "a value on the wrong device",
        "InvalidArgument",
        lambda s: _insert(s, value=_value(s).to("meta")),
    ),
    Row(WRONG_TYPE, "an owner that is not an Owner", "InvalidArgument", lambda s: _insert(s, owner="a")),
    Row(WRONG_TYPE, "a None owner", "InvalidArgument", lambda s: _insert(s, owner=None)),
    Row(NEGATIVE, "a negative protected_len", "InvalidArgument", lambda s: _insert(s, protected=-s.ps)),
    Row(
        WRONG_TYPE,
        "a float protected_len",
        "InvalidArgument",
        lambda s: _insert(s, protected=float(len(s.a_prefix))),
    ),
    Row(
        OUT_OF_RANGE,
        "protected_len beyond the key",
        "InvalidArgument",
        lambda s: _insert(s, protected=len(_key(s)) + s.ps),
    ),
    Row(
        OUT_OF_RANGE,
        "protected_len beyond the cached prefix",
        "PrefixMismatch",
        lambda s: _insert(s, protected=len(_key(s))),
    ),
    Row(
        FOREIGN,
        "protected ids that are not the tree's",
        "PrefixMismatch",
        lambda s: _insert(s, value=torch.cat((s.a_own, s.a_prefix))),
    ),
    Row(
        DOUBLE,
        "an adopted id that is free",
        "DoubleFree",
        lambda s: _insert(s, value=torch.cat((s.a_prefix, s.free_kv))),
    ),
    Row(
        FOREIGN,
        "adopted ids held by another owner",
        "ForeignSlot",
        lambda s: _insert(s, value=torch.cat((s.a_prefix, s.b_own[: s.ps]))),
        True,
    ),
    Row(
        FOREIGN,
        "adopted ids the tree owns",
        "ForeignSlot",
        lambda s: _insert(s, value=torch.cat((s.a_prefix, s.a_prefix[: s.ps]))),
        True,
    ),
    Row(
        OUT_OF_RANGE,
        "an adopted id past the pool",
        "SlotOutOfRange",
        lambda s: _insert(s, value=torch.cat((s.a_prefix, torch.arange(10**4 * s.ps, 10**4 * s.ps + s.ps)))),
    ),
    Row(
        NEGATIVE,
        "a negative adopted id",
        "SlotOutOfRange",
        lambda s: _insert(s, value=torch.cat((s.a_prefix, torch.arange(-s.ps, 0)))),
    ),
    Row(
        DUPLICATE,
        "an adopted id twice",
        "DuplicateIds",
        lambda s: _insert(s, key=[*_key(s), *[8] * s.ps], value=torch.cat((s.a_prefix, s.a_own, s.a_own))),
    ),
]

PAGED_INSERT: list[Row] = [
    Row(
        DEGENERATE,
        "a key that is not whole pages",
        "InvalidKey",
        lambda s: _insert(s, key=_key(s)[:-1], value=_value(s)[:-1]),
    ),
    Row(
        OUT_OF_RANGE,
        "adopted ids that are not whole pages in order",
        "InvalidArgument",
        lambda s: _insert(s, value=torch.cat((s.a_prefix, s.a_own.flip(0)))),
    ),
    Row(
        DEGENERATE,
        "an unaligned protected_len",
        "InvalidArgument",
        lambda s: _insert(s, protected=len(s.a_prefix) - 1),
    ),
]

MAMBA_INSERT: list[Row] = [
    Row(
        WRONG_TYPE,
        "an unknown state_op (V2)",
        "InvalidArgument",
        lambda s: s.cache.insert(_key(s), _value(s), s.a, mamba_slot=s.a_slot, state_op="steal"),
    ),
    Row(
        WRONG_TYPE,
        "a None state_op (V2)",
        "InvalidArgument",
        lambda s: s.cache.insert(_key(s), _value(s), s.a, mamba_slot=s.a_slot, state_op=None),
    ),
    Row(WRONG_STATE, "no state for a new leaf", "InvalidArgument", lambda s: _insert(s, slot=None)),
    Row(DOUBLE, "a free state slot", "InvalidArgument", lambda s: _insert(s, slot=s.free_slot)),
    Row(
        FOREIGN, "a state slot another owner holds", "ForeignSlot", lambda s: _insert(s, slot=s.b_slot), True
    ),
    Row(
        FOREIGN,
        "a state slot the tree owns",
        "ForeignSlot",
        lambda s: _insert(s, slot=s.a_node.mamba_value),
        True,
    ),
    Row(
        OUT_OF_RANGE,
        "a state slot past the pool",
        "SlotOutOfRange",
        lambda s: _insert(s, slot=torch.tensor([99])),
    ),
    Row(OUT_OF_RANGE, "the reserved state slot", "SlotOutOfRange", lambda s: _insert(s, slot=0)),
    Row(
        DEGENERATE,
        "two state slots",
        "InvalidArgument",
        lambda s: _insert(s, slot=torch.cat((s.a_slot, s.b_slot))),
    ),
    Row(WRONG_TYPE, "a float state slot", "InvalidArgument", lambda s: _insert(s, slot=torch.tensor([1.0]))),
    Row(WRONG_TYPE, "a str state slot", "InvalidArgument", lambda s: _insert(s, slot="1")),
]

MATCH: list[Row] = _key_rows("match_prefix")

MAMBA_MATCH: list[Row] = [
    Row(
        WRONG_TYPE,
        "a cow_owner that is not an Owner",
        "InvalidArgument",
        lambda s: s.cache.match_prefix(s.p1, cow_owner="a"),
    ),
    Row(
        WRONG_STATE,
        "a cow_slot without a cow_owner",
        "InvalidArgument",
        lambda s: s.cache.match_prefix(s.p1, cow_slot=s.a_slot),
    ),
    Row(
        DOUBLE,
        "a free cow_slot",
        "InvalidArgument",
        lambda s: s.cache.match_prefix(s.p1, cow_owner=s.a, cow_slot=torch.tensor([s.free_slot])),
    ),
    Row(
        FOREIGN,
        "a cow_slot another owner holds",
        "ForeignSlot",
        lambda s: s.cache.match_prefix(s.p1, cow_owner=s.a, cow_slot=s.b_slot),
        True,
    ),
    Row(
        FOREIGN,
        "a cow_slot the tree owns",
        "ForeignSlot",
        lambda s: s.cache.match_prefix(s.p1, cow_owner=s.a, cow_slot=s.a_node.mamba_value),
        True,
    ),
    Row(
        OUT_OF_RANGE,
        "a cow_slot past the pool",
        "SlotOutOfRange",
        lambda s: s.cache.match_prefix(s.p1, cow_owner=s.a, cow_slot=torch.tensor([9])),
    ),
    Row(
        NEGATIVE,
        "a negative cow_slot",
        "SlotOutOfRange",
        lambda s: s.cache.match_prefix(s.p1, cow_owner=s.a, cow_slot=-1),
    ),
    Row(
        DEGENERATE,
        "two cow slots",
        "InvalidArgument",
        lambda s: s.cache.match_prefix(s.p1, cow_owner=s.a, cow_slot=torch.cat((s.a_slot, s.b_slot))),
    ),
    Row(
        WRONG_TYPE,
        "a float cow_slot",
        "InvalidArgument",
        lambda s: s.cache.match_prefix(s.p1, cow_owner=s.a, cow_slot=1.0),
    ),
]

INC: list[Row] = [
    Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.cache.inc_lock_ref(None)),
    Row(WRONG_TYPE, "a lock instead of a node", "InvalidArgument", lambda s: s.cache.inc_lock_ref(s.a_lock)),
    Row(WRONG_TYPE, "a key instead of a node", "InvalidArgument", lambda s: s.cache.inc_lock_ref(s.p1)),
    Row(FOREIGN, "a node of another cache", "ForeignNode", lambda s: s.cache.inc_lock_ref(s.foreign_node)),
    Row(
        WRONG_STATE,
        "a node no longer in the tree",
        "ForeignNode",
        lambda s: s.cache.inc_lock_ref(s.dead_node),
    ),
]

DEC: list[Row] = [
    Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.cache.dec_lock_ref(None)),
    Row(WRONG_TYPE, "a node instead of a lock", "InvalidArgument", lambda s: s.cache.dec_lock_ref(s.a_node)),
    Row(DOUBLE, "a released lock", "LockNotHeld", lambda s: s.cache.dec_lock_ref(s.released_lock)),
    Row(FOREIGN, "a lock of another cache", "ForeignNode", lambda s: s.cache.dec_lock_ref(s.foreign_lock)),
    Row(
        FOREIGN,
        "a forged lock",
        "LockNotHeld",
        lambda s: s.cache.dec_lock_ref(LockRef(s.a_node, False, s.a_lock.tree_id)),
    ),
]


def _count_rows(method: str) -> list[Row]:
    return [
        Row(NEGATIVE, "a negative count", "InvalidArgument", lambda s: getattr(s.cache, method)(-1)),
        Row(WRONG_TYPE, "a float count", "InvalidArgument", lambda s: getattr(s.cache, method)(1.5)),
        Row(WRONG_TYPE, "a bool count", "InvalidArgument", lambda s: getattr(s.cache, method)(True)),
        Row(WRONG_TYPE, "a None count", "InvalidArgument", lambda s: getattr(s.cache, method)(None)),
        Row(OUT_OF_RANGE, "a count beyond MAX_SIZE", "SizeOutOfRange", lambda s: getattr(s.cache, method)(2**70)),
    ]


def _small_alloc() -> Any:
    return TokenToKVPoolAllocator(8)


def _small_pool() -> Any:
    return MambaPool(2, num_layers=1, conv_state_shape=(1,), temporal_state_shape=(1,))


CTOR_PLAIN: list[Row] = [
    Row(WRONG_TYPE, "a None allocator", "InvalidArgument", lambda s: Plain(None)),
    Row(WRONG_TYPE, "a tensor allocator", "InvalidArgument", lambda s: Plain(torch.zeros(4))),
    Row(WRONG_TYPE, "a Mamba pool as the allocator", "InvalidArgument", lambda s: Plain(_small_pool())),
    Row(DEGENERATE, "page_size 0", "InvalidArgument", lambda s: Plain(_small_alloc(), page_size=0)),
    Row(NEGATIVE, "a negative page_size", "InvalidArgument", lambda s: Plain(_small_alloc(), page_size=-2)),
    Row(WRONG_TYPE, "a float page_size", "InvalidArgument", lambda s: Plain(_small_alloc(), page_size=1.0)),
    Row(
        WRONG_TYPE, "a name that is not a str", "InvalidArgument", lambda s: Plain(_small_alloc(), name=None)
    ),
]

CTOR_MAMBA: list[Row] = [
    Row(
        DEGENERATE,
        "a V2 chunk size 0",
        "InvalidArgument",
        lambda s: Mamba(_small_alloc(), _small_pool(), mamba_cache_chunk_size=0),
    ),
    Row(
        WRONG_TYPE,
        "a float V2 chunk size",
        "InvalidArgument",
        lambda s: Mamba(_small_alloc(), _small_pool(), mamba_cache_chunk_size=8.0),
    ),
    Row(
        OUT_OF_RANGE,
        "a V2 chunk size beyond MAX_SIZE",
        "SizeOutOfRange",
        lambda s: Mamba(_small_alloc(), _small_pool(), mamba_cache_chunk_size=2**70),
    ),
    Row(
        DEGENERATE,
        "a V2 chunk size that is not a page multiple",
        "InvalidArgument",
        lambda s: Mamba(PagedTokenToKVPoolAllocator(64, 4), _small_pool(), mamba_cache_chunk_size=6),
    ),
    Row(WRONG_TYPE, "a None allocator", "InvalidArgument", lambda s: Mamba(None, _small_pool())),
    Row(WRONG_TYPE, "a None Mamba pool", "InvalidArgument", lambda s: Mamba(_small_alloc(), None)),
    Row(
        WRONG_TYPE,
        "a KV allocator as the Mamba pool",
        "InvalidArgument",
        lambda s: Mamba(_small_alloc(), _small_alloc()),
    ),
    Row(
        DEGENERATE,
        "page_size 0",
        "InvalidArgument",
        lambda s: Mamba(_small_alloc(), _small_pool(), page_size=0),
    ),
    Row(
        WRONG_TYPE,
        "a str page_size",
        "InvalidArgument",
        lambda s: Mamba(_small_alloc(), _small_pool(), page_size="1"),
    ),
    Row(
        WRONG_TYPE,
        "a name that is not a str",
        "InvalidArgument",
        lambda s: Mamba(_small_alloc(), _small_pool(), name=1),
    ),
]


def _tree_rows(mamba: bool, paged: bool) -> dict[str, list[Row]]:
    rows = {
        "match_prefix": MATCH + (MAMBA_MATCH if mamba else []),
        "insert": INSERT + (PAGED_INSERT if paged else []) + (MAMBA_INSERT if mamba else []),
        "inc_lock_ref": INC,
        "dec_lock_ref": DEC,
        "evict": _count_rows("evict"),
        "observe_steps": OBSERVE,
        "component": COMPONENT,
    }
    if mamba:
        rows["match_prefix_kv"] = _key_rows("match_prefix_kv")  # the PD decode's KV-only match (issue 27)
        rows["evict_full"] = _count_rows("evict_full")
        rows["evict_mamba"] = _count_rows("evict_mamba")
    return rows


COMPONENT = [  # the tree component of a pool kind (issue 36 item 2)
    Row(OUT_OF_RANGE, "a kind the tree does not cache", "InvalidArgument", lambda s: s.cache.component("nope")),
    Row(WRONG_TYPE, "a kind that is not a name", "InvalidArgument", lambda s: s.cache.component(1)),
]


OBSERVE = [
    Row(WRONG_TYPE, "wrappers that are not a mapping", "InvalidArgument", lambda s: s.cache.observe_steps([])),
    Row(
        OUT_OF_RANGE,
        "a step the trees do not have",
        "InvalidArgument",
        lambda s: s.cache.observe_steps({"insert": lambda real: real}),
    ),
    Row(
        WRONG_TYPE,
        "a wrapper that is not callable",
        "InvalidArgument",
        lambda s: s.cache.observe_steps({"split": 1}),
    ),
]


CASES: list[Case] = [
    *method_cases("RadixCache", "plain_cache", {"__init__": CTOR_PLAIN, **_tree_rows(False, False)}),
    *method_cases("RadixCache", "plain_paged_cache", _tree_rows(False, True), " (page 2)"),
    *method_cases("MambaRadixCache", "mamba_cache", {"__init__": CTOR_MAMBA, **_tree_rows(True, False)}),
]

_SIZES = ("evictable_size", "protected_size", "total_size")
_MAMBA_SIZES = (
    "full_evictable_size",
    "full_protected_size",
    "mamba_evictable_size",
    "mamba_protected_size",
    "mamba_total_size",
)

_VIEWS = {  # the read-only views for recorders and snapshots
    "clock": lambda s: s.cache.clock,
    "live_locks": lambda s: s.cache.live_locks(),
    "lru_order": lambda s: s.cache.lru_order(),
    "cached_kinds": lambda s: s.cache.cached_kinds(),
}

QUERIES: list[Query] = [
    Query("RadixCache.audit", "plain_cache", lambda s: s.cache.audit(), "a full recount"),
    Query("MambaRadixCache.audit", "mamba_cache", lambda s: s.cache.audit(), "a full recount"),
    *(Query(f"RadixCache.{n}", "plain_cache", lambda s, n=n: getattr(s.cache, n)()) for n in _SIZES),
    *(
        Query(f"MambaRadixCache.{n}", "mamba_cache", lambda s, n=n: getattr(s.cache, n)())
        for n in (*_SIZES, *_MAMBA_SIZES)
    ),
    *(Query(f"RadixCache.{n}", "plain_cache", call, "a read-only view") for n, call in _VIEWS.items()),
    *(Query(f"MambaRadixCache.{n}", "mamba_cache", call, "a read-only view") for n, call in _VIEWS.items()),
    Query("RadixCache.kv_ledger", "plain_cache", lambda s: s.cache.kv_ledger, "a read-only view"),
    Query("MambaRadixCache.kv_ledger", "mamba_cache", lambda s: s.cache.kv_ledger, "a read-only view"),
    Query("MambaRadixCache.mamba_lru_order", "mamba_cache", lambda s: s.cache.mamba_lru_order(), "a view"),
    Query("MambaRadixCache.mamba_cache_chunk_size", "mamba_cache", lambda s: s.cache.mamba_cache_chunk_size, "grid"),
]
