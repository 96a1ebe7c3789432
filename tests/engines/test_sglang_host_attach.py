"""SGLang 0.5.23's HiCache host pools under kvledger's ledgers (``attach_host.watch_host``): a clean
write-through / load-back / host-eviction round trip through the real ``HiCacheController`` leaves
everything back, and the ledger names what SGLang's own host pools let through (a Mamba host slot freed
twice, a KV host slot repeated inside one free) or cannot see (a node's host copy leaked, a free behind the
ledger's back), each under its invariant."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.engines.sglang import build, build_host
from kvledger.engines.sglang.attach import watch
from kvledger.engines.sglang.attach_host import watch_host

PAGE = 4


@pytest.fixture
def tier(sgl: Any) -> Any:
    alloc = build.token_allocator(64, PAGE, sgl)
    host = build_host.kv_host_pool(alloc)
    ctl = build_host.controller(alloc, host)
    device = watch(allocator=alloc)
    hw = watch_host(host, controller=ctl, device=device, audit_each=True)
    return alloc, host, ctl, device, hw


def _backed_up_node(tier: Any, node: int, tokens: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    alloc, _, ctl, device, hw = tier
    with device.holder(f"node:{node}"):
        dev = alloc.alloc(tokens)
    host = ctl.write(dev, node_id=node)
    ack = ctl.ack_write_queue.pop(0)
    assert ack.node_ids == [node] and ack.finish_event.query()
    hw.commit_backup(node, host)
    return dev, host


def test_write_through_load_back_and_host_eviction_come_back(tier: Any) -> None:
    alloc, host_pool, ctl, device, hw = tier
    dev, host = _backed_up_node(tier, 1)
    assert hw.ledger.holdings(hw.node_host(1)) == set((host // PAGE).tolist())
    with device.holder("node:1"):  # device eviction: the node keeps its host copy only
        alloc.free(dev)
    loaded = ctl.load(host, node_id=1)
    assert ctl.start_loading() >= 0 and ctl.ack_load_queue.pop(0).node_ids == [1]
    assert device.kv.holdings(device.owner_of_request("load:1")) == set((loaded // PAGE).tolist())
    ctl.evict_host(host)  # host eviction: the tree drops the node's host copy
    hw.node_dropped(1)
    with device.holder("load:1"):
        alloc.free(loaded)
    device.check_idle()
    hw.check_idle()
    assert int(host_pool.available_size()) == host_pool.size


def test_a_mamba_host_slot_freed_twice_is_named_where_sglang_checks_nothing(sgl: Any) -> None:
    pool = build_host.mamba_host_pool(build.hybrid_req_pool(8, 6, modules=sgl))
    slots = pool.alloc(3)
    pool.free(slots)
    pool.free(slots)  # unwatched: MambaPoolHost.free takes it, the free list now holds the slots twice
    assert pool.available_size() == pool.size + 3
    fresh = build_host.mamba_host_pool(build.hybrid_req_pool(8, 6, modules=sgl))
    hw = watch_host(fresh, label="mamba_host")
    slots = fresh.alloc(3)
    fresh.free(slots)
    with pytest.raises(ContractViolation, match=r"I-NODUP-FREE") as err:
        fresh.free(slots)
    assert "slot 0: owner free_list" in str(err.value)  # the id, its owner and its moves
    assert fresh.available_size() == fresh.size  # refused before SGLang's free ran
    hw.check_idle()


def test_a_kv_host_slot_repeated_in_one_free_is_named_before_sglang_pushes_it_twice(tier: Any) -> None:
    _, host_pool, _, _, hw = tier
    with hw.acting_for(hw.writing(7)):
        got = host_pool.alloc(PAGE)
        with pytest.raises(
            ContractViolation, match=r"repeated within one free: freed twice \(I-NODUP-FREE\)"
        ):
            host_pool.free(torch.cat([got, got]))
        assert host_pool.available_size() == host_pool.size - PAGE  # nothing moved
        host_pool.free(got)
    hw.check_idle()


def test_a_node_dropped_with_host_slots_still_held_names_the_leak(tier: Any) -> None:
    _, _, ctl, _, hw = tier
    _, host = _backed_up_node(tier, 3)
    ctl.evict_host(host[PAGE:])  # the leak: the first page of the node's host copy is not given back
    with pytest.raises(ContractViolation, match=r"node_host#3.*I-OWNER-RELEASE"):
        hw.node_dropped(3)
    with pytest.raises(ContractViolation, match=r"I-IDLE-IDENTITY"):
        hw.check_idle()


def test_a_free_behind_the_ledgers_back_fails_the_audit(tier: Any) -> None:
    _, host_pool, _, _, hw = tier
    with hw.acting_for(hw.writing(5)):
        got = host_pool.alloc(PAGE)
    type(host_pool).free(host_pool, got)  # the class's method: the instance wrapper is bypassed
    with pytest.raises(ContractViolation, match=r"disagree \(I-PARTITION\): free in the pool only \[0\]"):
        hw.audit()


def test_watch_host_refuses_what_is_not_an_idle_host_pool(tier: Any) -> None:
    alloc, host_pool, ctl, _, hw = tier
    with pytest.raises(InvalidArgument, match="not a host pool"):
        watch_host(alloc)
    hw.detach()
    host_pool.alloc(PAGE)
    with pytest.raises(InvalidArgument, match="every slot free"):
        watch_host(host_pool)
    with pytest.raises(InvalidArgument, match="mem_pool_host"):
        watch_host(build_host.kv_host_pool(alloc), controller=ctl)
