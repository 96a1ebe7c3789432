"""SGLang 0.5.23's radix tree drives its own HiCache host tier on CPU under the ledgers: ``init_hicache``
(its ``HostPoolGroup`` and ``HybridCacheController``, the host pools unpinned), write-through on
``insert``, the acks in ``check_hicache_events``, device eviction keeping the host copy, a host hit in
``match_prefix``, ``load_back`` + ``ready_to_load_host_cache``, and host eviction (``evict_host``). The
device allocator and the KV host pool are watched; everything comes back, the loaded rows hold what was
written, and two bugs planted into SGLang's ``HostPoolGroup.free`` (scoped monkeypatches) are named."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvledger.contracts.errors import ContractViolation
from kvledger.engines.sglang import build, build_host
from kvledger.engines.sglang.attach import watch
from kvledger.engines.sglang.attach_host import watch_host

PROMPTS = ([1, 2, 3] * 8, [1, 2, 3] * 4 + [3, 2, 1] * 4, [2] * 20)  # a shared prefix: the tree splits nodes


def _device_hit(sgl: Any, tree: Any, tokens: list[int]) -> tuple[Any, torch.Tensor]:
    """``match_prefix`` of ``tokens`` and the device indices of its device-resident prefix."""
    hit = tree.match_prefix(sgl.MatchPrefixParams(key=build.radix_key(tokens, sgl)))
    return hit, tree.path_device_indices(hit.last_device_node)[: hit.device_prefix_len]


def _round_trip(sgl: Any, page: int, core: str = "rust") -> tuple[Any, Any, Any]:
    """Each prompt through the tree's host tier and back; returns the watches and the host pool."""
    alloc = build.token_allocator(128, page, sgl)
    tree = build_host.hicache_tree(alloc, build.req_pool(8, 64, sgl), core)
    host = tree.cache_controller.mem_pool_host.anchor_entry.host_pool
    dw, hw = watch(allocator=alloc), watch_host(host, label="kv_host", audit_each=True)
    k = alloc.get_kvcache().k_buffer[0]
    for n, tokens in enumerate(PROMPTS):
        _, prefix = _device_hit(sgl, tree, tokens)
        done = len(prefix)
        aligned = len(tokens) - len(tokens) % page
        value = torch.cat([prefix, alloc.alloc(aligned - done)])
        k[value[done:]] = (100.0 * n + torch.arange(done, aligned, dtype=torch.float32)).reshape(-1, 1, 1)
        tree.insert(
            sgl.InsertParams(key=build.radix_key(tokens[:aligned], sgl), value=value, prev_prefix_len=done)
        )
        tree.check_hicache_events()  # the write-through acks
    written = {n: k[_device_hit(sgl, tree, t)[1]].clone() for n, t in enumerate(PROMPTS)}
    tree.evict(sgl.EvictParams(num_tokens=128))  # device to host: every node keeps its host copy
    assert alloc.available_size() == 128 and host.available_size() < host.size
    for n, tokens in enumerate(PROMPTS):
        hit, prefix = _device_hit(sgl, tree, tokens)
        assert len(prefix) < len(written[n]) and hit.host_hit_length > 0
        assert tree.load_back(hit.best_match_node, None, req=None)
        tree.ready_to_load_host_cache()
        tree.check_hicache_events()
        _, back = _device_hit(sgl, tree, tokens)
        assert torch.equal(k[back], written[n])  # the loaded rows hold what was written
    tree.evict(sgl.EvictParams(num_tokens=128))
    tree.evict_host(host.size)
    return dw, hw, host


@pytest.mark.parametrize("core", ["rust", "python"])
@pytest.mark.parametrize("page", [1, 4])
def test_the_trees_own_host_tier_round_trip_comes_back(sgl: Any, page: int, core: str) -> None:
    dw, hw, host = _round_trip(sgl, page, core)
    dw.check_idle()
    hw.check_idle()  # free + cached == size on the host pool: every host slot came back
    assert host.available_size() == host.size and hw.calls > 0


@pytest.fixture
def group_cls(sgl: Any) -> Any:
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup

    return HostPoolGroup


def test_a_host_page_the_tree_never_frees_is_named_at_the_end(
    sgl: Any, monkeypatch: Any, group_cls: Any
) -> None:
    release_free = group_cls.free

    def free(self: Any, indices: torch.Tensor, *, pool: Any = None) -> int:
        page = self.get_entry(pool).host_pool.page_size
        return release_free(self, indices[page:], pool=pool)  # the planted bug: the first page is kept

    monkeypatch.setattr(group_cls, "free", free)
    _, hw, _ = _round_trip(sgl, 1)
    with pytest.raises(ContractViolation, match=r"host_caller#kv_host.* never came back \(I-IDLE-IDENTITY\)"):
        hw.check_idle()


def test_a_host_slot_the_tree_frees_twice_is_named_at_the_call(
    sgl: Any, monkeypatch: Any, group_cls: Any
) -> None:
    release_free = group_cls.free

    def free(self: Any, indices: torch.Tensor, *, pool: Any = None) -> int:
        return release_free(self, torch.cat([indices, indices[:1]]), pool=pool)  # the planted bug

    monkeypatch.setattr(group_cls, "free", free)
    with pytest.raises(ContractViolation, match=r"freed twice \(I-NODUP-FREE\)"):
        _round_trip(sgl, 1)


TREE_BUDGET = 40  # examples of 30 steps (about 4 CPU s clean)


def test_the_tree_machine_runs_clean_on_sglangs_own_host_tier(sgl: Any) -> None:
    from kvledger.engines.sglang.drive_hicache_tree import STATS, hunt

    STATS.clear()
    assert hunt(TREE_BUDGET, shrink=False) == {"found": None, "steps": []}
    for kind in ("insert", "host hit", "load_back", "device tokens evicted", "host tokens evicted"):
        assert STATS[kind] > 0, (kind, dict(STATS))
    assert STATS["runs clean"] >= TREE_BUDGET


def test_the_tree_machine_finds_a_host_page_the_tree_never_frees(monkeypatch: Any, group_cls: Any) -> None:
    from kvledger.engines.sglang.drive_hicache_tree import hunt

    release_free = group_cls.free

    def free(self: Any, indices: torch.Tensor, *, pool: Any = None) -> int:
        page = self.get_entry(pool).host_pool.page_size
        return release_free(self, indices[page:], pool=pool)  # the planted bug: the first page is kept

    monkeypatch.setattr(group_cls, "free", free)
    found = hunt(TREE_BUDGET, shrink=False)["found"]
    assert found is not None and "never came back (I-IDLE-IDENTITY)" in found, found
