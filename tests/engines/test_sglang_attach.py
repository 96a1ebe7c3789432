"""The attach: SGLang's real components, watched; clean runs stay clean, wrong moves fire the registry's IDs."""

from __future__ import annotations

import random
import types
from typing import Any

import pytest
import torch

from kvledger.contracts.errors import ContractViolation
from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import Watch, watch
from kvledger.engines.sglang.workload import serve

TREES = ["radix-p1", "radix-p4", "unified-full", "unified-mamba"]


def setup(kind: str, pages: int = 12) -> tuple[Any, Any, Any, Watch]:
    ps = 4 if kind == "radix-p4" else 1
    alloc = build.token_allocator(pages * ps, ps)
    mamba = kind == "unified-mamba"
    rows = build.hybrid_req_pool(4, 6) if mamba else build.req_pool(4)
    tree = (
        build.unified_radix_cache(alloc, rows, mamba=mamba)
        if kind.startswith("unified")
        else build.radix_cache(alloc, rows)
    )
    w = watch(allocator=alloc, req_pool=rows, mamba_pool=rows if mamba else None, tree=tree, audit_each=True)
    return alloc, rows, tree, w


@pytest.mark.parametrize("kind", TREES)
def test_a_clean_workload_stays_clean_and_detach_restores(sgl: Any, kind: str) -> None:
    alloc, rows, tree, w = setup(kind)
    rng = random.Random(7)
    prefixes = [[rng.randrange(1, 50) for _ in range(8)] for _ in range(3)]
    for rid in range(40):
        tokens = rng.choice(prefixes)[: rng.randrange(2, 9)] + [
            rng.randrange(1, 50) for _ in range(rng.randrange(0, 5))
        ]
        serve(sgl, alloc, rows, tree, w, rid, tokens)
    w.audit()
    assert w.kv is not None and w.calls > 200
    held = w.kv.held_count(w.tree_kv) * alloc.page_size
    assert held == tree.evictable_size() + tree.protected_size() > 0  # every lock was released
    assert tree.protected_size() == 0
    w.detach()
    assert "alloc" not in vars(alloc) and "insert" not in vars(tree)


@pytest.mark.fires("I-NODUP-FREE")
@pytest.mark.parametrize("page", [1, 4])
def test_a_double_free_on_the_real_allocator_fires_and_leaves_it_unchanged(sgl: Any, page: int) -> None:
    alloc = build.token_allocator(8 * page, page)
    w = watch(allocator=alloc)
    with w.holder("r1"):
        ids = alloc.alloc(2 * page)
        alloc.free(ids)
        before = alloc.available_size()
        with pytest.raises(ContractViolation, match=r"I-NODUP-FREE") as err:
            alloc.free(ids)
    assert "owner free_list" in str(err.value) and "alloc: free_list[free] -> req#r1" in str(err.value)
    assert alloc.available_size() == before  # SGLang's free never ran
    w.audit()


