"""A bookkeeping bug is a ContractViolation with the evidence; bad input is a typed error (elsewhere).

``_free_unchecked`` is the path internal callers (radix caches, the scheduler) use once they have
validated their input, so only the ledger stands between a bug there and a corrupted free list. These
tests drive that path wrongly on purpose and check that the ledger refuses, names the pool, the slot,
its real owner and that owner's moves, and leaves everything unchanged.

The second half checks that the icontract pre/postconditions and class invariants are live: pool
internals are monkeypatched to misbehave and the public call must raise. Those tests need the
decorators, i.e. ``KVLEDGER_CONTRACTS=1`` when the package was imported.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import kvledger.kernels
from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, KVLedgerError
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.oracle import check_free_list_order
from kvledger.contracts.owners import CACHE_EVICTABLE, FREE_LIST, REQ_RUNNING, REQ_WAITING, Owner
from kvledger.reference.pools import (
    KVBufferPool,
    MambaPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from kvledger.reference.pools.id_free_list import IdFreeList
from tests.levels import debug_level

from ._helpers import id_list_of, snapshot
from ._model import FreeListModel

PAGE = 4
needs_contracts = pytest.mark.skipif(
    not switch.ENABLED, reason="icontract decorators are off (KVLEDGER_CONTRACTS=0)"
)


def _make(kind: str, ledgers: bool = True) -> Any:
    if kind == "token":
        return TokenToKVPoolAllocator(8, name="kv", checks=debug_level(ledgers))
    if kind == "paged":
        return PagedTokenToKVPoolAllocator(8 * PAGE, PAGE, name="kv_paged", checks=debug_level(ledgers))
    if kind == "req":
        return ReqToTokenPool(8, 16, name="req_rows", checks=debug_level(ledgers))
    return MambaPool(
        8, num_layers=1, conv_state_shape=(2,), temporal_state_shape=(2,), name="mamba", checks=debug_level(ledgers)
    )


def _alloc(pool: Any, n: int, owner: Owner) -> torch.Tensor:
    """``n`` ledger ids' worth (pages for the paged pool), as what ``_free_unchecked`` takes."""
    unit = getattr(pool, "page_size", 1) if isinstance(pool, PagedTokenToKVPoolAllocator) else 1
    out = pool.alloc(n * unit, owner)
    assert out is not None
    return torch.as_tensor(out, dtype=torch.int64)


