"""The host tier's slice (a): host pool, residency, write policies, device -> host and host eviction."""

from __future__ import annotations

import pytest
import torch

from kvledger import kernels
from kvledger.contracts.errors import ContractViolation, DoubleFree, InvalidArgument
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED
from kvledger.reference.hicache import HostKVComponent, WritePolicy
from kvledger.reference.radix.component import component_class
from tests.hicache._tier import LEDGER, tier

PROMPT = list(range(1, 9))


def test_the_host_component_is_registered_by_kind() -> None:
    t = tier()
    assert component_class("host_kv") is HostKVComponent
    assert t.tree.cached_kinds() == ("kv", "host_kv")
    with pytest.raises(InvalidArgument, match="write policy"):
        WritePolicy("write_around")


def test_write_through_backs_up_at_insert_with_the_same_data() -> None:
    t = tier()
    t.cache(PROMPT)
    (copy,) = t.comp.copies()
    assert copy.residency == "both" and len(copy) == 8
    assert copy.owner.account is CACHE_EVICTABLE and t.comp.counts.protected == 0
    assert t.host.available_size() == 32 - 8
    host = kernels.fingerprint_slots(t.host.buffer, copy.ids)
    assert copy.node is not None
    assert torch.equal(host, kernels.fingerprint_slots(t.buffer, copy.node.value))
    assert t.host.ledger.held_count(copy.owner) == 8
    t.tree.audit()


def test_write_through_selective_waits_for_the_second_hit() -> None:
    t = tier(policy="write_through_selective")
    t.cache(PROMPT)
    assert not t.comp.copies()  # one hit: device only
    t.tree.match_prefix(PROMPT)  # the second: backed up now
    assert [c.residency for c in t.comp.copies()] == ["both"]
    t.tree.audit()


def test_write_back_backs_up_only_when_the_device_copy_is_evicted() -> None:
    t = tier(policy="write_back")
    t.cache(PROMPT)
    assert not t.comp.copies() and t.host.available_size() == 32
    before = t.buffer[:, t.tree.match_prefix(PROMPT).device_indices].clone()
    assert t.tree.evict(8) == 8
    (copy,) = t.comp.copies()
    assert copy.residency == "host" and copy.owner.account is CACHE_EVICTABLE
    assert torch.equal(t.host.buffer[:, copy.ids], before)  # written before the device slots went
    assert t.tree.match_prefix(PROMPT).device_indices.numel() == 0
    t.tree.audit()


def test_a_split_cuts_the_host_copy_with_the_node() -> None:
    t = tier()
    t.cache(PROMPT)
    t.cache([*PROMPT[:4], 50, 51, 52, 53], rid=1)  # splits the node after 4 tokens
    copies = sorted(t.comp.copies(), key=lambda c: (c.start, len(c.key)))
    assert [(c.start, len(c)) for c in copies][:2] == [(0, 4), (4, 4)]
    assert t.host.ledger.held_count(copies[0].owner) == 4
    t.tree.audit()


def test_device_eviction_keeps_host_only_copies_and_a_match_reports_them() -> None:
    t = tier()
    t.cache(PROMPT)
    t.cache([*PROMPT, 9, 10, 11, 12], rid=1)
    t.tree.evict(100)
    assert {c.residency for c in t.comp.copies()} == {"host"}
    assert t.comp.counts.evictable == 12 and t.comp.counts.protected == 0
    result = t.tree.match_prefix([*PROMPT, 9, 10, 11, 12, 13])
    hit = t.comp.match_host([*PROMPT, 9, 10, 11, 12, 13], result.device_indices.numel(), 1)
    assert (hit.device_len, hit.host_len) == (0, 12)
    t.tree.audit()


def test_host_eviction_frees_lru_host_leaves_only_never_a_pinned_copy() -> None:
    t = tier(host_size=12)
    t.cache(PROMPT)
    t.cache([*PROMPT, 9, 10, 11, 12], rid=1)
    t.tree.evict(100)
    leaf = next(c for c in t.comp.copies() if c.start == 8)
    t.comp.pin(leaf)  # a load-back reads it
    assert t.comp.evict_component(4) == 0  # the only host leaf is pinned; its parent is not a leaf
    t.comp.unpin(leaf)
    assert t.comp.evict_component(4) == 4 and leaf not in t.comp.copies()
    assert t.host.available_size() == 4
    t.tree.audit()


def test_a_short_host_pool_evicts_host_only_copies_for_a_new_backup() -> None:
    t = tier(host_size=8)
    t.cache(PROMPT)
    t.tree.evict(100)
    t.cache(list(range(20, 28)), rid=1)  # write-through needs 8 host slots: the old copy goes
    (copy,) = t.comp.copies()
    assert copy.residency == "both" and copy.key[0] == 20
    assert t.comp.stats["host_evictions"] == 1
    t.tree.audit()


def test_recomputing_an_evicted_prefix_adopts_its_host_copy() -> None:
    t = tier()
    t.cache(PROMPT)
    t.tree.evict(100)
    (old,) = t.comp.copies()
    slots = old.ids.tolist()
    t.cache(PROMPT, rid=1)
    (copy,) = t.comp.copies()
    assert copy.residency == "both" and copy.ids.tolist() == slots and t.comp.stats["adopted"] == 1
    assert t.host.available_size() == 24
    t.tree.audit()


