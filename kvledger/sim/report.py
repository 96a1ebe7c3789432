"""The simulation's outputs for people: a summary table (rich) and the ledger timeline plot (matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from kvledger.contracts.levels import LEVEL_DOCS, CheckLevel, parse_level
from kvledger.contracts.owners import PD_ACCOUNTS, STANDARD_ACCOUNTS
from kvledger.sim.simulate import SimResult

if TYPE_CHECKING:  # pragma: no cover
    from kvledger.sim.pd import PDSimResult

_COLOURS = {
    "free": "#d9d9d9",
    "pending_free": "#bdbdbd",
    "cache.evictable": "#8ecae6",
    "cache.protected": "#219ebc",
    "req.waiting": "#ffb703",
    "req.chunked": "#fb8500",
    "req.running": "#e63946",
    "batch.inflight": "#6a4c93",
    "pd.prefill.bootstrap": "#c7e9c0",
    "pd.prefill.inflight": "#41ab5d",
    "pd.prefill.lease": "#005a32",
    "pd.decode.prealloc": "#dadaeb",
    "pd.decode.transfer": "#9e9ac8",
    "pd.decode.waiting": "#6a51a3",
    "pd.decode.retracted": "#fdae6b",
    "pd.decode.lease": "#3f007d",
}


def summary_table(result: SimResult) -> Table:
    t = Table(title="kvledger simulate", show_header=True, header_style="bold")
    t.add_column("metric", no_wrap=True)  # labels stay whole; a long value wraps on a narrow terminal
    t.add_column("value", justify="right")
    rows = [
        (
            "requests (finished / aborted / rejected)",
            f"{result.requests} ({result.finished} / {result.aborted} / {result.rejected})",
        ),
        *[(f"  rejected: {reason}", f"{n}") for reason, n in sorted(result.reject_reasons.items())],
        ("scheduler steps", f"{result.steps}"),
        ("steps/s", f"{result.steps_per_s}"),
        ("prefill / decode batches", f"{result.prefill_batches} / {result.decode_batches}"),
        ("prompt tokens (cached)", f"{result.prompt_tokens:,} ({result.cached_prompt_tokens:,})"),
        ("prefix hit rate (cached / prompt tokens)", f"{result.prefix_hit_rate:.1%}"),
        ("generated tokens", f"{result.generated_tokens}"),
        ("retractions", f"{result.retractions}"),
        ("admission rollbacks", f"{result.rollbacks}"),
        *_fault_rows(result.faults),
        *[(f"peak use: {pool}", f"{use:.1%}") for pool, use in result.peak_use.items()],
        *_tracking_rows(result),
        *_speculative_rows(result),
        *_check_rows(result),
        ("wall time", f"{result.wall_s:.2f} s"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _fault_rows(faults: Mapping[str, int]) -> list[tuple[str, str]]:
    """A fault soak's injections (kvledger.sim.faults); nothing when none were asked for."""
    rows = []
    if faults.get("alloc_faults_planned"):
        planned, fired = faults["alloc_faults_planned"], faults["alloc_faults_fired"]
        rows.append(("allocation faults (planned / fired)", f"{planned} / {fired}"))
    if faults.get("aborts_sent"):
        rows.append(("client aborts injected", f"{faults['aborts_sent']}"))
    return rows


def _tracking_rows(result: SimResult) -> list[tuple[str, str]]:
    """The Mamba cache's strategy and, under V2, what its tracking did."""
    opts = result.options
    if not opts.get("hybrid") or not opts.get("radix_cache"):
        return []
    t = result.mamba_tracking
    if t is None:
        return [("Mamba radix cache", "V1 no_buffer")]
    return [
        ("Mamba radix cache", "V2 extra_buffer"),
        ("  track interval (tokens)", f"{opts['mamba_track_interval']}"),
        ("  states captured (at branching)", f"{t['captures']} ({t['branching_captures']})"),
        ("  states donated (skipped)", f"{t['donations']} ({t['donations_skipped']})"),
    ]


def _speculative_rows(result: SimResult) -> list[tuple[str, str]]:
    """Speculative decoding: accepted tokens per step and the over-allocation's peak."""
    sp = result.speculative
    if sp is None:
        return []
    hist = ", ".join(f"{k}: {v}" for k, v in sp["accept_histogram"].items())
    drafts = sp["num_draft_tokens"] - 1
    rows = [
        ("speculative decoding", f"{drafts} drafts, topk {sp['topk']}, accept rate {sp['accept_rate']}"),
        ("  accepted tokens per step (drafts + bonus)", f"{sp['accepted_tokens_per_step']:.2f}"),
        ("  drafts accepted per verify (count: verifies)", hist or "-"),
        (
            "  over-allocation peak (tokens; reserve per request)",
            f"{sp['over_allocation_peak_tokens']} ({sp['reserve_tokens']})",
        ),
        ("  rejected tail given back (tokens)", f"{sp['rejected_tail_freed_tokens']}"),
    ]
    if result.mamba_tracking is not None:
        rows.append(("  decode captures (at accepted positions)", f"{sp['decode_captures']}"))
    return rows


