"""``kvledger simulate``: a generated-shared-prefix workload through the scheduler, ledger on every pool.

The parser is built without importing torch or the engine (``kvledger simulate --help`` is instant); the
run imports them. The checks made before the run are in :mod:`kvledger.cli.simulate_checks`; the output
files (``--record``, ``--plot``) are staged (:func:`kvledger.process.staged.staged`) and appear only when the
run has finished: Ctrl-C leaves none of them behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from kvledger.cli import simulate_hicache
from kvledger.cli.checks import add_checks_option, apply_checks
from kvledger.cli.options import UsageError, bounded_help, int_in, probability, usage_error
from kvledger.cli.output import console as make_console
from kvledger.cli.simulate_checks import check_options, record_paths
from kvledger.process.staged import staged

NAME = "simulate"
HELP = "run a generated-shared-prefix workload through the scheduler"
DESCRIPTION = (
    "Run a generated-shared-prefix workload (after SGLang's bench_serving) through the scheduler with the"
    " ledger on every pool; print a summary and write the ledger timeline. Every size option has a stated"
    " range: a value outside it is refused before anything is allocated."
)


# Every size option: (flag, metavar, lowest value, highest value, default, what it sets); --help shows the
# range and the default, and a value outside the range is refused while parsing, before anything is
# allocated. The highest values keep one run within a few GiB: the reference pools cost about 30 bytes
# per KV token, the request-to-token table 4 bytes per row and context token (products of sizes are
# bounded in kvledger.cli.simulate_checks).
# fmt: off
WORKLOAD_SIZES = (
    ("--gsp-num-groups", "N", 1, 2**20, 8, "groups sharing a system prompt"),
    ("--gsp-prompts-per-group", "N", 1, 2**20, 16, "requests per group"),
    ("--gsp-system-prompt-len", "TOKENS", 0, 2**20, 512, "tokens of the shared system prompt"),
    ("--gsp-question-len", "TOKENS", 0, 2**20, 128, "tokens of each request's own question"),
    ("--gsp-output-len", "TOKENS", 1, 2**20, 96, "new tokens per request"),
    ("--arrivals-per-step", "N", 1, 2**20, 4, "requests arriving per scheduler step"),
)
MEMORY_SIZES = (
    ("--kv-pool-tokens", "TOKENS", 1, 2**25, 5120, "KV pool size in tokens, a multiple of --page-size"),
    (
        "--mamba-slots", "SLOTS", 1, 2**16, 64,
        "Mamba state pool size in slots; SGLang sizes it as max running requests x 3, plus 1 per request for"
        " extra_buffer's tracking slot (2 with --overlap)",
    ),
    ("--req-pool-rows", "ROWS", 1, 2**16, None, "request-to-token pool size in rows"),
    ("--max-running-requests", "N", 1, 2**16, 16, "requests decoding at once"),
    (
        "--page-size", "TOKENS", 1, 2**12, 1,
        "tokens per KV page; > 1 with the Mamba radix cache needs --mamba-strategy extra_buffer",
    ),
    ("--chunked-prefill-size", "TOKENS", 0, 2**20, 256, "tokens per prefill chunk, 0 disables chunking"),
    ("--max-prefill-tokens", "TOKENS", 1, 2**20, 2048, "tokens per prefill batch"),
    (
        "--mamba-track-interval", "TOKENS", 1, 2**20, 256,
        "extra_buffer: decoding captures a state every TOKENS tokens, a multiple of --page-size",
    ),
    (
        "--mamba-chunk-size", "TOKENS", 1, 2**20, 64,
        "extra_buffer: the kernel chunk; prefill captures on a grid of max(TOKENS, --page-size)",
    ),
)
PD_SIZES = (
    ("--pd-latency", "STEPS", 1, 2**16, 1, "steps a transfer or control message takes"),
    (
        "--pd-transfer-timeout", "STEPS", 1, 2**20, 64,
        "steps without progress after which the decode side fails a transfer",
    ),
)
# fmt: on
SHOWN_DEFAULT = {"--req-pool-rows": "--max-running-requests + 4"}  # defaults computed from other options


def _add_sizes(group: Any, sizes: tuple[tuple[str, str, int, int, int | None, str], ...]) -> None:
    for flag, metavar, low, high, default, text in sizes:
        shown = SHOWN_DEFAULT.get(flag, "%(default)s")
        group.add_argument(
            flag,
            metavar=metavar,
            type=int_in(low, high),
            default=default,
            help=bounded_help(text, low, high, shown),
        )


def add_parser(sub: Any) -> None:
    s = sub.add_parser(NAME, help=HELP, description=DESCRIPTION)
    g = s.add_argument_group("workload (after bench_serving --dataset generated-shared-prefix)")
    _add_sizes(g, WORKLOAD_SIZES)
    _add_memory_options(s)
    _add_speculative_options(s)
    _add_fault_options(s)
    _add_pd_options(s)
    simulate_hicache.add_options(s)
    _add_run_options(s)


def _add_memory_options(s: Any) -> None:
    """``simulate``'s options for the pools, the cache and the model."""
    m = s.add_argument_group("memory and scheduling")
    _add_sizes(m, MEMORY_SIZES)
    m.add_argument("--overlap", action="store_true", help="process results one step late (overlap scheduler)")
    m.add_argument("--no-radix-cache", action="store_true", help="no prefix cache")
    m.add_argument("--no-mamba", action="store_true", help="attention-only model: no Mamba pool")
    m.add_argument(
        "--mamba-strategy",
        choices=["no_buffer", "extra_buffer"],
        default="extra_buffer",
        help=(
            "the Mamba radix cache's mamba_scheduler_strategy: extra_buffer (V2, what a Qwen3-Next"
            " deployment runs: any page size, ping-pong tracking slots) or no_buffer (V1, page size 1)"
            " (default: %(default)s)"
        ),
    )
    m.add_argument(
        "--model",
        choices=["hash", "tiny-hybrid"],
        default="hash",
        help=(
            "next-token source: a deterministic hash, or the tiny hybrid model reading KV and states"
            " through the pools (about 40x slower; needs the Mamba pool) (default: %(default)s)"
        ),
    )