@pytest.mark.fires("I-HOST-DATA")
def test_a_host_copy_that_differs_from_its_device_copy_is_caught() -> None:
    t = tier()
    t.cache(PROMPT)
    (copy,) = t.comp.copies()
    t.host.buffer[:, copy.ids[3]] += 1  # a transfer that wrote one slot wrong
    with pytest.raises(ContractViolation, match="I-HOST-DATA"):
        t.tree.audit()


@pytest.mark.fires("I-HOST-RESIDENCY")
def test_counters_that_forget_a_host_copy_are_caught() -> None:
    t = tier()
    t.cache(PROMPT)
    t.comp.counts.protected += 8
    t.comp.counts.evictable -= 8  # moved between counters: the identity holds, the recount does not
    with pytest.raises(ContractViolation, match="I-HOST-RESIDENCY"):
        t.tree.audit()


@pytest.mark.fires("I-HOST-IDENTITY")
def test_a_leaked_host_slot_breaks_the_two_tier_identity() -> None:
    t = tier()
    t.cache(PROMPT)
    (copy,) = t.comp.copies()
    stray = t.host.alloc(1, copy.owner)  # taken behind the component's back: held by no copy it counts
    assert stray is not None
    with pytest.raises(ContractViolation, match="I-HOST-IDENTITY"):
        t.tree.audit()


@pytest.mark.fires("I-HOST-EVICT-PINNED")
def test_a_host_eviction_that_picks_a_pinned_copy_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    t = tier(host_size=8)
    t.cache(PROMPT)
    t.tree.evict(100)
    (copy,) = t.comp.copies()
    t.comp.pin(copy)  # a load-back reads it

    def careless(amount: int) -> int:  # the bug, re-enacted on this instance: pins ignored
        return sum(t.comp._evict_copy(c) for c in list(t.comp.host_only))

    monkeypatch.setattr(t.comp, "evict_component", careless)
    with pytest.raises(ContractViolation, match="I-HOST-EVICT-PINNED"):
        t.cache(list(range(20, 28)), rid=1)  # write-through finds the host pool full and evicts
    assert t.host.ledger.held_count(copy.owner) == 8  # the pinned copy was not freed


@pytest.mark.fires("I-NODUP-FREE")  # the generic ledger invariant covers the host pool
def test_a_host_slot_freed_twice_is_the_generic_double_free() -> None:
    t = tier()
    t.cache(PROMPT)
    t.tree.evict(100)
    (copy,) = t.comp.copies()
    ids = copy.ids.clone()
    t.comp.evict_component(8)
    with pytest.raises(DoubleFree, match="I-NODUP-FREE"):
        t.host.free(ids, copy.owner)


def test_the_pool_kinds_describe_the_host_tier() -> None:
    from kvledger.contracts.pool_kinds import HOST_KV, HOST_MAMBA, UNITS

    t = tier()
    assert HOST_KV.cached == HostKVComponent.kind and component_class(HOST_KV.cached) is HostKVComponent
    assert (UNITS["host_kv"], UNITS["host_mamba"]) == ("tokens", "slots")
    assert HOST_KV.accounts[-2:] == (CACHE_EVICTABLE, CACHE_PROTECTED) and HOST_MAMBA.cached is None
    assert t.host.size == 32 and t.host.buffer.shape == (2, 33, 4)


def test_a_host_mamba_pool_backs_up_and_restores_a_state() -> None:
    """The ``host_mamba`` kind's pool (no tree component yet): one owner per host slot, states moved
    through the transfer kernel bit for bit, both components."""
    from kvledger.contracts.owners import Owner
    from kvledger.reference.hicache import HostPool
    from kvledger.reference.pools.mamba_pool import MambaPool

    mamba = MambaPool(4, num_layers=2, conv_state_shape=(3,), temporal_state_shape=(2, 2), checks=LEDGER)
    conv, temporal = mamba.states
    conv[:, 2] = torch.arange(6, dtype=conv.dtype).view(2, 3)
    temporal[:, 2] = 7.0
    host_conv = HostPool(3, conv, name="host_mamba", checks=LEDGER)
    host_temporal = HostPool(3, temporal, name="host_mamba_ssm", checks=LEDGER)
    owner = Owner("host_mamba.copy", 1, CACHE_EVICTABLE)
    slots = [host_conv.alloc(1, owner), host_temporal.alloc(1, owner)]
    assert slots[0] is not None and slots[1] is not None
    for pool, state, slot in ((host_conv, conv, slots[0]), (host_temporal, temporal, slots[1])):
        kernels.transfer_slots(state, torch.tensor([2]), pool.buffer, slot)  # backup
        kernels.transfer_slots(pool.buffer, slot, state, torch.tensor([3]))  # restore into another slot
        assert torch.equal(
            kernels.fingerprint_slots(state, torch.tensor([3])),
            kernels.fingerprint_slots(state, torch.tensor([2])),
        )
    assert host_conv.ledger.held_count(owner) == 1 and host_conv.available_size() == 2
    host_conv.free(slots[0], owner)
    with pytest.raises(DoubleFree, match="I-NODUP-FREE"):
        host_conv.free(slots[0], owner)
