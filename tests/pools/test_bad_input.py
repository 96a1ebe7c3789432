"""Bad input is an operating error: a typed :class:`KVLedgerError`, and the pool and ledger unchanged.

The table of bad calls on every pool member lives in the sweep (``tests/sweep/cases_pools.py``, run by
``tests/sweep/test_sweep.py`` with contracts on and off). This module keeps the pool-specific stories
around it: the reserved id named in the message, double frees with and without a ledger and inside a
free group, SGLang's double-free scenario, group and backup misuse, and the regressions found while
writing the table. Each builds a pool in a known busy state (owner ``a`` and owner ``b`` hold ids, some
ids are free), snapshots it (free list, state mask, free-group buffer, ledger owner table, holdings,
account counts, step counter, tensor contents), makes one bad call, and compares the snapshot.

Pools are built with ledgers on (``checks=``, at least ``ledger``) whatever ``KVLEDGER_CONTRACTS`` says, so a
foreign free is detectable; the double-free tests also run with ledgers off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from kvledger.contracts.errors import (
    DoubleFree,
    DuplicateIds,
    FreeGroupError,
    InvalidArgument,
    KVLedgerError,
    SlotOutOfRange,
    StaleSnapshot,
)
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.null_ledger import NullLedger
from kvledger.contracts.owners import REQ_RUNNING, REQ_WAITING, Owner
from kvledger.reference.pools import (
    MambaPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from tests.levels import debug_level

from ._helpers import expect_rejected, id_list_of, snapshot

PAGE = 4


@dataclass
class Scene:
    """A pool in a busy state. ``*_ids`` are what ``free`` takes (token ids for the paged pool)."""

    pool: Any
    a: Owner
    b: Owner
    a_ids: list[int]
    b_ids: list[int]
    free_ids: list[int]
    reserved: list[int] = field(default_factory=list)  # ids below the domain (slot 0, page 0's tokens)
    beyond: list[int] = field(default_factory=list)  # ids above the domain


def _ids(t: Any) -> list[int]:
    return t if isinstance(t, list) else t.tolist()


def _free_of(pool: Any) -> list[int]:
    return id_list_of(pool).free.tolist()


def token_scene(ledgers: bool = True) -> Scene:
    pool = TokenToKVPoolAllocator(8, checks=debug_level(ledgers))
    a, b = Owner("req", 1, REQ_RUNNING), Owner("req", 2, REQ_WAITING)
    a_ids, b_ids = _ids(pool.alloc(3, a)), _ids(pool.alloc(2, b))
    return Scene(pool, a, b, a_ids, b_ids, _free_of(pool), reserved=[0], beyond=[9, 10**6])


def req_scene(ledgers: bool = True) -> Scene:
    pool = ReqToTokenPool(5, 8, checks=debug_level(ledgers))
    a, b = Owner("req", 1, REQ_RUNNING), Owner("req", 2, REQ_WAITING)
    a_ids, b_ids = _ids(pool.alloc(2, a)), _ids(pool.alloc(1, b))
    pool.write(a_ids[0], 0, torch.tensor([11, 12, 13]))
    return Scene(pool, a, b, a_ids, b_ids, _free_of(pool), reserved=[], beyond=[5, 99])


def mamba_scene(ledgers: bool = True) -> Scene:
    pool = MambaPool(6, num_layers=2, conv_state_shape=(3,), temporal_state_shape=(2, 2), checks=debug_level(ledgers))
    a, b = Owner("req", 1, REQ_RUNNING), Owner("req", 2, REQ_WAITING)
    a_ids, b_ids = _ids(pool.alloc(2, a)), _ids(pool.alloc(2, b))
    for i, slot in enumerate(a_ids + b_ids):
        pool.conv_state[:, slot] = float(i + 1)
        pool.temporal_state[:, slot] = -float(i + 1)
    return Scene(pool, a, b, a_ids, b_ids, _free_of(pool), reserved=[0], beyond=[7, 10**6])


def paged_scene(ledgers: bool = True) -> Scene:
    pool = PagedTokenToKVPoolAllocator(6 * PAGE, PAGE, checks=debug_level(ledgers))
    a, b = Owner("req", 1, REQ_RUNNING), Owner("req", 2, REQ_WAITING)
    a_tokens = _ids(pool.alloc(2 * PAGE, a))
    b_tokens = _ids(pool.alloc(PAGE, b))
    free_tokens = [p * PAGE for p in _free_of(pool)]
    return Scene(
        pool,
        a,
        b,
        a_tokens,
        b_tokens,
        free_tokens,
        reserved=list(range(PAGE)),
        beyond=[7 * PAGE, 7 * PAGE + 1],
    )


SCENES: dict[str, Callable[..., Scene]] = {
    "token": token_scene,
    "paged": paged_scene,
    "req": req_scene,
    "mamba": mamba_scene,
}

# ---------------------------------------------------------------------- the id domain
@pytest.mark.fires("I-DIAG-DOMAIN")
@pytest.mark.parametrize("pool_kind", ["token", "paged", "mamba"])
def test_the_reserved_id_is_refused_and_named(pool_kind: str) -> None:
    """Slot 0 / page 0 is padding: never handed out, so never taken back; the refusal names the rule."""
    scene = SCENES[pool_kind]()
    err = expect_rejected(
        scene.pool, SlotOutOfRange, lambda: scene.pool.free([scene.reserved[0]], scene.a), "reserved id"
    )
    assert "outside the usable range" in str(err) and str(err).endswith("[I-DIAG-DOMAIN]")
    assert scene.reserved[0] not in id_list_of(scene.pool).free.tolist()


# ---------------------------------------------------------------------- double free, every pool
@pytest.mark.parametrize("ledgers", [True, False], ids=["ledger", "null-ledger"])
@pytest.mark.parametrize("pool_kind", sorted(SCENES))
@pytest.mark.fires("I-NODUP-FREE")
def test_double_free_is_refused(pool_kind: str, ledgers: bool) -> None:
    """Free, free again: DoubleFree, and the pool is as after the first free (with or without a ledger)."""
    scene = SCENES[pool_kind](ledgers)
    assert isinstance(scene.pool.ledger, Ledger if ledgers else NullLedger)
    available = scene.pool.available_size()
    scene.pool.free(scene.a_ids, scene.a)
    after_first = scene.pool.available_size()
    assert after_first > available
    err = expect_rejected(
        scene.pool, DoubleFree, lambda: scene.pool.free(scene.a_ids, scene.a), "second free"
    )
    assert "I-NODUP-FREE" in str(err)
    assert scene.pool.available_size() == after_first
    scene.pool.audit()


@pytest.mark.parametrize("pool_kind", ["token", "paged", "mamba"])
def test_double_free_inside_a_free_group(pool_kind: str) -> None:
    """An id freed inside an open group is pending, not free: freeing it again is still a double free."""
    scene = SCENES[pool_kind]()
    scene.pool.free_group_begin()
    scene.pool.free(scene.a_ids[:1], scene.a)
    err = expect_rejected(
        scene.pool, DoubleFree, lambda: scene.pool.free(scene.a_ids[:1], scene.a), "pending"
    )
    assert "pending" in str(err)
    scene.pool.free_group_end()
    expect_rejected(
        scene.pool, DoubleFree, lambda: scene.pool.free(scene.a_ids[:1], scene.a), "after the group"
    )
    scene.pool.audit()


@pytest.mark.parametrize("size", [1024])
@pytest.mark.fires("I-NODUP-FREE")
def test_sglang_double_free_scenario(size: int) -> None:
    """SGLang's allocator reports 1026 free slots of 1024 after alloc(2), free, free; here the second free
    is refused and available_size() stays what the first free left (the whole pool)."""
    pool = TokenToKVPoolAllocator(size, checks=debug_level(True))
    req = Owner("req", 0, REQ_RUNNING)
    ids = pool.alloc(2, req)
    assert ids is not None
    pool.free(ids, req)
    assert pool.available_size() == size
    before = snapshot(pool)
    with pytest.raises(DoubleFree):
        pool.free(ids, req)
    before.assert_same(snapshot(pool), "the second free")
    assert pool.available_size() == size  # not size + 2
    assert pool.ledger.account_sizes() == {"free": size}
    pool.audit()


# ---------------------------------------------------------------------- group / backup misuse
@pytest.mark.fires("I-PENDING")
def test_nested_free_group_begin() -> None:
    scene = token_scene()
    scene.pool.free_group_begin()
    expect_rejected(scene.pool, FreeGroupError, scene.pool.free_group_begin, "nested begin")
    expect_rejected(scene.pool, FreeGroupError, scene.pool.backup_state, "backup inside a group")


@pytest.mark.parametrize("pool_kind", ["token", "paged"])
@pytest.mark.fires("I-ROLLBACK")
def test_restore_misuse(pool_kind: str) -> None:
    scene = SCENES[pool_kind]()
    pool = scene.pool
    snap = pool.backup_state()
    pool.free(scene.a_ids, scene.a)  # freed after the backup: restoring would take them back from nobody
    expect_rejected(pool, StaleSnapshot, lambda: pool.restore_state(snap), "stale snapshot")
    other = SCENES[pool_kind]().pool
    expect_rejected(pool, StaleSnapshot, lambda: pool.restore_state(other.backup_state()), "foreign snapshot")
    fresh = pool.backup_state()
    pool.free_group_begin()
    expect_rejected(pool, FreeGroupError, lambda: pool.restore_state(fresh), "restore inside a group")


# ---------------------------------------------------------------------- bugs found writing this suite
# Each test below pins a bug in kvledger/ found while writing this suite. Those marked BUG fail until the
# fix described in the docstring is applied; the others are regression tests for fixed ones.
@pytest.mark.fires("I-TYPED-INPUT")
def test_copy_from_a_slot_onto_itself_is_a_typed_error() -> None:
    """Was: ``MambaPool.copy_from(s, s)`` leaked the kernels' plain ValueError (not a KVLedgerError)."""
    scene = mamba_scene()
    slot = scene.a_ids[0]
    expect_rejected(scene.pool, InvalidArgument, lambda: scene.pool.copy_from(slot, slot), "copy onto itself")


