"""Every identity failure names its culprit: the ids, their ledger owner, the bookkeeping's claim, the moves.

Leaks are injected from outside the reference code (``tests/leaks.py``: a scoped patch of the finish
path), one test per pool: request rows, Mamba slots, KV token slots (page 1) and KV pages (page 4). The
count identity (I-COUNT) is the first check to fail; its message must name the request that leaked, the
ids it still holds in the ledger, and their history, not only the count.
"""

from __future__ import annotations

import re

import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, IdentityFailure
from kvledger.contracts.owners import REQ_WAITING, Owner
from tests.leaks import leaking
from tests.scheduler.harness import Setup, build, ledgers

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")

# pool under test -> (the leak injected, the engine, the pool attribute)
CASES = {
    "rows": ("row", Setup(tree="none", hybrid=False, kv_tokens=256, rows=3), "req_to_token_pool"),
    "mamba": (
        "mamba",
        Setup(tree="mamba_radix", kv_tokens=256, rows=3, mamba_slots=6, mamba_strategy="no_buffer"),
        "mamba_pool",
    ),
    "kv-token": ("kv", Setup(tree="radix", hybrid=False, kv_tokens=256, rows=3), "kv_allocator"),
    "kv-paged": (
        "kv",
        Setup(tree="radix", hybrid=False, page_size=4, kv_tokens=256, rows=3, chunk=8),
        "kv_allocator",
    ),
}
PROMPTS = {rid: [7, 7, 7, 7, 7, 7, rid, rid + 1, rid + 2] for rid in range(4)}


def _run_leaking(kind: str, spec: Setup) -> tuple[object, list[tuple[int, str]], str]:
    sched = build(spec)
    with leaking(kind, nth=2) as leaked:  # requests 1 and 3 leak
        for rid, prompt in PROMPTS.items():
            sched.add_request(rid, prompt, 4)
        with pytest.raises(ContractViolation) as info:
            sched.run_until_idle(200)
    return sched, leaked, str(info.value)


@needs_contracts
@pytest.mark.fires("I-COUNT")
@pytest.mark.parametrize("case", list(CASES))
def test_a_leak_names_the_request_its_ids_and_their_moves(case: str) -> None:
    kind, spec, attr = CASES[case]
    sched, leaked, message = _run_leaking(kind, spec)
    assert leaked, "the injected leak never ran"
    rid = leaked[0][0]
    req = sched.requests[rid]
    ledger = getattr(sched, attr).ledger
    held = sorted(ledger.holdings(req.owner))
    assert held, "the ledger must still give the leaked ids to the request"
    assert message.startswith("I-COUNT: ") and "unaccounted (leak)" in message, message
    # The ids, their ledger owner and the bookkeeping's claim, on one line.
    assert re.search(
        rf"leaked {re.escape(str(held[:8]))}.*\({len(held)}\): ledger owner req#{rid}\[req\.\w+\];"
        r" the bookkeeping says no holder",
        message,
    ), message
    # The request, by its state: finished and released, so its bookkeeping holds nothing.
    assert re.search(rf"^\s+req#{rid}: Req\(rid={rid}, finished, .*released", message, re.M), message
    # The last moves of a leaked id, dated by scheduler step: it was handed to the request.
    assert re.search(rf"^\s+{ledger.id_noun} {held[0]}: owner req#{rid}\[", message, re.M), message
    assert re.search(rf"scheduler step \d+: \w+: free_list\[free\] -> req#{rid}\[", message), message


@pytest.mark.fires("I-COUNT")
@pytest.mark.parametrize("case", list(CASES))
def test_with_contracts_off_the_count_identities_still_name_the_ids(case: str) -> None:
    """No ledger, no contracts: the count identities still run after every step and name the ids nobody
    holds (an :class:`IdentityFailure`, its own category)."""
    kind, spec, attr = CASES[case]
    sched = build(ledgers(spec, on=False))
    sched.accounting.enabled, sched.accounting.counting = False, True  # what KVLEDGER_CONTRACTS=0 sets
    with leaking(kind, nth=2) as leaked:
        for rid, prompt in PROMPTS.items():
            sched.add_request(rid, prompt, 4)
        with pytest.raises(IdentityFailure) as info:
            sched.run_until_idle(200)
    message = str(info.value)
    assert leaked and message.startswith("I-COUNT: "), message
    assert "no ledger: contracts off" in message and "found by the count identities" in message, message
    found = re.search(r"leaked (\[[\d, ]+\])(\.\.\.)? \((\d+)\): the bookkeeping says no holder", message)
    assert found, message
    pool = getattr(sched, attr)
    unit = getattr(pool, "page_size", 1) if case == "kv-paged" else 1
    gap = int(re.match(r"I-COUNT: (\d+) ", message).group(1))  # type: ignore[union-attr]
    assert int(found.group(3)) * unit == gap, message  # the named ids are exactly the missing ones
    assert sched.stats.count_checks > 0


@needs_contracts
@pytest.mark.fires("I-LEDGER-AGREES")
def test_a_slot_moved_behind_the_schedulers_back_names_both_owners() -> None:
    """The counts still sum, but the ledger gives a request's KV slot to someone else: both are named."""
    sched = build(Setup(tree="none", hybrid=False, kv_tokens=64))
    req = sched.add_request(0, [1, 2, 3, 4], 5)
    sched.step()
    slot = int(sched.req_to_token_pool.read(req.req_pool_idx, 0, 1)[0])
    intruder = Owner("req", 99, REQ_WAITING)
    sched.kv_allocator.ledger.transfer([slot], req.owner, intruder, "test: stray transfer")
    with pytest.raises(ContractViolation) as info:
        sched.accounting.after_step()
    message = str(info.value)
    assert message.startswith("I-LEDGER-AGREES: [kv]"), message
    assert re.search(
        rf"claimed by another \[{slot}\] \(1\): ledger owner req#99\[req\.waiting\];"
        r" the bookkeeping says held by req#0\[req\.running\]",
        message,
    ), message
    assert re.search(r"req#0: Req\(rid=0, running, .*not released", message), message
    assert re.search(r"scheduler step 1: test: stray transfer: req#0\[req\.running\] -> req#99", message), (
        message
    )
