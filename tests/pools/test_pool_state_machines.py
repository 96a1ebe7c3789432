"""Hypothesis state machines for every pool, checked step by step against a plain-Python model.

Each machine drives one small pool (so "pool full" states are common) with random alloc / free /
retag / free-group / backup-restore sequences, plus pool-specific operations (paged extend and decode,
request-row writes, Mamba copy and fork with state contents). Invalid calls are drawn on purpose: each
must raise its typed error (a :class:`KVLedgerError`) and leave a full snapshot of the pool and its
ledger unchanged. After every step the model (an ordered free list, a set per owner) is compared with
the pool's free list, ``available_size()`` and ``ledger.holdings(owner)``, and ``pool.audit()`` runs.

Pools are built with ledgers (``checks=``, at least ``ledger``) so the ownership checks run whatever
``KVLEDGER_CONTRACTS`` says; the icontract pre/postconditions follow the env var.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.contracts.errors import (
    DoubleFree,
    DuplicateIds,
    ForeignSlot,
    FreeGroupError,
    InvalidArgument,
    KVLedgerError,
    SlotOutOfRange,
    StaleSnapshot,
)
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.oracle import check_free_list_order
from kvledger.contracts.owners import FREE, FREE_LIST, PENDING_FREE, Owner
from kvledger.reference.pools import (
    MambaPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from kvledger.reference.pools.id_free_list import FreeListSnapshot
from tests.levels import debug_level

from ._helpers import expect_rejected, id_list_of, snapshot
from ._model import HOLDER_ACCOUNTS, FreeListModel, make_owners

NUM_OWNERS = 3
RETAG_OPS = ("admit", "retract", "lock", "unlock", "chunk")


def _as_arg(ids: list[int], form: str, device: torch.device) -> Any:
    """The same ids as a tensor (int64/int32), a list, or a bare int: every accepted form."""
    if form == "int64":
        return torch.tensor(ids, dtype=torch.int64, device=device)
    if form == "int32":
        return torch.tensor(ids, dtype=torch.int32, device=device)
    if form == "int" and len(ids) == 1:
        return ids[0]
    return list(ids)


def _bad_typed_arg(ids: list[int], kind: str) -> Any:
    """Ids in a form every pool must refuse with InvalidArgument."""
    if kind == "float":
        return torch.tensor(ids, dtype=torch.float32)
    if kind == "bool":
        return torch.ones(max(len(ids), 1), dtype=torch.bool)
    if kind == "uint8":
        return torch.tensor(ids, dtype=torch.uint8)
    if kind == "int16":
        return torch.tensor(ids, dtype=torch.int16)
    if kind == "2d":
        return torch.tensor([ids], dtype=torch.int64)
    if kind == "meta":
        return torch.tensor(ids, dtype=torch.int64, device="meta")
    if kind == "pyfloat":
        return [float(i) for i in ids] or [1.0]
    if kind == "pybool":
        return True
    return "1"  # a str is a Sequence, of str


BAD_TYPED_KINDS = ("float", "bool", "uint8", "int16", "2d", "meta", "pyfloat", "pybool", "str")


class PoolMachine(RuleBasedStateMachine):
    """What every pool shares: owners, retags, the model comparison and the audit.

    Subclasses build ``self.pool`` and ``self.model`` in an ``@initialize``; pools with free groups or
    backup/restore mix in :class:`FreeGroupRules` / :class:`BackupRules`.
    """

    unit = 1  # tokens per ledger id

    pool: Any
    model: FreeListModel
    owners: list[Owner]

    def _setup(self, pool: Any, domain: range, reuse: str) -> None:
        self.pool = pool
        self.owners = make_owners(NUM_OWNERS)
        self.model = FreeListModel(domain, self.owners, reuse)
        self.backups: list[tuple[FreeListSnapshot, tuple[int, ...]]] = []
        assert isinstance(pool.ledger, Ledger)

    def _draw_owner(self, data: st.DataObject, holding: bool = False) -> Owner | None:
        candidates = [o for o in self.owners if self.model.held[o]] if holding else self.owners
        if not candidates:
            return None
        return data.draw(st.sampled_from(candidates), label="owner")

    def _reject(self, error: type[KVLedgerError], call: Any, what: str) -> None:
        event(f"rejected: {what} -> {error.__name__}")
        expect_rejected(self.pool, error, call, what)

    # ------------------------------------------------------------------ shared rules
    @rule(data=st.data())
    def retag(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(self.owners), label="owner")
        account = data.draw(st.sampled_from(HOLDER_ACCOUNTS), label="account")
        owner.set_account(account, data.draw(st.sampled_from(RETAG_OPS), label="op"))

    @rule(data=st.data())
    def invalid_call(self, data: st.DataObject) -> None:
        """One bad call, from one of the pool's families of bad input (one rule, so valid steps dominate)."""
        family = data.draw(st.sampled_from(self._bad_input_families()), label="bad input family")
        family(data)

    def _bad_input_families(self) -> list[Callable[[st.DataObject], None]]:
        return []

    def _after_ids_removed(self) -> None:
        """Hook: ids left some owners (free, restore); the paged machine drops broken sequences."""

    # ------------------------------------------------------------------ checks after every step
    @invariant()
    def model_matches_pool(self) -> None:
        model, ledger = self.model, self.pool.ledger
        model.check_partition()
        ids = id_list_of(self.pool)
        check_free_list_order(ids.name, ids.free.tolist(), model.free)
        assert self.pool.available_size() == len(model.free) * self.unit
        assert ids.pending_count() == len(model.pending or ())
        assert ledger.holdings(FREE_LIST) == frozenset(model.free)
        assert ledger.holdings(ledger.pending_owner) == frozenset(model.pending or ())
        for owner, held in model.held.items():
            assert ledger.holdings(owner) == frozenset(held), f"{owner!r} holds {sorted(held)} in the model"
        assert ledger.count(FREE) == len(model.free)
        assert ledger.count(PENDING_FREE) == len(model.pending or ())
        for account in HOLDER_ACCOUNTS:
            expected = sum(len(held) for o, held in model.held.items() if o.account == account)
            assert ledger.count(account) == expected, f"account {account} count"

    @invariant()
    def audit_passes(self) -> None:
        self.pool.audit()


