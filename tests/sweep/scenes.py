"""Busy scenes for the bad-input sweep: every target object in a state where a bad call could do harm.

A scene is built fresh for every call tried. ``roots`` are the objects whose full state the sweep
snapshots before and after (``tests/sweep/snapshot.py`` follows them to everything they hold). The
other attributes are the handles the bad calls use: owners, ids held by each, free ids, reserved and
out-of-range ids, nodes and locks (live, released, deleted, from another cache), requests in every
state and batches (in flight, processed, from another scheduler).

Pools and caches are built at the process's checking level (``KVLEDGER_CHECKS``), nothing forced on: a
row that needs to know who holds an id (``Case.needs_owners``) is claimed from the level ``owners`` up.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from kvledger.contracts.owners import REQ_RUNNING, REQ_WAITING, Owner
from kvledger.reference.disagg import PDSpec, build_pd
from kvledger.reference.engine import EngineSpec, build_engine
from kvledger.reference.pools import (
    KVBufferPool,
    MambaPool,
    MetadataBufferPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from kvledger.reference.radix import MambaRadixCache, RadixCache
from kvledger.reference.scheduler import ReqState

PAGE = 4


class Scene(types.SimpleNamespace):
    """Handles for the bad calls; ``roots``: what the snapshot starts from."""

    roots: tuple[Any, ...]


def _ids(t: Any) -> list[int]:
    return t if isinstance(t, list) else t.tolist()


def _free_ids(pool: Any) -> list[int]:
    from tests.sweep.snapshot import free_list_of

    ids = free_list_of(pool)
    assert ids is not None
    return ids.free.tolist()


def _free_tokens(alloc: Any, ps: int) -> torch.Tensor:
    """The token ids of the first free page (or slot) of an allocator."""
    first = _free_ids(alloc)[0]
    return torch.arange(first * ps, (first + 1) * ps, dtype=torch.int64) if ps > 1 else torch.tensor([first])


def owners() -> tuple[Owner, Owner]:
    return Owner("req", 1, REQ_RUNNING), Owner("req", 2, REQ_WAITING)


# ---------------------------------------------------------------------- pools
def token_scene() -> Scene:
    pool = TokenToKVPoolAllocator(8)
    a, b = owners()
    a_ids, b_ids = _ids(pool.alloc(3, a)), _ids(pool.alloc(2, b))
    return Scene(
        roots=(pool,), pool=pool, a=a, b=b, a_ids=a_ids, b_ids=b_ids, free_ids=_free_ids(pool), unit=1,
        reserved=[0], beyond=[9, 10**6], other=TokenToKVPoolAllocator(8),
    )  # fmt: skip


def paged_scene() -> Scene:
    pool = PagedTokenToKVPoolAllocator(6 * PAGE, PAGE)
    a, b = owners()
    a_tokens = _ids(pool.alloc(2 * PAGE, a))
    b_tokens = _ids(pool.alloc(PAGE, b))
    partial = _ids(pool.alloc_extend([0], [1], [-1], [a]))  # a one-token sequence: a partial page of a's
    return Scene(
        roots=(pool,), pool=pool, a=a, b=b, a_ids=a_tokens, b_ids=b_tokens,
        free_ids=[p * PAGE for p in _free_ids(pool)], partial_loc=partial[0], unit=PAGE,
        reserved=list(range(PAGE)), beyond=[7 * PAGE, 7 * PAGE + 1],
        other=PagedTokenToKVPoolAllocator(6 * PAGE, PAGE),
    )  # fmt: skip


def req_scene() -> Scene:
    pool = ReqToTokenPool(5, 8)
    a, b = owners()
    a_ids, b_ids = _ids(pool.alloc(2, a)), _ids(pool.alloc(1, b))
    pool.write(a_ids[0], 0, torch.tensor([11, 12, 13]))
    return Scene(
        roots=(pool,), pool=pool, a=a, b=b, a_ids=a_ids, b_ids=b_ids, free_ids=_free_ids(pool), unit=1,
        reserved=[], beyond=[5, 99],
    )  # fmt: skip


def mamba_scene() -> Scene:
    pool = MambaPool(6, num_layers=2, conv_state_shape=(3,), temporal_state_shape=(2, 2))
    a, b = owners()
    a_ids, b_ids = _ids(pool.alloc(2, a)), _ids(pool.alloc(2, b))
    for i, slot in enumerate(a_ids + b_ids):
        pool.conv_state[:, slot] = float(i + 1)
        pool.temporal_state[:, slot] = -float(i + 1)
    pool.flush()
    return Scene(
        roots=(pool,), pool=pool, a=a, b=b, a_ids=a_ids, b_ids=b_ids, free_ids=_free_ids(pool), unit=1,
        reserved=[0], beyond=[7, 10**6],
    )  # fmt: skip


def kv_buffer_scene() -> Scene:
    buf = KVBufferPool(10, num_layers=2, num_kv_heads=2, head_dim=4)
    buf.k_buffer[:, 1:4] = 1.0
    buf.v_buffer[:, 1:4] = -1.0
    return Scene(roots=(buf,), pool=buf, kv=torch.ones(2, 2, 4), slots=[1, 2])


# ---------------------------------------------------------------------- caches
def _cache_scene(mamba: bool, page_size: int) -> Scene:
    """A tree with a split, a live lock held by ``a`` (its own KV and working slot beside it), a released
    lock, a deleted node, and ``b`` holding KV and a slot the tree does not know."""
    ps = page_size
    alloc = TokenToKVPoolAllocator(32) if ps == 1 else PagedTokenToKVPoolAllocator(32 * ps, ps)
    pool: Any = (
        MambaPool(8, num_layers=1, conv_state_shape=(2,), temporal_state_shape=(2,)) if mamba else None
    )
    cache: Any = MambaRadixCache(alloc, pool) if mamba else RadixCache(alloc)

    def put(tokens: list[int]) -> None:
        owner = Owner("req", 100 + tokens[0], REQ_RUNNING)
        kv = alloc.alloc(len(tokens), owner)
        if mamba:
            slot = pool.alloc(1, owner)
            res = cache.insert(tokens, kv, owner, mamba_slot=slot)
            if not res.mamba_adopted:
                pool.free(slot, owner)
        else:
            cache.insert(tokens, kv, owner)

    def key(*pages: int) -> list[int]:
        return [t for p in pages for t in [p] * ps]

    put(key(9, 9))
    dead = cache.match_prefix(key(9, 9)).last_node
    cache.evict(cache.evictable_size())  # ``dead`` is no longer in the tree
    p1, p2 = key(1, 2, 3, 4), key(1, 5, 6)
    put(p1)
    put(p2)  # splits p1's node after its first page
    a, b = owners()
    m = cache.match_prefix(p1 + key(7))
    a_lock = cache.inc_lock_ref(m.last_node)
    a_own = alloc.alloc(ps, a)
    b_own = alloc.alloc(2 * ps, b)
    released = cache.inc_lock_ref(cache.match_prefix(p2).last_node)
    cache.dec_lock_ref(released)
    scene = Scene(
        roots=(cache,), cache=cache, alloc=alloc, pool=pool, ps=ps, a=a, b=b, p1=p1, p2=p2,
        a_lock=a_lock, a_node=m.last_node, a_prefix=m.device_indices, a_own=a_own, b_own=b_own,
        released_lock=released, dead_node=dead, free_kv=_free_tokens(alloc, ps),
        a_slot=None, b_slot=None, free_slot=None,
    )  # fmt: skip
    if mamba:
        scene.a_slot = pool.alloc(1, a)
        scene.b_slot = pool.alloc(1, b)
        scene.free_slot = _free_ids(pool)[0]
        pool.flush()
    return scene


def plain_cache_scene() -> Scene:
    return _cache_scene(False, 1)


def plain_paged_cache_scene() -> Scene:
    return _cache_scene(False, 2)


def mamba_cache_scene() -> Scene:
    return _cache_scene(True, 1)


def with_foreign(build: Callable[[], Scene]) -> Callable[[], Scene]:
    """The scene plus a node and a lock of another cache of the same kind (for foreign-handle calls)."""

    def scene() -> Scene:
        s = build()
        other = build()
        s.foreign_node, s.foreign_lock, s.foreign_cache = other.a_node, other.a_lock, other.cache
        return s

    return scene


# ---------------------------------------------------------------------- schedulers
# Mamba V1 (no_buffer), said explicitly: EngineSpec's default is V2
SCHED_SPEC = dict(
    page_size=1, tree="mamba_radix", hybrid=True, kv_tokens=256, rows=6, mamba_slots=8, max_running=2,
    chunk=8, max_prefill=32, max_context_len=128, mamba_strategy="no_buffer",
)  # fmt: skip


# Mamba V2 (extra_buffer): tracking slots beside the working slot, captures every 4 tokens
V2_SPEC = dict(
    SCHED_SPEC, mamba_strategy="extra_buffer", mamba_chunk_size=8, mamba_track_interval=4, mamba_slots=16
)


def _busy_scheduler(overlap: bool, v2: bool = False) -> tuple[Any, list[Any]]:
    """Requests finished (0), running (1), chunked (2) and waiting (3); with overlap a batch in flight."""
    sched = build_engine(EngineSpec(overlap=overlap, **(V2_SPEC if v2 else SCHED_SPEC)))  # type: ignore[arg-type]
    batches = []
    sched.add_request(0, [1, 2, 3, 4, 5], 2)
    while sched.requests[0].state is not ReqState.FINISHED:
        batches.append(sched.step())
    sched.add_request(1, [1, 2, 3, 4, 5, 6, 7], 50)
    batches += [sched.step(), sched.step()]
    sched.add_request(2, list(range(10, 40)), 5)
    batches.append(sched.step())
    sched.add_request(3, [9, 9, 9], 4)
    batches.append(sched.step())
    states = [sched.requests[i].state for i in range(4)]
    assert states == [ReqState.FINISHED, ReqState.RUNNING, ReqState.CHUNKED, ReqState.WAITING], states
    return sched, [b for b in batches if b is not None]


def _sched_scene(overlap: bool, v2: bool = False) -> Scene:
    sched, batches = _busy_scheduler(overlap, v2)
    other, other_batches = _busy_scheduler(overlap, v2)
    inflight = list(sched.inflight)
    assert bool(inflight) == overlap
    processed = [b for b in batches if b not in inflight]
    return Scene(
        roots=(sched,), sched=sched, finished=sched.requests[0], running=sched.requests[1],
        chunked=sched.requests[2], waiting=sched.requests[3], inflight=inflight, processed=processed,
        foreign_req=other.requests[1], foreign_batch=other_batches[-1], other=other,
    )  # fmt: skip


def sched_scene() -> Scene:
    return _sched_scene(False)


def sched_overlap_scene() -> Scene:
    return _sched_scene(True)


def sched_v2_scene() -> Scene:
    """Mamba V2 with overlap: the requests also hold tracking slots, a batch is in flight."""
    return _sched_scene(True, v2=True)


# ---------------------------------------------------------------------- PD
def metadata_scene() -> Scene:
    pool = MetadataBufferPool(5)
    a, b = owners()
    a_ids = [pool.alloc(a), pool.alloc(a)]
    b_ids = [pool.alloc(b)]
    pool.set_buf(a_ids[0], 7, 3)
    return Scene(roots=(pool,), pool=pool, a=a, b=b, a_ids=a_ids, b_ids=b_ids, free_ids=_free_ids(pool))


def pd_scene() -> Scene:
    """A PD system: request 0 finished, 1 between the instances (prefilled or in transfer), 2 waiting."""
    system = build_pd(PDSpec())
    system.add_request(0, [1, 2, 3], 2)
    system.run_until_idle(200)
    system.add_request(1, list(range(1, 20)), 8)
    system.step()
    system.step()
    system.add_request(2, [5, 6, 7], 3)
    assert not system.is_quiescent()
    return Scene(roots=(system,), system=system, sched=system.decode)


def empty_scene() -> Scene:
    """For constructors and module functions: nothing exists yet, so nothing may change."""
    return Scene(roots=())


SCENES: dict[str, Callable[[], Scene]] = {
    "token": token_scene,
    "paged": paged_scene,
    "req": req_scene,
    "mamba": mamba_scene,
    "kv_buffer": kv_buffer_scene,
    "plain_cache": with_foreign(plain_cache_scene),
    "plain_paged_cache": with_foreign(plain_paged_cache_scene),
    "mamba_cache": with_foreign(mamba_cache_scene),
    "sched": sched_scene,
    "sched_overlap": sched_overlap_scene,
    "sched_v2": sched_v2_scene,
    "metadata": metadata_scene,
    "pd": pd_scene,
    "empty": empty_scene,
}
