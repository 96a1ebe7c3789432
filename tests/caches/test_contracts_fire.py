"""Every cache invariant of §5.2-5.3 fires: break it on purpose and see ``ContractViolation`` name it.

Each test corrupts one field or swaps in a buggy helper (the bug class it stands for is in its
docstring), then runs the operation or ``audit()`` that must catch it. Where a cheap class invariant
would fire first, the test builds the cache without a ledger so the O(tree) recount is what fires.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvledger.contracts import tree_checks
from kvledger.contracts.errors import ContractViolation
from kvledger.museum import exhibit
from kvledger.reference.radix import MambaRadixCache, RadixCache
from tests.levels import debug_level

from ._helpers import insert_fresh, make_mamba, make_plain, needs_contracts, new_owner, nodes_of

pytestmark = needs_contracts


def _no_ledger(factory: Any, **kw: Any) -> Any:
    return factory(**kw, checks=debug_level(False))


def _two_leaves(cache: Any) -> Any:
    insert_fresh(cache, [1, 2, 3, 4], tag=1)
    insert_fresh(cache, [1, 2, 5, 6], tag=2)
    return cache


# ---------------------------------------------------------------------- I-PROTECTED-DEF
@pytest.mark.fires("I-PROTECTED-DEF")
def test_protected_def_cheap_form_fires_on_the_next_call() -> None:
    cache = _two_leaves(make_plain())
    cache._protected += 2  # a lock path that forgot to move the node's KV between accounts
    with pytest.raises(ContractViolation, match="I-PROTECTED-DEF"):
        cache.evictable_size()


@pytest.mark.fires("I-PROTECTED-DEF")
def test_protected_def_recount_fires_in_audit() -> None:
    cache = _two_leaves(_no_ledger(make_plain))
    cache._evictable -= 2
    cache._protected += 2
    with pytest.raises(ContractViolation, match="I-PROTECTED-DEF"):
        cache.audit()


@pytest.mark.fires("I-PROTECTED-DEF")
def test_protected_def_owner_account_fires_in_audit() -> None:
    cache = _two_leaves(_no_ledger(make_plain))
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    node.kv_owner.account = tree_checks.CACHE_EVICTABLE  # the lock's retag was lost
    with pytest.raises(ContractViolation, match="I-PROTECTED-DEF"):
        cache.audit()


# ---------------------------------------------------------------------- I-LOCK-TREE
@pytest.mark.parametrize("factory", [make_plain, make_mamba])
@pytest.mark.fires("I-LOCK-TREE")
def test_lock_tree_fires_when_a_count_disagrees_with_the_holders(factory: Any) -> None:
    cache = _two_leaves(factory())
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    node.lock_ref += 1  # an inc without a handle (SGLang's raw counters): accounts unchanged, tree wrong
    with pytest.raises(ContractViolation, match="I-LOCK-TREE"):
        cache.audit()


# ---------------------------------------------------------------------- I-EVICT-LOCKED
@pytest.mark.fires("I-EVICT-LOCKED")
def test_evict_locked_fires_when_the_victim_search_returns_a_locked_leaf(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = _two_leaves(make_plain())
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    monkeypatch.setattr(cache, "_oldest_unlocked_leaf", lambda: node)  # a victim search that ignores lock_ref
    with pytest.raises(ContractViolation, match="I-EVICT-LOCKED"):
        cache.evict(1)


@pytest.mark.fires("I-EVICT-LOCKED")
def test_evict_locked_fires_for_a_locked_state(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _two_leaves(make_mamba())
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    monkeypatch.setattr(cache, "_state_unlocked_from", lambda start: node)  # ignores mamba_lock_ref
    with pytest.raises(ContractViolation, match="I-EVICT-LOCKED"):
        cache.evict_mamba(1)


@pytest.mark.fires("I-EVICT-LOCKED")
def test_evict_locked_fires_in_the_mamba_leaf_path(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _two_leaves(make_mamba())
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    monkeypatch.setattr(cache, "_oldest_unlocked_leaf", lambda: node)
    with pytest.raises(ContractViolation, match="I-EVICT-LOCKED"):
        cache.evict_full(1)


# ---------------------------------------------------------------------- I-NODE-NONEMPTY / I-KEYS
@pytest.mark.parametrize("factory", [make_plain, make_mamba])
@pytest.mark.fires("I-NODE-NONEMPTY")
def test_node_nonempty_refuses_to_create_a_ghost_node(factory: Any) -> None:
    """B16 / #35821: an empty-key insert path that reaches leaf creation."""
    cache = factory()
    empty = torch.empty(0, dtype=torch.int64)
    with pytest.raises(ContractViolation, match="I-NODE-NONEMPTY"):
        cache._new_leaf(cache.root, (), empty, new_owner())


