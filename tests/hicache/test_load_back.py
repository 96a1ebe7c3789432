"""The host tier's slice (b): load-back on a host hit, in flight, committed only once landed."""

from __future__ import annotations

import pytest
import torch

from kvledger import kernels
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.owners import CACHE_PROTECTED, REQ_RUNNING, Owner
from kvledger.reference.hicache import match_with_host
from kvledger.reference.hicache.load_back import ABORTED, COMMITTED, FAILED, LANDED, PENDING
from tests.hicache._tier import Tier, tier

PROMPT = list(range(1, 13))


def _evicted(t: Tier) -> torch.Tensor:
    """Cache PROMPT, remember its device data, evict it to the host."""
    t.cache(PROMPT)
    data = t.buffer[:, t.tree.match_prefix(PROMPT).device_indices].clone()
    t.tree.evict(100)
    return data


def _start(t: Tier, key: list[int]) -> tuple[Owner, object]:
    owner = Owner("req", 7, REQ_RUNNING)
    result, hit = match_with_host(t.tree, t.comp, key)
    ids = t.kv.alloc(hit.host_len, owner)  # in a scheduler: reserved through the holdings coordinator
    assert ids is not None
    return owner, (result, t.loads.start(key, hit, ids, owner))


def test_a_host_hit_loads_back_lands_and_commits_into_the_tree() -> None:
    t = tier(delay=2)
    data = _evicted(t)
    owner, (result, load) = _start(t, PROMPT)
    assert result.device_indices.numel() == 0 and load.hit.host_len == 12
    assert all(c.loading == 1 and c.owner.account is CACHE_PROTECTED for c in load.hit.copies())
    assert bool(kernels.any_poisoned(t.buffer, load.device_ids).all())  # pending: poisoned
    t.tree.audit()
    assert t.loads.poll() == [] and load.state == PENDING  # the transfer takes two polls
    t.loads.poll()
    (landed,) = t.loads.poll()
    assert landed is load and load.state == LANDED
    assert torch.equal(t.buffer[:, load.device_ids], data)  # the device copy holds the host's data
    t.loads.check_readable(load.device_ids)
    assert t.loads.commit(load, result.device_indices, 0) == 0
    assert load.state == COMMITTED and t.kv.ledger.held_count(owner) == 0  # the tree adopted the slots
    assert torch.equal(t.tree.match_prefix(PROMPT).device_indices, load.device_ids)
    assert {c.residency for c in t.comp.copies()} == {"both"}  # the host copies back the new node again
    t.tree.audit()


def test_a_partial_host_hit_after_a_device_match() -> None:
    t = tier(delay=0)
    _evicted(t)
    t.cache(PROMPT[:4], rid=3)  # the first 4 tokens back on the device (adopting nothing: a cut copy)
    key = [*PROMPT, 99]
    _owner, (result, load) = _start(t, key)
    assert (load.hit.device_len, load.hit.host_len) == (4, 8)
    lock = t.tree.inc_lock_ref(result.last_node)
    t.loads.poll()
    assert t.loads.commit(load, result.device_indices, 4) == 4
    t.tree.dec_lock_ref(lock)
    assert t.tree.match_prefix(key).device_indices.numel() == 12
    t.tree.audit()


@pytest.mark.fires("I-HOST-LOAD-PENDING")
def test_a_reader_of_a_pending_load_is_caught() -> None:
    t = tier(delay=3)
    _evicted(t)
    _, (_, load) = _start(t, PROMPT)
    with pytest.raises(ContractViolation, match="I-HOST-LOAD-PENDING"):
        t.loads.check_readable(load.device_ids[5:7])


@pytest.mark.fires("I-HOST-LOAD-ATOMIC")
def test_a_commit_before_the_load_landed_is_refused_and_changes_nothing() -> None:
    t = tier(delay=3)
    _evicted(t)
    owner, (result, load) = _start(t, PROMPT)
    with pytest.raises(ContractViolation, match="I-HOST-LOAD-ATOMIC"):
        t.loads.commit(load, result.device_indices, 0)
    assert load.state == PENDING and t.kv.ledger.held_count(owner) == 12
    assert t.tree.match_prefix(PROMPT).device_indices.numel() == 0
    t.tree.audit()


@pytest.mark.parametrize("landed", [False, True])
def test_an_abort_in_flight_rolls_back_cleanly(landed: bool) -> None:
    t = tier(delay=0 if landed else 5)
    _evicted(t)
    owner, (_, load) = _start(t, PROMPT)
    t.loads.poll()
    assert load.state == (LANDED if landed else PENDING)
    t.loads.abort(load)  # the request was aborted or retracted
    assert load.state == ABORTED and not t.loads.pending_slots and not t.loads.loads
    assert all(c.loading == 0 for c in t.comp.copies()) and t.comp.counts.protected == 0
    t.kv.free(load.device_ids, owner)  # the caller gives its reservation back (the holdings' rollback)
    assert t.kv.available_size() == 64
    with pytest.raises(InvalidArgument, match="aborted"):
        t.loads.abort(load)
    t.tree.audit()


def test_a_failed_transfer_lands_nothing_and_unpins() -> None:
    t = tier(delay=0, fails=lambda load: True)
    _evicted(t)
    owner, (result, load) = _start(t, PROMPT)
    t.loads.poll()
    assert load.state == FAILED and bool(kernels.any_poisoned(t.buffer, load.device_ids).all())
    with pytest.raises(ContractViolation, match="I-HOST-LOAD-ATOMIC"):
        t.loads.commit(load, result.device_indices, 0)
    assert t.comp.counts.evictable == 12
    t.kv.free(load.device_ids, owner)
    t.tree.audit()


def test_bad_load_back_input_is_a_typed_error_with_nothing_changed() -> None:
    t = tier()
    _evicted(t)
    owner = Owner("req", 7, REQ_RUNNING)
    _, hit = match_with_host(t.tree, t.comp, PROMPT)
    ids = t.kv.alloc(11, owner)
    assert ids is not None
    with pytest.raises(InvalidArgument, match="12 tokens"):
        t.loads.start(PROMPT, hit, ids, owner)
    assert all(c.loading == 0 for c in t.comp.copies()) and not t.loads.pending_slots
    with pytest.raises(InvalidArgument, match="delay"):
        type(t.loads)(t.tree, t.comp, delay=-1)
