"""Unit tests of the plain ``RadixCache``: matching, splitting, inserting, locking, evicting, bad input."""

from __future__ import annotations

import pytest
import torch

from kvledger.contracts.errors import (
    DuplicateIds,
    ForeignNode,
    ForeignSlot,
    InvalidArgument,
    InvalidKey,
    LockNotHeld,
    PrefixMismatch,
)
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, FREE_LIST
from kvledger.reference.radix import LockRef, RadixCache
from tests.levels import debug_level

from ._helpers import (
    assert_rejected,
    audit_all,
    extract,
    insert_fresh,
    make_allocator,
    make_plain,
    needs_contracts,
    new_owner,
    nodes_of,
)


def test_empty_tree_and_empty_key_match_the_root() -> None:
    cache = make_plain()
    for key in ([], [1, 2, 3]):
        m = cache.match_prefix(key)
        assert m.last_node is cache.root and m.device_indices.numel() == 0
        assert m.device_indices.dtype == torch.int64
    assert cache.total_size() == 0
    audit_all(cache)


def test_insert_then_match_returns_the_tree_ids_and_splits() -> None:
    cache = make_plain()
    owner = new_owner()
    kv = cache.token_to_kv_pool_allocator.alloc(4, owner)
    assert cache.insert([1, 2, 3, 4], kv, owner) == 0
    assert cache.evictable_size() == 4 and cache.protected_size() == 0
    full = cache.match_prefix([1, 2, 3, 4, 5])
    assert full.device_indices.tolist() == kv.tolist()
    part = cache.match_prefix([1, 2, 9])
    assert part.device_indices.tolist() == kv[:2].tolist()
    assert len(part.last_node.key) == 2 and len(nodes_of(cache)) == 2  # split at 2
    assert cache.total_size() == 4
    audit_all(cache)


def test_insert_frees_the_callers_duplicates_exactly_once() -> None:
    cache = make_plain(pages=32)
    alloc = cache.token_to_kv_pool_allocator
    insert_fresh(cache, [1, 2, 3])
    owner = new_owner()
    kv = alloc.alloc(5, owner)
    before = alloc.available_size()
    assert cache.insert([1, 2, 3, 4, 5], kv, owner) == 3
    assert alloc.available_size() == before + 3  # the three duplicates
    if alloc.ledger.enabled:
        assert alloc.ledger.held_count(owner) == 0  # dups freed, the rest adopted
        assert all(alloc.ledger.owner_of(i) is FREE_LIST for i in kv[:3].tolist())
    assert cache.total_size() == 5
    audit_all(cache)


def test_protected_prefix_is_neither_freed_nor_adopted_again() -> None:
    cache = make_plain()
    alloc = cache.token_to_kv_pool_allocator
    insert_fresh(cache, [1, 2, 3])
    owner = new_owner()
    m = cache.match_prefix([1, 2, 3, 4, 5])
    lock = cache.inc_lock_ref(m.last_node)
    assert cache.protected_size() == 3
    tail = alloc.alloc(2, owner)
    before = alloc.available_size()
    assert cache.insert([1, 2, 3, 4, 5], torch.cat((m.device_indices, tail)), owner, protected_len=3) == 3
    assert alloc.available_size() == before
    cache.dec_lock_ref(lock)
    assert cache.protected_size() == 0 and cache.evictable_size() == 5
    audit_all(cache)


@pytest.mark.parametrize("page_size", [2, 4])
def test_split_child_is_keyed_by_its_new_first_page_36696(page_size: int) -> None:
    cache = make_plain(page_size=page_size, pages=16)
    tokens = list(range(10, 10 + 3 * page_size))
    insert_fresh(cache, tokens)
    m = cache.match_prefix(tokens[:page_size] + [99] * page_size)
    upper = m.last_node
    assert len(upper.key) == page_size
    ((child_key, child),) = upper.children.items()
    assert child_key == tuple(child.key[:page_size]) == tuple(tokens[page_size : 2 * page_size])
    assert cache.root.children[tuple(tokens[:page_size])] is upper
    audit_all(cache)
    # the split child is still evictable through its parent's dict (the #36696 symptom)
    assert cache.evict(cache.evictable_size()) == 3 * page_size
    audit_all(cache)


def test_paged_match_truncates_to_whole_pages() -> None:
    cache = make_plain(page_size=4, pages=8)
    insert_fresh(cache, list(range(8)))
    assert cache.match_prefix(list(range(7))).device_indices.numel() == 4
    assert cache.match_prefix(list(range(3))).device_indices.numel() == 0
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).device_indices.numel() == 4  # mismatch inside page 2
    audit_all(cache)