class FreeGroupRules(PoolMachine):
    """For pools with ``free_group_begin`` / ``free_group_end``."""

    @precondition(lambda self: not self.model.in_group())
    @rule()
    def free_group_begin(self) -> None:
        self.pool.free_group_begin()
        self.model.group_begin()

    @precondition(lambda self: self.model.in_group())
    @rule()
    def free_group_end(self) -> None:
        event(f"free group closed with {len(self.model.pending or ())} ids")
        self.pool.free_group_end()
        self.model.group_end()

    def _bad_input_families(self) -> list[Callable[[st.DataObject], None]]:
        return [*super()._bad_input_families(), self._bad_group_order]

    def _bad_group_order(self, data: st.DataObject) -> None:
        if self.model.in_group():
            self._reject(FreeGroupError, self.pool.free_group_begin, "nested free_group_begin")
        else:
            self._reject(FreeGroupError, self.pool.free_group_end, "free_group_end without begin")


class BackupRules(PoolMachine):
    """For pools with ``backup_state`` / ``restore_state``."""

    @rule()
    def backup(self) -> None:
        if self.model.in_group():
            self._reject(FreeGroupError, self.pool.backup_state, "backup_state inside a free group")
            return
        self.backups.append((self.pool.backup_state(), self.model.backup()))

    @precondition(lambda self: bool(self.backups))
    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        snap, model_snap = data.draw(st.sampled_from(self.backups), label="backup")
        if self.model.in_group():
            self._reject(
                FreeGroupError, lambda: self.pool.restore_state(snap), "restore_state inside a free group"
            )
        elif self.model.is_stale(model_snap):
            self._reject(StaleSnapshot, lambda: self.pool.restore_state(snap), "stale restore_state")
        else:
            event("restore_state")
            self.pool.restore_state(snap)
            self.model.restore(model_snap)
            self._after_ids_removed()

    def _bad_input_families(self) -> list[Callable[[st.DataObject], None]]:
        return [*super()._bad_input_families(), self._bad_foreign_snapshot]

    def _bad_foreign_snapshot(self, data: st.DataObject) -> None:
        if self.model.in_group():
            return
        other = type(self.pool)(**self._twin_kwargs())
        foreign = other.backup_state()
        self._reject(
            StaleSnapshot, lambda: self.pool.restore_state(foreign), "restore_state from another pool"
        )

    def _twin_kwargs(self) -> dict[str, Any]:
        """Constructor arguments for a second pool of the same shape (its snapshot must be refused)."""
        raise NotImplementedError


