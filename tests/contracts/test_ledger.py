"""Unit tests of the ownership ledger: transfers, retags across ledgers, history, audit, NullLedger.

The ledger is the executable I-PARTITION of one pool: every id of the domain has exactly one owner,
holdings are disjoint and cover the domain, account counts sum to the size (I-COUNT). Transfers check
before they change anything; a wrong one is a ContractViolation that names the id, its real owner and
its recent moves.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvledger.contracts.errors import ContractViolation, ForeignSlot, KVLedgerError
from kvledger.contracts.ledger import Ledger, as_id_list
from kvledger.contracts.ledger_by_level import make_ledger
from kvledger.contracts.null_ledger import NullLedger
from kvledger.contracts.owners import (
    CACHE_EVICTABLE,
    CACHE_PROTECTED,
    FREE,
    FREE_LIST,
    PENDING_FREE,
    REQ_RUNNING,
    REQ_WAITING,
    Account,
    Owner,
)
from tests.levels import debug_level


def state(ledger: Ledger) -> tuple[object, ...]:
    """Everything a refused transfer must leave alone."""
    holdings = sorted((o.name, tuple(sorted(ledger.holdings(o)))) for o in ledger.owners())
    return (tuple(ledger.owner_table()), tuple(holdings), tuple(sorted(ledger.account_sizes().items())), ledger.step)


def req(key: int, account: Account = REQ_RUNNING) -> Owner:
    return Owner("req", key, account)


# ---------------------------------------------------------------------- construction and queries
@pytest.mark.parametrize("domain", [range(0), range(3, 3), range(1, 9, 2), range(-1, 4)])
def test_bad_domain_is_refused(domain: range) -> None:
    with pytest.raises(ValueError, match="non-empty contiguous range"):
        Ledger("t", domain)


def test_fresh_ledger_is_all_free() -> None:
    ledger = Ledger("kv", range(1, 9))
    assert ledger.size == 8
    assert ledger.account_sizes() == {"free": 8}
    assert ledger.holdings(FREE_LIST) == frozenset(range(1, 9))
    assert ledger.owners() == [FREE_LIST]
    assert ledger.owner_of(0) is None  # reserved padding id
    assert ledger.owner_of(9) is None and ledger.owner_of(-1) is None and ledger.owner_of(10**9) is None
    assert all(ledger.owner_of(i) is FREE_LIST for i in range(1, 9))
    assert ledger.history_of(3) == []
    ledger.audit(range(1, 9))


@pytest.mark.parametrize(
    ("ids", "expected"),
    [(5, [5]), ([3, 1], [3, 1]), ((2,), [2]), (torch.tensor([4, 2]), [4, 2]), (torch.tensor(7), [7])],
)
def test_as_id_list(ids: object, expected: list[int]) -> None:
    assert as_id_list(ids) == expected


# ---------------------------------------------------------------------- transfers
def test_transfer_moves_ids_and_counts() -> None:
    ledger = Ledger("kv", range(1, 9))
    a, b = req(1), req(2, REQ_WAITING)
    ledger.transfer(torch.tensor([1, 2, 3]), FREE_LIST, a, "alloc")
    ledger.transfer([4], FREE_LIST, b, "alloc")
    ledger.transfer(2, a, b, "handover")
    assert ledger.holdings(a) == {1, 3} and ledger.held_count(a) == 2
    assert ledger.holdings(b) == {2, 4}
    assert ledger.owner_of(2) is b
    assert ledger.count(REQ_RUNNING) == 2 and ledger.count(REQ_WAITING) == 2 and ledger.count(FREE) == 4
    assert ledger.account_sizes() == {"free": 4, "req.running": 2, "req.waiting": 2}
    assert set(ledger.owners()) == {FREE_LIST, a, b}
    assert ledger.step == 3
    ledger.transfer([1, 3], a, FREE_LIST, "free")
    assert a not in ledger.owners() and ledger.holdings(a) == frozenset()
    ledger.audit([5, 6, 7, 8, 1, 3])


def test_empty_transfer_is_a_no_op() -> None:
    ledger = Ledger("kv", range(1, 5))
    ledger.transfer([], req(1), req(2), "nothing")
    ledger.transfer(torch.empty(0, dtype=torch.int64), FREE_LIST, req(1), "nothing")
    assert ledger.step == 0 and ledger.account_sizes() == {"free": 4}


@pytest.mark.parametrize(
    ("ids", "why"),
    [
        ([2], "held by someone else"),
        ([1, 5], "one of them is free"),
        ([0], "reserved id"),
        ([9], "past the domain"),
        ([10**6], "far past the domain"),
        ([-1], "negative: must not alias the last id"),
        ([-8], "negative: must not alias the first id"),
        ([1, 1], "repeated"),
    ],
)
def test_wrong_transfer_is_a_violation_and_changes_nothing(ids: list[int], why: str) -> None:
    ledger = Ledger("kv", range(1, 9))
    a, b = req(1), req(2)
    ledger.transfer([1, 3], FREE_LIST, a, "alloc")
    ledger.transfer([2, 8], FREE_LIST, b, "alloc")
    before = state(ledger)
    with pytest.raises(ContractViolation) as info:
        ledger.transfer(ids, a, FREE_LIST, "free")
    assert not isinstance(info.value, KVLedgerError)
    assert info.value.args[0].startswith("[kv] free: "), why
    assert state(ledger) == before, why
    ledger.audit(range(4, 8))


@pytest.mark.fires("I-EXCLUSIVE")
def test_violation_message_names_owner_and_history() -> None:
    ledger = Ledger("kv", range(1, 9))
    holder, culprit = req(7), req(8)
    ledger.transfer([5, 6], FREE_LIST, holder, "alloc")
    holder.set_account(REQ_WAITING, "retract")
    with pytest.raises(ContractViolation) as info:
        ledger.transfer([6], culprit, FREE_LIST, "free")
    lines = str(info.value).splitlines()
    assert "req#8[req.running]" in lines[0] and "[6]" in lines[0]
    assert lines[1].strip() == "slot 6: owner req#7[req.waiting]"
    assert re.fullmatch(r"\s+step 0: alloc: free_list\[free\] -> req#7\[req\.running\]", lines[2])
    assert re.fullmatch(r"\s+step 1: retract: req#7 req\.running -> req\.waiting", lines[3])
    assert len(lines) == 4


@pytest.mark.fires("I-EXCLUSIVE")
def test_require_held_by_is_a_typed_error() -> None:
    ledger = Ledger("rows", range(0, 4))
    a, b = req(1), req(2)
    ledger.transfer([0, 1], FREE_LIST, a, "alloc")
    ledger.require_held_by([0, 1], a, "free")  # fine
    before = state(ledger)
    with pytest.raises(ForeignSlot, match=r"\[rows\] free: ids not held by req#2\[req\.running\]: \[0\]"):
        ledger.require_held_by(torch.tensor([0]), b, "free")
    with pytest.raises(ForeignSlot):
        ledger.require_held_by([3], a, "free")  # free, not a's
    assert state(ledger) == before


# ---------------------------------------------------------------------- retags
def test_retag_moves_counts_in_every_ledger_the_owner_holds_in() -> None:
    kv, mamba, rows = Ledger("kv", range(1, 17)), Ledger("mamba", range(1, 5)), Ledger("rows", range(4))
    r = req(3)
    kv.transfer([1, 2, 3], FREE_LIST, r, "alloc")
    mamba.transfer([4], FREE_LIST, r, "alloc")
    rows.transfer([0], FREE_LIST, r, "alloc")
    untouched = Ledger("untouched", range(1, 3))  # r never held anything here
    r.set_account(REQ_WAITING, "retract")
    assert kv.account_sizes() == {"free": 13, "req.waiting": 3}
    assert mamba.account_sizes() == {"free": 3, "req.waiting": 1}
    assert rows.account_sizes() == {"free": 3, "req.waiting": 1}
    assert untouched.step == 0
    for ledger in (kv, mamba, rows):
        assert ledger._log[-1].op == "retract" and ledger._log[-1].ids is None
    r.set_account(REQ_WAITING, "again")  # same account: nothing happens
    assert kv._log[-1].op == "retract" and kv.step == 2  # one alloc, one retag


def test_retag_of_an_owner_that_emptied_its_holdings() -> None:
    ledger = Ledger("kv", range(1, 5))
    r = req(1)
    ledger.transfer([1], FREE_LIST, r, "alloc")
    ledger.transfer([1], r, FREE_LIST, "free")
    r.set_account(CACHE_PROTECTED, "lock")
    assert ledger.account_sizes() == {"free": 4}
    assert ledger.count(CACHE_PROTECTED) == 0
    ledger.audit(range(1, 5))


def test_cache_node_lock_and_unlock_are_retags() -> None:
    ledger = Ledger("kv", range(1, 9))
    node = Owner("node", 4, CACHE_EVICTABLE)
    ledger.transfer([1, 2, 3, 4], FREE_LIST, node, "insert")
    node.set_account(CACHE_PROTECTED, "lock")
    assert ledger.count(CACHE_PROTECTED) == 4 and ledger.count(CACHE_EVICTABLE) == 0
    node.set_account(CACHE_EVICTABLE, "unlock")
    assert ledger.count(CACHE_PROTECTED) == 0 and ledger.count(CACHE_EVICTABLE) == 4


# ---------------------------------------------------------------------- history
def test_history_follows_the_slot_through_its_holders() -> None:
    ledger = Ledger("kv", range(1, 9))
    a, b, c = req(1), Owner("node", 2, CACHE_EVICTABLE), req(3)
    ledger.transfer([3, 4], FREE_LIST, a, "alloc")  # 3 -> a
    ledger.transfer([5], FREE_LIST, c, "alloc")  # unrelated slot
    a.set_account(REQ_WAITING, "retract")  # a holds 3
    ledger.transfer([3], a, b, "insert")  # 3 -> b
    a.set_account(REQ_RUNNING, "admit")  # a no longer holds 3: not in 3's history
    c.set_account(REQ_WAITING, "retract")  # never held 3
    b.set_account(CACHE_PROTECTED, "lock")  # b holds 3
    ledger.transfer([3], b, FREE_LIST, "evict")
    ops = [m.op for m in ledger.history_of(3, limit=10)]
    assert ops == ["alloc", "retract", "insert", "lock", "evict"]
    assert [m.op for m in ledger.history_of(3, limit=2)] == ["lock", "evict"]
    assert [m.op for m in ledger.history_of(4, limit=10)] == ["alloc", "retract", "admit"]
    assert [m.op for m in ledger.history_of(5, limit=10)] == ["alloc", "retract"]


def test_history_is_a_bounded_window() -> None:
    ledger = Ledger("kv", range(1, 9), history=3)
    a = req(1)
    ledger.transfer([1], FREE_LIST, a, "alloc")
    for i in range(2, 6):
        ledger.transfer([i], FREE_LIST, req(i), "alloc")
    assert ledger.history_of(1) == []  # its alloc fell out of the window
    report = ledger.describe([1], "headline")
    assert report.splitlines() == [
        "[kv] headline",
        "  slot 1: owner req#1[req.running]",
        "    (no recorded moves: held since construction or older than the log)",
    ]


def test_describe_reports_at_most_eight_slots() -> None:
    ledger = Ledger("kv", range(1, 21))
    report = ledger.describe(range(1, 21), "many")
    assert sum(1 for line in report.splitlines() if line.startswith("  slot ")) == 8


# ---------------------------------------------------------------------- audit
def _busy() -> tuple[Ledger, Owner]:
    ledger = Ledger("kv", range(1, 7))
    a = req(1)
    ledger.transfer([1, 2], FREE_LIST, a, "alloc")
    ledger.transfer([3], FREE_LIST, ledger.pending_owner, "free(group)")  # as if freed inside a group
    return ledger, a


def test_audit_passes_on_a_consistent_pool() -> None:
    ledger, _ = _busy()
    ledger.audit([4, 5, 6], pending_ids=[3])
    ledger.audit([6, 5, 4], pending_ids=[3])  # order does not matter to the ledger


@pytest.mark.parametrize(
    ("free", "pending", "pattern"),
    [
        ([4, 5, 6, 6], [3], r"free list holds ids twice \(I-NODUP-FREE\): \[6\]"),
        ([4, 5], [3], r"in ledger but not in pool \[6\]"),  # a leak: the pool lost a free id
        ([4, 5, 6, 1], [3], r"in pool but not in ledger \[1\]"),  # a held id on the free list
        ([4, 5, 6], [], r"free group disagrees"),
        ([4, 5, 6], [3, 2], r"free group disagrees.*in pool but not in ledger \[2\]"),
    ],
)
def test_audit_detects_a_corrupted_free_list(free: list[int], pending: list[int], pattern: str) -> None:
    ledger, _ = _busy()
    with pytest.raises(ContractViolation, match=pattern):
        ledger.audit(free, pending_ids=pending)


def test_audit_detects_owner_table_and_holdings_disagreeing() -> None:
    ledger, a = _busy()
    ledger._own[4] = ledger._codes[a]  # the table says a, a's held count still says 2
    with pytest.raises(
        ContractViolation,
        match=r"owner table and holdings disagree for req#1\[req\.running\]: the table gives it ids \[1, 2, 4\]",
    ) as info:
        ledger.audit([4, 5, 6], pending_ids=[3])
    assert "slot 4: owner req#1[req.running]" in str(info.value)


@pytest.mark.fires("I-PARTITION")
def test_audit_detects_holdings_beyond_the_domain() -> None:
    ledger, a = _busy()
    ledger._held[ledger._codes[a]] += 1  # a count that covers more ids than the domain has
    with pytest.raises(ContractViolation, match="holdings cover 7 ids, domain has 6"):
        ledger.audit([4, 5, 6], pending_ids=[3])


def test_audit_detects_an_owned_reserved_id() -> None:
    ledger, a = _busy()
    ledger._own[0] = ledger._codes[a]
    with pytest.raises(ContractViolation, match="reserved id 0 has an owner"):
        ledger.audit([4, 5, 6], pending_ids=[3])


def test_audit_detects_miscounted_accounts() -> None:
    ledger, _ = _busy()
    ledger._count[FREE] -= 1  # the sum stays right (the class invariant passes), the split does not
    ledger._count[REQ_WAITING] += 1
    with pytest.raises(ContractViolation, match="account counts"):
        ledger.audit([4, 5, 6], pending_ids=[3])


# ---------------------------------------------------------------------- a random walk keeps I-PARTITION
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(1, 8), st.booleans()), max_size=40)
)
def test_random_transfers_keep_the_partition(moves: list[tuple[int, int, int, bool]]) -> None:
    """Right transfers are applied, wrong ones refused; a plain dict model agrees after every move."""
    ledger = Ledger("kv", range(1, 9))
    owners = [FREE_LIST, req(1), req(2, REQ_WAITING), Owner("node", 3, CACHE_EVICTABLE)]
    model = dict.fromkeys(range(1, 9), 0)  # id -> index into owners
    for src, dst, slot, retag in moves:
        if retag and src:
            owners[src].set_account(owners[dst].account if dst else REQ_RUNNING, "retag")
            continue
        if model[slot] == src:
            ledger.transfer([slot], owners[src], owners[dst], "move")
            model[slot] = dst
        else:
            with pytest.raises(ContractViolation):
                ledger.transfer([slot], owners[src], owners[dst], "move")
        for i, o in enumerate(owners):
            assert ledger.holdings(o) == {s for s, h in model.items() if h == i}
        counts = Counter(owners[h].account.name for h in model.values())
        assert ledger.account_sizes() == dict(counts)
    ledger.audit([s for s, h in model.items() if h == 0])


# ---------------------------------------------------------------------- NullLedger and make_ledger
def test_null_ledger_is_a_no_op() -> None:
    null = NullLedger("kv", range(1, 5))
    assert null.enabled is False and Ledger.enabled is True
    assert null.size == 4 and null.pending_owner.account is PENDING_FREE
    a = req(1)
    null.transfer([1, 1, -5, 99], a, FREE_LIST, "anything")  # nothing is checked, nothing recorded
    null.require_held_by([3], a, "free")
    null.audit([1, 1, 1], pending_ids=[7])
    assert null.owner_of(1) is None
    assert a._ledgers == []  # the owner was never attached to anything
    assert repr(null) == "NullLedger(kv)"


@pytest.mark.parametrize("enabled", [True, False])
def test_make_ledger_follows_the_level_it_is_handed(enabled: bool) -> None:
    ledger = make_ledger("kv", range(1, 5), unit=4, level=debug_level(enabled))
    assert isinstance(ledger, Ledger if enabled else NullLedger)
    assert ledger.unit == 4 and ledger.size == 4


# ---------------------------------------------------------------------- batched hand-out (a decode step)
def test_transfer_each_hands_one_id_to_each_owner_and_keeps_their_history() -> None:
    ledger = Ledger("kv", range(1, 9))
    a, b, c = req(1), req(2, REQ_WAITING), req(3)
    ledger.transfer_each([4, 2, 7], FREE_LIST, [a, b, c], "alloc_decode")
    assert ledger.owner_of(4) is a and ledger.owner_of(2) is b and ledger.owner_of(7) is c
    assert ledger.account_sizes() == {"free": 5, "req.running": 2, "req.waiting": 1}
    assert ledger.step == 3
    b.set_account(REQ_RUNNING, "admit")
    moves = ledger.history_of(2, limit=10)
    assert [m.describe() for m in moves] == [
        "step 1: alloc_decode: free_list[free] -> req#2[req.waiting]",
        "step 3: admit: req#2 req.waiting -> req.running",
    ]
    only = [m.describe() for m in ledger.history_of(7)]
    assert only == ["step 2: alloc_decode: free_list[free] -> req#3[req.running]"]
    ledger.audit([1, 3, 5, 6, 8])


@pytest.mark.parametrize(
    ("ids", "why"),
    [([4, 4], "repeated"), ([4, 9], "past the domain"), ([4], "one id for two owners")],
)
def test_wrong_transfer_each_is_a_violation_and_changes_nothing(ids: list[int], why: str) -> None:
    ledger = Ledger("kv", range(1, 9))
    ledger.transfer([3], FREE_LIST, req(9), "alloc")
    before = state(ledger)
    with pytest.raises(ContractViolation):
        ledger.transfer_each(ids, FREE_LIST, [req(1), req(2)], "alloc_decode")
    assert state(ledger) == before, why