def test_tree_page_may_be_a_multiple_of_the_allocator_page() -> None:
    cache = RadixCache(make_allocator(2, 16), page_size=4)
    insert_fresh(cache, list(range(8)))
    assert cache.match_prefix(list(range(6))).device_indices.numel() == 4
    audit_all(cache)
    with pytest.raises(InvalidArgument):
        RadixCache(make_allocator(2, 16), page_size=3)


def test_lock_moves_the_path_between_accounts() -> None:
    cache = make_plain()
    insert_fresh(cache, [1, 2, 3])
    insert_fresh(cache, [1, 2, 3, 4, 5])
    m = cache.match_prefix([1, 2, 3, 4, 5])
    lock = cache.inc_lock_ref(m.last_node)
    assert isinstance(lock, LockRef) and not lock.took_mamba
    assert (cache.evictable_size(), cache.protected_size()) == (0, 5)
    assert all(n.kv_owner.account == CACHE_PROTECTED for n in nodes_of(cache))
    parent = m.last_node.parent
    assert parent is not None
    lock2 = cache.inc_lock_ref(parent)
    assert parent.lock_ref == 2
    cache.dec_lock_ref(lock)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 3)
    assert m.last_node.kv_owner.account == CACHE_EVICTABLE
    cache.dec_lock_ref(lock2)
    assert cache.protected_size() == 0
    audit_all(cache)


def test_locking_the_root_is_a_no_op_handle() -> None:
    cache = make_plain()
    lock = cache.inc_lock_ref(cache.root)
    assert cache.root.lock_ref == 1
    cache.dec_lock_ref(lock)
    assert lock.released
    audit_all(cache)


def test_evict_takes_lru_leaves_and_never_locked_ones() -> None:
    cache = make_plain()
    insert_fresh(cache, [1, 1])
    insert_fresh(cache, [2, 2])
    insert_fresh(cache, [3, 3])
    cache.match_prefix([1, 1])  # refresh: [2,2] is now the LRU leaf
    lock = cache.inc_lock_ref(cache.match_prefix([3, 3]).last_node)
    assert cache.evict(1) == 2
    pages, _ = extract(cache)
    assert (2,) not in pages and (1,) in pages and (3,) in pages
    assert cache.evict(100) == 2  # only [1,1] is unlocked
    assert set(extract(cache)[0]) == {(3,), (3, 3)}
    cache.dec_lock_ref(lock)
    audit_all(cache)


def test_evict_cascades_to_parents_that_become_unlocked_leaves() -> None:
    cache = make_plain()
    insert_fresh(cache, [1, 2, 3, 4])
    insert_fresh(cache, [1, 2, 7, 8])  # [1,2] internal with two leaves
    assert len(nodes_of(cache)) == 3
    assert cache.evict(5) == 6
    assert cache.total_size() == 0 and not cache.root.children
    audit_all(cache)


def test_evict_zero_and_too_much() -> None:
    cache = make_plain()
    insert_fresh(cache, [1, 2])
    assert cache.evict(0) == 0
    assert cache.evict(10**6) == 2
    assert cache.evict(5) == 0
    audit_all(cache)


def test_empty_key_insert_creates_no_ghost_node_35821() -> None:
    cache = make_plain()
    owner = new_owner()
    empty = torch.empty(0, dtype=torch.int64)
    assert cache.insert([], empty, owner) == 0
    assert not cache.root.children
    audit_all(cache)


# ---------------------------------------------------------------------- bad input: typed errors, no change
@pytest.fixture
def populated() -> RadixCache:
    cache = make_plain(page_size=2, pages=32)
    insert_fresh(cache, [1, 2, 3, 4])
    insert_fresh(cache, [1, 2, 5, 6, 7, 8])
    return cache


def test_insert_rejects_bad_keys(populated: RadixCache) -> None:
    cache = populated
    owner = new_owner()
    kv = cache.token_to_kv_pool_allocator.alloc(4, owner)
    assert_rejected(cache, InvalidKey, lambda: cache.insert([9, 9, 9], kv[:2], owner))
    assert_rejected(cache, InvalidKey, lambda: cache.insert([9, 9, 9], torch.cat((kv[:2], kv[2:3])), owner))
    assert_rejected(cache, InvalidArgument, lambda: cache.insert([9, 9], kv[:2].to(torch.float32), owner))
    assert_rejected(cache, InvalidArgument, lambda: cache.insert([9, 9], kv[:2], "not an owner"))  # type: ignore[arg-type]
    assert_rejected(cache, InvalidArgument, lambda: cache.insert([9, 9], kv[:2], owner, protected_len=1))
    assert_rejected(cache, InvalidArgument, lambda: cache.insert([9, 9], kv[:2], owner, protected_len=-2))


