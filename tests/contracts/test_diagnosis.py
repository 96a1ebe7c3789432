"""``kvledger.contracts.diagnosis``: disputes between a census of the bookkeeping and a ledger, id by id."""

from __future__ import annotations

from kvledger.contracts.diagnosis import Census, diagnose, find_disputes, free_list_report
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.null_ledger import NullLedger
from kvledger.contracts.owners import FREE_LIST, REQ_RUNNING, Owner


def _setup() -> tuple[Ledger, Owner, Owner]:
    ledger = Ledger("kv", range(1, 9))
    a, b = Owner("req", 1, REQ_RUNNING), Owner("req", 2, REQ_RUNNING)
    ledger.transfer([1, 2], FREE_LIST, a, "alloc")
    ledger.transfer([3], FREE_LIST, b, "alloc")
    return ledger, a, b


def _census(free: list[int], claims: dict[Owner, list[int]]) -> Census:
    c = Census("kv")
    c.claim(free, FREE_LIST)
    for owner, ids in claims.items():
        c.claim(ids, owner)
    return c


def test_agreeing_views_have_no_dispute() -> None:
    ledger, a, b = _setup()
    census = _census([4, 5, 6, 7, 8], {a: [1, 2], b: [3]})
    assert find_disputes(census, ledger.domain, ledger) == []
    assert "no id in dispute" in diagnose(census, ledger.domain, ledger)


def test_each_kind_of_dispute_is_found_and_named() -> None:
    ledger, a, b = _setup()
    # 2: a forgot it (leak); 3: a claims b's id; 5: free, but b claims it too (counted twice)
    census = _census([4, 5, 6, 7, 8], {a: [1, 3], b: [3, 5]})
    disputes = {d.slot: d for d in find_disputes(census, ledger.domain, ledger)}
    assert sorted(disputes) == [2, 3, 5]
    assert disputes[2].kind == "leaked" and disputes[2].ledger_owner is a
    assert disputes[3].kind == "claimed twice" and disputes[3].claimed == (a, b)
    assert disputes[5].kind == "claimed twice" and disputes[5].ledger_owner is FREE_LIST
    report = diagnose(census, ledger.domain, ledger, describe_owner=lambda o: f"about {o.name}")
    assert "leaked [2] (1): ledger owner req#1[req.running]; the bookkeeping says no holder" in report
    assert "claimed twice [3] (1): ledger owner req#2[req.running]; the bookkeeping says held by" in report
    assert "    req#1: about req#1" in report and "    req#2: about req#2" in report
    assert "step 0: alloc: free_list[free] -> req#1[req.running]" in report


def test_without_a_ledger_the_census_alone_names_unclaimed_and_doubly_claimed_ids() -> None:
    ledger = NullLedger("kv", range(1, 9))
    a = Owner("req", 1, REQ_RUNNING)
    census = _census([4, 5, 6, 7, 8], {a: [1, 3, 4]})  # 2 unclaimed, 4 claimed twice
    disputes = find_disputes(census, ledger.domain, ledger)
    assert [(d.slot, d.kind) for d in disputes] == [(2, "leaked"), (4, "claimed twice")]
    report = diagnose(census, ledger.domain, ledger)
    assert "no ledger: contracts off" in report and "leaked [2] (1): the bookkeeping says no holder" in report


def test_an_incomplete_census_does_not_accuse_free_ids() -> None:
    ledger, a, _b = _setup()
    census = Census("kv", complete=False)  # the free list could not be read
    census.claim([1, 2], a)
    assert find_disputes(census, ledger.domain, ledger) == [
        d for d in find_disputes(census, ledger.domain, ledger) if d.slot == 3
    ]
    assert [d.slot for d in find_disputes(census, ledger.domain, ledger)] == [3]


def test_free_list_report_names_both_directions() -> None:
    ledger, _a, _ = _setup()
    report = free_list_report(ledger, [1, 4, 5, 6, 7], [])  # 1 is a's; 8 is missing
    assert "listed as free but owned by someone [1], free in the ledger but not listed [8]" in report
    assert (
        "slot 1: owner req#1[req.running]; the bookkeeping says the pool lists it as free_list[free]"
        in report
    )
