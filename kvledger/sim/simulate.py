"""``kvledger simulate``: build the pools, the cache and the scheduler, run a workload, report.

The run records the identity's terms per pool after the steps it samples (the ledger timeline), which
the report turns into a table and a stacked-area plot whose stack always reaches the pool size.

Memory stays flat however long the run (issue 17): the timeline keeps at most
:data:`TIMELINE_POINTS` samples (every step while the run is short, every 2nd, 4th, ... step once it
is longer), peak use is a running maximum over every step, and the outcome counts come from the
scheduler's counters rather than from a list of every request.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import IO, Any

from kvledger.audit.record import Recorder
from kvledger.contracts import switch
from kvledger.contracts.errors import (
    ContractViolation,
    DoubleFree,
    DuplicateIds,
    ForeignSlot,
    IdentityFailure,
)
from kvledger.contracts.levels import CheckLevel
from kvledger.reference.engine import EngineSpec, ModelKind, TreeKind, build_engine
from kvledger.reference.scheduler.config import MambaSchedulerStrategy
from kvledger.reference.scheduler.spec_config import SpeculativeConfig
from kvledger.sim.faults import FaultDriver
from kvledger.sim.workload import GSPWorkload

TIMELINE_POINTS = 4096
"""The most steps the timeline keeps. A run with more steps is sampled every ``stride`` steps, the
stride doubling whenever the timeline fills up (the default run has about 1,500 steps: all kept)."""


class Timeline:
    """Per-step snapshots, downsampled to at most ``max_points`` evenly strided steps."""

    def __init__(self, max_points: int = TIMELINE_POINTS) -> None:
        if max_points < 2:
            raise ValueError("a timeline needs at least 2 points")
        self.max_points = max_points
        self.stride = 1
        self.steps: list[int] = []
        self.snapshots: list[dict[str, dict[str, int]]] = []

    def wants(self, step: int) -> bool:
        return step % self.stride == 0

    def add(self, step: int, snapshot: dict[str, dict[str, int]]) -> None:
        self.steps.append(step)
        self.snapshots.append(snapshot)
        if len(self.steps) > self.max_points:
            self.stride *= 2
            keep = [i for i, st in enumerate(self.steps) if st % self.stride == 0]
            self.steps = [self.steps[i] for i in keep]
            self.snapshots = [self.snapshots[i] for i in keep]


@dataclass(frozen=True)
class SimOptions:
    workload: GSPWorkload = field(default_factory=GSPWorkload)
    kv_pool_tokens: int = 5120
    # SGLang's sizing: max_running x (3 + 1) for V2 without overlap, the default mode
    mamba_slots: int = 64
    max_running_requests: int = 16
    rows: int | None = None  # rows of the request-to-token pool; None: max_running_requests + 4
    page_size: int = 1
    chunked_prefill_size: int | None = 256
    max_prefill_tokens: int = 2048
    overlap: bool = False
    radix_cache: bool = True
    hybrid: bool = True  # a Mamba pool (and the Mamba radix cache when radix_cache)
    mamba_layers: int = 2
    model: ModelKind = "hash"  # or "tiny-hybrid": the tiny hybrid model over the pools
    # The Mamba radix cache's strategy: "extra_buffer" (V2) is what a Qwen3-Next deployment runs
    # (any page size, overlap); "no_buffer" (V1) needs page size 1.
    mamba_strategy: MambaSchedulerStrategy = "extra_buffer"
    mamba_track_interval: int = 256
    mamba_chunk_size: int | None = None  # None: the FLA kernel's 64
    max_steps: int = 200_000
    # Closed-loop arrivals: while this many requests wait, no new ones arrive (None: arrivals never
    # pause, as bench_serving's generated-shared-prefix run). A long steady run uses it to keep the
    # queue, and so the memory it needs, bounded.
    max_waiting: int | None = None
    # Speculative decoding (EAGLE/MTP, spec/speculative.md): K drafts per verify (0: off), the draft tree's
    # topk, and the acceptance distribution: each draft accepted with this probability if every earlier
    # one was (seeded by the workload's seed).
    speculative: int = 0
    speculative_topk: int = 1
    speculative_accept_rate: float = 0.7
    # A fault soak (kvledger.sim.faults): per step, the probability of an injected allocation failure and
    # of a client abort (seeded by the workload's seed).
    alloc_fault_rate: float = 0.0
    abort_rate: float = 0.0

    def fault_driver(self) -> FaultDriver:
        return FaultDriver(self.alloc_fault_rate, self.abort_rate, self.workload.seed)

    def speculative_config(self) -> SpeculativeConfig | None:
        k = self.speculative
        if k == 0:
            return None
        return SpeculativeConfig(
            num_steps=k,
            topk=self.speculative_topk,
            num_draft_tokens=k + 1,
            accept_rate=self.speculative_accept_rate,
            seed=self.workload.seed,
        )
    # The checking level the engine is built at (spec/checking-levels.md); None: the process's level.
    checks: CheckLevel | None = None

    def engine_spec(self) -> EngineSpec:
        wl = self.workload
        tree: TreeKind = "none"
        if self.radix_cache:
            tree = "mamba_radix" if self.hybrid else "radix"
        return EngineSpec(
            page_size=self.page_size,
            tree=tree,
            hybrid=self.hybrid,
            kv_tokens=self.kv_pool_tokens,
            rows=self.rows if self.rows is not None else self.max_running_requests + 4,
            mamba_slots=self.mamba_slots,
            mamba_layers=self.mamba_layers,
            max_running=self.max_running_requests,
            chunk=self.chunked_prefill_size,
            max_prefill=self.max_prefill_tokens,
            overlap=self.overlap,
            max_context_len=wl.system_prompt_len + wl.question_len + wl.output_len + 16,
            model=self.model,
            vocab_size=wl.vocab_size,
            mamba_strategy=self.mamba_strategy if tree == "mamba_radix" else "no_buffer",
            mamba_track_interval=self.mamba_track_interval,
            mamba_chunk_size=self.mamba_chunk_size,
            speculative=self.speculative_config(),
            checks=self.checks,
        )


@dataclass
class SimResult:
    options: dict[str, Any]
    contracts: bool
    steps: int
    wall_s: float
    steps_per_s: float
    requests: int
    finished: int
    aborted: int
    rejected: int
    reject_reasons: dict[str, int]
    prompt_tokens: int
    cached_prompt_tokens: int
    prefix_hit_rate: float
    generated_tokens: int
    retractions: int
    rollbacks: int
    prefill_batches: int
    decode_batches: int
    contract_checks: int
    idle_checks: int
    # Contracts on: violations found (0 or 1: the run stops at the first). Contracts off: None, because
    # a build without contracts does not look for them; the count identities it still checks report
    # in their own category below.
    violations: int | None
    violation: str | None
    peak_use: dict[str, float]
    # Mamba V2: captures planned, donations to the tree, donations skipped (no replacement slot)
    mamba_tracking: dict[str, int] | None
    timeline: list[dict[str, dict[str, int]]] = field(repr=False)
    timeline_steps: list[int] = field(default_factory=list, repr=False)  # the step of each snapshot
    count_checks: int = 0  # contracts off: steps after which the count identities were checked
    identity_failures: int = 0  # contracts off: count identity failures found (0 or 1: the run stops)
    identity_failure: str | None = None
    failed_at_step: int | None = None  # the step the run stopped at on a violation or identity failure
    units: dict[str, str] = field(default_factory=dict)  # per pool: what its terms count (tokens, rows, slots)
    speculative: dict[str, Any] | None = None  # speculative decoding's figures (None: off)
    checks: str = ""  # the checking level the engine ran at (release, owners, ledger, full)
    faults: dict[str, int] = field(default_factory=dict)  # a fault soak's injections (kvledger.sim.faults)

    @property
    def failed(self) -> bool:
        """A check failed: a contract violation, or a count identity failure with contracts off."""
        return bool(self.violations) or bool(self.identity_failures)

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("timeline")
        out.pop("timeline_steps")
        return out


def recordable(spec: EngineSpec) -> EngineSpec:
    """``spec`` with pools a recorder can observe: real ledgers, so at least the level ``ledger`` (a
    recorded run reads every move from them; below it the pools keep no moves to read)."""
    return replace(spec, checks=max(switch.building_level(spec.checks), CheckLevel.LEDGER))


def run_simulation(
    opts: SimOptions,
    progress: Callable[[int, int], None] | None = None,
    *,
    record: IO[str] | None = None,
    build: Callable[[EngineSpec], Any] = build_engine,
) -> SimResult:
    """Run the workload to completion; a ContractViolation is caught and reported, not hidden.

    ``record``: write the run's event log there (``kvledger simulate --record``; ``spec/event-log.md``).
    ``build``: the engine's builder (``kvledger simulate --hicache``: the host tier's, kvledger/sim/hicache.py).
    The pools then carry real ledgers whatever the contracts switch says: the recorder observes them.
    """
    if record is None:
        sched = build(opts.engine_spec())
        recorder = None
    else:
        sched = build(recordable(opts.engine_spec()))
        recorder = Recorder(sched, record, source=f"kvledger simulate {options_dict(opts)}")
    arrivals = opts.workload.stream()  # built lazily: a long run does not hold every prompt
    total = opts.workload.total
    timeline = Timeline()
    peak: dict[str, float] = {}
    violation: str | None = None
    identity_failure: str | None = None
    failed_at: int | None = None
    faults = opts.fault_driver()
    start = time.perf_counter()
    next_arrival = 0
    try:
        while next_arrival < total or sched.has_work():
            room = opts.workload.arrivals_per_step
            if opts.max_waiting is not None:
                room = min(room, max(0, opts.max_waiting - len(sched.waiting)))
            for rid, prompt, max_new in itertools.islice(arrivals, room):
                sched.add_request(rid, prompt, max_new)
            next_arrival = min(total, next_arrival + room)
            if faults.active:
                faults.before_step([sched], abort_in=sched)
            sched.step()
            update_peak(peak, sched.accounting.free_terms())
            if timeline.wants(sched.step_no):
                timeline.add(sched.step_no, sched.accounting.snapshot())
            if progress is not None:
                progress(sched.ended_count(), total)
            if sched.step_no >= opts.max_steps:
                raise ContractViolation(f"liveness: not drained after {opts.max_steps} steps")
        if switch.ENABLED:
            sched.accounting.check_quiescent()
    except IdentityFailure as exc:
        identity_failure, failed_at = str(exc), sched.step_no
    except ContractViolation as exc:
        violation, failed_at = str(exc), sched.step_no
    except OWNERSHIP_REFUSALS as exc:  # the engine's own call refused (from owners up): a bug it made
        violation, failed_at = f"{type(exc).__name__} (the engine's own call): {exc}", sched.step_no
    # Closed (the log's end written) only when the run ended or stopped on what it found: on any other
    # exception (Ctrl-C, bad input) the log is cut off, and the caller discards it (kvledger.cli.output).
    if recorder is not None:
        recorder.close("violation" if failed_at is not None else None)  # None: completed, or stopped
    if failed_at is not None:
        _last_snapshot(timeline, sched)
    wall = time.perf_counter() - start
    return _sim_result(
        opts, sched, faults, wall=wall, peak=peak, timeline=timeline, violation=violation,
        identity_failure=identity_failure, failed_at=failed_at,
    )  # fmt: skip


def _sim_result(
    opts: SimOptions,
    sched: Any,
    faults: FaultDriver,
    *,
    wall: float,
    peak: dict[str, float],
    timeline: Timeline,
    violation: str | None,
    identity_failure: str | None,
    failed_at: int | None,
) -> SimResult:
    """The summary of a finished (or stopped) run: the scheduler's counters and what the checks found."""
    st = sched.stats
    level = switch.LEVEL if opts.checks is None else opts.checks
    return SimResult(
        options=options_dict(opts),
        contracts=switch.ENABLED,
        checks=level.label,
        steps=sched.step_no,
        wall_s=round(wall, 3),
        steps_per_s=round(sched.step_no / wall, 1) if wall > 0 else 0.0,
        requests=opts.workload.total,
        finished=st.finished,
        aborted=st.aborts,
        rejected=st.rejections,
        reject_reasons=dict(st.reject_reasons),
        prompt_tokens=st.prompt_tokens,
        cached_prompt_tokens=st.cached_prompt_tokens,
        prefix_hit_rate=round(st.cached_prompt_tokens / st.prompt_tokens, 4) if st.prompt_tokens else 0.0,
        generated_tokens=st.generated_tokens,
        retractions=st.retractions,
        rollbacks=st.rollbacks,
        prefill_batches=st.prefill_batches,
        decode_batches=st.decode_batches,
        contract_checks=st.busy_checks,
        idle_checks=st.idle_checks,
        # At release nothing looks for violations (None), unless a ledger (--record) found one.
        violations=int(violation is not None) if level.tracks_owners or violation else None,
        violation=violation,
        peak_use=peak,
        mamba_tracking=None if sched.memory.tracking is None else dict(sched.memory.tracking.stats),
        timeline=timeline.snapshots,
        timeline_steps=timeline.steps,
        count_checks=st.count_checks,
        identity_failures=int(identity_failure is not None),
        identity_failure=identity_failure,
        failed_at_step=failed_at,
        units=sched.accounting.units(),
        speculative=_speculative_summary(sched),
        faults={
            "alloc_faults_planned": faults.faults_planned,
            "alloc_faults_fired": sched.faults.fired,
            "aborts_sent": faults.aborts_sent,
        },
    )