def test_copy_from_a_repeated_destination_is_a_typed_error() -> None:
    """Was: a repeated destination in ``MambaPool.copy_from`` leaked the kernels' plain ValueError."""
    scene = mamba_scene()
    a0, a1 = scene.a_ids
    b0, _ = scene.b_ids
    expect_rejected(
        scene.pool, DuplicateIds, lambda: scene.pool.copy_from([a0, a1], [b0, b0]), "repeated dst"
    )


def test_write_of_ids_beyond_int32_is_a_typed_error() -> None:
    """BUG: ``ReqToTokenPool.write`` casts int64 ids to int32 and wraps ``2**40`` to 0 (the table changes;
    with contracts on a ContractViolation follows, with them off the wrong id stays). Fix: after
    ``as_index_tensor``, ``check_in_range(values, 0, 2**31 - 1, self.name, "KV slot id")``."""
    scene = req_scene()
    row = scene.a_ids[0]
    expect_rejected(
        scene.pool, KVLedgerError, lambda: scene.pool.write(row, 0, torch.tensor([2**40])), "int32 overflow"
    )


def test_free_of_an_int_beyond_int64_is_a_typed_error() -> None:
    """BUG: ``free([2**70])`` leaks torch's ``ValueError: Overflow when unpacking long``. Fix: in
    ``validate.as_index_tensor`` turn the ``torch.tensor`` overflow into ``SlotOutOfRange``."""
    scene = token_scene()
    expect_rejected(scene.pool, SlotOutOfRange, lambda: scene.pool.free([2**70], scene.a), "int beyond int64")