@pytest.mark.fires("I-NODUP-FREE")
def test_repeated_page_ids_fire(sgl: Any) -> None:
    alloc = build.token_allocator(32, 4)
    w = watch(allocator=alloc)
    ids = alloc.alloc(8)
    with pytest.raises(ContractViolation, match="I-NODUP-FREE"):
        alloc.free_page_ids(torch.tensor([int(ids[0]) // 4] * 2))
    w.audit()


@pytest.mark.fires("I-EXCLUSIVE")
def test_a_request_freeing_another_requests_pages_is_a_foreign_free(sgl: Any) -> None:
    alloc = build.token_allocator(16)
    w = watch(allocator=alloc)
    with w.holder("a"):
        ids = alloc.alloc(3)
    with w.holder("b"), pytest.raises(ContractViolation, match="I-EXCLUSIVE") as err:
        alloc.free(ids)
    assert "owner req#a" in str(err.value)


@pytest.mark.fires("I-EXCLUSIVE")
@pytest.mark.parametrize("kind", ["radix-p1", "unified-full"])
def test_freeing_tree_owned_pages_outside_the_tree_is_a_foreign_free(sgl: Any, kind: str) -> None:
    alloc, _rows, tree, w = setup(kind)
    ids = alloc.alloc(4)
    tree.insert(sgl.InsertParams(key=build.radix_key([1, 2, 3, 4]), value=ids))
    with pytest.raises(ContractViolation, match="I-EXCLUSIVE") as err:
        alloc.free(ids[2:])
    assert "owner tree#kv" in str(err.value)
    w.audit()


@pytest.mark.fires("I-NODUP-FREE")
def test_a_double_free_of_a_mamba_slot_and_of_a_row_fire(sgl: Any) -> None:
    rows = build.hybrid_req_pool(4, 4)
    w = watch(req_pool=rows, mamba_pool=rows)
    slot = rows.mamba_allocator.alloc(1)
    rows.mamba_allocator.free(slot)
    with pytest.raises(ContractViolation, match="I-NODUP-FREE"):
        rows.mamba_allocator.free(slot)
    got = rows.alloc_rows(1)
    rows.free_rows(got)
    with pytest.raises(ContractViolation, match="I-NODUP-FREE"):
        rows.free_rows(got)
    w.audit()


@pytest.mark.fires("I-LOCK-TREE")
@pytest.mark.parametrize("kind", ["radix-p1", "unified-full"])
def test_an_unlock_without_a_lock_fires(sgl: Any, kind: str) -> None:
    alloc, _rows, tree, _w = setup(kind)
    ids = alloc.alloc(4)
    res = tree.insert(sgl.InsertParams(key=build.radix_key([1, 2, 3, 4]), value=ids))
    with pytest.raises(ContractViolation, match="I-LOCK-TREE"):
        tree.dec_lock_ref(res.last_device_node, None)


@pytest.mark.fires("I-LOCK-TREE")
def test_a_lock_count_that_disagrees_with_the_live_locks_fires_in_the_audit(sgl: Any) -> None:
    alloc, _rows, tree, w = setup("radix-p1")
    ids = alloc.alloc(4)
    res = tree.insert(sgl.InsertParams(key=build.radix_key([1, 2, 3, 4]), value=ids))
    res.last_device_node.lock_ref += 1  # a lock taken behind the watch's back
    tree.evictable_size_ -= 4
    tree.protected_size_ += 4
    with pytest.raises(ContractViolation, match="I-LOCK-TREE"):
        w.audit()


@pytest.mark.fires("I-COW-SOURCE")
def test_a_copy_from_a_free_slot_fires(sgl: Any) -> None:
    rows = build.hybrid_req_pool(4, 4)
    w = watch(mamba_pool=rows)
    src = rows.mamba_allocator.alloc(1)
    dst = rows.mamba_allocator.alloc(1)
    rows.mamba_allocator.free(src)
    with pytest.raises(ContractViolation, match="I-COW-SOURCE"):
        rows.mamba_pool.copy_from(src, dst)
    w.audit()


@pytest.mark.fires("I-PARTITION")
def test_a_page_that_leaves_the_free_list_behind_the_watch_fires_in_the_audit(sgl: Any) -> None:
    alloc = build.token_allocator(32, 4)
    w = watch(allocator=alloc)
    alloc.free_pages = alloc.free_pages[1:]  # a leak: the page is gone from the free list, nobody holds it
    with pytest.raises(ContractViolation, match="I-PARTITION"):
        w.audit()


@pytest.mark.fires("I-PROTECTED-DEF")
def test_tree_counters_that_disagree_with_a_recount_fire(sgl: Any) -> None:
    alloc, _rows, tree, w = setup("radix-p1")
    ids = alloc.alloc(4)
    tree.insert(sgl.InsertParams(key=build.radix_key([1, 2, 3, 4]), value=ids))
    tree.evictable_size_ -= 1
    tree.protected_size_ += 1
    with pytest.raises(ContractViolation, match="I-PROTECTED-DEF"):
        w.audit()


@pytest.mark.fires("I-PENDING")
def test_free_groups_are_mirrored_and_nesting_fires(sgl: Any) -> None:
    alloc = build.token_allocator(32, 4)
    w = watch(allocator=alloc)
    ids = alloc.alloc(8)
    alloc.free_group_begin()
    alloc.free(ids[:2])
    alloc.free(ids[2:4])  # same page, another call: SGLang merges a group's frees by page
    w.audit()
    assert w.kv is not None and w.kv.held_count(w.kv.pending_owner) == 1
    with pytest.raises(ContractViolation, match="I-PENDING"):
        alloc.free_group_begin()
    alloc.free_group_end()
    w.audit()
    assert alloc.available_size() == 28


def test_mamba_alloc_groups_are_mirrored(sgl: Any) -> None:
    """The scheduler's batched pre-allocation for matches: slots reserved, handed out one by one, the rest back."""
    rows = build.hybrid_req_pool(4, 6)
    w = watch(mamba_pool=rows)
    rows.mamba_allocator.alloc_group_begin(3)
    assert w.slots is not None and w.slots.held_count(w.slot_group) == 3
    with w.holder("r1"):
        slot = rows.mamba_allocator.alloc(1)
    assert w.slots.owner_of(int(slot)) is not w.slot_group
    rows.mamba_allocator.alloc_group_end()
    w.audit()
    assert w.slots.held_count(w.slot_group) == 0 and rows.mamba_allocator.available_size() == 5
    with w.holder("r1"):
        rows.mamba_allocator.free(slot)
    w.audit()


@pytest.mark.fires("I-HANDLE-OWNED")
def test_a_request_handle_naming_a_freed_slot_fires_once_the_release_returns(sgl: Any) -> None:
    """The request check: a Mamba slot freed while the request's handle still names it (the N1 pattern)
    fires I-HANDLE-OWNED naming the field; clearing the handle with the free is clean."""
    rows = build.hybrid_req_pool(4, 6)
    w = watch(req_pool=rows, mamba_pool=rows)
    slots = rows.mamba_allocator
    req = types.SimpleNamespace(req_pool_idx=None, mamba_pool_idx=None, mamba_ping_pong_track_buffer=None)
    w.track(req, "r1")
    with w.holder("r1"):
        req.mamba_pool_idx = slots.alloc(1)[0]
        req.mamba_ping_pong_track_buffer = slots.alloc(2)
    assert w.check_handles() == 3
    with w.holder("r1"):
        slots.free(req.mamba_ping_pong_track_buffer)
    with pytest.raises(ContractViolation, match=r"I-HANDLE-OWNED: req#r1.*mamba_ping_pong_track_buffer"):
        w.check_handles()
    req.mamba_ping_pong_track_buffer = None
    assert w.check_handles() == 1
    w.untrack(req)
    assert w.check_handles() == 0
    w.detach()


def test_a_free_groups_list_left_filled_after_its_end_is_not_read_as_pending(sgl: Any) -> None:
    """0.5.9 and 0.5.10 free a group's pages at ``free_group_end`` but clear the list only at the next
    begin; the audit read the stale list as pending pages that were also free (a false I-PARTITION found
    by the scheduler attach, issue 35). Emulated on the installed release by leaving the list filled."""
    alloc = build.token_allocator(16, 4)
    w = watch(allocator=alloc)
    page = alloc.alloc(4)
    alloc.free_group_begin()
    alloc.free(page)
    alloc.free_group_end()
    alloc.free_group = [page.clone()]  # what those releases leave behind
    w.audit()
    w.check_idle()


@pytest.mark.fires("I-LOCK-TREE")
def test_an_extra_unlock_names_the_key_path_the_holders_and_the_last_lock_calls(sgl: Any) -> None:
    """Issue 37: tree violations named ``node 1267`` and two counters; they now say where the node is (the
    first tokens of its key path) and what happened to its locks (the last lock and unlock calls)."""
    alloc, _rows, tree, w = setup("radix-p1")
    ids = alloc.alloc(6)
    res = tree.insert(sgl.InsertParams(key=build.radix_key([7, 8, 9, 10, 11, 12]), value=ids))
    node = res.last_device_node
    with w.holder("r1"):
        lock = tree.inc_lock_ref(node)
        tree.dec_lock_ref(node, lock.to_dec_params())
    with w.holder("r2"), pytest.raises(ContractViolation, match="I-LOCK-TREE") as err:
        tree.dec_lock_ref(node, lock.to_dec_params())  # the second release of one lock
    text = str(err.value)
    assert "key path [7, 8, 9, 10, 11, 12]" in text and "by req#r2" in text
    assert "inc_lock_ref by req#r1" in text and "dec_lock_ref by req#r1" in text