def _ledger_ids(pool: Any, ids: torch.Tensor) -> list[int]:
    if isinstance(pool, PagedTokenToKVPoolAllocator):
        return sorted({int(t) // pool.page_size for t in ids})
    return ids.tolist()


POOLS = ["token", "paged", "req", "mamba"]


@pytest.mark.parametrize("kind", POOLS)
@pytest.mark.fires("I-EXCLUSIVE")
def test_free_unchecked_of_a_waiting_requests_slot_names_holder_and_history(kind: str) -> None:
    pool = _make(kind)
    holder = Owner("req", 7, REQ_RUNNING)
    culprit = Owner("req", 8, REQ_RUNNING)
    held = _alloc(pool, 3, holder)
    _alloc(pool, 2, culprit)
    holder.set_account(REQ_WAITING, "retract")  # the request went back to the queue, its slots with it
    victim = held[1:2] if kind != "paged" else held[PAGE : PAGE + 1]
    slot = _ledger_ids(pool, victim)[0]
    before = snapshot(pool)

    with pytest.raises(ContractViolation) as info:
        pool._free_unchecked(victim, culprit, "free")

    message = str(info.value)
    assert not isinstance(info.value, KVLedgerError), "a bookkeeping bug must not look like bad input"
    assert message.startswith(f"[{pool.name}]"), message
    assert re.search(rf"^\s+{pool.ledger.id_noun} {slot}: owner req#7\[req\.waiting\]$", message, re.M), message
    assert "expected to be held by req#8[req.running]" in message
    history = [line.strip() for line in message.splitlines() if line.strip().startswith("step ")]
    assert len(history) == 2, message
    assert re.fullmatch(r"step \d+: alloc: free_list\[free\] -> req#7\[req\.running\]", history[0]), history
    assert re.fullmatch(r"step \d+: retract: req#7 req\.running -> req\.waiting", history[1]), history
    before.assert_same(snapshot(pool), "the refused transfer")
    pool.audit()


@pytest.mark.parametrize("kind", POOLS)
@pytest.mark.fires("I-NODUP-FREE")
def test_double_free_through_free_unchecked(kind: str) -> None:
    pool = _make(kind)
    owner = Owner("req", 3, REQ_RUNNING)
    ids = _alloc(pool, 2, owner)
    pool.free(ids, owner)
    slot = _ledger_ids(pool, ids)[0]
    before = snapshot(pool)
    with pytest.raises(ContractViolation) as info:
        pool._free_unchecked(ids, owner, "free")
    message = str(info.value)
    assert "I-NODUP-FREE" in message
    assert re.search(rf"{pool.ledger.id_noun} {slot}: owner free_list\[free\]", message), message
    assert re.search(r"step \d+: free: req#3\[req\.running\] -> free_list\[free\]", message), message
    before.assert_same(snapshot(pool), "the refused double free")


@pytest.mark.parametrize("kind", ["token", "paged", "mamba"])
def test_free_unchecked_of_a_pending_id(kind: str) -> None:
    """Inside a free group a freed id belongs to the group's pending owner; freeing it again is a bug."""
    pool = _make(kind)
    owner = Owner("req", 4, REQ_RUNNING)
    ids = _alloc(pool, 2, owner)
    pool.free_group_begin()
    pool.free(ids, owner)
    before = snapshot(pool)
    with pytest.raises(ContractViolation, match=r"owner free_group#\w+\[pending_free\]"):
        pool._free_unchecked(ids, owner, "free")
    before.assert_same(snapshot(pool), "a free of pending ids")
    pool.free_group_end()
    pool.audit()


def test_free_unchecked_of_a_negative_id_does_not_alias_the_last_slot() -> None:
    """``owner[-1]`` in Python is the last entry: a negative id must not pass as the last slot's owner."""
    pool = _make("token")
    owner = Owner("req", 5, REQ_RUNNING)
    _alloc(pool, 8, owner)  # the owner holds every slot, the last one included
    before = snapshot(pool)
    with pytest.raises(ContractViolation, match=r"slot -1: owner None"):
        pool._free_unchecked(torch.tensor([-1]), owner, "free")
    before.assert_same(snapshot(pool), "a negative id")
    pool.audit()


def test_free_unchecked_of_a_cache_nodes_slot_names_the_node() -> None:
    """The same evidence for a non-request holder: a cache node's KV, moved in from a request."""
    pool = _make("token")
    req = Owner("req", 1, REQ_RUNNING)
    node = Owner("node", 12, CACHE_EVICTABLE)
    ids = _alloc(pool, 2, req)
    pool.ledger.transfer(ids, req, node, "insert")
    with pytest.raises(ContractViolation) as info:
        pool._free_unchecked(ids[:1], req, "free")
    message = str(info.value)
    assert re.search(rf"slot {int(ids[0])}: owner node#12\[cache\.evictable\]", message), message
    assert re.search(r"step \d+: insert: req#1\[req\.running\] -> node#12\[cache\.evictable\]", message)


@pytest.mark.fires("I-CAP")
def test_without_a_ledger_audit_still_catches_a_double_free() -> None:
    """With ledgers off ``_free_unchecked`` is unguarded (that is the price), but the free list and the
    state mask then disagree, and ``audit()`` says so."""
    pool = _make("token", ledgers=False)
    owner = Owner("req", 1, REQ_RUNNING)
    ids = _alloc(pool, 2, owner)
    pool.free(ids, owner)
    pool._free_unchecked(ids, owner, "free")  # nothing stops it
    assert id_list_of(pool).available() == 10  # the SGLang symptom: more free than the pool has
    if switch.ENABLED:  # the class invariant I-CAP still fires on the next public call
        with pytest.raises(ContractViolation, match="I-CAP"):
            pool.available_size()
    with pytest.raises(ContractViolation, match="free list and state mask disagree"):
        id_list_of(pool).audit()


@pytest.mark.fires("I-PARTITION")
def test_audit_catches_a_free_list_tampered_behind_the_ledger() -> None:
    pool = _make("token")
    owner = Owner("req", 1, REQ_RUNNING)
    ids = _alloc(pool, 2, owner)
    free = id_list_of(pool)
    free.free = torch.cat((free.free, ids[:1]))  # a slot back on the free list without any transfer
    free.state[ids[:1]] = 1
    with pytest.raises(ContractViolation, match=r"in pool but not in ledger \[1\]"):
        free.audit()


# ---------------------------------------------------------------------- icontract is live
@needs_contracts
def test_alloc_postcondition_catches_a_short_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _make("token")
    owner = Owner("req", 1, REQ_RUNNING)
    real = IdFreeList.alloc

    def short(self: IdFreeList, n: int, who: Owner, op: str = "alloc") -> torch.Tensor | None:
        out = real(self, n, who, op)
        return None if out is None else out[: max(n - 1, 0)]

    monkeypatch.setattr(IdFreeList, "alloc", short)
    with pytest.raises(ContractViolation, match=r"result\.numel\(\) == n"):
        pool.alloc(3, owner)


@needs_contracts
@pytest.mark.parametrize("kind", ["token", pytest.param("paged", marks=pytest.mark.fires("I-PAGE-UNIT")), "mamba"])
def test_free_postcondition_catches_a_lost_free(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger moved the ids to the free list but the pool forgot them: free's postcondition fires."""
    pool = _make(kind)
    owner = Owner("req", 1, REQ_RUNNING)
    ids = _alloc(pool, 2, owner)
    monkeypatch.setattr(IdFreeList, "_push_free", lambda self, ids: None)
    with pytest.raises(ContractViolation):
        pool.free(ids, owner)


@needs_contracts
@pytest.mark.fires("I-COUNT")
def test_class_invariant_catches_a_corrupted_free_list() -> None:
    pool = _make("token")
    owner = Owner("req", 1, REQ_RUNNING)
    _alloc(pool, 2, owner)
    id_list_of(pool).free = id_list_of(pool).free[1:]  # drop a free id behind the pool's back
    with pytest.raises(ContractViolation, match="I-COUNT"):
        pool.available_size()


@needs_contracts
@pytest.mark.fires("I-ZERO-ON-ALLOC")
def test_mamba_alloc_postcondition_catches_an_unzeroed_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new request must never inherit a previous request's state (llama.cpp/ik_llama #1696)."""
    pool = _make("mamba")
    owner = Owner("req", 1, REQ_RUNNING)
    slot = pool.alloc(1, owner)
    pool.conv_state[:, slot] = 3.0
    pool.free(slot, owner)
    pool.alloc(7, owner)  # the FIFO free list hands the dirty slot out again after these seven
    monkeypatch.setattr(kvledger.kernels, "zero_slots", lambda state, slots: None)
    pool.alloc(1, owner)  # the zeroing is scheduled; the check runs where the bytes move
    with pytest.raises(ContractViolation, match="a slot handed out is zeroed"):
        pool.flush()


@needs_contracts
@pytest.mark.fires("I-COPY")
def test_mamba_copy_postcondition_catches_a_lost_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _make("mamba")
    owner = Owner("req", 1, REQ_RUNNING)
    src, dst = pool.alloc(2, owner).tolist()
    pool.conv_state[:, src] = 5.0
    monkeypatch.setattr(kvledger.kernels, "copy_slots", lambda state, s, d: None)
    pool.copy_from(src, dst)  # scheduled; the check runs where the bytes move
    with pytest.raises(ContractViolation, match="fingerprint equals its source"):
        _ = pool.conv_state  # any read applies the schedule first


@needs_contracts
@pytest.mark.fires("I-COUNT")
def test_ledger_invariant_catches_a_miscounted_account() -> None:
    ledger = Ledger("t", range(1, 5))
    owner = Owner("req", 1, REQ_RUNNING)
    ledger._count[REQ_RUNNING] += 1  # an account count that no transfer made
    with pytest.raises(ContractViolation, match="I-COUNT"):
        ledger.transfer([1], FREE_LIST, owner, "alloc")


@needs_contracts
@pytest.mark.fires("I-NO-PARTIAL")
@pytest.mark.parametrize("ledgers", [True, False], ids=["ledger", "null-ledger"])
def test_a_refused_allocation_that_took_an_id_is_caught(monkeypatch: pytest.MonkeyPatch, ledgers: bool) -> None:
    """All or nothing: an allocation that answers None must not have taken anything on the way."""
    pool = _make("token", ledgers)
    owner = Owner("req", 1, REQ_RUNNING)
    real = IdFreeList.alloc

    def leaky(self: IdFreeList, n: int, who: Owner, op: str = "alloc") -> torch.Tensor | None:
        if n > self.free.numel():
            real(self, 1, who, op)  # takes one id, then refuses the whole request
            return None
        return real(self, n, who, op)

    monkeypatch.setattr(IdFreeList, "alloc", leaky)
    with pytest.raises(ContractViolation, match="I-NO-PARTIAL"):
        pool.alloc(pool.size + 1, owner)


@pytest.mark.fires("I-REUSE-ORDER")
def test_reuse_order_check_catches_a_pool_that_reuses_in_the_wrong_order() -> None:
    """The check the state machines run after every step: a FIFO pool that reuses LIFO is named."""
    pool = _make("token")
    owner = Owner("req", 1, REQ_RUNNING)
    model = FreeListModel(range(1, 9), [owner], "fifo")
    ids = _alloc(pool, 3, owner)
    assert ids.tolist() == model.take(3, owner)
    id_list_of(pool).reuse = "lifo"  # the bug: freed slots go to the head of the free list
    pool.free(ids[:1], owner)
    model.release(ids[:1].tolist(), owner)
    assert sorted(id_list_of(pool).free.tolist()) == sorted(model.free)  # same ids, other order
    with pytest.raises(ContractViolation, match=r"I-REUSE-ORDER: \[kv\] the free list differs"):
        check_free_list_order(pool.name, id_list_of(pool).free.tolist(), model.free)


@needs_contracts
@pytest.mark.fires("I-POISON-ON-FREE")
@pytest.mark.parametrize("kind", ["mamba", "kv", "kv_paged"])
def test_a_free_that_skips_the_poison_is_caught(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debug builds poison what comes back, so a stale read shows in the data; skipping it is a bug."""
    if kind == "mamba":
        pool = _make("mamba")
    else:
        pool = _make("token" if kind == "kv" else "paged")
        pool.attach_kv_buffer(KVBufferPool.for_allocator(pool, num_layers=1, num_kv_heads=1, head_dim=2))
    owner = Owner("req", 1, REQ_RUNNING)
    ids = _alloc(pool, 2, owner)
    monkeypatch.setattr(kvledger.kernels, "poison_slots", lambda state, slots: None)
    with pytest.raises(ContractViolation, match="I-POISON-ON-FREE"):
        pool.free(ids, owner)
