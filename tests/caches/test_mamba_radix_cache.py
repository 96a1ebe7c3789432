"""Unit tests of ``MambaRadixCache``: SGLang's micro-geometry, copy-on-write, tombstones, locks, eviction."""

from __future__ import annotations

import pytest
import torch

from kvledger import kernels
from kvledger.contracts.errors import ForeignNode, ForeignSlot, InvalidArgument, LockNotHeld
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, REQ_WAITING, Owner
from kvledger.reference.radix import InsertResult, MambaRadixCache

from ._helpers import (
    assert_rejected,
    audit_all,
    extract,
    insert_fresh,
    make_mamba,
    needs_contracts,
    new_owner,
    nodes_of,
    path_ids,
    read_tag,
)


def test_sglang_unit_test_micro_geometry() -> None:
    """test_mamba_unittest.py::test_mamba_radix_cache_1: KV 128, Mamba 20, page 1, the same expectations."""
    cache = make_mamba(pages=128, slots=20)
    pool = cache.mamba_pool
    assert insert_fresh(cache, [1, 2, 3], tag=1) == InsertResult(0, True)
    assert insert_fresh(cache, [1, 2, 3, 4, 5, 6, 7], tag=2) == InsertResult(3, True)
    assert insert_fresh(cache, [10, 11, 12], tag=3) == InsertResult(0, True)
    assert insert_fresh(cache, [1, 2, 3, 4, 5, 60, 70], tag=4) == InsertResult(5, True)
    audit_all(cache)
    assert cache.evict(1) == 3  # the LRU leaf [10, 11, 12]
    assert cache.evict_mamba(1) == 1  # [1, 2, 3] becomes a tombstone
    audit_all(cache)
    m5 = cache.match_prefix([1, 2, 3, 4, 5])
    assert m5.device_indices.numel() == 0
    m6 = cache.match_prefix([1, 2, 3, 4, 5, 60, 70])
    assert m6.device_indices.numel() == 7 and len(m6.last_node.key) == 2
    m7 = cache.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert m7.device_indices.numel() == 7 and len(m7.last_node.key) == 2
    assert cache.evict_mamba(1) == 1  # [60, 70] is now the LRU state: a leaf, evicted whole
    m8 = cache.match_prefix([1, 2, 3, 4, 5, 60, 70])
    assert m8.device_indices.numel() == 0 and len(m8.last_node.key) == 0
    req = Owner("req", 9, REQ_WAITING)
    m9 = cache.match_prefix([1, 2, 3, 4, 5, 6, 7], cow_owner=req)
    assert m9.cow_slot is not None and m9.last_node.mamba_value is not None
    for state in pool.states:
        assert torch.equal(
            kernels.fingerprint_slots(state, m9.cow_slot),
            kernels.fingerprint_slots(state, m9.last_node.mamba_value),
        )
    assert read_tag(pool, m9.cow_slot) == 2
    if pool.ledger.enabled:
        assert pool.ledger.owner_of(int(m9.cow_slot)) is req
    audit_all(cache)


def test_match_stops_at_the_deepest_state_on_the_path() -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2], tag=1)
    insert_fresh(cache, [1, 2, 3, 4, 5, 6], tag=2)
    m = cache.match_prefix([1, 2, 3, 4, 9])  # splits [3..6] at 2: the upper part is a tombstone
    assert m.device_indices.numel() == 2 and m.last_node.key == (1, 2)
    upper = m.last_node.children[(3,)]
    assert upper.mamba_value is None and upper.key == (3, 4)
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).device_indices.numel() == 6
    audit_all(cache)


def test_cow_copies_into_the_callers_slot_from_an_earlier_round() -> None:
    cache = make_mamba()
    pool = cache.mamba_pool
    insert_fresh(cache, [1, 2, 3], tag=7)
    req = new_owner()
    held = pool.alloc(1, req)
    m = cache.match_prefix([1, 2, 3, 4], cow_owner=req, cow_slot=held)
    assert m.cow_slot is not None and m.cow_slot.tolist() == held.tolist() and read_tag(pool, held) == 7
    assert pool.available_size() == pool.size - 2
    # no state on the path: nothing copied, the caller's slot is left as it was
    m2 = cache.match_prefix([8, 8], cow_owner=req, cow_slot=held)
    assert m2.cow_slot is None and m2.last_node is cache.root
    audit_all(cache)


