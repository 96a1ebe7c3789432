"""A Hypothesis state machine over the whole scheduler.

Arrivals from shared-prefix families, steps, aborts of any request drawn by stage (waiting with or
without a copy-on-write slot, chunked, running, in flight, and ended ones: an abort of an ended request
must be a no-op; uniform over the stages occupied, so a brief one is as likely as a crowded one),
injected allocation failures of the kinds this example enabled (a swarm of fault kinds per
example; Hypothesis already draws a swarm of rules), forced retractions; overlap on and off, page 1 and
> 1, with the Mamba radix cache (V1 or V2, either copy-on-write release policy), the plain radix cache
or none; tiny pools (down to 16 KV
tokens, few Mamba slots, few rows); requests drawn at the capacity edges (about one arrival in three at,
one below or one above a boundary: :func:`request_edges`, :mod:`.edges`) and bursts of as many arrivals
as rows, running slots or Mamba slots hold, one fewer or one more. After every rule: I-HANDLE-OWNED,
I-OWNER-RELEASE at the step boundary, the busy identity per pool (the scheduler checks it itself; the
machine calls it again so a disabled switch cannot hide it), the ledger cross-check, every pool's and the
tree's audit, and prediction == commitment (an admission rolls back only for an injected fault). At drain: every request
finished, aborted or rejected with a reason (I-LIVENESS), the strong idle identity, and every finished
request's output equals the same request run alone with no cache (I-OUTPUT-ORACLE).

``hypothesis.target`` steers toward pool pressure, requests in flight and retractions (in runs long
enough for Hypothesis to optimise: the deep and fuzz profiles, not the hunt's batches of 8).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.identity import check_busy_identity
from kvledger.contracts.oracle import check_output_oracle
from kvledger.museum.machines.data_oracle import check_scheduler_data, with_data_tags
from kvledger.museum.machines.edges import OFFSETS, Edge, edge_draws, fit, multiples
from kvledger.museum.machines.notes import event, target
from kvledger.museum.machines.oracles import expected_output
from kvledger.reference.engine import EngineSpec, TreeKind, build_engine
from kvledger.reference.scheduler import ReqState
from kvledger.reference.scheduler.config import CowReleasePolicy
from kvledger.reference.scheduler.scheduler import FAULT_KINDS as SCHEDULER_FAULT_KINDS
from kvledger.reference.scheduler.spec_config import SpeculativeConfig

FAMILIES = [
    [],
    [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22],
    [31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50],
    [11, 12, 13, 14, 15, 16, 70, 71, 72, 73],
]
T = TypeVar("T")
S = TypeVar("S", str, tuple[str, str])  # a stage: a name, or a pair of names (PD: prefill, decode)

FAULT_KINDS = SCHEDULER_FAULT_KINDS  # what an injected allocation failure may hit
# How many allocations of the kind a fault lets through first: a rollback in the middle of a round
# undoes what the earlier requests took (at page > 1 a page given back may come back elsewhere in a row).
FAULT_AFTER = st.sampled_from([0, 1, 2])
MAX_CONTEXT_LEN = 96
CHECKED_DRAIN_STEPS = 200


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


def max_context_len_edges(max_context_len: int, page_size: int) -> list[int]:
    """KV pool sizes around the one that holds the longest legal request alone with one spare page (the
    arrival check's rule), a page below and a page above it."""
    fits = -(-max_context_len // page_size) * page_size + page_size
    return [fits + o * page_size for o in OFFSETS]


def request_edges(setup: EngineSpec) -> list[tuple[str, int]]:
    """The boundaries a request's length can sit at, as ``("prompt" | "total", tokens)`` (total: prompt +
    max_new tokens, what the arrival check and the decode reservation count): the row width and context
    limit, the KV pool (fits alone with its spare page; the whole pool), page multiples, the chunked
    prefill size, the prefill budget, and under Mamba V2 the capture grid and the track interval."""
    ps = setup.page_size
    edges = [("total", setup.max_context_len), ("total", setup.kv_tokens - ps), ("total", setup.kv_tokens)]
    edges += [("total", n) for n in multiples(ps, setup.max_context_len)]
    edges += [("prompt", n) for n in multiples(ps, setup.max_context_len)]
    edges += [("prompt", setup.max_prefill)] + ([("prompt", setup.chunk)] if setup.chunk else [])
    if setup.mamba_strategy == "extra_buffer" and setup.tree == "mamba_radix":
        grid = max(ps, setup.mamba_chunk_size or ps)
        edges += [("prompt", n) for n in multiples(grid, setup.max_context_len)]
        edges += [("prompt", setup.mamba_track_interval), ("total", setup.mamba_track_interval)]
    return edges


def land(
    setup: EngineSpec, prompt: list[int], max_new: int, edge: Edge, filler: list[int]
) -> tuple[list[int], int]:
    """``prompt`` and ``max_new`` moved so that the request sits at the boundary ``edge`` names, one below
    or one above it (a prompt extended by repeating ``filler``, or cut); unchanged for no edge."""
    if edge is None:
        return prompt, max_new
    edges = request_edges(setup)
    pick, offset = edge
    kind, at = edges[pick % len(edges)]
    length = max(at + offset, 1)
    if kind == "total":
        max_new = max(min(max_new, length - 1), 1)
        length = max(length - max_new, 1)
    return fit(prompt, length, filler), max_new


def chunk_sizes(page_size: int, grid: int) -> list[int | None]:
    """Chunked-prefill sizes the configuration accepts (>= the page and, under V2, >= the capture grid)."""
    return [None, *(c for c in (8, 16, 32) if c >= max(page_size, grid) and c % page_size == 0)]


@st.composite
def setups(
    draw: st.DrawFn, page_sizes: tuple[int, ...] = (1, 1, 4, 16), v2_only: bool = False
) -> EngineSpec:
    """Any tree at any page size; the Mamba radix cache as V1 (page 1 only) or V2 (any page); pools from
    tiny (a prompt may not fit at all: rejected at arrival) to roomy."""
    page_size = draw(st.sampled_from(page_sizes))
    trees: list[TreeKind] = ["mamba_radix"] if v2_only else ["mamba_radix", "radix", "none"]
    tree = draw(st.sampled_from(trees))
    hybrid = tree == "mamba_radix" or (tree == "none" and draw(st.booleans()))
    overlap = draw(st.booleans())
    v2: dict[str, object] = {}
    if tree == "mamba_radix" and (v2_only or page_size > 1 or draw(st.booleans())):
        v2 = v2_options(draw, page_size, overlap)
    grid = max(page_size, int(v2.get("mamba_chunk_size", 1)))  # type: ignore[call-overload]
    k = (2 if overlap else 1) if v2 else 0
    # Both copy-on-write release policies, V1 and V2 alike: #21404's (free the stopper's copy unless it
    # was appended) and the late-2025 "keep" (a waiting request keeps its copy, so a waiting request
    # holding a slot is a state every rule can be drawn from). Under "keep" Mamba V2 once deadlocked on
    # tiny pools (a later request's match-time copy took a slot the round promised to an appended one;
    # found by this machine, fixed by PrefillAdder.room_to_match).
    policies: list[CowReleasePolicy] = ["if_not_appended", "keep"]
    tiny, roomy, top = (64, 96, 256) if page_size == 16 else (16, 48, 160)
    # A third of the pools sit at the edge of the longest legal request (prompt + max_new at
    # max_context_len): one page short of fitting it alone, exactly fitting it with the spare page the
    # arrival check asks for, or one page more.
    longest = max_context_len_edges(MAX_CONTEXT_LEN, page_size)
    kv = draw(st.one_of(st.integers(tiny, roomy), st.integers(roomy, top), st.sampled_from(longest)))
    return EngineSpec(
        page_size=page_size,
        tree=tree,
        hybrid=hybrid,
        kv_tokens=max(kv // page_size, 2) * page_size,
        rows=draw(st.integers(1, 5)),
        mamba_slots=draw(st.integers(2 + k, 6 + k)),
        max_running=draw(st.integers(1, 5)),
        chunk=draw(st.sampled_from(chunk_sizes(page_size, grid))),
        max_prefill=draw(st.sampled_from([16, 32, 64])),
        overlap=overlap,
        cow_release_policy=draw(st.sampled_from(policies)),
        max_context_len=MAX_CONTEXT_LEN,
        eos_token_id=draw(st.sampled_from([None, 7])),
        **(v2 or {"mamba_strategy": "no_buffer"}),  # type: ignore[arg-type]  # V1 unless V2 was drawn
    )


def drain_bound(live: list[Any]) -> int:
    """Steps a drain may take before I-LIVENESS: generous for the work left (every token of every live
    request, one step each, plus room for retractions), small enough that shrinking a liveness failure
    does not spend its time draining."""
    work = sum(len(r.origin_input_ids) + r.max_new_tokens for r in live)
    return 100 + 4 * work


def stage_of(sched: Any, req: Any) -> str:
    """Where ``req`` stands in ``sched``, finer than its state: a launched batch's request, the chunked
    one, a running one, a waiting one holding pool ids (a copy-on-write slot from ``match_prefix``) or
    none, an ended one."""
    if req.state.is_done:
        return "ended"
    if any(req in b.reqs for b in sched.inflight):
        return "launched"
    if req is sched.chunked_req:
        return "chunked"
    if req.state is ReqState.WAITING:
        return "waiting holding ids" if req.handles() else "waiting"
    return req.state.value


def pick_by_stage(items: Iterable[T], stage_of_item: Callable[[T], S], stage: int, pick: int) -> tuple[S, T]:
    """The ``pick``-th item (modulo) of the ``stage``-th stage (modulo, in sorted order) among the stages
    some item is in: uniform over stages first, then within one. Returns the stage and the item."""
    by_stage: dict[S, list[T]] = {}
    for item in items:
        by_stage.setdefault(stage_of_item(item), []).append(item)
    name = sorted(by_stage)[stage % len(by_stage)]
    chosen = by_stage[name]
    return name, chosen[pick % len(chosen)]


fault_swarms = st.lists(st.sampled_from(FAULT_KINDS), unique=True).map(sorted)

# Speculative decoding (spec/speculative.md), drawn on top of any set-up: off (two thirds of the examples),
# or (num_steps, topk, extra draft tokens) with a cycle of acceptance counts for the verifies (0 ..
# max_accept each), so a failure shrinks to the acceptances that matter. Drawn as one value, the counts
# only when speculation is on: an example without it draws one choice more than before.
SpecDraw = tuple[int, int, int, list[int]]
spec_draws: st.SearchStrategy[SpecDraw | None] = st.one_of(
    st.none(),
    st.none(),
    st.tuples(
        st.integers(1, 3),
        st.sampled_from([1, 2, 4]),
        st.integers(0, 3),
        st.lists(st.integers(0, 3), min_size=1, max_size=6),
    ),
)


def speculative_setup(setup: EngineSpec, drawn: SpecDraw | None) -> EngineSpec:
    """``setup`` with the drawn speculative configuration, fitted to it: ``num_draft_tokens`` within the
    tree, and under Mamba V2 with overlap few enough steps that two consecutive verifies cannot both
    capture (the configuration's rule); none when even one step is too many, or under V1 with overlap
    (which ``EngineSpec`` refuses)."""
    if drawn is None:
        return setup
    steps, topk, extra, _ = drawn
    if setup.overlap and setup.tree == "mamba_radix" and setup.mamba_strategy == "no_buffer":
        return setup  # refused by EngineSpec: V1 under overlap would cache a state a verify moved
    if setup.mamba_strategy == "extra_buffer" and setup.tree == "mamba_radix" and setup.overlap:
        steps = min(steps, setup.mamba_track_interval // 2 - 1)
        if steps < 1:
            return setup
    draft_tokens = min(steps + 1 + extra, steps * topk + 1)
    spec = SpeculativeConfig(num_steps=steps, topk=topk, num_draft_tokens=draft_tokens)
    return dataclasses.replace(setup, speculative=spec)


class SchedulerMachine(RuleBasedStateMachine):
    faults: frozenset[str] = frozenset(FAULT_KINDS)  # a subclass whose init draws no swarm injects every kind
    # the last batches step() launched (re-processing a processed one is a bad call, tests/scheduler); a
    # tuple, rebound by step(), so subclasses with their own initialize rule inherit it
    launched: tuple[Any, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.max_in_flight = 0
        self.max_pressure = 0.0

    @initialize(setup=setups(), faults=fault_swarms, spec=spec_draws)
    def init(self, setup: EngineSpec, faults: list[str], spec: SpecDraw | None = None) -> None:
        # the hash tokens, with data tags in every state and KV slot (the verify forward writes them too)
        setup = with_data_tags(speculative_setup(setup, spec))
        self.setup = setup
        self.faults = frozenset(faults)
        self.sched = build_engine(setup)
        self.next_rid = 0
        if self.sched.speculative is not None and spec is not None:
            self.sched.speculative.draw.scripted(spec[3])
        event(
            f"tree={setup.tree} page={setup.page_size} overlap={setup.overlap}"
            + (" extra_buffer" if setup.mamba_strategy == "extra_buffer" else "")
            + ("" if setup.speculative is None else f" speculative topk={setup.speculative.topk}")
        )

    @rule(
        family=st.sampled_from(range(len(FAMILIES))),
        suffix=st.lists(st.integers(0, 99), min_size=1, max_size=20),
        max_new=st.integers(1, 12),
        edge=edge_draws,
    )
    def arrive(self, family: int, suffix: list[int], max_new: int, edge: Edge = None) -> None:
        """A request; with an edge drawn, its length sits at a capacity boundary, one below or one above
        (:func:`request_edges`; the drawn tokens repeat to the length, or are cut)."""
        prompt, max_new = land(self.setup, FAMILIES[family] + suffix, max_new, edge, suffix)
        if edge is not None:
            event("arrival at a capacity edge")
        self.add(prompt, max_new)

    @rule(
        family=st.sampled_from(range(len(FAMILIES))),
        suffix=st.lists(st.integers(0, 99), min_size=1, max_size=20),
        max_new=st.integers(1, 12),
        capacity=st.integers(0, 63),
        offset=st.sampled_from(OFFSETS),
    )
    def arrive_at_capacity(
        self, family: int, suffix: list[int], max_new: int, capacity: int, offset: int
    ) -> None:
        """As many requests at once as a count capacity holds (request rows, running requests, Mamba
        slots), one fewer or one more; they share the prompt up to its last token (a branching point)."""
        setup = self.setup
        counts = [setup.rows, setup.max_running, *([setup.mamba_slots] if setup.hybrid else [])]
        n = max(counts[capacity % len(counts)] + offset, 1)
        event("arrivals at a count capacity")
        for i in range(n):
            self.add(FAMILIES[family] + suffix + [i], max_new)

    @precondition(lambda self: bool(self.sched.requests))
    @rule(
        pick=st.integers(0, 63),
        suffix=st.lists(st.integers(0, 99), max_size=8),
        max_new=st.integers(1, 12),
        copies=st.integers(1, 3),
    )
    def arrive_follow_up(self, pick: int, suffix: list[int], max_new: int, copies: int) -> None:
        """A conversation's next turn: an earlier request's prompt and the output it has so far, then new
        tokens (none: the same prompt sent again), one to three at once. Its prefix is cached whenever the
        earlier turn's was kept, so the match lands on a node with a state: a waiting request holding a
        copy-on-write slot, the state every rule (an abort, a retraction, the next admission) can then
        meet. Uniform arrivals rarely extend a whole earlier prompt."""
        reqs = [self.sched.requests[rid] for rid in sorted(self.sched.requests)]
        earlier = reqs[pick % len(reqs)]
        prompt = earlier.origin_input_ids + earlier.output_ids + suffix
        event("follow-up arrival")
        for _ in range(copies):
            self.add(prompt, max_new)

    def add(self, prompt: list[int], max_new: int) -> None:
        req = self.sched.add_request(self.next_rid, prompt, max_new)
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

    @precondition(lambda self: bool(self.sched.requests))
    @rule(stage=st.integers(0, 7), pick=st.integers(0, 63))
    def abort(self, stage: int, pick: int) -> None:
        """Abort any request, ended ones included (then it must be a no-op). The victim is drawn by stage
        first (uniform over the stages some request is in now), then within it: a stage that one request
        passes through briefly (waiting with a copy-on-write slot) is as likely a victim as the crowded
        ones, whatever the number of requests."""
        reqs = (self.sched.requests[rid] for rid in sorted(self.sched.requests))
        _, req = pick_by_stage(reqs, lambda r: stage_of(self.sched, r), stage, pick)
        self.abort_request(req)

    @precondition(lambda self: bool(self.sched.waiting))
    @rule(pick=st.integers(0, 63), sweep=st.booleans())
    def abort_waiting(self, pick: int, sweep: bool) -> None:
        """An abort aimed at the waiting queue: one waiting request, or (``sweep``) every one, as a queue
        timeout or a queue-length limit ends them. The waiting queue is where a request may hold ids it
        was never admitted with (a matched prefix's copy-on-write slot); the stage-drawn abort meets it
        only as one stage among the others."""
        waiting = list(self.sched.waiting)
        for req in waiting if sweep else [waiting[pick % len(waiting)]]:
            self.abort_request(req)

    def abort_request(self, req: Any) -> None:
        was_done = req.state.is_done
        event(f"abort from {stage_of(self.sched, req)}")
        if self.sched.abort(req.rid) is not (not was_done):
            raise ContractViolation(
                f"I-OWNER-RELEASE: abort of {'an ended' if was_done else 'a live'} request answered"
                f" {'True' if was_done else 'False'} (an abort of an ended request is a no-op): {req!r}"
            )

    @rule(kind=st.sampled_from(FAULT_KINDS), after=FAULT_AFTER)
    def inject_allocation_failure(self, kind: str, after: int = 0) -> None:
        """The allocation of ``kind`` after the next ``after`` fails: with ``after`` > 0 the failure lands in
        the middle of an admission or a verify, once earlier requests of the round took their ids."""
        if kind in self.faults:
            self.sched.faults.fail_next(kind, after=after)

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

    @invariant()
    def identities_hold(self) -> None:
        sched = self.sched
        sched.check_handles_owned()
        sched.check_ended_requests_released()
        if sched.speculative is not None:  # I-SPEC-ROW, I-SPEC-TAIL
            sched.speculative.check_requests()
        accounting = sched.accounting
        recount = accounting.pool_terms()
        for terms in recount:
            check_busy_identity(terms)
        accounting.cross_check_ledgers(recount)
        # The after-step identity is incremental: its sums must equal the full recount after every rule.
        accounting.check_incremental(accounting.terms(), recount)
        for pool in accounting.pools():
            pool.audit()
        if sched.tree is not None:
            sched.tree.audit()
        if sched.stats.rollbacks > sched.faults.fired:
            raise ContractViolation(
                f"I-ATOMIC-ADMISSION: prediction != commitment: {sched.stats.rollbacks} admission(s) rolled"
                f" back with {sched.faults.fired} injected fault(s); {sched.describe_queues()}"
            )
        for batch in sched.inflight:  # a launched batch's requests keep their rows until its results
            for req in batch.reqs:
                if req.released:
                    raise ContractViolation(
                        f"I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT: {req.owner!r} was released while launched"
                        f" batch#{batch.batch_id} still references it: {req!r}"
                    )
        check_scheduler_data(sched)  # I-DATA-STATE, I-DATA-KV: every state and KV slot holds its prefix's tag
        in_flight = sum(len(b.reqs) for b in sched.inflight)
        self.max_in_flight = max(self.max_in_flight, in_flight)
        kv = sched.kv_allocator
        self.max_pressure = max(self.max_pressure, 1.0 - kv.available_size() / kv.size)

    def teardown(self) -> None:
        sched = getattr(self, "sched", None)
        if sched is None or sys.exc_info()[1] is not None:
            return  # a check already fired: draining would only report a later, secondary violation
        target(float(self.max_in_flight), label="requests in flight")
        target(float(sched.stats.retractions), label="retractions")
        target(self.max_pressure, label="KV pool pressure")
        sched.faults.pending.clear()
        for _ in range(CHECKED_DRAIN_STEPS):  # drain with the checks after every step, then plainly
            if not sched.has_work():
                break
            sched.step()
            self.identities_hold()
        sched.run_until_idle(max_steps=drain_bound(sched.live_requests()))
        sched.accounting.check_quiescent()
        tracking = sched.memory.tracking
        if tracking is not None:  # Mamba V2: show which tracking paths the example took
            for what, n in tracking.stats.items():
                if n:
                    event(f"V2 {what}")
        for req in sched.requests.values():
            if not (req.state.is_done and req.finish_reason):
                raise ContractViolation(f"I-LIVENESS: {req!r} never ended, or ended without a reason")
            if req.state is ReqState.FINISHED:
                check_output_oracle(req, req.output_ids, self.expected(req.origin_input_ids, req.max_new_tokens))

    def expected(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """The oracle: what the request generates when run alone with no cache."""
        return expected_output(prompt, max_new_tokens, self.setup.eos_token_id)


def v2_machine(page_size: int) -> type[SchedulerMachine]:
    """The machine with the Mamba radix cache in V2 (extra_buffer) only, at one page size."""

    class V2Machine(SchedulerMachine):
        @initialize(setup=setups(page_sizes=(page_size,), v2_only=True), faults=fault_swarms)
        def init(self, setup: EngineSpec, faults: list[str]) -> None:
            SchedulerMachine.init(self, setup, faults)

    V2Machine.__name__ = V2Machine.__qualname__ = f"SchedulerMachineV2Page{page_size}"
    return V2Machine
