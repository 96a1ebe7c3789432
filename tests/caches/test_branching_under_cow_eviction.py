"""Mamba V2: the branching point a copy-on-write match reports when that copy had to evict a state.

``match_prefix(cow_owner=...)`` computes the branching point from the path it matched, then makes the
copy; with the state pool empty the copy evicts one state (the source pinned), and that eviction can prune
the tombstones the match went through. The result then names a branching point past what the tree still
holds. SGLang 0.5.20 does the same (``MambaRadixCache._match_post_processor`` computes
``mamba_branching_seqlen`` before its copy-on-write eviction), and it is harmless: the request captures
its own state there and inserts it with its own KV. The cache machine's model must expect the branching
point of the tree as matched, not of the tree after the call (``TestMambaV2Paged`` failed under the
``dev`` profile on this: "branching point 8, the model's is None").
"""

from __future__ import annotations

from kvledger.museum.machines.cache import CacheMachine
from kvledger.museum.machines.cache_support import make_allocator, make_mamba_pool, new_owner
from kvledger.reference.radix import MambaRadixCache

A, B = (1,) * 8, (2,) * 8  # two pages each at page 4; the capture grid is 8 tokens


def _put(cache: MambaRadixCache, alloc: object, pool: object, key: tuple[int, ...]) -> None:
    owner = new_owner()
    kv = alloc.alloc(len(key), owner)  # type: ignore[attr-defined]
    slot = pool.alloc(1, owner)  # type: ignore[attr-defined]
    if not cache.insert(key, kv, owner, mamba_slot=slot, protected_len=0).mamba_adopted:
        pool.free(slot, owner)  # type: ignore[attr-defined]


def test_the_branching_point_is_the_matched_trees_even_when_the_copy_evicts_it() -> None:
    alloc, pool = make_allocator(4, 10), make_mamba_pool(2)
    cache = MambaRadixCache(alloc, pool, mamba_cache_chunk_size=8)
    _put(cache, alloc, pool, A + B + (3,) * 4)
    _put(cache, alloc, pool, A + B + (4,) * 4)  # A+B: a tombstone split off, two leaves with states
    cache.evict_mamba(1)  # the older leaf goes: the tombstone A+B keeps one child
    _put(cache, alloc, pool, A)  # A takes the freed slot: the pool is empty again
    key = A + B + (5,) * 4
    assert cache.match_prefix(key).mamba_branching_seqlen == 16  # past A's state, through A+B

    m = cache.match_prefix(key, cow_owner=new_owner())
    assert m.cow_slot is not None and m.device_indices.numel() == 8
    assert m.mamba_branching_seqlen == 16  # the tree as matched: SGLang's order
    assert cache.match_prefix(key).mamba_branching_seqlen is None  # the copy's eviction pruned A+B


def test_the_cache_machine_expects_the_branching_point_of_the_tree_as_matched() -> None:
    """The same sequence through the machine's rules (page 4, two state slots): no violation."""
    machine = CacheMachine()
    machine.setup(kind=1, page=2, pool_pages=10, mamba_slots=2)  # mamba_v2, page 4
    machine.insert_unmatched(key=([0, 0, 4, 4, 8], None, 0))
    machine.insert_unmatched(key=([0, 0, 4, 4, 1], None, 0))
    machine.refines_the_model()
    machine.evict_mamba(n=1)
    machine.insert_unmatched(key=([0, 0], None, 0))
    assert machine.pool.available_size() == 0
    machine.admit(key=([0, 0, 4, 4, 2], None, 0), cow=True)
    machine.refines_the_model()
    assert machine.reqs and machine.reqs[-1].branching == 16
    machine.teardown()