class IdPoolMachine(PoolMachine):
    """Rules for pools whose ``alloc(n)`` / ``free(ids)`` work on the ledger's ids directly."""

    first_id = 1

    def _alloc(self, n: int, owner: Owner) -> list[int] | None:
        out = self.pool.alloc(n, owner)
        if out is None:
            return None
        return out if isinstance(out, list) else out.tolist()

    def _size(self) -> int:
        return int(self.pool.size)

    @rule(data=st.data())
    def alloc(self, data: st.DataObject) -> None:
        owner = self._draw_owner(data)
        assert owner is not None
        n = data.draw(st.integers(0, self._size() + 1), label="n")
        expected = self.model.free[:n] if n <= len(self.model.free) else None
        before = snapshot(self.pool) if expected is None else None
        got = self._alloc(n, owner)
        if before is not None:
            event("alloc refused: pool short")
            assert got is None
            before.assert_same(snapshot(self.pool), "a refused alloc")
            return
        if not self.model.free[n:]:
            event("alloc drained the pool")
        assert got == expected, "alloc must hand out the head of the free list"
        self.model.take(n, owner)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        owner = self._draw_owner(data, holding=True)
        if owner is None:
            return
        held = sorted(self.model.held[owner])
        ids = data.draw(st.lists(st.sampled_from(held), min_size=1, unique=True), label="ids")
        form = data.draw(st.sampled_from(("int64", "int32", "list", "int")), label="form")
        self.pool.free(_as_arg(ids, form, self.pool.device), owner)
        self.model.release(ids, owner)
        self._after_ids_removed()

    def _bad_input_families(self) -> list[Callable[[st.DataObject], None]]:
        return [*super()._bad_input_families(), self._bad_free, self._bad_free_type, self._bad_alloc]

    def _bad_free(self, data: st.DataObject) -> None:
        model = self.model
        owner = self._draw_owner(data)
        assert owner is not None
        own = sorted(model.held[owner])
        mine = (
            data.draw(st.lists(st.sampled_from(own), unique=True, max_size=2), label="valid part")
            if own
            else []
        )
        cases: dict[str, tuple[type[KVLedgerError], list[int] | Any]] = {}
        not_held = model.free + list(model.pending or ())
        if not_held:
            cases["double free"] = (
                DoubleFree,
                [*mine, data.draw(st.sampled_from(not_held), label="free id")],
            )
        foreign = [i for o, held in model.held.items() if o is not owner for i in held]
        if foreign:
            cases["foreign slot"] = (
                ForeignSlot,
                [*mine, data.draw(st.sampled_from(sorted(foreign)), label="theirs")],
            )
        high = self.first_id + self._size()
        out = data.draw(st.sampled_from((high, high + 7, -1, -(10**6), 10**9)), label="out of range")
        cases["out of range"] = (SlotOutOfRange, [*mine, out])
        if self.first_id == 1:
            cases["reserved id 0"] = (SlotOutOfRange, [*mine, 0])
        if own:
            dup = data.draw(st.sampled_from(own), label="dup")
            cases["duplicate"] = (DuplicateIds, [*mine, dup, dup] if dup not in mine else [*mine, dup])
        kind = data.draw(st.sampled_from(sorted(cases)), label="kind")
        error, ids = cases[kind]
        form = data.draw(st.sampled_from(("int64", "int32", "list")), label="form")
        arg = _as_arg(ids, form, self.pool.device)
        self._reject(error, lambda: self.pool.free(arg, owner), kind)

    def _bad_free_type(self, data: st.DataObject) -> None:
        owner = self._draw_owner(data)
        assert owner is not None
        own = sorted(self.model.held[owner]) or [self.first_id]
        kind = data.draw(st.sampled_from(BAD_TYPED_KINDS), label="kind")
        arg = _bad_typed_arg(own[:2], kind)
        self._reject(InvalidArgument, lambda: self.pool.free(arg, owner), f"free with {kind} ids")

    def _bad_alloc(self, data: st.DataObject) -> None:
        owner = self._draw_owner(data)
        n = data.draw(st.sampled_from((-1, -3, True, 1.0, "2", None)), label="n")
        self._reject(InvalidArgument, lambda: self.pool.alloc(n, owner), f"alloc({n!r})")


