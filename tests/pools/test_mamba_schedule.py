"""``MambaPool``'s scheduled data plane: zeroing and copies are applied in batches, invisibly to readers.

Each test states one rule of spec/mamba-cache-vs-sglang.md §4; the state machine at the end compares the
pool with a plain dict of slot contents over random sequences that read the states only now and then,
so schedules of many writes build up between reads.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger import kernels
from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.contracts.switch import ENABLED
from kvledger.reference.pools import MambaPool
from kvledger.reference.pools.write_schedule import ZERO, WriteSchedule
from tests.levels import debug_level

needs_contracts = pytest.mark.skipif(not ENABLED, reason="needs KVLEDGER_CONTRACTS=1")
# Poisoning a freed slot is the debug build's (the level full); a process below full cannot build at full.
needs_full = pytest.mark.skipif(switch.LEVEL < CheckLevel.FULL, reason="poison on free: the level full only")
OWNER = Owner("req", 1, REQ_RUNNING)


def make_pool(size: int = 8, *, ledger: bool = True) -> MambaPool:
    return MambaPool(size, num_layers=2, conv_state_shape=(3,), temporal_state_shape=(2, 2), checks=debug_level(ledger))


def take(pool: MambaPool, n: int) -> torch.Tensor:
    got = pool.alloc(n, OWNER)
    assert got is not None, "test pool too small"
    return got


def write(pool: MambaPool, slot: int, value: float) -> None:
    for state in pool.states:
        state[:, slot] = value


def value_of(pool: MambaPool, slot: int) -> float:
    values = {float(v) for s in pool.states for v in s[:, slot].reshape(-1).tolist()}
    assert len(values) == 1, f"slot {slot} holds a mixed state {values}"
    return values.pop()


def test_write_schedule_bookkeeping() -> None:
    """The pure part: replacement, resolution through a scheduled write, drop, and the one rule."""
    w = WriteSchedule()
    w.add(5, ZERO)
    w.add(6, 1)  # 6 <- 1
    w.add(5, 1)  # replaces 5's zeroing
    w.add(7, 6)  # 6 holds 1 once applied: recorded as 7 <- 1
    w.add(8, ZERO)
    w.add(9, 8)  # 8 will be zero: 9 is a zeroing too
    assert (w.write_to(5), w.write_to(7), w.write_to(9)) == (1, 1, ZERO)
    assert w.reads(1) and not w.reads(6) and w.inconsistency() is None
    with pytest.raises(ValueError, match="read by a scheduled copy"):
        w.add(1, ZERO)
    w.drop(5)
    w.drop(6)
    assert w.reads(1) and w.inconsistency() is None  # 7 still reads it
    assert w.take() == ([8, 9], [1], [7])
    assert not w and not w.reads(1)


@needs_full
def test_alloc_schedules_the_zeroing_and_a_read_applies_it() -> None:
    pool = make_pool()
    slot = int(take(pool, 1))
    write(pool, slot, 3.0)
    pool.free(torch.tensor([slot]), OWNER)
    again = take(pool, pool.available_size())  # FIFO: the dirty slot comes back last
    assert again is not None and int(again[-1]) == slot
    assert pool.scheduled_writes() == again.numel()
    assert pool._conv[:, slot].isnan().all(), "the bytes have not moved yet (poisoned when freed)"
    assert value_of(pool, slot) == 0.0  # reading applied the batch
    assert pool.scheduled_writes() == 0


def test_a_copy_reads_its_source_as_it_was_even_if_the_source_is_released_first() -> None:
    pool = make_pool()
    src, dst = take(pool, 2).tolist()
    write(pool, src, 5.0)
    pool.copy_from(src, dst)
    assert pool.scheduled_writes() == 1
    pool.free(torch.tensor([src]), OWNER)  # releasing a slot a scheduled copy reads applies the batch first
    assert pool.scheduled_writes() == 0
    assert value_of(pool, dst) == 5.0
    pool.audit()


def test_a_copy_of_a_slot_with_a_scheduled_write_copies_what_that_write_puts_there() -> None:
    pool = make_pool()
    donor = int(take(pool, 1))
    write(pool, donor, 7.0)
    cow = take(pool, 1)  # zeroing scheduled
    pool.copy_from(donor, cow)  # replaces it: cow will hold donor's state
    fork = pool.fork_from(cow, OWNER)  # reads cow before its copy ran: scheduled from donor, no batch
    assert fork is not None and pool.scheduled_writes() == 2
    fresh = take(pool, 1)
    twin = pool.fork_from(fresh, OWNER)  # a fork of a slot whose zeroing is scheduled is a zeroing
    assert twin is not None and pool.scheduled_writes() == 4
    pool.audit()
    assert [value_of(pool, int(s)) for s in (cow, fork, fresh, twin)] == [7.0, 7.0, 0.0, 0.0]


def test_overwriting_a_slot_a_scheduled_copy_reads_applies_the_copy_first() -> None:
    pool = make_pool()
    a, b, c = take(pool, 3).tolist()
    write(pool, a, 1.0)
    write(pool, c, 3.0)
    pool.copy_from(a, b)
    pool.copy_from(c, a)  # a is read by the scheduled a -> b: that copy runs first
    assert [value_of(pool, s) for s in (a, b, c)] == [3.0, 1.0, 3.0]


@needs_full
def test_releasing_a_slot_drops_its_scheduled_write_and_poisons_it() -> None:
    pool = make_pool()
    slot = take(pool, 1)
    assert pool.scheduled_writes() == 1
    pool.free(slot, OWNER)
    assert pool.scheduled_writes() == 0
    assert bool(pool.poisoned(slot).all())
    pool.audit()


def test_the_schedule_is_bounded() -> None:
    pool = make_pool(size=3 * MambaPool.FLUSH_AT)
    for _ in range(3 * MambaPool.FLUSH_AT):
        pool.alloc(1, OWNER)
        assert pool.scheduled_writes() < MambaPool.FLUSH_AT
    assert pool.available_size() == 0


@needs_contracts
@pytest.mark.fires("I-NO-POISON-READ")
def test_a_batch_that_would_read_poison_is_a_contract_violation() -> None:
    pool = make_pool()
    src, dst = take(pool, 2).tolist()
    write(pool, src, 2.0)
    pool.copy_from(src, dst)
    for state in (pool._conv, pool._temporal):  # corrupt the source behind the pool's back
        kernels.poison_slots(state, torch.tensor([src]))
    with pytest.raises(ContractViolation, match="I-NO-POISON-READ"):
        pool.flush()


@pytest.mark.fires("I-WRITE-SCHEDULE")
def test_audit_catches_a_scheduled_write_into_a_free_slot() -> None:
    pool = make_pool()
    slot = int(take(pool, 1))
    pool.free(torch.tensor([slot]), OWNER)
    pool._writes._writes[slot] = ZERO  # a zeroing left behind for a released slot
    with pytest.raises(ContractViolation, match=r"I-WRITE-SCHEDULE: .* free slots"):
        pool.audit()


class ScheduleMachine(RuleBasedStateMachine):
    """The pool against a dict of slot contents; reads (which apply the schedule) are one rule of many."""

    @initialize(size=st.integers(2, 6), ledger=st.booleans())
    def setup(self, size: int, ledger: bool) -> None:
        self.pool = make_pool(size, ledger=ledger)
        self.value: dict[int, float] = {}  # held slot -> what it must read
        self.next_value = 1.0

    @rule(n=st.integers(1, 3))
    def alloc(self, n: int) -> None:
        available = self.pool.available_size()
        got = self.pool.alloc(n, OWNER)
        assert (got is None) == (n > available)
        for slot in [] if got is None else got.tolist():
            self.value[slot] = 0.0

    @precondition(lambda self: self.value)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(sorted(self.value)))
        self.pool.free(torch.tensor([slot]), OWNER)
        del self.value[slot]

    @precondition(lambda self: len(self.value) >= 2)
    @rule(data=st.data())
    def copy(self, data: st.DataObject) -> None:
        src, dst = data.draw(st.permutations(sorted(self.value)))[:2]
        self.pool.copy_from(src, dst)
        self.value[dst] = self.value[src]

    @precondition(lambda self: self.value)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        src = data.draw(st.sampled_from(sorted(self.value)))
        got = self.pool.fork_from(src, OWNER)
        if got is not None:
            self.value[int(got)] = self.value[src]

    @precondition(lambda self: self.value)
    @rule(data=st.data())
    def write_one(self, data: st.DataObject) -> None:
        """A forward pass writes a request's working slot (reading the states applies the schedule)."""
        slot = data.draw(st.sampled_from(sorted(self.value)))
        write(self.pool, slot, self.next_value)
        self.value[slot] = self.next_value
        self.next_value += 1.0

    @rule()
    def read_all(self) -> None:
        for slot, expected in self.value.items():
            assert value_of(self.pool, slot) == expected, f"slot {slot}"
        assert self.pool.scheduled_writes() == 0

    @invariant()
    def audit(self) -> None:
        if hasattr(self, "pool"):
            self.pool.audit()
            assert self.pool.scheduled_writes() < MambaPool.FLUSH_AT

    def teardown(self) -> None:
        if hasattr(self, "pool"):
            self.read_all()


TestScheduleMachine = ScheduleMachine.TestCase
