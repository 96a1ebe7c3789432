"""The ``kvledger`` command: ``kvledger --version``, ``simulate``, ``audit``, ``hunt``, ``museum``, ``explore``.

Every option is checked before anything runs: a bad value, a combination the engine cannot run, a
workload that could only be rejected, or a plot or record path that cannot be written ends in one line
on stderr and exit status 2, never a traceback. Exit status 1 means the run found a contract violation
or, with contracts off, a count identity failure; for ``audit``, that the log breaks an invariant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from kvledger import __version__
from kvledger.contracts import switch
from kvledger.museum import cli as museum_cli

USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse, with a one-line error (argparse prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1], got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvledger", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"kvledger {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    s = sub.add_parser(
        "simulate",
        help="run a generated-shared-prefix workload through the scheduler",
        description=(
            "Run a generated-shared-prefix workload (after SGLang's bench_serving) through the scheduler"
            " with the ledger on every pool; print a summary and write the ledger timeline."
        ),
    )
    g = s.add_argument_group("workload (after bench_serving --dataset generated-shared-prefix)")
    g.add_argument(
        "--gsp-num-groups",
        metavar="N",
        type=_int_at_least(1),
        default=8,
        help="groups sharing a system prompt (default: %(default)s)",
    )
    g.add_argument(
        "--gsp-prompts-per-group",
        metavar="N",
        type=_int_at_least(1),
        default=16,
        help="requests per group (default: %(default)s)",
    )
    g.add_argument(
        "--gsp-system-prompt-len",
        metavar="TOKENS",
        type=_int_at_least(0),
        default=512,
        help="tokens of the shared system prompt (default: %(default)s)",
    )
    g.add_argument(
        "--gsp-question-len",
        metavar="TOKENS",
        type=_int_at_least(0),
        default=128,
        help="tokens of each request's own question (default: %(default)s)",
    )
    g.add_argument(
        "--gsp-output-len",
        metavar="TOKENS",
        type=_int_at_least(1),
        default=96,
        help="new tokens per request (default: %(default)s)",
    )
    g.add_argument(
        "--arrivals-per-step",
        metavar="N",
        type=_int_at_least(1),
        default=4,
        help="requests arriving per scheduler step (default: %(default)s)",
    )
    m = s.add_argument_group("memory and scheduling")
    m.add_argument(
        "--kv-pool-tokens",
        metavar="TOKENS",
        type=_int_at_least(1),
        default=5120,
        help="KV pool size in tokens, a multiple of --page-size (default: %(default)s)",
    )
    m.add_argument(
        "--mamba-slots",
        metavar="SLOTS",
        type=_int_at_least(1),
        default=64,
        help=(
            "Mamba state pool size in slots; SGLang sizes it as max running requests x 3, plus 1 per"
            " request for extra_buffer's tracking slot (2 with --overlap) (default: %(default)s)"
        ),
    )
    m.add_argument(
        "--req-pool-rows",
        metavar="ROWS",
        type=_int_at_least(1),
        default=None,
        help="request-to-token pool size in rows (default: --max-running-requests + 4)",
    )
    m.add_argument(
        "--max-running-requests",
        metavar="N",
        type=_int_at_least(1),
        default=16,
        help="requests decoding at once (default: %(default)s)",
    )
    m.add_argument(
        "--page-size",
        metavar="TOKENS",
        type=_int_at_least(1),
        default=1,
        help=(
            "tokens per KV page; > 1 with the Mamba radix cache needs --mamba-strategy extra_buffer"
            " (default: %(default)s)"
        ),
    )
    m.add_argument(
        "--chunked-prefill-size",
        metavar="TOKENS",
        type=_int_at_least(0),
        default=256,
        help="tokens per prefill chunk, 0 disables chunking (default: %(default)s)",
    )
    m.add_argument(
        "--max-prefill-tokens",
        metavar="TOKENS",
        type=_int_at_least(1),
        default=2048,
        help="tokens per prefill batch (default: %(default)s)",
    )
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
        "--mamba-track-interval",
        metavar="TOKENS",
        type=_int_at_least(1),
        default=256,
        help="extra_buffer: decoding captures a state every TOKENS tokens, a multiple of --page-size"
        " (default: %(default)s)",
    )
    m.add_argument(
        "--mamba-chunk-size",
        metavar="TOKENS",
        type=_int_at_least(1),
        default=64,
        help="extra_buffer: the kernel chunk; prefill captures on a grid of max(TOKENS, --page-size)"
        " (default: %(default)s)",
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
        "--pd-fault-rate",
        metavar="P",
        type=_probability,
        default=0.0,
        help="probability that a message or handshake drops, is delayed, fails or hangs (default: %(default)s)",
    )
    d.add_argument(
        "--pd-abort-rate",
        metavar="P",
        type=_probability,
        default=0.0,
        help="probability per step that one live request is aborted at a random side (default: %(default)s)",
    )
    d.add_argument(
        "--pd-latency",
        metavar="STEPS",
        type=_int_at_least(1),
        default=1,
        help="steps a transfer or control message takes (default: %(default)s)",
    )
    d.add_argument(
        "--pd-transfer-timeout",
        metavar="STEPS",
        type=_int_at_least(1),
        default=64,
        help="steps without progress after which the decode side fails a transfer (default: %(default)s)",
    )
    o = s.add_argument_group("run")
    o.add_argument(
        "--contracts",
        choices=["on", "off"],
        default=None,
        help="override KVLEDGER_CONTRACTS, re-executing the process with it set (default: the env var, on)",
    )
    o.add_argument("--seed", metavar="N", type=_int, default=0, help="workload seed (default: %(default)s)")
    o.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    o.add_argument(
        "--plot",
        metavar="PATH",
        type=Path,
        default=Path("out/ledger_timeline.png"),
        help="ledger timeline image; the suffix picks the format: .png, .svg, .pdf, ... (default: %(default)s)",
    )
    o.add_argument("--no-plot", action="store_true", help="do not write the timeline")
    o.add_argument(
        "--record",
        metavar="FILE",
        type=Path,
        default=None,
        help="write the run's event log (JSON lines, spec/event-log.md) for `kvledger audit`",
    )
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = sub.add_parser(
        "audit",
        help="replay a recorded event log through the ledger and the identities",
        description=(
            "Replay an event log (JSON lines, spec/event-log.md: `kvledger simulate --record FILE`, or an"
            " engine's debug build) through the ownership ledger and the identities. Stops at the first"
            " violation and names the event, the ids, their owner and their last moves. Exit status 0: the"
            " log is clean; 1: a violation; 2: the file cannot be read or is not a valid log."
        ),
    )
    a.add_argument("log", metavar="FILE", type=Path, help="the event log")
    a.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    museum_cli.add_commands(sub)
    return p


# ---------------------------------------------------------------------- checks before the run
def _kv_tokens_needed(ns: argparse.Namespace) -> int:
    """KV slots one request needs alone, with a spare page (the scheduler's rejection rule)."""
    total = ns.gsp_system_prompt_len + ns.gsp_question_len + ns.gsp_output_len
    pages = -(-total // ns.page_size)
    return (pages + 1) * ns.page_size


def _plot_problem(path: Path) -> str | None:
    """Why ``path`` cannot be written as an image, or None."""
    from matplotlib.backend_bases import FigureCanvasBase

    if path.is_dir():
        return f"--plot {path}: is a directory"
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        kind = repr(path.suffix) if path.suffix else "no suffix"
        return f"--plot {path}: unsupported image format ({kind}); use one of {', '.join(sorted(formats))}"
    return _write_problem(path, "--plot")


def _write_problem(path: Path, option: str) -> str | None:
    """Why the file ``path`` cannot be written, or None (the run writes it: find out now, not after minutes)."""
    if path.is_dir():
        return f"{option} {path}: is a directory"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{option} {path}: {ancestor} is not a directory"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with open(path, "ab"):
                pass
        else:
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".kvledger-probe-"):
                pass
    except OSError as exc:
        return f"{option} {path}: cannot be written ({exc.strerror or exc})"
    return None


def _extra_buffer_problem(ns: argparse.Namespace) -> str | None:
    """The extra_buffer (V2) settings the scheduler would refuse, as one line."""
    ps, interval, chunk = ns.page_size, ns.mamba_track_interval, ns.mamba_chunk_size
    if interval % ps:
        return f"--mamba-track-interval {interval} is not a multiple of --page-size {ps}"
    if max(chunk, ps) % min(chunk, ps):
        return f"--mamba-chunk-size {chunk} and --page-size {ps}: one must divide the other"
    grid = max(chunk, ps)
    if ns.chunked_prefill_size and ns.chunked_prefill_size < grid:
        return (
            f"--chunked-prefill-size {ns.chunked_prefill_size} is below the capture grid {grid}"
            f" (max of --mamba-chunk-size and --page-size): a chunk would never capture a state"
        )
    if ns.overlap and interval < 2:
        return "--mamba-track-interval 1 with --overlap: consecutive decode captures would clash; use >= 2"
    per_request = 1 + (2 if ns.overlap else 1)
    if ns.mamba_slots < per_request:
        return (
            f"--mamba-slots {ns.mamba_slots}: one request under extra_buffer holds {per_request} (a working"
            " slot and its tracking slots)"
        )
    return None


def check_options(ns: argparse.Namespace) -> str | None:
    """The first reason the options cannot make a meaningful run, or None. One line, no traceback."""
    if ns.gsp_system_prompt_len + ns.gsp_question_len < 1:
        return "--gsp-system-prompt-len plus --gsp-question-len must be >= 1: prompts would be empty"
    if ns.no_mamba and ns.model == "tiny-hybrid":
        return "--model tiny-hybrid needs the Mamba pool: drop --no-mamba or use --model hash"
    mamba_tree = not ns.no_mamba and not ns.no_radix_cache
    if ns.page_size > 1 and mamba_tree and ns.mamba_strategy == "no_buffer":
        return (
            f"--page-size {ns.page_size} with the Mamba radix cache in no_buffer (V1) mode: V1 caches Mamba"
            " states per token and needs --page-size 1; use --mamba-strategy extra_buffer, or add --no-mamba"
            " or --no-radix-cache"
        )
    if mamba_tree and ns.mamba_strategy == "extra_buffer":
        problem = _extra_buffer_problem(ns)
        if problem is not None:
            return problem
    if ns.kv_pool_tokens % ns.page_size:
        return f"--kv-pool-tokens {ns.kv_pool_tokens} is not a multiple of --page-size {ns.page_size}"
    if ns.chunked_prefill_size and ns.chunked_prefill_size < ns.page_size:
        return f"--chunked-prefill-size {ns.chunked_prefill_size} must be 0 or >= --page-size {ns.page_size}"
    needed = _kv_tokens_needed(ns)
    if needed > ns.kv_pool_tokens:
        return (
            f"every request needs {needed} KV tokens alone (prompt + output, one spare page) but --kv-pool-tokens"
            f" is {ns.kv_pool_tokens}: all {ns.gsp_num_groups * ns.gsp_prompts_per_group} requests would be"
            f" rejected; use --kv-pool-tokens {needed} or more"
        )
    pd_only = [o for o, v in (("--pd-fault-rate", ns.pd_fault_rate), ("--pd-abort-rate", ns.pd_abort_rate)) if v]
    if pd_only and not ns.pd:
        return f"{pd_only[0]} applies to --pd runs only: add --pd"
    if ns.record is not None and ns.pd:
        # The event log models one engine with the kv/req/mamba pools; PD's two instances, metadata pool,
        # transfer queues and channel are not in its format yet (spec/event-log.md).
        return "--record does not support --pd runs yet: record a run without --pd"
    if ns.record is not None:
        problem = _write_problem(ns.record, "--record")
        if problem is not None:
            return problem
    if not ns.no_plot:
        return _plot_problem(ns.plot)
    return None


# ---------------------------------------------------------------------- the run
def _reexec_with_contracts(value: str) -> NoReturn:
    """Contracts are fixed at import: switching them means a new process with the env var set."""
    env = dict(os.environ, **{switch.ENV_VAR: "1" if value == "on" else "0"})
    args = list(sys.argv[1:])
    i = args.index("--contracts")
    del args[i : i + 2]
    os.execvpe(sys.executable, [sys.executable, "-m", "kvledger", *args], env)


def _fail(message: str) -> int:
    print(f"kvledger simulate: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def _simulate(ns: argparse.Namespace) -> int:
    problem = check_options(ns)
    if problem is not None:
        return _fail(problem)
    if ns.contracts is not None and (ns.contracts == "on") != switch.ENABLED:
        _reexec_with_contracts(ns.contracts)
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from kvledger.contracts.errors import KVLedgerError
    from kvledger.sim.estimate import LONG_RUN_S, describe_duration, predicted_seconds, total_tokens
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
    )
    console = Console(stderr=ns.json)
    predicted = predicted_seconds(workload, ns.model, switch.ENABLED)
    if predicted > LONG_RUN_S:
        print(
            f"kvledger simulate: warning: this run may take about {describe_duration(predicted)}"
            f" ({total_tokens(workload):,} tokens, --model {ns.model}, contracts"
            f" {'on' if switch.ENABLED else 'off'}); fewer --gsp-num-groups or --gsp-prompts-per-group"
            " shorten it",
            file=sys.stderr,
        )
    if ns.pd:
        return _simulate_pd(ns, opts, console)
    show_progress = not ns.no_progress and not ns.json
    record = None if ns.record is None else open(ns.record, "w", encoding="utf-8")  # noqa: SIM115
    try:
        if show_progress:
            with Progress(
                TextColumn("simulate"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("requests"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console,
            ) as bar:
                task = bar.add_task("requests", total=workload.num_groups * workload.prompts_per_group)
                result = run_simulation(
                    opts, progress=lambda done, total: bar.update(task, completed=done), record=record
                )
        else:
            result = run_simulation(opts, record=record)
    except KVLedgerError as exc:  # a combination the checks above did not foresee: still a user error
        return _fail(str(exc).splitlines()[0])
    finally:
        if record is not None:
            record.close()
    plot_path = None
    plot_error = None
    if not ns.no_plot:
        try:
            plot_path = plot_timeline(result, ns.plot)
        except (OSError, ValueError) as exc:
            plot_error = f"could not write the plot {ns.plot}: {exc}"
    if ns.json:
        out = result.summary()
        out["plot"] = str(plot_path) if plot_path else None
        out["record"] = None if ns.record is None else str(ns.record)
        print(json.dumps(out))
    else:
        print_summary(result, console)
        if plot_path:
            console.print(f"ledger timeline written to {plot_path}")
        if ns.record is not None:
            console.print(f"event log written to {ns.record} (check it: kvledger audit {ns.record})")
    if plot_error is not None:
        print(f"kvledger simulate: error: {plot_error}", file=sys.stderr)
        return 1
    return 1 if result.failed else 0


def _simulate_pd(ns: argparse.Namespace, opts: Any, console: Any) -> int:
    """``--pd``: the same workload through both instances; one summary and one timeline per instance."""
    from kvledger.contracts.errors import KVLedgerError
    from kvledger.sim.pd import PDSimOptions, run_pd_simulation
    from kvledger.sim.report import plot_pd_timelines, print_pd_summary

    pd_opts = PDSimOptions(
        base=opts,
        fault_rate=ns.pd_fault_rate,
        abort_rate=ns.pd_abort_rate,
        latency=ns.pd_latency,
        transfer_timeout=ns.pd_transfer_timeout,
    )
    try:
        result = run_pd_simulation(pd_opts)
    except KVLedgerError as exc:  # a combination the checks above did not foresee: still a user error
        return _fail(str(exc).splitlines()[0])
    plots: list[Path] = []
    plot_error = None
    if not ns.no_plot:
        try:
            plots = plot_pd_timelines(result, ns.plot)
        except (OSError, ValueError) as exc:
            plot_error = f"could not write the plots beside {ns.plot}: {exc}"
    if ns.json:
        out = result.summary()
        out["plots"] = [str(p) for p in plots]
        print(json.dumps(out))
    else:
        print_pd_summary(result, console)
        for path in plots:
            console.print(f"ledger timeline written to {path}")
    if plot_error is not None:
        print(f"kvledger simulate: error: {plot_error}", file=sys.stderr)
        return 1
    return 1 if result.violations else 0


def _audit(ns: argparse.Namespace) -> int:
    """``kvledger audit FILE``: 0 clean, 1 a violation (printed with its evidence), 2 not a readable log."""
    from kvledger.audit import audit_file
    from kvledger.contracts.errors import EventLogError

    try:
        report = audit_file(ns.log)
    except EventLogError as exc:
        print(f"kvledger audit: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return USAGE_ERROR
    if ns.json:
        print(json.dumps(report.summary()))
    else:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(report.by_kind.items(), key=lambda kv: -kv[1]))
        print(f"kvledger audit {ns.log}: {report.events} events ({kinds})")
        print(f"  pools {report.pools}, {report.requests} requests, {report.steps} steps")
        if report.clean:
            print("  clean: every event keeps every invariant the log determines")
        else:
            print(f"  VIOLATION at event {report.violation_event}:")
            print(report.violation)
    return 0 if report.clean else 1


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    if ns.command == "simulate":
        return _simulate(ns)
    if ns.command == "audit":
        return _audit(ns)
    if ns.command in museum_cli.COMMANDS:
        return museum_cli.run(ns)
    parser.print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