# ====================================================================== TokenToKVPoolAllocator
class TokenAllocatorMachine(IdPoolMachine, FreeGroupRules, BackupRules):
    @initialize(size=st.integers(1, 8))
    def setup(self, size: int) -> None:
        pool = TokenToKVPoolAllocator(size, checks=debug_level(True))
        self._setup(pool, range(1, size + 1), "fifo")

    def _twin_kwargs(self) -> dict[str, Any]:
        return {"size": self.pool.size}


TestTokenAllocator = TokenAllocatorMachine.TestCase


# ====================================================================== ReqToTokenPool
MAX_CONTEXT = 6


class ReqToTokenMachine(IdPoolMachine):
    first_id = 0

    @initialize(size=st.integers(1, 5))
    def setup(self, size: int) -> None:
        pool = ReqToTokenPool(size, MAX_CONTEXT, checks=debug_level(True))
        self._setup(pool, range(size), "fifo")
        self.table = [[0] * MAX_CONTEXT for _ in range(size)]
        self.next_value = 1

    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        held = self.model.held_ids()
        if not held:
            return
        row = data.draw(st.sampled_from(held), label="row")
        start = data.draw(st.integers(0, MAX_CONTEXT), label="start")
        length = data.draw(st.integers(0, MAX_CONTEXT - start), label="length")
        values = list(range(self.next_value, self.next_value + length))
        self.next_value += length
        dtype = data.draw(st.sampled_from((torch.int64, torch.int32)), label="dtype")
        self.pool.write(row, start, torch.tensor(values, dtype=dtype))
        self.table[row][start : start + length] = values
        assert self.pool.read(row, start, start + length).tolist() == values

    def _bad_input_families(self) -> list[Callable[[st.DataObject], None]]:
        return [*super()._bad_input_families(), self._bad_write]

    def _bad_write(self, data: st.DataObject) -> None:
        size = self.pool.size
        free_rows = self.model.free + list(self.model.pending or ())
        held = self.model.held_ids()
        cases: list[tuple[str, int, int, int, type[KVLedgerError]]] = [
            ("row out of range", size, 0, 1, SlotOutOfRange),
            ("negative start", 0, -1, 1, InvalidArgument),
        ]
        if free_rows:
            free_row = data.draw(st.sampled_from(free_rows), label="free row")
            cases.append(("row nobody holds", free_row, 0, 1, InvalidArgument))
        if held:
            row = data.draw(st.sampled_from(held), label="row")
            start = data.draw(st.integers(0, MAX_CONTEXT), label="start")
            cases.append(("past max_context_len", row, start, MAX_CONTEXT - start + 1, InvalidArgument))
        what, row, start, length, error = data.draw(st.sampled_from(cases), label="case")
        values = torch.arange(100, 100 + length, dtype=torch.int64)
        self._reject(error, lambda: self.pool.write(row, start, values), what)

    @invariant()
    def table_matches(self) -> None:
        assert self.pool.req_to_token.tolist() == self.table


TestReqToTokenPool = ReqToTokenMachine.TestCase


# ====================================================================== MambaPool
CONV_SHAPE = (3,)
SSM_SHAPE = (2, 2)