def run_level(result: Any) -> CheckLevel:
    """The level a run's engine was built at (``checks``), or what its contracts switch implies."""
    if result.checks:
        return parse_level(result.checks)
    return CheckLevel.FULL if result.contracts else CheckLevel.RELEASE


def level_row(result: Any) -> tuple[str, str]:
    level = run_level(result)
    return ("checking level", f"{level.label}: {LEVEL_DOCS[level].short}")


def _check_rows(result: SimResult) -> list[tuple[str, str]]:
    """The checking level, what was checked and what failed: a level says what it did not look for."""
    level = run_level(result)
    rows = [level_row(result)]
    if result.contracts:
        return [
            *rows,
            ("contract checks run (busy / idle)", f"{result.contract_checks} / {result.idle_checks}"),
            ("violations", f"{result.violations}"),
        ]
    rows += [
        ("count identity checks run", f"{result.count_checks}"),
        ("count identity failures", f"{result.identity_failures}"),
    ]
    if level.tracks_owners or result.violations is not None:
        what = "every move checked" if level.keeps_history else "every call naming ids checked against its owner"
        rows.append(("violations", f"{result.violations or 0} ({what})"))
    else:
        rows.append(("violations", "not looked for (release knows no owner per id)"))
    return rows


def print_summary(result: SimResult, console: Console | None = None) -> None:
    console = console or Console()
    console.print(summary_table(result))
    if result.violation:
        console.print(f"[bold red]ContractViolation[/bold red] at step {result.failed_at_step}")
        console.print(result.violation, markup=False, highlight=False)
    if result.identity_failure:
        console.print(f"[bold red]Count identity failure[/bold red] at step {result.failed_at_step}")
        console.print(result.identity_failure, markup=False, highlight=False)


def plot_timeline(result: SimResult, path: Path) -> Path:
    """Per pool, stacked areas of the identity's terms over the steps; the stack reaches the pool size.

    Each pool's axis is in its own unit (tokens, rows, slots). An account is drawn when it holds ids at
    some sampled step: ``pending_free`` (freed inside an open free group) would be its own area, but the
    reference scheduler closes every free group within the step, so a simulate timeline never shows it.
    The step a check failed at is marked on every axis with a red line. Written whether or not the run
    stopped on a violation: the timeline then ends at the failing step.
    """
    failure = None
    if result.failed_at_step is not None:
        failure = (
            result.failed_at_step,
            "contract violation" if result.violation else "count identity failure",
        )
    return _plot_timeline(
        result.timeline,
        path,
        "kvledger ledger timeline",
        result.timeline_steps,
        units=result.units,
        failure=failure,
    )