OWNERSHIP_REFUSALS = (ForeignSlot, DoubleFree, DuplicateIds)
"""Errors a pool raises when a caller names ids it does not hold: in a run, the caller is the engine."""


def _speculative_summary(sched: Any) -> dict[str, Any] | None:
    """Accepted tokens per step (drafts + the bonus token, per request and verify), the acceptance counts
    drawn, and the over-allocation: its peak over the verifies and the rejected tails given back."""
    spec = sched.speculative
    if spec is None:
        return None
    st = spec.stats
    steps = st.request_steps
    return {
        "num_draft_tokens": spec.config.num_draft_tokens,
        "topk": spec.config.topk,
        "accept_rate": spec.config.accept_rate,
        "reserve_tokens": spec.reserve,
        "verify_batches": st.verify_batches,
        "request_steps": steps,
        "accepted_tokens_per_step": round(st.tokens_per_step, 4),
        "accepted_drafts_per_step": round(st.drafts_accepted / steps, 4) if steps else 0.0,
        "accept_histogram": {str(k): v for k, v in sorted(st.accept_histogram.items())},
        "over_allocation_peak_tokens": st.over_allocation_peak,
        "rejected_tail_freed_tokens": st.tail_freed_tokens,
        "decode_captures": st.captures,
    }


def _last_snapshot(timeline: Timeline, sched: Any) -> None:
    """The terms at the step a check failed on, so the plot reaches the failure (best effort: terms that
    cannot be computed any more, say a request whose lengths are out of order, leave the timeline as is)."""
    if timeline.steps and timeline.steps[-1] == sched.step_no:
        return
    try:
        snap = sched.accounting.snapshot()
    except ContractViolation:
        return
    timeline.steps.append(sched.step_no)
    timeline.snapshots.append(snap)


def options_dict(opts: SimOptions) -> dict[str, Any]:
    """The run's options as its JSON summary and event-log header name them (the workload's fields
    inline; the checking level reported on its own). The PD simulation reports its base run's the same way."""
    d = asdict(opts)
    d.update(d.pop("workload"))
    del d["checks"]  # reported on its own (SimResult.checks)
    if d["max_waiting"] is None:  # open-loop arrivals (the default): the summary reads as it always did
        del d["max_waiting"]
    return d


def update_peak(peak: dict[str, float], free_terms: dict[str, tuple[int, int]]) -> None:
    """Per pool, the largest fraction of the pool that was not free at a step boundary (running max)."""
    for pool, (size, free) in free_terms.items():
        peak[pool] = max(peak.get(pool, 0.0), round((size - free) / size, 4))