class MambaPoolMachine(IdPoolMachine, FreeGroupRules):
    @initialize(size=st.integers(1, 8), data=st.data())
    def setup(self, size: int, data: st.DataObject) -> None:
        pool = MambaPool(
            size, num_layers=2, conv_state_shape=CONV_SHAPE, temporal_state_shape=SSM_SHAPE, checks=debug_level(True)
        )
        self._setup(pool, range(1, size + 1), "fifo")
        self.value: dict[int, tuple[float, float]] = {}  # slot -> (its conv value, its temporal value)
        self.next_value = 1.0
        for owner in self.owners:  # start busy, so copies between several distinct states are common
            n = data.draw(st.integers(0, len(self.model.free)), label="initial slots")
            got = self._alloc(n, owner)
            assert got == self.model.take(n, owner)

    def _alloc(self, n: int, owner: Owner) -> list[int] | None:
        got = super()._alloc(n, owner)
        for slot in got or ():
            for state in self.pool.states:
                assert bool((state[:, slot] == 0).all()), f"slot {slot} handed out without zeroing its state"
            self._write(slot)  # the new request's prefill: a state no other slot has
        return got

    def _write(self, slot: int) -> None:
        v = self.next_value
        self.next_value += 1.0
        self.pool.conv_state[:, slot] = v
        self.pool.temporal_state[:, slot] = v + 0.25
        self.value[slot] = (v, v + 0.25)

    @rule(data=st.data())
    def write_state(self, data: st.DataObject) -> None:
        """What a forward pass does: write a distinct value into held slots (directly, as a kernel would)."""
        held = self.model.held_ids()
        if not held:
            return
        for slot in data.draw(st.lists(st.sampled_from(held), min_size=1, unique=True), label="slots"):
            self._write(slot)

    @rule(data=st.data())
    def copy_from(self, data: st.DataObject) -> None:
        held = self.model.held_ids()
        if len(held) < 2:
            return
        order = data.draw(st.permutations(held), label="slot order")
        if not data.draw(st.booleans(), label="repeated sources"):  # k distinct sources -> k other slots
            k = len(held) // 2 - data.draw(st.integers(0, len(held) // 2 - 1), label="fewer pairs")
            dst, src = order[:k], order[k : 2 * k]
        else:  # sources may repeat: one state forked into several slots
            k = data.draw(st.integers(1, len(held) - 1), label="pairs")
            dst = order[:k]
            src = data.draw(st.lists(st.sampled_from(order[k:]), min_size=k, max_size=k), label="src")
        self.pool.copy_from(torch.tensor(src), torch.tensor(dst))
        new = {d: self.value[s] for s, d in zip(src, dst, strict=True)}  # gather, then scatter
        event(f"copy_from: {len(dst)} pair(s), {len(set(new.values()))} distinct state(s)")
        self.value.update(new)

    @rule(data=st.data())
    def fork_from(self, data: st.DataObject) -> None:
        held = self.model.held_ids()
        if not held:
            return
        src = data.draw(st.sampled_from(held), label="src")
        owner = self._draw_owner(data)
        assert owner is not None
        form = data.draw(st.sampled_from(("int64", "int")), label="form")
        expected = self.model.free[:1]
        before = snapshot(self.pool) if not expected else None
        got = self.pool.fork_from(_as_arg([src], form, self.pool.device), owner)
        if before is not None:
            event("fork_from refused: pool empty")
            assert got is None
            before.assert_same(snapshot(self.pool), "a refused fork_from")
            return
        assert got is not None and got.tolist() == expected
        self.model.take(1, owner)
        self.value[expected[0]] = self.value[src]

    def _bad_input_families(self) -> list[Callable[[st.DataObject], None]]:
        return [*super()._bad_input_families(), self._bad_copy]

    def _bad_copy(self, data: st.DataObject) -> None:
        held = self.model.held_ids()
        not_held = self.model.free + list(self.model.pending or ())
        cases: list[tuple[str, type[KVLedgerError], Any]] = [
            ("copy_from slot 0", SlotOutOfRange, lambda: self.pool.copy_from(0, held[0] if held else 1)),
            ("fork_from two sources", InvalidArgument, lambda: self.pool.fork_from([1, 2], self.owners[0])),
            (
                "fork_from float index",
                InvalidArgument,
                lambda: self.pool.fork_from(torch.tensor([1.0]), self.owners[0]),
            ),
        ]
        if held and not_held:
            h = data.draw(st.sampled_from(held), label="held")
            f = data.draw(st.sampled_from(not_held), label="not held")
            cases += [
                ("copy_from a free source", InvalidArgument, lambda: self.pool.copy_from(f, h)),
                ("copy_from into a free slot", InvalidArgument, lambda: self.pool.copy_from(h, f)),
            ]
        if not_held:
            g = data.draw(st.sampled_from(not_held), label="not held")
            cases.append(
                ("fork_from a free slot", InvalidArgument, lambda: self.pool.fork_from(g, self.owners[0]))
            )
        if held:
            cases.append(
                ("copy_from a slot onto itself", InvalidArgument, lambda: self.pool.copy_from(held, held))
            )
        if len(held) >= 3:
            cases += [
                (
                    "copy_from length mismatch",
                    InvalidArgument,
                    lambda: self.pool.copy_from(held[:1], held[1:3]),
                ),
                (
                    "copy_from a repeated destination",
                    DuplicateIds,
                    lambda: self.pool.copy_from(held[:2], [held[2], held[2]]),
                ),
            ]
        what, error, call = data.draw(st.sampled_from(cases), label="case")
        self._reject(error, call, what)

    @invariant()
    def states_match(self) -> None:
        for slot in self.model.held_ids():
            conv, temporal = self.value[slot]
            assert bool((self.pool.conv_state[:, slot] == conv).all()), f"conv state of slot {slot} != {conv}"
            assert bool((self.pool.temporal_state[:, slot] == temporal).all()), (
                f"temporal state of slot {slot}"
            )


