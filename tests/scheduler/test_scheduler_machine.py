"""A Hypothesis state machine over the whole scheduler.

Arrivals from shared-prefix families, steps, aborts of random requests in any state, injected
allocation failures, forced retractions; overlap on and off, page 1 and > 1, with the Mamba radix cache,
the plain radix cache or none; tight pools (few Mamba slots, few rows). After every rule: the busy
identity per pool (the scheduler checks it itself; the machine calls it again so a disabled switch
cannot hide it), the ledger cross-check, every pool's and the tree's audit. At drain: every request
finished, aborted or rejected with a reason (liveness), the strong idle identity, and every finished
request's output equals the same request run alone with no cache (I-OUTPUT-ORACLE).
"""

from __future__ import annotations

import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvledger.contracts.identity import check_busy_identity
from kvledger.contracts.oracle import check_output_oracle
from kvledger.reference.scheduler import ReqState
from tests.scheduler.harness import Setup, build, expected_output, long_fuzz_settings

FAMILIES = [
    [],
    [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22],
    [31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50],
    [11, 12, 13, 14, 15, 16, 70, 71, 72, 73],
]


@st.composite
def setups(draw: st.DrawFn) -> Setup:
    page_size = draw(st.sampled_from([1, 1, 4]))
    tree = draw(st.sampled_from(["mamba_radix", "radix", "none"] if page_size == 1 else ["radix", "none"]))
    hybrid = tree == "mamba_radix" or (tree == "none" and draw(st.booleans()))
    return Setup(
        page_size=page_size,
        tree=tree,
        hybrid=hybrid,
        kv_tokens=draw(st.integers(48, 160)) // page_size * page_size,
        rows=draw(st.integers(1, 5)),
        mamba_slots=draw(st.integers(2, 6)),
        max_running=draw(st.integers(1, 5)),
        chunk=draw(st.sampled_from([None, 8, 16])),
        max_prefill=draw(st.sampled_from([16, 32, 64])),
        overlap=draw(st.booleans()),
        cow_release_policy=draw(st.sampled_from(["if_not_appended", "keep"])),
        max_context_len=96,
        eos_token_id=draw(st.sampled_from([None, 7])),
    )


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(setup=setups())
    def init(self, setup: Setup) -> None:
        self.setup = setup
        self.sched = build(setup)
        self.next_rid = 0
        event(f"tree={setup.tree} page={setup.page_size} overlap={setup.overlap}")

    @rule(
        family=st.sampled_from(range(len(FAMILIES))),
        suffix=st.lists(st.integers(0, 99), min_size=1, max_size=20),
        max_new=st.integers(1, 12),
    )
    def arrive(self, family: int, suffix: list[int], max_new: int) -> None:
        req = self.sched.add_request(self.next_rid, FAMILIES[family] + suffix, max_new)
        self.next_rid += 1
        if req.state is ReqState.REJECTED:
            event("rejected at arrival")

    @rule(n=st.integers(1, 4))
    def step(self, n: int) -> None:
        for _ in range(n):
            self.sched.step()
        if self.sched.stats.retractions:
            event("retraction happened")

    @precondition(lambda self: any(not r.state.is_done for r in self.sched.requests.values()))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        live = sorted(r.rid for r in self.sched.requests.values() if not r.state.is_done)
        rid = data.draw(st.sampled_from(live))
        event(f"abort from {self.sched.requests[rid].state.value}")
        assert self.sched.abort(rid) is True

    @rule(kind=st.sampled_from(["row", "mamba", "kv"]))
    def inject_allocation_failure(self, kind: str) -> None:
        self.sched.faults.fail_next(kind)

    @precondition(lambda self: bool(self.sched.running))
    @rule()
    def force_retract(self) -> None:
        self.sched.force_retract(1)

    @invariant()
    def identities_hold(self) -> None:
        accounting = self.sched.accounting
        recount = accounting.pool_terms()
        for terms in recount:
            check_busy_identity(terms)
        accounting._cross_check_ledgers(recount)
        # The after-step identity is incremental: its sums must equal the full recount after every rule.
        accounting._check_incremental(accounting.terms(), recount)
        for pool in self.sched.accounting._pools():
            pool.audit()
        if self.sched.tree is not None:
            self.sched.tree.audit()

    def teardown(self) -> None:
        sched = getattr(self, "sched", None)
        if sched is None:
            return
        sched.faults.pending.clear()
        sched.run_until_idle(max_steps=5000)
        sched.accounting.check_quiescent()
        for req in sched.requests.values():
            assert req.state.is_done, f"liveness: {req!r} never ended"
            assert req.finish_reason, f"{req!r} ended without a reason"
            if req.state is ReqState.FINISHED:
                check_output_oracle(req, req.output_ids, self.expected(req.origin_input_ids, req.max_new_tokens))

    def expected(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """The oracle: what the request generates when run alone with no cache."""
        return expected_output(prompt, max_new_tokens, self.setup.eos_token_id)


TestSchedulerMachine = SchedulerMachine.TestCase


@pytest.mark.deep
def test_scheduler_machine_long_fuzz() -> None:
    """Nightly-style fuzzing: ``pytest -m deep`` (excluded from the default run)."""
    run_state_machine_as_test(
        SchedulerMachine,
        settings=long_fuzz_settings(3000, 120),
    )
