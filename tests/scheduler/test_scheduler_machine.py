"""A Hypothesis state machine over the whole scheduler.

Arrivals from shared-prefix families, steps, aborts of random requests in any state, injected
allocation failures, forced retractions, early processing of the batch in flight, and bad calls from
whatever state the scheduler is in (each must raise a typed error and leave the full snapshot of the
scheduler, its pools and tree unchanged: ``tests/sweep/snapshot.py``); overlap on and off, page 1 and > 1,
with the Mamba radix cache, the plain radix cache or none; tight pools (few Mamba slots, few rows). After
every rule: the busy identity per pool (the scheduler checks it itself; the machine calls it again so a disabled switch
cannot hide it), the ledger cross-check, every pool's and the tree's audit. At drain: every request
finished, aborted or rejected with a reason (liveness), the strong idle identity, and every finished
request's output equals the same request run alone with no cache (I-OUTPUT-ORACLE).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvledger.contracts.errors import (
    BatchNotInFlight,
    InvalidArgument,
    InvalidState,
    KVLedgerError,
)
from kvledger.contracts.identity import check_busy_identity
from kvledger.contracts.oracle import check_output_oracle
from kvledger.reference.scheduler import ReqState, UnknownRequest
from tests.scheduler.harness import Setup, build, expected_output, long_fuzz_settings
from tests.sweep import snapshot

FAMILIES = [
    [],
    [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22],
    [31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50],
    [11, 12, 13, 14, 15, 16, 70, 71, 72, 73],
]


def v2_options(draw: st.DrawFn, page_size: int, overlap: bool) -> dict[str, object]:
    """Mamba V2 (``extra_buffer``) knobs small enough for short prompts: a kernel chunk of 2 to 8 tokens
    (the capture grid is the larger of it and the page) and a decode interval of a few pages (>= 2 with
    overlap, the configuration check)."""
    interval = page_size * draw(st.sampled_from([1, 2, 3, 4, 8]))
    return {
        "mamba_strategy": "extra_buffer",
        "mamba_chunk_size": draw(st.sampled_from([2, 4, 8])),
        "mamba_track_interval": max(interval, 2) if overlap else interval,
    }


def chunk_sizes(page_size: int, grid: int) -> list[int | None]:
    """Chunked-prefill sizes the configuration accepts (>= the page and, under V2, >= the capture grid)."""
    return [None, *(c for c in (8, 16, 32) if c >= max(page_size, grid) and c % page_size == 0)]


@st.composite
def setups(
    draw: st.DrawFn, page_sizes: tuple[int, ...] = (1, 1, 4, 16), v2_only: bool = False
) -> Setup:
    """Any tree at any page size; the Mamba radix cache as V1 (page 1 only) or V2 (any page)."""
    page_size = draw(st.sampled_from(page_sizes))
    trees = ["mamba_radix"] if v2_only else ["mamba_radix", "radix", "none"]
    tree = draw(st.sampled_from(trees))
    hybrid = tree == "mamba_radix" or (tree == "none" and draw(st.booleans()))
    overlap = draw(st.booleans())
    v2: dict[str, object] = {}
    if tree == "mamba_radix" and (v2_only or page_size > 1 or draw(st.booleans())):
        v2 = v2_options(draw, page_size, overlap)
    grid = max(page_size, int(v2.get("mamba_chunk_size", 1)))  # type: ignore[call-overload]
    k = (2 if overlap else 1) if v2 else 0
    low_kv = 96 if page_size == 16 else 48
    return Setup(
        page_size=page_size,
        tree=tree,
        hybrid=hybrid,
        kv_tokens=draw(st.integers(low_kv, 160 if page_size < 16 else 256)) // page_size * page_size,
        rows=draw(st.integers(1, 5)),
        mamba_slots=draw(st.integers(2 + k, 6 + k)),
        max_running=draw(st.integers(1, 5)),
        chunk=draw(st.sampled_from(chunk_sizes(page_size, grid))),
        max_prefill=draw(st.sampled_from([16, 32, 64])),
        overlap=overlap,
        cow_release_policy=draw(st.sampled_from(["if_not_appended", "keep"])),
        max_context_len=96,
        eos_token_id=draw(st.sampled_from([None, 7])),
        **v2,  # type: ignore[arg-type]
    )


class SchedulerMachine(RuleBasedStateMachine):
    # the last batches step() launched (re-processing a processed one is a bad call); a tuple, rebound
    # by step(), so subclasses with their own initialize rule (the model oracle machines) inherit it
    launched: tuple[Any, ...] = ()

    @initialize(setup=setups())
    def init(self, setup: Setup) -> None:
        self.setup = setup
        self.sched = build(setup)
        self.next_rid = 0
        event(
            f"tree={setup.tree} page={setup.page_size} overlap={setup.overlap}"
            + (" extra_buffer" if setup.mamba_strategy == "extra_buffer" else "")
        )

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
            batch = self.sched.step()
            if batch is not None:
                self.launched = (*self.launched[-7:], batch)
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

    @precondition(lambda self: bool(self.sched.inflight))
    @rule()
    def process_in_flight_early(self) -> None:
        """Overlap: the caller processes the batch in flight itself; the next step must not process it again."""
        self.sched.process_batch_result(self.sched.inflight[0])
        event("batch processed early")

    # ------------------------------------------------------------------ bad calls from any state
    def _bad_calls(self) -> list[tuple[str, type[KVLedgerError], Callable[[], object]]]:
        """The bad calls the current state allows: (what, typed error, call)."""
        sched = self.sched
        used = sorted(sched.requests)
        calls: list[tuple[str, type[KVLedgerError], Callable[[], object]]] = [
            (
                "a generator prompt",
                InvalidArgument,
                lambda: sched.add_request(self.next_rid, iter([1, 2]), 2),
            ),
            ("an empty prompt", InvalidArgument, lambda: sched.add_request(self.next_rid, [], 2)),
            ("a float token", InvalidArgument, lambda: sched.add_request(self.next_rid, [1, 2.0], 2)),
            (
                "a token outside the vocabulary",
                InvalidArgument,
                lambda: sched.add_request(self.next_rid, [1, 32000], 2),
            ),
            ("a negative token", InvalidArgument, lambda: sched.add_request(self.next_rid, [-1], 2)),
            ("max_new_tokens 0", InvalidArgument, lambda: sched.add_request(self.next_rid, [1], 0)),
            ("abort of an unknown rid", UnknownRequest, lambda: sched.abort(self.next_rid + 1000)),
            ("abort of a str rid", InvalidArgument, lambda: sched.abort("0")),
            ("a batch built outside step", InvalidState, sched.get_next_batch_to_run),
            ("a prefill built outside step", InvalidState, sched.get_new_batch_prefill),
            ("a decode built outside step", InvalidState, sched.update_running_batch),
            ("force_retract(0)", InvalidArgument, lambda: sched.force_retract(0)),
            ("run_until_idle(0)", InvalidArgument, lambda: sched.run_until_idle(0)),
            ("an unknown fault kind", InvalidArgument, lambda: sched.faults.fail_next("disk")),
            ("retract of None", InvalidArgument, lambda: sched.retract(None)),  # type: ignore[arg-type]
        ]
        if used:
            rid = used[-1]
            calls.append(("a used rid", InvalidArgument, lambda: sched.add_request(rid, [1], 2)))
        in_flight = {id(r) for b in sched.inflight for r in b.reqs}
        for req in list(sched.requests.values()):
            if req not in sched.running or req.state is not ReqState.RUNNING or id(req) in in_flight:
                calls.append(
                    (f"retract of a {req.state.value} request", InvalidState, lambda r=req: sched.retract(r))
                )
        for batch in self.launched:
            if not sched.inflight or sched.inflight[0] is not batch:
                calls.append(
                    ("re-processing a batch", BatchNotInFlight, lambda b=batch: sched.process_batch_result(b))
                )
        return calls

    @rule(data=st.data())
    def bad_call(self, data: st.DataObject) -> None:
        what, error, call = data.draw(st.sampled_from(self._bad_calls()), label="bad call")
        before = snapshot.take(self.sched)
        try:
            call()
        except KVLedgerError as exc:
            assert isinstance(exc, error), (
                f"{what}: expected {error.__name__}, got {type(exc).__name__}: {exc}"
            )
        else:
            raise AssertionError(f"{what}: accepted although bad")
        changed = snapshot.differences(before, snapshot.take(self.sched))
        assert not changed, f"{what}: refused but changed {changed}"
        event(f"bad call: {what.split(' request')[0]}")

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
        tracking = sched.memory.tracking
        if tracking is not None:  # Mamba V2: show which tracking paths the example took
            for what, n in tracking.stats.items():
                if n:
                    event(f"V2 {what}")
        for req in sched.requests.values():
            assert req.state.is_done, f"liveness: {req!r} never ended"
            assert req.finish_reason, f"{req!r} ended without a reason"
            if req.state is ReqState.FINISHED:
                check_output_oracle(
                    req, req.output_ids, self.expected(req.origin_input_ids, req.max_new_tokens)
                )

    def expected(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """The oracle: what the request generates when run alone with no cache."""
        return expected_output(prompt, max_new_tokens, self.setup.eos_token_id)


TestSchedulerMachine = SchedulerMachine.TestCase


def v2_machine(page_size: int) -> type[SchedulerMachine]:
    """The machine with the Mamba radix cache in V2 (extra_buffer) only, at one page size."""

    class V2Machine(SchedulerMachine):
        @initialize(setup=setups(page_sizes=(page_size,), v2_only=True))
        def init(self, setup: Setup) -> None:
            SchedulerMachine.init(self, setup)

    V2Machine.__name__ = V2Machine.__qualname__ = f"SchedulerMachineV2Page{page_size}"
    return V2Machine


V2_BUDGET = settings(settings(), max_examples=25)  # each page size on its own: V2 at 1, 4 and 16 in CI
TestSchedulerMachineV2Page1 = v2_machine(1).TestCase
TestSchedulerMachineV2Page4 = v2_machine(4).TestCase
TestSchedulerMachineV2Page16 = v2_machine(16).TestCase
for _case in (TestSchedulerMachineV2Page1, TestSchedulerMachineV2Page4, TestSchedulerMachineV2Page16):
    _case.settings = V2_BUDGET
del _case


@pytest.mark.deep
def test_scheduler_machine_long_fuzz() -> None:
    """Nightly-style fuzzing: ``pytest -m deep`` (excluded from the default run)."""
    run_state_machine_as_test(
        SchedulerMachine,
        settings=long_fuzz_settings(3000, 120),
    )