TestMambaPool = MambaPoolMachine.TestCase


# ====================================================================== PagedTokenToKVPoolAllocator
class PagedAllocatorMachine(FreeGroupRules, BackupRules):
    """Page-level model; each owner is a request with one growing token sequence plus loose pages."""

    page_size = 1

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        p = self.page_size
        num_pages = data.draw(st.integers(1, 5), label="num_pages")
        size = num_pages * p + data.draw(st.integers(0, p - 1), label="ragged tail")  # rounded down to pages
        pool = PagedTokenToKVPoolAllocator(size, p, checks=debug_level(True))
        assert pool.num_pages == num_pages and pool.size == num_pages * p
        self.unit = p
        self._setup(pool, range(1, num_pages + 1), "lifo")
        self.seq: dict[Owner, list[int]] = {o: [] for o in self.owners}

    def _twin_kwargs(self) -> dict[str, Any]:
        return {"size": self.pool.size, "page_size": self.page_size}

    # -------------------------------------------------------------- model helpers
    def _tokens(self, pages: list[int]) -> list[int]:
        p = self.page_size
        return [page * p + off for page in pages for off in range(p)]

    def _after_ids_removed(self) -> None:
        for owner, tokens in self.seq.items():
            if any(t // self.page_size not in self.model.held[owner] for t in tokens):
                self.seq[owner] = []  # the request lost a page of its sequence: it is gone

    def _first_seen_pages(self, tokens: list[int]) -> list[int]:
        pages: list[int] = []
        for t in tokens:
            if t // self.page_size not in pages:
                pages.append(t // self.page_size)
        return pages

    def _distinct_owners(self, data: st.DataObject) -> list[Owner]:
        return data.draw(st.lists(st.sampled_from(self.owners), min_size=1, max_size=NUM_OWNERS, unique=True))

    # -------------------------------------------------------------- rules
    @rule(data=st.data())
    def alloc_pages(self, data: st.DataObject) -> None:
        owner = self._draw_owner(data)
        assert owner is not None
        k = data.draw(st.integers(0, self.pool.num_pages + 1), label="pages")
        expected = self.model.free[:k] if k <= len(self.model.free) else None
        before = snapshot(self.pool) if expected is None else None
        got = self.pool.alloc(k * self.page_size, owner)
        if expected is None:
            assert got is None and before is not None
            before.assert_same(snapshot(self.pool), "a refused alloc")
            return
        assert got is not None and got.tolist() == self._tokens(expected)
        self.model.take(k, owner)

    @rule(data=st.data())
    def alloc_extend(self, data: st.DataObject) -> None:
        p = self.page_size
        owners = self._distinct_owners(data)
        extends = [data.draw(st.integers(0, 2 * p + 1), label="extend") for _ in owners]
        prefix = [len(self.seq[o]) for o in owners]
        last_loc = [self.seq[o][-1] if self.seq[o] else -1 for o in owners]
        plans = []  # (fill, new pages) per request, from the page arithmetic itself
        for pre, ext in zip(prefix, extends, strict=True):
            spare = (-pre) % p
            fill = min(spare, ext)
            plans.append((fill, -(-(ext - fill) // p)))
        refused = sum(new for _, new in plans) > len(self.model.free)
        before = snapshot(self.pool) if refused else None
        got = self.pool.alloc_extend(
            prefix, [a + b for a, b in zip(prefix, extends, strict=True)], last_loc, owners
        )
        if before is not None:
            event("alloc_extend refused: pool short")
            assert got is None
            before.assert_same(snapshot(self.pool), "a refused alloc_extend")
            return
        assert got is not None
        expected: list[int] = []
        for owner, ext, loc, (fill, new) in zip(owners, extends, last_loc, plans, strict=True):
            tokens = list(range(loc + 1, loc + 1 + fill))
            pages = self.model.take(new, owner)
            assert pages is not None
            tokens += self._tokens(pages)[: ext - fill]
            self.seq[owner].extend(tokens)
            expected.extend(tokens)
        if any(fill for fill, _ in plans):
            event("alloc_extend filled a partial page")
        assert got.tolist() == expected

    @rule(data=st.data())
    def alloc_decode(self, data: st.DataObject) -> None:
        p = self.page_size
        owners = self._distinct_owners(data)
        seq_lens = [len(self.seq[o]) + 1 for o in owners]
        last_loc = [self.seq[o][-1] if self.seq[o] else 0 for o in owners]
        opens = [(s - 1) % p == 0 for s in seq_lens]
        before = snapshot(self.pool) if sum(opens) > len(self.model.free) else None
        got = self.pool.alloc_decode(seq_lens, last_loc, owners)
        if before is not None:
            event("alloc_decode refused: pool short")
            assert got is None
            before.assert_same(snapshot(self.pool), "a refused alloc_decode")
            return
        assert got is not None
        expected = []
        for owner, loc, new_page in zip(owners, last_loc, opens, strict=True):
            if new_page:
                pages = self.model.take(1, owner)
                assert pages is not None
                token = pages[0] * p
            else:
                token = loc + 1
            self.seq[owner].append(token)
            expected.append(token)
        assert got.tolist() == expected

    @rule(data=st.data())
    def free_tokens(self, data: st.DataObject) -> None:
        """Free some pages by naming any of their tokens, several tokens of one page included."""
        owner = self._draw_owner(data, holding=True)
        if owner is None:
            return
        p = self.page_size
        pages = data.draw(st.lists(st.sampled_from(sorted(self.model.held[owner])), min_size=1, unique=True))
        tokens = []
        for page in pages:
            offsets = data.draw(st.lists(st.integers(0, p - 1), min_size=1, max_size=p + 1), label="offsets")
            tokens += [page * p + off for off in offsets]
        tokens = data.draw(st.permutations(tokens), label="token order")
        if len(tokens) > len(pages):
            event("free named several tokens of one page")
        form = data.draw(st.sampled_from(("int64", "int32", "list")), label="form")
        self.pool.free(_as_arg(tokens, form, self.pool.device), owner)
        self.model.release(self._first_seen_pages(tokens), owner)
        self._after_ids_removed()

    @precondition(lambda self: any(self.seq.values()))
    @rule(data=st.data())
    def release_request(self, data: st.DataObject) -> None:
        """A request finishes: free its whole sequence (the loose pages stay)."""
        owner = data.draw(st.sampled_from([o for o in self.owners if self.seq[o]]), label="owner")
        tokens = self.seq[owner]
        self.pool.free(torch.tensor(tokens, dtype=torch.int64), owner)
        self.model.release(self._first_seen_pages(tokens), owner)
        self.seq[owner] = []

    def _bad_input_families(self) -> list[Callable[[st.DataObject], None]]:
        return [*super()._bad_input_families(), self._bad_free, self._bad_alloc]

    def _bad_free(self, data: st.DataObject) -> None:
        p = self.page_size
        model = self.model
        owner = self._draw_owner(data)
        assert owner is not None
        own_pages = sorted(model.held[owner])
        mine = [page * p + data.draw(st.integers(0, p - 1)) for page in own_pages[:2]]
        cases: dict[str, tuple[type[KVLedgerError], list[int]]] = {}
        off = data.draw(st.integers(0, p - 1), label="offset")
        not_held = model.free + list(model.pending or ())
        if not_held:
            cases["token of a free page"] = (
                DoubleFree,
                [*mine, data.draw(st.sampled_from(not_held)) * p + off],
            )
        foreign = sorted(i for o, held in model.held.items() if o is not owner for i in held)
        if foreign:
            cases["token of a foreign page"] = (
                ForeignSlot,
                [*mine, data.draw(st.sampled_from(foreign)) * p + off],
            )
        cases["token of page 0"] = (SlotOutOfRange, [*mine, off])
        beyond = (self.pool.num_pages + 1) * p
        cases["token beyond the pool"] = (
            SlotOutOfRange,
            [*mine, data.draw(st.sampled_from((beyond, beyond + p, -1)))],
        )
        kind = data.draw(st.sampled_from(sorted(cases)), label="kind")
        error, tokens = cases[kind]
        self._reject(error, lambda: self.pool.free(torch.tensor(tokens), owner), kind)
        kind = data.draw(st.sampled_from(BAD_TYPED_KINDS), label="bad type")
        arg = _bad_typed_arg(mine or [p], kind)
        self._reject(InvalidArgument, lambda: self.pool.free(arg, owner), f"free with {kind} tokens")

    def _bad_alloc(self, data: st.DataObject) -> None:
        p = self.page_size
        owner = self._draw_owner(data)
        assert owner is not None
        cases: list[tuple[str, Any]] = [
            ("alloc(-p)", lambda: self.pool.alloc(-p, owner)),
            ("alloc(1.0)", lambda: self.pool.alloc(1.0, owner)),
            ("alloc_extend lengths differ", lambda: self.pool.alloc_extend([0], [1, 2], [-1], [owner])),
            ("alloc_extend prefix > seq", lambda: self.pool.alloc_extend([3], [2], [-1], [owner])),
            ("alloc_extend negative", lambda: self.pool.alloc_extend([0], [-1], [-1], [owner])),
            ("alloc_decode seq_len 0", lambda: self.pool.alloc_decode([0], [0], [owner])),
            ("alloc_decode lengths differ", lambda: self.pool.alloc_decode([1], [0, 0], [owner])),
        ]
        if p > 1:
            cases.append(("alloc(not a page multiple)", lambda: self.pool.alloc(p + 1, owner)))
        what, call = data.draw(st.sampled_from(cases), label="case")
        self._reject(InvalidArgument, call, what)

    @precondition(lambda self: self.page_size > 1 and any(len(s) % self.page_size for s in self.seq.values()))
    @rule(data=st.data())
    def invalid_partial_page(self, data: st.DataObject) -> None:
        """A request with a partial last page, extended or decoded with a wrong ``last_loc``.

        The batch may start with a valid request: the bad one must still leave everything unchanged.
        """
        p = self.page_size
        owner = data.draw(st.sampled_from([o for o in self.owners if len(self.seq[o]) % p]), label="owner")
        n = len(self.seq[owner])
        loc = self.seq[owner][-1]
        cases: list[tuple[str, type[KVLedgerError], int]] = [
            ("last_loc off by one", InvalidArgument, loc + 1),  # still in the partial page, wrong offset
        ]
        free_pages = self.model.free + list(self.model.pending or ())
        if free_pages:
            cases.append(
                (
                    "last_loc in a free page",
                    InvalidArgument,
                    data.draw(st.sampled_from(free_pages)) * p + loc % p,
                )
            )
        foreign = sorted(i for o, held in self.model.held.items() if o is not owner for i in held)
        if foreign:
            cases.append(
                ("last_loc in a foreign page", ForeignSlot, data.draw(st.sampled_from(foreign)) * p + loc % p)
            )
        what, error, bad_loc = data.draw(st.sampled_from(cases), label="case")
        others = [o for o in self.owners if o is not owner]
        lead = others[:1] if data.draw(st.booleans(), label="valid request first") else []
        lead_len = [len(self.seq[o]) for o in lead]
        lead_loc = [self.seq[o][-1] if self.seq[o] else -1 for o in lead]
        if data.draw(st.booleans(), label="decode"):
            self._reject(
                error,
                lambda: self.pool.alloc_decode(
                    [*(x + 1 for x in lead_len), n + 1],
                    [*(x if x >= 0 else 0 for x in lead_loc), bad_loc],
                    [*lead, owner],
                ),
                "alloc_decode: " + what,
            )
        else:
            self._reject(
                error,
                lambda: self.pool.alloc_extend(
                    [*lead_len, n], [*(x + p for x in lead_len), n + 1], [*lead_loc, bad_loc], [*lead, owner]
                ),
                "alloc_extend: " + what,
            )

    @invariant()
    def sequences_are_owned(self) -> None:
        """Model sanity (the ledger is compared with ``model.held`` elsewhere): a sequence owns its pages."""
        for owner, tokens in self.seq.items():
            assert {t // self.page_size for t in tokens} <= self.model.held[owner]


class PagedAllocatorPage1Machine(PagedAllocatorMachine):
    page_size = 1


class PagedAllocatorPage3Machine(PagedAllocatorMachine):
    page_size = 3


class PagedAllocatorPage4Machine(PagedAllocatorMachine):
    page_size = 4


TestPagedAllocatorPage1 = PagedAllocatorPage1Machine.TestCase
TestPagedAllocatorPage3 = PagedAllocatorPage3Machine.TestCase
TestPagedAllocatorPage4 = PagedAllocatorPage4Machine.TestCase