def test_cow_with_an_empty_pool_evicts_another_state_not_the_source() -> None:
    cache = make_mamba(slots=3)
    pool = cache.mamba_pool
    insert_fresh(cache, [1, 1], tag=1)  # LRU: the source will be the oldest state
    insert_fresh(cache, [2, 2], tag=2)
    insert_fresh(cache, [3, 3], tag=3)
    assert pool.available_size() == 0
    req = new_owner()
    m = cache.match_prefix([1, 1, 5], cow_owner=req)
    assert m.cow_slot is not None and read_tag(pool, m.cow_slot) == 1
    _, states = extract(cache, pool)
    assert (1, 1) in states and len(states) == 2  # another state went, the source stayed
    assert m.last_node.lock_ref == 0 and m.last_node.mamba_lock_ref == 0  # the pin was released
    audit_all(cache)


def test_cow_gives_up_without_asserting_when_nothing_can_be_evicted() -> None:
    cache = make_mamba(slots=2)
    pool = cache.mamba_pool
    insert_fresh(cache, [1, 1], tag=1)
    insert_fresh(cache, [2, 2], tag=2)
    lock = cache.inc_lock_ref(cache.match_prefix([2, 2]).last_node)
    m = cache.match_prefix([1, 1], cow_owner=new_owner())
    assert m.cow_slot is None and m.last_node.key == (1, 1)
    assert pool.available_size() == 0 and cache.mamba_total_size() == 2
    assert m.last_node.lock_ref == 0
    cache.dec_lock_ref(lock)
    audit_all(cache)


def test_insert_revives_a_tombstone_and_refuses_a_second_state() -> None:
    cache = make_mamba()
    pool = cache.mamba_pool
    insert_fresh(cache, [1, 2, 3, 4], tag=1)
    cache.match_prefix([1, 2, 9])  # split: [1, 2] is a tombstone
    assert cache.mamba_total_size() == 1
    assert insert_fresh(cache, [1, 2], tag=5) == InsertResult(2, True)
    assert cache.mamba_evictable_size() == 2
    m = cache.match_prefix([1, 2, 8])
    assert m.device_indices.numel() == 2 and read_tag(pool, m.last_node.mamba_value) == 5
    free_before = pool.available_size()
    assert insert_fresh(cache, [1, 2], tag=6) == InsertResult(2, False)  # the caller frees its slot
    assert pool.available_size() == free_before
    audit_all(cache)


def test_insert_without_a_slot_only_where_no_leaf_is_needed() -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2, 3], tag=1)
    owner = new_owner()
    kv = cache.token_to_kv_pool_allocator.alloc(4, owner)
    assert_rejected(cache, InvalidArgument, lambda: cache.insert([1, 2, 3, 4], kv, owner, mamba_slot=None))
    assert cache.insert([1, 2, 3], kv[:3], owner, mamba_slot=None) == InsertResult(3, False)
    audit_all(cache)


def test_b14_dec_after_revival_does_not_touch_the_mamba_lock() -> None:
    """PR #27147: inc on a tombstone (no state lock), revive it, dec: the state lock must stay untouched."""
    cache = make_mamba()
    insert_fresh(cache, [1, 2, 3, 4], tag=1)
    cache.match_prefix([1, 2, 9])
    tomb = cache.root.children[(1,)]
    assert tomb.mamba_value is None
    early = cache.inc_lock_ref(tomb)
    assert not early.took_mamba and tomb.mamba_lock_ref == 0
    insert_fresh(cache, [1, 2], tag=2)  # revival
    assert tomb.mamba_value is not None and tomb.mamba_owner.account == CACHE_EVICTABLE
    late = cache.inc_lock_ref(tomb)
    assert late.took_mamba and tomb.mamba_lock_ref == 1 and tomb.mamba_owner.account == CACHE_PROTECTED
    cache.dec_lock_ref(early)
    assert tomb.mamba_lock_ref == 1 and cache.mamba_protected_size() == 1
    audit_all(cache)
    cache.dec_lock_ref(late)
    assert tomb.mamba_lock_ref == 0 and cache.mamba_protected_size() == 0
    audit_all(cache)


