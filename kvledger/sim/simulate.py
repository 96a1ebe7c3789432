"""``kvledger simulate``: build the pools, the cache and the scheduler, run a workload, report.

The run records the identity's terms per pool after every step (the ledger timeline), which the
report turns into a table and a stacked-area plot whose stack always reaches the pool size.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.reference.engine import EngineSpec, ModelKind, TreeKind, build_engine
from kvledger.sim.workload import GSPWorkload


@dataclass(frozen=True)
class SimOptions:
    workload: GSPWorkload = field(default_factory=GSPWorkload)
    kv_pool_tokens: int = 5120
    mamba_slots: int = 24
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
    max_steps: int = 200_000

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
    violations: int
    violation: str | None
    peak_use: dict[str, float]
    timeline: list[dict[str, dict[str, int]]] = field(repr=False)

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("timeline")
        return out


def run_simulation(opts: SimOptions, progress: Callable[[int, int], None] | None = None) -> SimResult:
    """Run the workload to completion; a ContractViolation is caught and reported, not hidden."""
    sched = build_engine(opts.engine_spec())
    arrivals = opts.workload.requests()
    total = len(arrivals)
    timeline: list[dict[str, dict[str, int]]] = []
    violation: str | None = None
    start = time.perf_counter()
    next_arrival = 0
    try:
        while next_arrival < total or sched.has_work():
            for rid, prompt, max_new in arrivals[
                next_arrival : next_arrival + opts.workload.arrivals_per_step
            ]:
                sched.add_request(rid, prompt, max_new)
            next_arrival = min(total, next_arrival + opts.workload.arrivals_per_step)
            sched.step()
            timeline.append(sched.accounting.snapshot())
            if progress is not None:
                progress(len(sched.done), total)
            if sched.step_no >= opts.max_steps:
                raise ContractViolation(f"liveness: not drained after {opts.max_steps} steps")
        if switch.ENABLED:
            sched.accounting.check_quiescent()
    except ContractViolation as exc:
        violation = str(exc)
    wall = time.perf_counter() - start
    st = sched.stats
    states = [r.state.value for r in sched.requests.values()]
    return SimResult(
        options=_options_dict(opts),
        contracts=switch.ENABLED,
        steps=sched.step_no,
        wall_s=round(wall, 3),
        steps_per_s=round(sched.step_no / wall, 1) if wall > 0 else 0.0,
        requests=total,
        finished=states.count("finished"),
        aborted=states.count("aborted"),
        rejected=states.count("rejected"),
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
        violations=int(violation is not None),
        violation=violation,
        peak_use=_peak_use(timeline),
        timeline=timeline,
    )


def _options_dict(opts: SimOptions) -> dict[str, Any]:
    d = asdict(opts)
    d.update(d.pop("workload"))
    return d


def _peak_use(timeline: list[dict[str, dict[str, int]]]) -> dict[str, float]:
    """Per pool, the largest fraction of the pool that was not free at a step boundary."""
    peak: dict[str, float] = {}
    for snap in timeline:
        for pool, row in snap.items():
            used = (row["size"] - row["free"]) / row["size"]
            peak[pool] = max(peak.get(pool, 0.0), round(used, 4))
    return peak
