"""``kvledger simulate --pd``: the same workload through a prefill instance, a decode instance and a
faulty channel, with a summary per instance and a ledger timeline per instance.

Both instances get the pool sizes of :class:`~kvledger.sim.simulate.SimOptions` (the decode instance
sized by I-SIZING on top: ``max_running + pre_alloc`` rows, a Mamba pool covering them). Random faults
(``fault_rate``: each message and handshake draws drop / delay / fail / timeout with that probability)
and random client aborts (``abort_rate``: each step, with that probability, one live request is aborted
at a random side) are seeded by the workload seed. ``decode_radix_cache`` gives the decode instance a
radix cache (``PDSpec.decode_radix_cache``; a hybrid model needs page size 1 for it).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import IO, Any

from kvledger.audit.pd_record import PDRecorder
from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.reference.disagg import DECODE, PREFILL, ChannelConfig, PDScheduler, PDSpec, PDSystem, build_pd
from kvledger.sim.simulate import SimOptions, Timeline, options_dict, recordable, update_peak


@dataclass(frozen=True)
class PDSimOptions:
    base: SimOptions = field(default_factory=SimOptions)
    fault_rate: float = 0.0
    abort_rate: float = 0.0
    latency: int = 1
    transfer_timeout: int = 64
    decode_radix_cache: bool = False  # ``--pd-decode-cache``: a radix cache on the decode instance too

    def spec(self) -> PDSpec:
        engine = self.base.engine_spec()
        channel = ChannelConfig(
            latency=self.latency,
            transfer_timeout=self.transfer_timeout,
            bootstrap_timeout=max(24, 4 * self.latency),
            fault_rate=self.fault_rate,
            seed=self.base.workload.seed,
        )
        decode = replace(engine, tree="none", chunk=None)
        return PDSpec(prefill=engine, decode=decode, channel=channel, decode_radix_cache=self.decode_radix_cache)


@dataclass
class InstanceSummary:
    """One instance's counts for the report."""

    transfers_started: int
    transfers_succeeded: int
    failures: dict[str, int]
    retries: int
    aborts_by_stage: dict[str, int]
    leases: int
    longest_lease: int
    resumes: int
    prefix_hits: int  # decode radix cache: pre-allocations that matched a cached prefix
    prefix_tokens: int  # ... and the positions they did not need transferred
    retractions: int
    prefill_batches: int
    decode_batches: int
    contract_checks: int
    peak_use: dict[str, float]

    @staticmethod
    def of(inst: PDScheduler, peak_use: dict[str, float]) -> InstanceSummary:
        st, pd = inst.stats, inst.pd_stats
        return InstanceSummary(
            transfers_started=pd.transfers_started,
            transfers_succeeded=pd.transfers_succeeded,
            failures=dict(pd.failures),
            retries=pd.retries,
            aborts_by_stage=dict(pd.aborts_by_stage),
            leases=pd.leases,
            longest_lease=pd.longest_lease,
            resumes=pd.resumes,
            prefix_hits=pd.prefix_hits,
            prefix_tokens=pd.prefix_tokens,
            retractions=st.retractions,
            prefill_batches=st.prefill_batches,
            decode_batches=st.decode_batches,
            contract_checks=st.busy_checks,
            peak_use=peak_use,
        )


@dataclass
class PDSimResult:
    options: dict[str, Any]
    contracts: bool
    steps: int
    wall_s: float
    steps_per_s: float
    requests: int
    finished: int
    aborted: int
    rejected: int
    generated_tokens: int
    prefix_hit_rate: float
    instances: dict[str, InstanceSummary]
    channel: dict[str, Any]
    drained_aborts: int
    longest_drain: int
    drain_bound: int
    violations: int
    violation: str | None
    timelines: dict[str, list[dict[str, dict[str, int]]]] = field(repr=False)
    timeline_steps: dict[str, list[int]] = field(default_factory=dict, repr=False)  # the step of each snapshot
    units: dict[str, dict[str, str]] = field(default_factory=dict)  # per instance, per pool: what its terms count
    checks: str = ""  # the checking level the instances ran at (release, owners, ledger, full)
    faults: dict[str, int] = field(default_factory=dict)  # a fault soak's injections (kvledger.sim.faults)

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("timelines")
        out.pop("timeline_steps")
        return out