def test_releasing_a_tombstone_leaf_deletes_it() -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2, 3, 4], tag=1)
    cache.match_prefix([1, 2, 9])
    tomb = cache.root.children[(1,)]
    lock = cache.inc_lock_ref(tomb)  # a holder pins the tombstone's KV
    assert cache.evict(10) == 2  # its child goes; it stays, locked
    assert tomb.live and not tomb.children
    audit_all(cache)
    cache.dec_lock_ref(lock)
    assert not tomb.live and cache.total_size() == 0  # I-TOMBSTONE: no unlocked tombstone leaf
    audit_all(cache)


def test_evict_mamba_tombstones_internal_nodes_and_evicts_leaves_whole() -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2], tag=1)
    insert_fresh(cache, [1, 2, 3, 4], tag=2)
    insert_fresh(cache, [5, 6], tag=3)
    kv_free = cache.token_to_kv_pool_allocator.available_size()
    assert cache.evict_mamba(1) == 1  # [1, 2] is the oldest state; internal: tombstone, KV kept
    assert cache.total_size() == 6 and cache.token_to_kv_pool_allocator.available_size() == kv_free
    assert cache.evict_mamba(1) == 1  # [3, 4]: a leaf, evicted whole, and its tombstone parent with it
    assert set(extract(cache)[0]) == {(5,), (5, 6)}
    audit_all(cache)


def test_evict_mamba_tombstones_a_leaf_whose_kv_is_locked_without_its_state() -> None:
    """A leaf with a state, full-locked by a holder that did not take the state (it locked a tombstone that
    was revived later): evict_mamba frees the state and keeps the locked KV instead of asserting."""
    cache = make_mamba()
    insert_fresh(cache, [1, 2, 3, 4], tag=1)
    cache.match_prefix([1, 2, 9])
    tomb = cache.root.children[(1,)]
    lock = cache.inc_lock_ref(tomb)
    assert cache.evict(2) == 2  # the child goes; the tombstone stays (locked)
    insert_fresh(cache, [1, 2], tag=2)  # revived: a leaf with a state, full lock 1, state lock 0
    assert tomb.mamba_value is not None and not tomb.children and tomb.mamba_lock_ref == 0
    assert cache.evict_mamba(1) == 1
    assert tomb.live and tomb.mamba_value is None and cache.total_size() == 2
    audit_all(cache)
    cache.dec_lock_ref(lock)  # now an unlocked tombstone leaf: deleted
    assert not tomb.live and cache.total_size() == 0
    audit_all(cache)


def test_evict_full_cascades_through_tombstone_parents() -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2, 3, 4, 5, 6], tag=1)
    cache.match_prefix([1, 2, 9])
    cache.match_prefix([1, 2, 3, 4, 9])  # two tombstones above the leaf
    assert len(nodes_of(cache)) == 3
    assert cache.evict(1) == 6 and not cache.root.children
    audit_all(cache)


@pytest.mark.parametrize("page_size", [2, 4])
def test_paged_mamba_cache(page_size: int) -> None:
    cache = make_mamba(page_size=page_size, pages=32, slots=8)
    p = page_size
    key = list(range(3 * p))
    insert_fresh(cache, key, tag=1)
    insert_fresh(cache, key[: 2 * p] + [99] * p, tag=2)
    m = cache.match_prefix(key[: 2 * p] + [7] * (p - 1))
    assert m.device_indices.numel() == 0  # the branching point at 2 pages is a tombstone
    m = cache.match_prefix([*key, 1])
    assert m.device_indices.numel() == 3 * p and m.device_indices.tolist() == path_ids(m.last_node)
    audit_all(cache)


def test_empty_key_insert_is_a_no_op_35821() -> None:
    cache = make_mamba()
    owner = new_owner()
    slot = cache.mamba_pool.alloc(1, owner)
    res = cache.insert([], torch.empty(0, dtype=torch.int64), owner, mamba_slot=slot)
    assert res == InsertResult(0, False) and not cache.root.children
    cache.mamba_pool.free(slot, owner)
    audit_all(cache)