@pytest.mark.fires("I-NODE-NONEMPTY")
def test_node_nonempty_fires_in_audit_for_an_unaligned_node() -> None:
    cache = make_plain(page_size=2, pages=16)
    insert_fresh(cache, [1, 2, 3, 4])
    leaf = nodes_of(cache)[0]
    leaf.key = leaf.key[:3]
    leaf.value = leaf.value[:3]
    with pytest.raises(ContractViolation, match="I-NODE-NONEMPTY"):
        cache.audit()


@pytest.mark.fires("I-KEYS")
def test_keys_fires_for_a_child_under_a_stale_key_36696(monkeypatch: pytest.MonkeyPatch) -> None:
    """#36696: a split that keys the lower child by its old first page."""
    cache = make_plain()
    original_split = RadixCache._split

    def stale_split(self: Any, child: Any, m: int) -> Any:
        old_first = child.key[:1]
        upper = original_split(self, child, m)
        upper.children = {old_first: child}
        return upper

    monkeypatch.setattr(cache, "_split", stale_split.__get__(cache))
    insert_fresh(cache, [1, 2, 3, 4])
    cache.match_prefix([1, 2, 9])
    with pytest.raises(ContractViolation, match="I-KEYS"):
        cache.audit()


# ---------------------------------------------------------------------- I-NO-TREE-ALIAS
@pytest.mark.parametrize("ledger", [True, False])
@pytest.mark.fires("I-NO-TREE-ALIAS")
def test_no_tree_alias_fires_when_two_nodes_share_ids(ledger: bool) -> None:
    cache = make_plain(checks=debug_level(ledger))
    _two_leaves(cache)
    a = cache.match_prefix([1, 2, 3, 4]).last_node
    b = cache.match_prefix([1, 2, 5, 6]).last_node
    b.value = a.value.clone()
    with pytest.raises(ContractViolation, match="I-NO-TREE-ALIAS"):
        cache.audit()


@pytest.mark.fires("I-NO-TREE-ALIAS")
def test_no_tree_alias_fires_when_a_request_owns_a_tree_id() -> None:
    cache = _two_leaves(make_plain())
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    req = new_owner()
    cache._kv.ledger.transfer(node.value[:1], node.kv_owner, req, "bug")  # the tree's id handed to a request
    req.set_account(tree_checks.CACHE_EVICTABLE)  # keep the cheap counts equal: only the recount sees it
    with pytest.raises(ContractViolation, match="I-NO-TREE-ALIAS"):
        cache.audit()


# ---------------------------------------------------------------------- I-MAMBA-DEF
@pytest.mark.fires("I-MAMBA-DEF")
def test_mamba_def_cheap_form_fires() -> None:
    cache = _two_leaves(make_mamba())
    cache._m_evictable += 1
    with pytest.raises(ContractViolation, match="I-MAMBA-DEF"):
        cache.mamba_evictable_size()


@pytest.mark.fires("I-MAMBA-DEF")
def test_mamba_def_recount_fires_in_audit() -> None:
    cache = _two_leaves(_no_ledger(make_mamba))
    cache._m_evictable -= 1
    cache._m_protected += 1
    with pytest.raises(ContractViolation, match="I-MAMBA-DEF"):
        cache.audit()