def run_pd_simulation(
    opts: PDSimOptions,
    progress: Callable[[int, int], None] | None = None,
    *,
    record: Mapping[str, IO[str]] | None = None,
) -> PDSimResult:
    """Run the workload through both instances to completion; a violation is reported, not hidden.

    ``record``: write each instance's event log to ``record["prefill"]`` / ``record["decode"]``
    (``kvledger simulate --pd --record``; :class:`kvledger.audit.PDRecorder`). The pools then carry real
    ledgers whatever the contracts switch says: the recorders observe them."""
    recorder = None
    if record is None:
        system = build_pd(opts.spec())
    else:
        spec = opts.spec()
        system = build_pd(replace(spec, prefill=recordable(spec.prefill), decode=recordable(spec.decode)))
        recorder = PDRecorder(system, record, source=f"kvledger simulate --pd {options_dict(opts.base)}")
    arrivals = opts.base.workload.stream()
    total = opts.base.workload.total
    rng = random.Random(opts.base.workload.seed + 1)
    timelines = {PREFILL: Timeline(), DECODE: Timeline()}
    peaks: dict[str, dict[str, float]] = {PREFILL: {}, DECODE: {}}
    violation: str | None = None
    start = time.perf_counter()
    next_arrival = 0
    per_step = opts.base.workload.arrivals_per_step
    faults = opts.base.fault_driver()
    try:
        while next_arrival < total or system.has_work():
            for rid, prompt, max_new in itertools.islice(arrivals, per_step):
                system.add_request(rid, prompt, max_new)
            next_arrival = min(total, next_arrival + per_step)
            if opts.abort_rate and rng.random() < opts.abort_rate:
                _abort_one(system, rng)
            if faults.active:
                faults.before_step([system.prefill, system.decode])
            system.step()
            for side, inst in ((PREFILL, system.prefill), (DECODE, system.decode)):
                update_peak(peaks[side], inst.accounting.free_terms())
                if timelines[side].wants(system.step_no):
                    timelines[side].add(system.step_no, inst.accounting.snapshot())
            if progress is not None:
                progress(sum(d.state.is_done for _, d in system.pairs.values()), total)
            if system.step_no >= opts.base.max_steps:
                raise ContractViolation(f"I-LIVENESS: not drained after {opts.base.max_steps} steps")
        if switch.ENABLED:
            system.check_quiescent()
    except ContractViolation as exc:
        violation = str(exc)
    # Closed (each log's end written) only when the run ended or stopped on what it found; on any other
    # exception the logs are cut off and the caller discards them (kvledger.cli.output).
    if recorder is not None:
        recorder.close("violation" if violation is not None else None)
    wall = time.perf_counter() - start
    return _pd_result(opts, system, faults, wall=wall, peaks=peaks, timelines=timelines, violation=violation)


def _pd_result(
    opts: PDSimOptions,
    system: PDSystem,
    faults: Any,
    *,
    wall: float,
    peaks: dict[str, dict[str, float]],
    timelines: dict[str, Timeline],
    violation: str | None,
) -> PDSimResult:
    """The summary of a finished (or stopped) PD run: both instances, the channel, what the checks found."""
    total = opts.base.workload.total
    decode_states = [d.state.value for _, d in system.pairs.values()]
    p_stats = system.prefill.stats
    ch = system.channel.stats
    return PDSimResult(
        options={**options_dict(opts.base), **{k: v for k, v in asdict(opts).items() if k != "base"}},
        contracts=switch.ENABLED,
        checks=(switch.LEVEL if opts.base.checks is None else opts.base.checks).label,
        faults={
            "alloc_faults_planned": faults.faults_planned,
            "alloc_faults_fired": system.prefill.faults.fired + system.decode.faults.fired,
        },
        steps=system.step_no,
        wall_s=round(wall, 3),
        steps_per_s=round(system.step_no / wall, 1) if wall > 0 else 0.0,
        requests=total,
        finished=decode_states.count("finished"),
        aborted=decode_states.count("aborted"),
        rejected=decode_states.count("rejected"),
        generated_tokens=sum(len(d.output_ids) for _, d in system.pairs.values()),
        prefix_hit_rate=(
            round(p_stats.cached_prompt_tokens / p_stats.prompt_tokens, 4) if p_stats.prompt_tokens else 0.0
        ),
        instances={
            PREFILL: InstanceSummary.of(system.prefill, peaks[PREFILL]),
            DECODE: InstanceSummary.of(system.decode, peaks[DECODE]),
        },
        channel={
            "rooms": ch.rooms_opened,
            "messages": {f"{c}.{o}": n for (c, o), n in sorted(ch.messages.items())},
            "faults": {f"{c}.{f}": n for (c, f), n in sorted(ch.faults.items())},
            "abort_acks": ch.acks,
            "retransmissions": ch.retransmissions,
        },
        drained_aborts=system.drained_aborts,
        longest_drain=system.longest_drain,
        drain_bound=system.channel.config.drain_bound,
        violations=int(violation is not None),
        violation=violation,
        timelines={side: t.snapshots for side, t in timelines.items()},
        timeline_steps={side: t.steps for side, t in timelines.items()},
        units={PREFILL: system.prefill.accounting.units(), DECODE: system.decode.accounting.units()},
    )


def _abort_one(system: PDSystem, rng: random.Random) -> None:
    live = [rid for rid, (p, d) in system.pairs.items() if not (p.state.is_done and d.state.is_done)]
    if live:
        system.abort(rng.choice(live), rng.choice([PREFILL, DECODE]))
