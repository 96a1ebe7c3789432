"""The simulation's outputs for people: a summary table (rich) and the ledger timeline plot (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvledger.contracts.owners import STANDARD_ACCOUNTS
from kvledger.sim.simulate import SimResult

_COLOURS = {
    "free": "#d9d9d9",
    "pending_free": "#bdbdbd",
    "cache.evictable": "#8ecae6",
    "cache.protected": "#219ebc",
    "req.waiting": "#ffb703",
    "req.chunked": "#fb8500",
    "req.running": "#e63946",
    "batch.inflight": "#6a4c93",
}


def summary_table(result: SimResult) -> Table:
    t = Table(title="kvledger simulate", show_header=True, header_style="bold")
    t.add_column("metric")
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
        *[(f"peak use: {pool}", f"{use:.1%}") for pool, use in result.peak_use.items()],
        ("contracts", "on" if result.contracts else "off"),
        ("contract checks run (busy / idle)", f"{result.contract_checks} / {result.idle_checks}"),
        ("violations", f"{result.violations}"),
        ("wall time", f"{result.wall_s:.2f} s"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def print_summary(result: SimResult, console: Console | None = None) -> None:
    console = console or Console()
    console.print(summary_table(result))
    if result.violation:
        console.print("[bold red]ContractViolation[/bold red]")
        console.print(result.violation, markup=False, highlight=False)


def plot_timeline(result: SimResult, path: Path) -> Path:
    """Per pool, stacked areas of the identity's terms over the steps; the stack reaches the pool size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pools = list(result.timeline[0].keys()) if result.timeline else []
    fig, axes = plt.subplots(
        len(pools) or 1, 1, figsize=(11, 2.8 * max(1, len(pools))), sharex=True, squeeze=False
    )
    steps = result.timeline_steps or list(range(1, len(result.timeline) + 1))
    order = [a.name for a in STANDARD_ACCOUNTS]
    for ax, pool in zip(axes[:, 0], pools, strict=False):
        series_names = [n for n in order if any(s[pool].get(n, 0) for s in result.timeline)]
        extra = sorted({k for s in result.timeline for k in s[pool] if k not in order and k != "size"})
        series_names += extra
        values = [[s[pool].get(n, 0) for s in result.timeline] for n in series_names]
        ax.stackplot(
            steps,
            values,
            labels=series_names,
            colors=[_COLOURS.get(n, "#999999") for n in series_names],
            linewidth=0,
        )
        size = result.timeline[0][pool]["size"]
        ax.axhline(size, color="black", linewidth=0.8, linestyle="--")
        ax.set_ylabel(pool)
        ax.set_ylim(0, size * 1.03)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("scheduler step")
    fig.suptitle("kvledger ledger timeline: every slot's account per step (dashed: pool size)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