# ---------------------------------------------------------------------- I-MAMBA-LOCK
@pytest.mark.fires("I-MAMBA-LOCK")
def test_mamba_lock_fires_for_a_state_lock_without_a_holder() -> None:
    cache = _two_leaves(make_mamba())
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    node.mamba_lock_ref += 1
    with pytest.raises(ContractViolation, match="I-MAMBA-LOCK"):
        cache.audit()


@pytest.mark.fires("I-MAMBA-LOCK")
def test_mamba_lock_fires_for_a_locked_tombstone() -> None:
    cache = _two_leaves(_no_ledger(make_mamba))
    tomb = cache.root.children[(1,)]
    assert tomb.mamba_value is None
    cache.inc_lock_ref(tomb)
    tomb.mamba_lock_ref = 1
    with pytest.raises(ContractViolation, match="I-MAMBA-LOCK"):
        cache.audit()


# ---------------------------------------------------------------------- I-LOCK-SYMMETRY
@pytest.mark.fires("I-LOCK-SYMMETRY")
def test_lock_symmetry_fires_for_the_b14_rederivation() -> None:
    """B14 (museum exhibit): dec re-reads mamba_value instead of the record, after a revival in between."""
    cache = make_mamba()
    insert_fresh(cache, [1, 2, 3, 4], tag=1)
    cache.match_prefix([1, 2, 9])
    tomb = cache.root.children[(1,)]
    early = cache.inc_lock_ref(tomb)
    insert_fresh(cache, [1, 2], tag=2)
    cache.inc_lock_ref(tomb)  # a later holder takes the state lock
    with exhibit("B14").installed(), pytest.raises(ContractViolation, match="I-LOCK-SYMMETRY"):
        cache.dec_lock_ref(early)


# ---------------------------------------------------------------------- I-TOMBSTONE
@pytest.mark.fires("I-TOMBSTONE")
def test_tombstone_fires_when_the_cascade_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2, 3, 4], tag=1)
    cache.match_prefix([1, 2, 9])
    monkeypatch.setattr(
        cache, "_prune_tombstones", lambda node: (node, 0)
    )  # _iteratively_delete_tombstone_leaf forgotten
    cache.evict(2)
    with pytest.raises(ContractViolation, match="I-TOMBSTONE"):
        cache.audit()


@pytest.mark.fires("I-TOMBSTONE")
def test_tombstone_fires_for_a_root_with_a_state() -> None:
    cache = make_mamba()
    cache.root.mamba_value = torch.tensor([1])
    with pytest.raises(ContractViolation, match="I-TOMBSTONE"):
        tree_checks.check_tombstones(cache.root, nodes_of(cache))


# ---------------------------------------------------------------------- I-LRU-ORDER
@pytest.mark.parametrize("factory", [make_plain, make_mamba])
@pytest.mark.fires("I-LRU-ORDER")
def test_lru_order_fires_when_time_and_position_disagree(factory: Any) -> None:
    """B3: the list order drifted from last_access_time."""
    cache = _two_leaves(factory())
    oldest = cache._full_lru.oldest()
    oldest.last_access_time = cache._clock + 100
    with pytest.raises(ContractViolation, match="I-LRU-ORDER"):
        cache.audit()


@pytest.mark.fires("I-LRU-ORDER")
def test_lru_order_fires_for_the_mamba_list() -> None:
    cache = _two_leaves(make_mamba())
    node = cache._mamba_lru.oldest()
    cache._mamba_lru.move_to_mru(node)  # moved without a new time
    with pytest.raises(ContractViolation, match="I-LRU-ORDER"):
        cache.audit()


@pytest.mark.fires("I-LRU-ORDER")
def test_lru_order_fires_for_a_node_missing_from_the_list() -> None:
    cache = _two_leaves(make_mamba())
    node = cache._mamba_lru.oldest()
    cache._mamba_lru.remove(node)
    with pytest.raises(ContractViolation, match="I-LRU-ORDER"):
        cache.audit()


