"""The ``kvledger`` command: ``kvledger --version`` and ``kvledger simulate``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kvledger import __version__
from kvledger.contracts import switch


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvledger", description=__doc__)
    p.add_argument("--version", action="version", version=f"kvledger {__version__}")
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("simulate", help="run a generated-shared-prefix workload through the scheduler")
    g = s.add_argument_group("workload (after bench_serving --dataset generated-shared-prefix)")
    g.add_argument("--gsp-num-groups", type=int, default=8)
    g.add_argument("--gsp-prompts-per-group", type=int, default=16)
    g.add_argument("--gsp-system-prompt-len", type=int, default=512)
    g.add_argument("--gsp-question-len", type=int, default=128)
    g.add_argument("--gsp-output-len", type=int, default=96)
    g.add_argument("--arrivals-per-step", type=int, default=4)
    m = s.add_argument_group("memory and scheduling")
    m.add_argument("--kv-pool-tokens", type=int, default=5120)
    m.add_argument("--mamba-slots", type=int, default=24)
    m.add_argument("--max-running-requests", type=int, default=16)
    m.add_argument("--page-size", type=int, default=1)
    m.add_argument("--chunked-prefill-size", type=int, default=256, help="0 disables chunking")
    m.add_argument("--max-prefill-tokens", type=int, default=2048)
    m.add_argument("--overlap", action="store_true", help="process results one step late (overlap scheduler)")
    m.add_argument("--no-radix-cache", action="store_true")
    m.add_argument("--no-mamba", action="store_true", help="attention-only model: no Mamba pool")
    m.add_argument(
        "--model",
        choices=["hash", "tiny-hybrid"],
        default="hash",
        help="next-token source: a deterministic hash, or the tiny hybrid model over the pools",
    )
    o = s.add_argument_group("run")
    o.add_argument(
        "--contracts",
        choices=["on", "off"],
        default=None,
        help="override KVLEDGER_CONTRACTS (re-executes the process with it set)",
    )
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    o.add_argument("--plot", type=Path, default=Path("out/ledger_timeline.png"), help="timeline PNG path")
    o.add_argument("--no-plot", action="store_true")
    o.add_argument("--no-progress", action="store_true")
    return p


def _reexec_with_contracts(value: str) -> None:
    """Contracts are fixed at import: switching them means a new process with the env var set."""
    env = dict(os.environ, **{switch.ENV_VAR: "1" if value == "on" else "0"})
    args = [a for a in sys.argv[1:]]
    i = args.index("--contracts")
    del args[i : i + 2]
    os.execvpe(sys.executable, [sys.executable, "-m", "kvledger", *args], env)


def _simulate(ns: argparse.Namespace) -> int:
    if ns.contracts is not None and (ns.contracts == "on") != switch.ENABLED:
        _reexec_with_contracts(ns.contracts)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvledger.sim.report import plot_timeline, print_summary
    from kvledger.sim.simulate import SimOptions, run_simulation
    from kvledger.sim.workload import GSPWorkload

    workload = GSPWorkload(
        num_groups=ns.gsp_num_groups,
        prompts_per_group=ns.gsp_prompts_per_group,
        system_prompt_len=ns.gsp_system_prompt_len,
        question_len=ns.gsp_question_len,
        output_len=ns.gsp_output_len,
        arrivals_per_step=ns.arrivals_per_step,
        seed=ns.seed,
    )
    opts = SimOptions(
        workload=workload,
        kv_pool_tokens=ns.kv_pool_tokens,
        mamba_slots=ns.mamba_slots,
        max_running_requests=ns.max_running_requests,
        page_size=ns.page_size,
        chunked_prefill_size=ns.chunked_prefill_size or None,
        max_prefill_tokens=ns.max_prefill_tokens,
        overlap=ns.overlap,
        radix_cache=not ns.no_radix_cache,
        hybrid=not ns.no_mamba,
        model=ns.model,
    )
    console = Console(stderr=ns.json)
    show_progress = not ns.no_progress and not ns.json
    if show_progress:
        with Progress(
            TextColumn("simulate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as bar:
            task = bar.add_task("requests", total=workload.num_groups * workload.prompts_per_group)
            result = run_simulation(opts, progress=lambda done, total: bar.update(task, completed=done))
    else:
        result = run_simulation(opts)
    plot_path = None if ns.no_plot else plot_timeline(result, ns.plot)
    if ns.json:
        out = result.summary()
        out["plot"] = str(plot_path) if plot_path else None
        print(json.dumps(out))
    else:
        print_summary(result, console)
        if plot_path:
            console.print(f"ledger timeline written to {plot_path}")
    return 1 if result.violations else 0


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.command == "simulate":
        return _simulate(ns)
    _parser().print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