def test_insert_rejects_wrong_protected_ids(populated: RadixCache) -> None:
    cache = populated
    owner = new_owner()
    m = cache.match_prefix([1, 2, 3, 4])
    kv = cache.token_to_kv_pool_allocator.alloc(4, owner)
    # protected ids that are not the tree's
    assert_rejected(cache, PrefixMismatch, lambda: cache.insert([1, 2, 3, 4], kv, owner, protected_len=2))
    # protected length beyond what is cached
    value = torch.cat((m.device_indices, kv[:2]))
    assert_rejected(
        cache, PrefixMismatch, lambda: cache.insert([1, 2, 3, 4, 9, 9], value, owner, protected_len=6)
    )


@needs_contracts
def test_insert_rejects_ids_the_owner_does_not_hold(populated: RadixCache) -> None:
    cache = populated
    owner, other = new_owner(), new_owner()
    mine = cache.token_to_kv_pool_allocator.alloc(2, owner)
    theirs = cache.token_to_kv_pool_allocator.alloc(2, other)
    assert_rejected(cache, ForeignSlot, lambda: cache.insert([9, 9, 8, 8], torch.cat((mine, theirs)), owner))
    tree_ids = cache.match_prefix([1, 2]).device_indices
    assert_rejected(cache, ForeignSlot, lambda: cache.insert([9, 9], tree_ids, owner))  # the tree's ids
    assert_rejected(cache, DuplicateIds, lambda: cache.insert([9, 9, 8, 8], torch.cat((mine, mine)), owner))


def test_evict_rejects_negative_and_non_int(populated: RadixCache) -> None:
    assert_rejected(populated, InvalidArgument, lambda: populated.evict(-1))
    assert_rejected(populated, InvalidArgument, lambda: populated.evict(1.5))  # type: ignore[arg-type]


@pytest.mark.fires("I-LOCK-TREE")
def test_double_release_is_lock_not_held(populated: RadixCache) -> None:
    cache = populated
    lock = cache.inc_lock_ref(cache.match_prefix([1, 2, 3, 4]).last_node)
    cache.dec_lock_ref(lock)
    assert_rejected(cache, LockNotHeld, lambda: cache.dec_lock_ref(lock))


def test_lock_ref_below_zero_is_a_typed_error_not_minus_one(populated: RadixCache) -> None:
    """SGLang's legacy dec_lock_ref let lock_ref reach -1; here a release that would do so is refused."""
    cache = populated
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    lock = cache.inc_lock_ref(node)
    assert node.parent is not None
    node.lock_ref = 0  # corrupted by a buggy caller: the next release would go below zero
    node.parent.lock_ref -= 1
    with pytest.raises(LockNotHeld, match="below zero"):
        cache.dec_lock_ref(lock)
    assert node.lock_ref == 0 and not lock.released  # nothing changed


def test_forged_and_foreign_handles(populated: RadixCache) -> None:
    cache = populated
    other = make_plain(page_size=2, pages=32)
    insert_fresh(other, [1, 2])
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    foreign_node = other.match_prefix([1, 2]).last_node
    assert_rejected(cache, ForeignNode, lambda: cache.inc_lock_ref(foreign_node))
    foreign_lock = other.inc_lock_ref(foreign_node)
    assert_rejected(cache, ForeignNode, lambda: cache.dec_lock_ref(foreign_lock))
    forged = LockRef(node, False, cache._tree_id)
    assert_rejected(cache, LockNotHeld, lambda: cache.dec_lock_ref(forged))
    assert_rejected(cache, InvalidArgument, lambda: cache.dec_lock_ref(node))  # type: ignore[arg-type]
    assert_rejected(cache, InvalidArgument, lambda: cache.inc_lock_ref("node"))  # type: ignore[arg-type]
    other.dec_lock_ref(foreign_lock)


def test_locking_an_evicted_node_is_refused(populated: RadixCache) -> None:
    cache = populated
    node = cache.match_prefix([1, 2, 5, 6, 7, 8]).last_node
    cache.evict(cache.evictable_size())
    assert not node.live
    assert_rejected(cache, ForeignNode, lambda: cache.inc_lock_ref(node))


def test_works_without_a_ledger() -> None:
    cache = make_plain(page_size=2, pages=16, checks=debug_level(False))
    insert_fresh(cache, [1, 2, 3, 4])
    insert_fresh(cache, [1, 2, 5, 6])
    lock = cache.inc_lock_ref(cache.match_prefix([1, 2, 5, 6]).last_node)
    assert cache.evict(10) == 2
    cache.dec_lock_ref(lock)
    audit_all(cache)