@pytest.mark.parametrize("factory", [make_plain, make_mamba])
@pytest.mark.fires("I-LRU-ORDER")
def test_lru_order_fires_when_a_match_does_not_refresh_its_path(
    factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _two_leaves(factory())
    cache.match_prefix([1, 2, 5, 6])  # the shared [1, 2] node is now newer than its [3, 4] child
    monkeypatch.setattr(cache, "_touch_path", lambda nodes: None)
    with pytest.raises(ContractViolation, match="I-LRU-ORDER"):
        cache.match_prefix([1, 2, 3, 4])


# ---------------------------------------------------------------------- I-MAMBA-VALUE
@pytest.mark.fires("I-MAMBA-VALUE")
def test_mamba_value_fires_for_a_shared_state_slot() -> None:
    cache = _two_leaves(_no_ledger(make_mamba))
    a = cache.match_prefix([1, 2, 3, 4]).last_node
    b = cache.match_prefix([1, 2, 5, 6]).last_node
    b.mamba_value = a.mamba_value.clone()
    with pytest.raises(ContractViolation, match="I-MAMBA-VALUE"):
        cache.audit()


@pytest.mark.fires("I-MAMBA-VALUE")
def test_mamba_value_fires_when_the_ledger_disagrees() -> None:
    cache = _two_leaves(make_mamba())
    a = cache.match_prefix([1, 2, 3, 4]).last_node
    a.mamba_value = torch.tensor([cache.mamba_pool.size], dtype=torch.int64)  # a slot the node does not hold
    with pytest.raises(ContractViolation, match="I-MAMBA-VALUE"):
        cache.audit()


@pytest.mark.fires("I-MAMBA-VALUE")
def test_mamba_value_fires_when_a_cow_slot_is_the_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _two_leaves(make_mamba())
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    monkeypatch.setattr(
        cache, "_copy_on_write", lambda src, owner, dst: src.mamba_value
    )  # shares instead of copying
    with pytest.raises(ContractViolation, match="I-MAMBA-VALUE"):
        cache.match_prefix([1, 2, 3, 4], cow_owner=new_owner())
    assert node.mamba_value is not None


# ---------------------------------------------------------------------- I-COW-SOURCE
@pytest.mark.fires("I-COW-SOURCE")
def test_cow_source_fires_when_the_source_is_not_pinned_during_the_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = make_mamba(slots=2)
    insert_fresh(cache, [1, 1], tag=1)
    insert_fresh(cache, [2, 2], tag=2)
    cache.inc_lock_ref(cache.match_prefix([2, 2]).last_node)  # the source is the only evictable state
    monkeypatch.setattr(cache, "_pin_for_cow", lambda node: None)
    monkeypatch.setattr(cache, "_unpin", lambda lock: None)
    with pytest.raises(ContractViolation, match="I-COW-SOURCE"):
        cache.match_prefix([1, 1], cow_owner=new_owner())


@pytest.mark.fires("I-COW-SOURCE")
def test_cow_source_fires_for_an_empty_source() -> None:
    cache = make_mamba()
    with pytest.raises(ContractViolation, match="I-COW-SOURCE"):
        cache._copy_state(cache.root, torch.tensor([1]))


# ---------------------------------------------------------------------- I-MATCH-STATE
@pytest.mark.fires("I-MATCH-STATE")
def test_match_state_fires_when_a_tombstone_tail_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2, 3, 4], tag=1)
    monkeypatch.setattr(
        cache, "_best_prefix", lambda nodes: len(nodes)
    )  # KV-only matching where a state is required
    with pytest.raises(ContractViolation, match="I-MATCH-STATE"):
        cache.match_prefix([1, 2, 9])


@pytest.mark.fires("I-MATCH-STATE")
def test_match_state_fires_when_the_kv_does_not_end_at_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = make_mamba()
    insert_fresh(cache, [1, 2, 3, 4], tag=1)
    monkeypatch.setattr(cache, "_concat", lambda nodes: torch.arange(3))  # one id short of the node's depth
    with pytest.raises(ContractViolation, match="I-MATCH-STATE"):
        cache.match_prefix([1, 2, 3, 4])


def test_every_audit_check_passes_on_a_healthy_tree() -> None:
    for cache in (_two_leaves(make_plain()), _two_leaves(make_mamba())):
        cache.audit()
    assert isinstance(cache, MambaRadixCache)