def _add_speculative_options(s: Any) -> None:
    """``simulate``'s options for EAGLE/MTP drafts and their acceptance."""
    sp = s.add_argument_group("speculative decoding (EAGLE/MTP, spec/speculative.md)")
    sp.add_argument(
        "--speculative", metavar="K", type=int_in(0, 64), default=0,
        help=(
            "draft K tokens per decode step (num_steps K, num_draft_tokens K + 1) and verify them: the KV of"
            " the drafts is over-allocated before the verify, the rejected tail given back after; 0 is off"
            " (default: %(default)s)"
        ),
    )  # fmt: skip
    sp.add_argument(
        "--speculative-topk", metavar="N", type=int_in(1, 16), default=1,
        help="draft tree branching (topk > 1 widens the over-allocation at --page-size > 1) (default: %(default)s)",
    )  # fmt: skip
    sp.add_argument(
        "--speculative-accept-rate", metavar="P", type=probability, default=0.7,
        help=(
            "acceptance distribution: each draft is accepted with probability P if every earlier one was"
            " (a geometric count truncated at K, seeded by --seed) (default: %(default)s)"
        ),
    )  # fmt: skip


def _add_fault_options(s: Any) -> None:
    """``simulate``'s options for the fault soak."""
    f = s.add_argument_group("fault soak (kvledger/sim/faults.py; seeded by --seed)")
    f.add_argument(
        "--alloc-fault-rate", metavar="P", type=probability, default=0.0,
        help=(
            "probability per step that an allocation (a row, a Mamba slot or KV, drawn at random) fails"
            " after the next 0 to 2 of its kind: a rolled-back admission, decode step or verify; with --pd"
            " on either instance (default: %(default)s)"
        ),
    )  # fmt: skip
    f.add_argument(
        "--abort-rate", metavar="P", type=probability, default=0.0,
        help="probability per step that one live request is aborted (--pd: --pd-abort-rate) (default: %(default)s)",
    )  # fmt: skip


def _add_pd_options(s: Any) -> None:
    """``simulate``'s options for prefill/decode disaggregation."""
    d = s.add_argument_group("prefill/decode disaggregation")
    d.add_argument(
        "--pd",
        action="store_true",
        help=(
            "run through a prefill instance and a decode instance (both with the pool sizes above; the"
            " decode rows and Mamba slots raised to SGLang's PD sizing) joined by a faulty transfer channel;"
            " one summary and one timeline per instance"
        ),
    )
    d.add_argument(
        "--pd-fault-rate", metavar="P", type=probability, default=0.0,
        help="probability that a message or handshake drops, is delayed, fails or hangs (default: %(default)s)",
    )  # fmt: skip
    d.add_argument(
        "--pd-abort-rate", metavar="P", type=probability, default=0.0,
        help="probability per step that one live request is aborted at a random side (default: %(default)s)",
    )  # fmt: skip
    d.add_argument(
        "--pd-decode-cache",
        action="store_true",
        help=(
            "a radix cache on the decode instance too (SGLang's --disaggregation-decode-enable-radix-cache):"
            " a cached prompt prefix is not transferred; with a Mamba pool it needs --page-size 1"
        ),
    )
    _add_sizes(d, PD_SIZES)


