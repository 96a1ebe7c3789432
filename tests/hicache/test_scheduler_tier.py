"""The host tier under the real scheduler: admission's match loads host hits back, the identity over
both tiers is checked after every step, every policy, failures injected."""

from __future__ import annotations

import pytest
import torch

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.levels import CheckLevel
from kvledger.reference.hicache import HostPool, WritePolicy
from kvledger.reference.hicache.hi_radix_cache import HiRadixCache
from kvledger.reference.hicache.scheduler import HiCacheScheduler
from kvledger.reference.pools import ReqToTokenPool, TokenToKVPoolAllocator
from kvledger.reference.radix import RadixCache
from kvledger.reference.scheduler import SchedulerConfig

LEDGER = CheckLevel.LEDGER


def _engine(policy: str = "write_through", *, kv: int = 48, host: int = 256, fails=None) -> HiCacheScheduler:
    alloc = TokenToKVPoolAllocator(kv, checks=LEDGER)
    buffer = torch.zeros((1, kv + 1, 2))
    tree = HiRadixCache(
        alloc, HostPool(host, buffer, checks=LEDGER), buffer, policy=WritePolicy(policy), fails=fails
    )
    return HiCacheScheduler(
        SchedulerConfig(max_context_len=64),
        kv_allocator=alloc,
        req_to_token_pool=ReqToTokenPool(4, 64, checks=LEDGER),
        tree=tree,
    )


def _prompts(group: int) -> list[int]:
    return [100 * group + i for i in range(24)]


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_an_evicted_prefix_comes_back_from_the_host(policy: str) -> None:
    s = _engine(policy)
    tree = s.tree
    assert isinstance(tree, HiRadixCache)
    rid = 0
    for rnd in range(3):  # three groups cycle through a device pool that holds about one at a time
        for group in range(3):
            rid += 1
            s.add_request(rid, [*_prompts(group), rnd, group], 4)
            s.run_until_idle(200)
    assert tree.load_stats["loaded_tokens"] > 0
    assert [k.name for k in s.accounting.kinds] == ["kv", "req", "host_kv"]
    (host,) = [t for t in s.accounting.pool_terms() if t.pool == "host_kv"]
    assert host.free + host.evictable + host.protected == host.size == 256
    tree.audit()


def test_failed_transfers_fall_back_to_computing() -> None:
    s = _engine("write_back", fails=lambda load: True)
    rid = 0
    for rnd in range(2):
        for group in range(3):
            rid += 1
            s.add_request(rid, [*_prompts(group), rnd, group], 4)
            s.run_until_idle(200)
    tree = s.tree
    assert isinstance(tree, HiRadixCache)
    assert tree.load_stats["failed"] > 0 and tree.load_stats["loaded_tokens"] == 0
    assert all(r.finish_step is not None for r in s.requests.values())
    tree.audit()


def test_the_scheduler_needs_a_hiradix_tree() -> None:
    alloc = TokenToKVPoolAllocator(32)
    with pytest.raises(InvalidArgument, match="HiRadixCache"):
        HiCacheScheduler(
            SchedulerConfig(max_context_len=16),
            kv_allocator=alloc,
            req_to_token_pool=ReqToTokenPool(2, 16),
            tree=RadixCache(alloc),  # type: ignore[arg-type]
        )