# ---------------------------------------------------------------------- bad input
def test_cow_argument_errors() -> None:
    cache = make_mamba()
    pool = cache.mamba_pool
    insert_fresh(cache, [1, 2], tag=1)
    req, other = new_owner(), new_owner()
    theirs = pool.alloc(1, other)
    two = pool.alloc(2, req)
    assert_rejected(cache, InvalidArgument, lambda: cache.match_prefix([1, 2], cow_slot=theirs))
    assert_rejected(cache, InvalidArgument, lambda: cache.match_prefix([1, 2], cow_owner="x"))  # type: ignore[arg-type]
    assert_rejected(cache, InvalidArgument, lambda: cache.match_prefix([1, 2], cow_owner=req, cow_slot=two))


@needs_contracts
def test_cow_slot_must_be_the_callers() -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2], tag=1)
    theirs = cache.mamba_pool.alloc(1, new_owner())
    assert_rejected(
        cache, ForeignSlot, lambda: cache.match_prefix([1, 2], cow_owner=new_owner(), cow_slot=theirs)
    )
    tree_slot = cache.match_prefix([1, 2]).last_node.mamba_value
    assert_rejected(
        cache, ForeignSlot, lambda: cache.match_prefix([1, 2], cow_owner=new_owner(), cow_slot=tree_slot)
    )


@needs_contracts
def test_insert_slot_must_be_the_owners() -> None:
    cache = make_mamba()
    owner = new_owner()
    kv = cache.token_to_kv_pool_allocator.alloc(2, owner)
    theirs = cache.mamba_pool.alloc(1, new_owner())
    assert_rejected(cache, ForeignSlot, lambda: cache.insert([1, 2], kv, owner, mamba_slot=theirs))


def test_mamba_lock_errors() -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2], tag=1)
    node = cache.match_prefix([1, 2]).last_node
    lock = cache.inc_lock_ref(node)
    cache.dec_lock_ref(lock)
    assert_rejected(cache, LockNotHeld, lambda: cache.dec_lock_ref(lock))
    other = make_mamba()
    insert_fresh(other, [1, 2], tag=1)
    assert_rejected(cache, ForeignNode, lambda: cache.inc_lock_ref(other.match_prefix([1, 2]).last_node))
    assert_rejected(cache, InvalidArgument, lambda: cache.evict_mamba(-1))
    assert_rejected(cache, InvalidArgument, lambda: cache.evict_full(-3))


def test_mamba_state_lock_would_go_below_zero() -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2], tag=1)
    node = cache.match_prefix([1, 2]).last_node
    lock = cache.inc_lock_ref(node)
    assert isinstance(cache, MambaRadixCache) and lock.took_mamba
    node.mamba_lock_ref = 0  # corrupted: the release would take it to -1
    with pytest.raises(LockNotHeld, match="mamba_lock_ref"):
        cache.dec_lock_ref(lock)
    assert not lock.released


# ---------------------------------------------------------------------- recency rules (SGLang 0.5.20)
def _state_tags(cache: MambaRadixCache) -> dict[tuple[int, ...], int]:
    return extract(cache, cache.mamba_pool)[1]


def test_r1_a_split_leaves_the_state_list_alone() -> None:
    """R1: the lower half of a split keeps its state's place in the state list (SGLang's split moves no state).

    The old kvledger rule moved the lower node's state to the most recent end, so the other state went.
    """
    cache = make_mamba()
    insert_fresh(cache, [1, 2], tag=1)
    insert_fresh(cache, [5, 6], tag=2)  # state list, oldest first: [1, 2], [5, 6]
    m = cache.match_prefix([1, 9])  # splits [1, 2] at 1: a tombstone [1] above the [2] that keeps tag 1
    assert m.last_node is cache.root and cache.root.children[(1,)].mamba_value is None
    assert cache.evict_mamba(1) == 1
    assert _state_tags(cache) == {(5, 6): 2}, "the split refreshed the lower node's state"
    audit_all(cache)