def _add_run_options(s: Any) -> None:
    """``simulate``'s options for the level, the seed and the outputs."""
    o = s.add_argument_group("run")
    o.add_argument(
        "--contracts",
        choices=["on", "off"],
        default=None,
        help=(
            "the alias of --checks full (on) and --checks release (off), the switch of earlier releases"
            " (default: the environment's level, full)"
        ),
    )
    add_checks_option(o)
    seed = int_in(-(2**63), 2**63 - 1)
    o.add_argument("--seed", metavar="N", type=seed, default=0, help="workload seed (default: %(default)s)")
    o.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    o.add_argument(
        "--plot",
        metavar="PATH",
        type=Path,
        default=Path("out/ledger_timeline.png"),
        help=(
            "ledger timeline image, written when the run has finished; the suffix picks the format: .png,"
            " .svg, .pdf, ... (default: %(default)s)"
        ),
    )
    o.add_argument("--no-plot", action="store_true", help="do not write the timeline")
    o.add_argument(
        "--record",
        metavar="FILE",
        type=Path,
        default=None,
        help=(
            "write the run's event log (JSON lines, spec/event-log.md) for `kvledger audit`; it appears when"
            " the run has finished (Ctrl-C leaves none)"
        ),
    )
    o.add_argument("--no-progress", action="store_true", help="no progress bar (shown on a terminal only)")


# ---------------------------------------------------------------------------------------- the run
def _progress_bar(ns: argparse.Namespace, total: int) -> Any:
    """A context manager yielding ``progress(done, total)`` or None: a bar on stderr when it is a terminal."""
    import contextlib

    if ns.no_progress or ns.json or not sys.stderr.isatty():
        return contextlib.nullcontext(None)
    return _bar(total)