@pytest.mark.parametrize("ledgers", [True, False], ids=["ledger", "null-ledger"])
@pytest.mark.parametrize("pool_cls", [TokenToKVPoolAllocator, ReqToTokenPool])
@pytest.mark.fires("I-TYPED-INPUT")
def test_a_zero_size_pool_is_a_typed_error(pool_cls: type, ledgers: bool) -> None:
    """BUG: size 0 raises a plain ValueError from the Ledger constructor with ledgers on, and builds a
    pool with them off; MambaPool already refuses it with InvalidArgument. Fix: ``if size < 1: raise
    InvalidArgument`` in both constructors, as MambaPool does."""
    args: tuple[int, ...] = (0,) if pool_cls is TokenToKVPoolAllocator else (0, 8)
    with pytest.raises(InvalidArgument):
        pool_cls(*args, checks=debug_level(ledgers))


def test_alloc_extend_cannot_hand_one_slot_to_two_requests() -> None:
    """BUG: two entries of one batch that continue the same partial page both get the same token slot.
    Fix: in ``alloc_extend`` (entries with ``fill > 0``) and ``alloc_decode`` (entries that open no page)
    refuse a batch in which two entries name the same partial page ``last_loc // page_size``."""
    scene = paged_scene()
    pool = scene.pool
    tokens = pool.alloc_extend([0], [1], [-1], [scene.a])  # a one-token sequence: a partial page
    assert tokens is not None
    loc = int(tokens[0])
    expect_rejected(
        pool,
        InvalidArgument,
        lambda: pool.alloc_extend([1, 1], [2, 2], [loc, loc], [scene.a, scene.a]),
        "one partial page continued twice",
    )


# ---------------------------------------------------------------------- the snapshot is not vacuous
SNAPSHOT_CHANGES: dict[str, tuple[str, Callable[[Scene], object]]] = {
    "a valid free": ("token", lambda s: s.pool.free(s.a_ids[:1], s.a)),
    "a valid alloc": ("paged", lambda s: s.pool.alloc(PAGE, s.b)),
    "a retag (ledger counts and log only)": ("token", lambda s: s.a.set_account(REQ_WAITING, "retract")),
    "a free group opening": ("mamba", lambda s: s.pool.free_group_begin()),
    "a row write (contents only)": ("req", lambda s: s.pool.write(s.a_ids[1], 0, torch.tensor([5]))),
    "a state write (contents only)": ("mamba", lambda s: s.pool.conv_state.__setitem__((0, s.a_ids[0]), 9.0)),
}


@pytest.mark.parametrize("what", sorted(SNAPSHOT_CHANGES))
def test_snapshot_notices_the_change(what: str) -> None:
    """Guard for every test above: a snapshot comparison fails when anything a bad call could touch moved."""
    pool_kind, change = SNAPSHOT_CHANGES[what]
    scene = SCENES[pool_kind]()
    before = snapshot(scene.pool)
    change(scene)
    with pytest.raises(AssertionError):
        before.assert_same(snapshot(scene.pool))