def test_r2_a_match_refreshes_only_the_state_it_returns() -> None:
    """R2 (PR #31643): states above the returned node keep their place; only the used state is refreshed."""
    cache = make_mamba()
    insert_fresh(cache, [1, 2], tag=1)
    insert_fresh(cache, [1, 2, 3, 4], tag=2)
    insert_fresh(cache, [7, 8], tag=3)  # state list, oldest first: [1, 2], [1, 2, 3, 4], [7, 8]
    m = cache.match_prefix([1, 2, 3, 4])
    assert read_tag(cache.mamba_pool, m.last_node.mamba_value) == 2
    assert cache.evict_mamba(1) == 1  # [1, 2] is still the oldest state: tombstoned, its KV kept
    assert _state_tags(cache) == {(1, 2, 3, 4): 2, (7, 8): 3}, "the match refreshed an ancestor's state"
    assert cache.total_size() == 6
    audit_all(cache)


def test_r3_the_insert_walk_refreshes_no_state() -> None:
    """R3: inserting below a node with a state does not refresh that state (only the KV recency)."""
    cache = make_mamba()
    insert_fresh(cache, [1, 2], tag=1)
    insert_fresh(cache, [7, 8], tag=2)
    insert_fresh(cache, [1, 2, 3, 4], tag=3)  # walks through [1, 2]
    assert cache.evict_mamba(1) == 1
    assert _state_tags(cache) == {(7, 8): 2, (1, 2, 3, 4): 3}, "the insert walk refreshed a state"
    audit_all(cache)


def test_r3_a_repeated_insert_refreshes_the_kv_but_not_the_existing_state() -> None:
    """R3 at the end node: a second insert of a key whose node has a state (``mamba_adopted`` False) makes
    that node's KV the most recent, while its state keeps its place. The two recencies part here."""
    cache = make_mamba()
    insert_fresh(cache, [1, 2], tag=1)
    insert_fresh(cache, [7, 8], tag=2)
    assert insert_fresh(cache, [1, 2], tag=3) == InsertResult(2, False)
    assert cache.evict_mamba(1) == 1  # the state list still has [1, 2] oldest: that leaf goes whole
    assert _state_tags(cache) == {(7, 8): 2}, "the repeated insert refreshed the existing state"
    audit_all(cache)
    again = make_mamba()
    insert_fresh(again, [1, 2], tag=1)
    insert_fresh(again, [7, 8], tag=2)
    insert_fresh(again, [1, 2], tag=3)
    assert again.evict(1) == 2  # the full list has [7, 8] oldest: the repeated insert refreshed [1, 2]'s KV
    assert _state_tags(again) == {(1, 2): 1}
    audit_all(again)


def test_issue_16_minimal_divergent_case_frees_what_sglang_frees() -> None:
    """Issue 16's minimal case against SGLang 0.5.20 (page 1, pool 256, 12 state slots): SGLang's
    ``evict(0 tokens, 2 states)`` frees 1 KV token; the old split rule (R1) made kvledger free 2."""
    cache = make_mamba(pages=256, slots=12)
    pool, kv = cache.mamba_pool, cache.token_to_kv_pool_allocator
    insert_fresh(cache, [1, 3, 1], tag=1)
    insert_fresh(cache, [1, 2], tag=2)
    req = new_owner()
    m = cache.match_prefix([1, 3, 1, 3], cow_owner=req)
    assert m.device_indices.numel() == 3 and m.cow_slot is not None and read_tag(pool, m.cow_slot) == 1
    lock = cache.inc_lock_ref(m.last_node)
    own = kv.alloc(1, req)
    res = cache.insert(
        [1, 3, 1, 3], torch.cat((m.device_indices, own)), req, mamba_slot=m.cow_slot, protected_len=3
    )
    assert res == InsertResult(3, True)
    cache.dec_lock_ref(lock)
    assert cache.match_prefix([1, 3]).device_indices.numel() == 0  # splits [3, 1] into a tombstone [3] + [1]
    kv_before, slots_before = kv.available_size(), pool.available_size()
    assert cache.evict_full(0) == 0 and cache.evict_mamba(2) == 2
    assert kv.available_size() - kv_before == 1, "SGLang frees exactly the [2] leaf's one token"
    assert pool.available_size() - slots_before == 2
    assert _state_tags(cache) == {(1, 3, 1, 3): 1}  # [1, 2] evicted whole, [1, 3, 1] tombstoned
    audit_all(cache)