def _plot_timeline(
    timeline: list[dict[str, dict[str, int]]],
    path: Path,
    title: str,
    steps_taken: list[int] | None = None,
    *,
    units: dict[str, str] | None = None,
    failure: tuple[int, str] | None = None,
) -> Path:
    """Stacked areas per pool; ``steps_taken`` are the steps the samples were taken at (default 1, 2, ...);
    ``units`` names each pool's unit on its axis; ``failure`` (step, what) draws a red line at that step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pools = list(timeline[0].keys()) if timeline else []
    fig, axes = plt.subplots(
        len(pools) or 1, 1, figsize=(11, 2.8 * max(1, len(pools))), sharex=True, squeeze=False
    )
    steps = list(steps_taken) if steps_taken else list(range(1, len(timeline) + 1))
    order = [a.name for a in (*STANDARD_ACCOUNTS, *PD_ACCOUNTS)]
    for ax, pool in zip(axes[:, 0], pools, strict=False):
        series_names = [n for n in order if any(s[pool].get(n, 0) for s in timeline)]
        extra = sorted({k for s in timeline for k in s[pool] if k not in order and k != "size"})
        series_names += extra
        values = [[s[pool].get(n, 0) for s in timeline] for n in series_names]
        ax.stackplot(
            steps,
            values,
            labels=series_names,
            colors=[_COLOURS.get(n, "#999999") for n in series_names],
            linewidth=0,
        )
        size = timeline[0][pool]["size"]
        ax.axhline(size, color="black", linewidth=0.8, linestyle="--")
        ax.set_ylabel(f"{pool} ({(units or {}).get(pool, 'ids')})")  # "ids" only for a pool of unknown unit
        ax.set_ylim(0, size * 1.03)
        if failure is not None:
            ax.axvline(failure[0], color="#d00000", linewidth=1.4, label=f"{failure[1]} (step {failure[0]})")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("scheduler step")
    suptitle = f"{title}: every slot's account per step (dashed: pool size)"
    if failure is not None:
        suptitle += f"\nstopped at step {failure[0]}: {failure[1]}"
    fig.suptitle(suptitle)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- PD
def pd_summary_tables(result: PDSimResult) -> list[Table]:
    """The run's totals, then one column per instance (transfers, failures, retries, aborts by stage)."""
    top = Table(title="kvledger simulate --pd", show_header=True, header_style="bold")
    top.add_column("metric", no_wrap=True)
    top.add_column("value", justify="right")
    for k, v in [
        (
            "requests (finished / aborted / rejected, decode side)",
            f"{result.requests} ({result.finished} / {result.aborted} / {result.rejected})",
        ),
        ("system steps", f"{result.steps}"),
        ("steps/s", f"{result.steps_per_s}"),
        ("generated tokens", f"{result.generated_tokens}"),
        ("prefix hit rate (prefill)", f"{result.prefix_hit_rate:.1%}"),
        ("channel messages", _fmt(result.channel["messages"])),
        ("channel faults", _fmt(result.channel["faults"])),
        ("abort acknowledgements", f"{result.channel['abort_acks']}"),
        (
            "aborts drained (longest / bound, steps)",
            f"{result.drained_aborts} ({result.longest_drain} / {result.drain_bound})",
        ),
        *_fault_rows(result.faults),
        level_row(result),
        ("violations", f"{result.violations}"),
        ("wall time", f"{result.wall_s:.2f} s"),
    ]:
        top.add_row(k, v)
    per = Table(title="per instance", show_header=True, header_style="bold")
    per.add_column("metric", no_wrap=True)
    names = list(result.instances)
    for name in names:
        per.add_column(name, justify="right")
    rows: list[tuple[str, object]] = [
        ("transfers (started / succeeded)", lambda s: f"{s.transfers_started} / {s.transfers_succeeded}"),
        ("room failures", lambda s: _fmt(s.failures)),
        ("retries (waited for a row, slot or memory)", lambda s: f"{s.retries}"),
        ("aborts by stage", lambda s: _fmt(s.aborts_by_stage)),
        ("leases (longest, steps)", lambda s: f"{s.leases} ({s.longest_lease})"),
        ("retractions / resumes", lambda s: f"{s.retractions} / {s.resumes}"),
        ("prefix hits (tokens not transferred)", lambda s: f"{s.prefix_hits} ({s.prefix_tokens})"),
        ("prefill / decode batches", lambda s: f"{s.prefill_batches} / {s.decode_batches}"),
        ("busy checks", lambda s: f"{s.contract_checks}"),
        ("peak use", lambda s: _fmt({k: f"{v:.0%}" for k, v in s.peak_use.items()})),
    ]
    for label, cell in rows:
        per.add_row(label, *[cell(result.instances[n]) for n in names])  # type: ignore[operator]
    return [top, per]


def _fmt(d: dict[str, object]) -> str:
    """A breakdown for a table cell: one ``key=value`` per line, so a run with many kinds of faults grows
    the table downwards, never into a line hundreds of characters wide (a log is not a terminal: the
    tables never wrap or cut a cell there)."""
    return "\n".join(f"{k}={v}" for k, v in d.items()) or "-"


def print_pd_summary(result: PDSimResult, console: Console | None = None) -> None:
    console = console or Console()
    for table in pd_summary_tables(result):
        console.print(table)
    if result.violation:
        console.print("[bold red]ContractViolation[/bold red]")
        console.print(result.violation, markup=False, highlight=False)


def pd_timeline_paths(path: Path) -> dict[str, Path]:
    """Where ``--pd`` writes its timelines: ``NAME.prefill.SUFFIX`` and ``NAME.decode.SUFFIX`` beside ``path``."""
    return {side: path.with_name(f"{path.stem}.{side}{path.suffix}") for side in ("prefill", "decode")}


def plot_pd_timelines(result: PDSimResult, paths: Mapping[str, Path]) -> list[Path]:
    """One timeline per instance, to ``paths[side]`` (:func:`pd_timeline_paths`), each axis in its pool's
    unit (tokens, rows, slots; the metadata pool's slots)."""
    return [
        _plot_timeline(
            timeline,
            paths[side],
            f"{side} instance",
            result.timeline_steps.get(side),
            units=result.units.get(side),
        )
        for side, timeline in result.timelines.items()
    ]