def _bar(total: int) -> Any:
    import contextlib

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    @contextlib.contextmanager
    def bar() -> Any:
        with Progress(
            TextColumn("simulate"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as progress:
            task = progress.add_task("requests", total=total)
            yield lambda done, _total: progress.update(task, completed=done)

    return bar()


def _sim_options(ns: argparse.Namespace) -> Any:
    from kvledger.sim.simulate import SimOptions
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
    return SimOptions(
        workload=workload,
        kv_pool_tokens=ns.kv_pool_tokens,
        mamba_slots=ns.mamba_slots,
        max_running_requests=ns.max_running_requests,
        rows=ns.req_pool_rows,
        page_size=ns.page_size,
        chunked_prefill_size=ns.chunked_prefill_size or None,
        max_prefill_tokens=ns.max_prefill_tokens,
        overlap=ns.overlap,
        radix_cache=not ns.no_radix_cache,
        hybrid=not ns.no_mamba,
        model=ns.model,
        mamba_strategy=ns.mamba_strategy,
        mamba_track_interval=ns.mamba_track_interval,
        mamba_chunk_size=ns.mamba_chunk_size,
        speculative=ns.speculative,
        speculative_topk=ns.speculative_topk,
        speculative_accept_rate=ns.speculative_accept_rate,
        alloc_fault_rate=ns.alloc_fault_rate,
        abort_rate=ns.abort_rate,
    )


def _announce_long_run(ns: argparse.Namespace, workload: Any) -> None:
    from kvledger.contracts import switch
    from kvledger.sim.estimate import LONG_RUN_S, computed_tokens, describe_duration, predicted_seconds

    predicted = predicted_seconds(workload, ns.model, switch.ENABLED)
    if predicted > LONG_RUN_S:
        print(
            f"kvledger simulate: warning: this run may take about {describe_duration(predicted)}"
            f" ({computed_tokens(workload):,} tokens to compute, --model {ns.model}, contracts"
            f" {'on' if switch.ENABLED else 'off'}); fewer --gsp-num-groups or --gsp-prompts-per-group"
            " shorten it",
            file=sys.stderr,
        )


def _plot(draw: Any, temps: list[Path], what: str) -> str | None:
    """Draw into the staged ``temps``; on failure remove what was drawn and say why (the run's own
    result stands: exit status 1, the other outputs still written)."""
    try:
        draw()
    except (OSError, ValueError) as exc:
        for temp in temps:
            temp.unlink(missing_ok=True)
        return f"could not write {what}: {exc}"
    return None


def run(ns: argparse.Namespace) -> int:
    problem = check_options(ns)
    if problem is not None:
        return usage_error(NAME, problem)
    if ns.contracts is not None and ns.checks is not None:
        return usage_error(NAME, "--contracts and --checks both set the checking level: give one of them")
    if ns.contracts is not None:
        ns.checks = "full" if ns.contracts == "on" else "release"  # the alias of --checks full / release
    apply_checks(ns)
    opts = _sim_options(ns)
    _announce_long_run(ns, opts.workload)
    if ns.pd:
        return _run_pd(ns, opts)
    return _run_single(ns, opts, simulate_hicache.builder(ns) if ns.hicache else None)


def _run_single(ns: argparse.Namespace, opts: Any, build: Any = None) -> int:
    from kvledger.contracts.errors import KVLedgerError
    from kvledger.sim import simulate as sim
    from kvledger.sim.report import plot_timeline, print_summary

    targets = [p for p in (ns.record, None if ns.no_plot else ns.plot) if p is not None]
    plot_error = None
    with staged(*targets) as temps:
        staged_as = dict(zip(targets, temps, strict=True))
        with _progress_bar(ns, opts.workload.total) as progress:
            try:
                if build is not None:  # --hicache: the host tier's engine (never with --record)
                    result = sim.run_simulation(opts, progress, build=build.build)
                elif ns.record is None:
                    result = sim.run_simulation(opts, progress)
                else:
                    with open(staged_as[ns.record], "w", encoding="utf-8") as stream:
                        result = sim.run_simulation(opts, progress, record=stream)
            except OSError as exc:  # the event log: /dev/full, a disk that filled up mid-run
                raise UsageError(f"--record {ns.record}: cannot be written ({exc.strerror or exc})") from None
            except KVLedgerError as exc:  # a combination the checks did not foresee: still a user error
                raise UsageError(str(exc).splitlines()[0]) from None
        if not ns.no_plot:
            temp = staged_as[ns.plot]
            plot_error = _plot(lambda: plot_timeline(result, temp), [temp], f"the plot {ns.plot}")
    out = make_console(stderr=ns.json)
    if ns.json:
        summary = result.summary()
        summary["plot"] = None if ns.no_plot or plot_error else str(ns.plot)
        summary["record"] = None if ns.record is None else str(ns.record)
        if build is not None:
            simulate_hicache.report(build, summary, out)
        print(json.dumps(summary))
    else:
        print_summary(result, out)
        if build is not None:
            simulate_hicache.report(build, None, out)
        if not ns.no_plot and plot_error is None:
            out.print(f"ledger timeline written to {ns.plot}")
        if ns.record is not None:
            out.print(f"event log written to {ns.record} (check it: kvledger audit {ns.record})")
    if plot_error is not None:
        print(f"kvledger simulate: error: {plot_error}", file=sys.stderr)
        return 1
    return 1 if result.failed else 0


def _run_pd(ns: argparse.Namespace, opts: Any) -> int:
    """``--pd``: the same workload through both instances; one summary and one timeline per instance."""
    from kvledger.contracts.errors import KVLedgerError
    from kvledger.sim.pd import PDSimOptions, run_pd_simulation
    from kvledger.sim.report import pd_timeline_paths, plot_pd_timelines, print_pd_summary

    pd_opts = PDSimOptions(
        base=opts,
        fault_rate=ns.pd_fault_rate,
        abort_rate=ns.pd_abort_rate,
        latency=ns.pd_latency,
        transfer_timeout=ns.pd_transfer_timeout,
        decode_radix_cache=ns.pd_decode_cache,
    )
    finals = {} if ns.no_plot else pd_timeline_paths(ns.plot)
    logs = [] if ns.record is None else record_paths(ns.record, pd=True)  # the prefill's, the decode's
    plot_error = None
    with staged(*logs, *finals.values()) as temps:
        log_temps, plot_temps = temps[: len(logs)], temps[len(logs) :]
        with _progress_bar(ns, opts.workload.total) as progress:
            try:
                if not logs:
                    result = run_pd_simulation(pd_opts, progress)
                else:
                    with contextlib.ExitStack() as files:
                        streams = {
                            side: files.enter_context(open(path, "w", encoding="utf-8"))
                            for side, path in zip(("prefill", "decode"), log_temps, strict=True)
                        }
                        result = run_pd_simulation(pd_opts, progress, record=streams)
            except OSError as exc:  # an event log: /dev/full, a disk that filled up mid-run
                raise UsageError(f"--record {ns.record}: cannot be written ({exc.strerror or exc})") from None
            except KVLedgerError as exc:  # a combination the checks did not foresee: still a user error
                raise UsageError(str(exc).splitlines()[0]) from None
        if finals:
            to = dict(zip(finals, plot_temps, strict=True))
            plot_error = _plot(
                lambda: plot_pd_timelines(result, to), list(plot_temps), f"the plots beside {ns.plot}"
            )
    out = make_console(stderr=ns.json)
    plots = [] if plot_error else [str(p) for p in finals.values()]
    if ns.json:
        summary = result.summary()
        summary["plots"] = plots
        summary["records"] = [str(p) for p in logs]
        print(json.dumps(summary))
    else:
        print_pd_summary(result, out)
        for path in plots:
            out.print(f"ledger timeline written to {path}")
        for log in logs:
            out.print(f"event log written to {log} (check it: kvledger audit {log})")
    if plot_error is not None:
        print(f"kvledger simulate: error: {plot_error}", file=sys.stderr)
        return 1
    return 1 if result.violations else 0
