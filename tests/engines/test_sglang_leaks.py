"""The attach's leak checks against bugs planted into SGLang's own classes (scoped monkeypatches, the
installed release untouched): a release path that keeps an id, a bug inside SGLang's ``free``, a locked
node evicted, and the end of a run where something never came back. Each planted run fires the named
invariant at the call that went wrong; the same calls on the unpatched classes run clean."""

from __future__ import annotations

import random
import types
from typing import Any

import pytest

from kvledger.contracts.errors import ContractViolation
from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import watch
from kvledger.engines.sglang.workload import serve


def _fake_request(slot: Any) -> Any:
    """What ``free_mamba_cache`` reads of a request: its ``kv`` handles (0.5.14 on)."""
    return types.SimpleNamespace(kv=types.SimpleNamespace(mamba_pool_idx=slot, req_pool_idx=1))


def _free_mamba_cache_without_freeing(self: Any, req: Any, *args: Any) -> None:
    """The planted bug: the handle is cleared, the slot never goes back to the allocator."""
    req.kv.mamba_pool_idx = None


def _release_a_mamba_request(rows: Any) -> tuple[Any, Any]:
    w = watch(req_pool=rows, mamba_pool=rows)
    with w.holder("r1"):
        slot = rows.mamba_allocator.alloc(1)
        rows.free_mamba_cache(_fake_request(slot[0]))
    return w, slot


def test_a_mamba_request_released_by_sglangs_own_code_leaves_nothing(sgl: Any) -> None:
    w, _ = _release_a_mamba_request(build.hybrid_req_pool(4, 4))
    w.retire("r1")
    w.check_idle()


@pytest.mark.fires("I-OWNER-RELEASE")
def test_a_mamba_slot_cleared_but_never_freed_is_named_when_the_request_leaves(
    sgl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = build.hybrid_req_pool(4, 4)
    monkeypatch.setattr(type(rows), "free_mamba_cache", _free_mamba_cache_without_freeing)
    w, slot = _release_a_mamba_request(rows)
    with pytest.raises(ContractViolation, match=r"I-OWNER-RELEASE") as err:
        w.retire("r1")
    text = str(err.value)
    assert f"mamba id(s) [{int(slot[0])}]" in text and "req#r1" in text
    assert "mamba alloc: free_list[free] -> req#r1" in text  # the slot's last move, with its owner


def _free_dropping_the_last_id(original: Any) -> Any:
    def free(self: Any, free_index: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, free_index[: -self.page_size], *args, **kwargs)  # the last page lost

    return free


@pytest.mark.fires("I-COUNT")
@pytest.mark.parametrize("page", [1, 4])
def test_a_bug_inside_sglangs_free_is_named_at_the_call_without_an_audit(
    sgl: Any, monkeypatch: pytest.MonkeyPatch, page: int
) -> None:
    """Issue 37: with the README's defaults (no ``audit_each``) a leak inside SGLang's own ``free`` served
    100 requests without a word; the free list's growth is now compared with what was given back."""
    alloc = build.token_allocator(64 * page, page)
    cls = type(alloc)
    monkeypatch.setattr(cls, "free", _free_dropping_the_last_id(cls.free))
    w = watch(allocator=alloc)
    with w.holder("r1"):
        ids = alloc.alloc(3 * page)
        with pytest.raises(ContractViolation, match=r"I-COUNT") as err:
            alloc.free(ids)
    assert "3 id(s)" in str(err.value) and "SGLang's free list grew by 2" in str(err.value)


def test_the_same_frees_on_sglangs_own_free_run_clean(sgl: Any) -> None:
    for page in (1, 4):
        alloc = build.token_allocator(64 * page, page)
        w = watch(allocator=alloc)
        with w.holder("r1"):
            alloc.free(alloc.alloc(3 * page))
        w.retire("r1")
        w.check_idle()


def _update_leaf_status_ignoring_locks(self: Any, node: Any) -> None:
    """The planted bug: a locked leaf stays among the evictable leaves (the lock check forgotten)."""
    if node.evicted:
        self.evictable_leaves.discard(node)
        return
    if any(not child.evicted for child in node.children.values()):
        self.evictable_leaves.discard(node)
        return
    self.evictable_leaves.add(node)


@pytest.mark.fires("I-EVICT-LOCKED")
def test_a_locked_node_evicted_is_named_at_the_free_inside_evict(
    sgl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RadixCache.evict`` asserts nothing about locks: the attach refuses the free of a page on a
    locked path from its own lock records, naming the node's key and the lock's holder."""
    _evict_a_locked_node(sgl, monkeypatch, planted=True)


def test_a_locked_node_is_not_evicted_by_sglangs_own_code(sgl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _evict_a_locked_node(sgl, monkeypatch, planted=False)


def _evict_a_locked_node(sgl: Any, monkeypatch: pytest.MonkeyPatch, *, planted: bool) -> None:
    alloc = build.token_allocator(32)
    rows = build.req_pool(4)
    tree = build.radix_cache(alloc, rows)
    if planted:
        monkeypatch.setattr(type(tree), "_update_leaf_status", _update_leaf_status_ignoring_locks)
    w = watch(allocator=alloc, tree=tree)
    tokens = [5, 6, 7, 8, 9, 10]
    serve(sgl, alloc, rows, tree, w, 1, tokens)
    with w.holder("r2"):
        m = tree.match_prefix(sgl.MatchPrefixParams(key=build.radix_key(tokens)))
        lock = tree.inc_lock_ref(m.last_device_node)
    if not planted:
        assert tree.evict(sgl.EvictParams(num_tokens=len(tokens))).num_tokens_evicted == 0
        with w.holder("r2"):
            tree.dec_lock_ref(m.last_device_node, lock.to_dec_params())
        w.check_idle()
        return
    with pytest.raises(ContractViolation, match=r"I-EVICT-LOCKED") as err:
        tree.evict(sgl.EvictParams(num_tokens=len(tokens)))
    text = str(err.value)
    assert "key path [5, 6, 7, 8, 9, 10]" in text and "req#r2" in text


@pytest.mark.fires("I-IDLE-IDENTITY")
def test_the_end_of_a_run_names_what_never_came_back(sgl: Any) -> None:
    alloc = build.token_allocator(64)
    rows = build.req_pool(4)
    tree = build.radix_cache(alloc, rows)
    w = watch(allocator=alloc, tree=tree)
    rng = random.Random(3)
    for rid in range(20):
        serve(sgl, alloc, rows, tree, w, rid, [rng.randrange(1, 9) for _ in range(rng.randrange(2, 7))])
    w.check_idle()  # every request retired, nothing locked: everything is free or the tree's
    with w.holder("r99"):
        kept = alloc.alloc(2)
    with pytest.raises(ContractViolation, match=r"I-IDLE-IDENTITY") as err:
        w.check_idle()
    assert "req#r99" in str(err.value) and str(int(kept[0])) in str(err.value)
    with w.holder("r99"):
        alloc.free(kept)
        m = tree.match_prefix(sgl.MatchPrefixParams(key=build.radix_key([1, 2])))
        tree.inc_lock_ref(m.last_device_node)
    with pytest.raises(ContractViolation, match=r"lock\(s\) taken through inc_lock_ref are still held"):
        w.check_idle()
