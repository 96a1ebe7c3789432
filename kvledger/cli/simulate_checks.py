"""``kvledger simulate``: the checks made before anything is built, each ending in one line.

Three kinds, in this order: sizes whose product would be allocated up front (each option alone is
bounded when parsed: :mod:`kvledger.cli.simulate`), options that would have no effect under another
option the user set (``--plot x.svg --no-plot``), and combinations the scheduler would refuse or a
workload that could only be rejected. A message names the options the user typed; an option left at
its default is called "the default --NAME VALUE", so ``--page-size 3`` is blamed, not the track
interval nobody set.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from kvledger.cli.options import given

CONTEXT_MAX = 2**20
"""Tokens of one request (system prompt + question + output): its row of the request-to-token table."""
ALLOCATED_MAX = 2**28
"""Entries of the arrays a run allocates up front: the workload's prompts (int32, 1 GiB at the bound)
and the request-to-token table (rows x context)."""


def option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


class Named:
    """Options rendered for a message: ``--page-size 3`` when typed, ``the default --kv-pool-tokens 5120``
    otherwise."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.given = given(ns)

    def __call__(self, dest: str) -> str:
        text = f"{option(dest)} {getattr(self.ns, dest)}"
        return text if dest in self.given else f"the default {text}"

    def set(self, dest: str) -> bool:
        return dest in self.given


# ------------------------------------------------------------------------------------ sizes up front
def _context(ns: argparse.Namespace) -> int:
    return ns.gsp_system_prompt_len + ns.gsp_question_len + ns.gsp_output_len


def _allocation_problem(ns: argparse.Namespace) -> str | None:
    context = _context(ns)
    if context > CONTEXT_MAX:
        return (
            f"a request of {context:,} tokens (--gsp-system-prompt-len + --gsp-question-len + --gsp-output-len)"
            f" is above the bound of {CONTEXT_MAX:,}"
        )
    requests = ns.gsp_num_groups * ns.gsp_prompts_per_group
    for what, entries in (
        (
            "the workload's questions (--gsp-num-groups x --gsp-prompts-per-group x --gsp-question-len)",
            requests * ns.gsp_question_len,
        ),
        (
            "the workload's system prompts (--gsp-num-groups x --gsp-system-prompt-len)",
            ns.gsp_num_groups * ns.gsp_system_prompt_len,
        ),
        (
            "the request-to-token table (--req-pool-rows x tokens per request)",
            (ns.req_pool_rows or ns.max_running_requests + 4) * (context + 16),
        ),
    ):
        if entries > ALLOCATED_MAX:
            return f"{what} would hold {entries:,} tokens, above the bound of {ALLOCATED_MAX:,}: use smaller sizes"
    return None


# ------------------------------------------------------------------------- options without an effect
def _ineffective() -> list[tuple[str, str, Callable[[argparse.Namespace], bool]]]:
    """(option, what cancels it, whether that is in force): the pairs where the first option does nothing."""
    mamba = ("mamba_slots", "mamba_strategy", "mamba_track_interval", "mamba_chunk_size")
    v2_only = ("mamba_track_interval", "mamba_chunk_size")
    pd_only = ("pd_fault_rate", "pd_abort_rate", "pd_latency", "pd_transfer_timeout", "pd_decode_cache")
    rows: list[tuple[str, str, Callable[[argparse.Namespace], bool]]] = [
        ("plot", "--no-plot", lambda n: n.no_plot)
    ]
    rows += [(d, "--no-mamba", lambda n: n.no_mamba) for d in mamba]
    # Without the radix cache there is no Mamba tree to track states for: the engine runs no_buffer.
    rows += [(d, "--no-radix-cache", lambda n: n.no_radix_cache) for d in ("mamba_strategy", *v2_only)]
    rows += [(d, "--mamba-strategy no_buffer", lambda n: n.mamba_strategy == "no_buffer") for d in v2_only]
    rows += [(d, "a run without --pd", lambda n: not n.pd) for d in pd_only]
    rows += [("abort_rate", "--pd (its aborts: --pd-abort-rate)", lambda n: n.pd)]
    spec_only = ("speculative_topk", "speculative_accept_rate")
    rows += [(d, "a run without --speculative", lambda n: not n.speculative) for d in spec_only]
    return rows


INEFFECTIVE = _ineffective()


def _conflict(ns: argparse.Namespace) -> str | None:
    named = Named(ns)
    for dest, other, cancels in INEFFECTIVE:
        if named.set(dest) and cancels(ns):
            if other == "a run without --speculative":
                return f"{option(dest)} applies to --speculative runs only: add --speculative K or drop {option(dest)}"
            if other.startswith("a run"):
                return f"{option(dest)} applies to --pd runs only: add --pd or drop {option(dest)}"
            return f"{option(dest)} has no effect with {other}: drop one of them"
    return None


# ------------------------------------------------------------------ combinations the engine refuses
def _kv_tokens_needed(ns: argparse.Namespace) -> int:
    """KV slots one request needs alone, with a spare page (the scheduler's rejection rule); with
    speculative decoding also the over-allocation it holds before its last verify."""
    pages = -(-(_context(ns) + _speculative_reserve(ns)) // ns.page_size)
    return (pages + 1) * ns.page_size


def _speculative_reserve(ns: argparse.Namespace) -> int:
    from kvledger.contracts.spec_footprint import reserve

    k = ns.speculative
    return reserve(k, ns.speculative_topk, k + 1, ns.page_size, ns.overlap) if k else 0


def _must_divide(named: Named, multiple: str, base: str) -> str:
    """``multiple`` must be a multiple of ``base``, said from the side of the option the user set."""
    if named.set(multiple) or not named.set(base):
        return f"{named(multiple)} is not a multiple of {named(base)}"
    return (
        f"{named(base)} does not divide {named(multiple)}: set {option(multiple)} to a multiple of"
        f" {getattr(named.ns, base)} too"
    )


def _extra_buffer_problem(ns: argparse.Namespace) -> str | None:
    """The extra_buffer (V2) settings the scheduler would refuse, as one line."""
    named = Named(ns)
    ps, interval, chunk = ns.page_size, ns.mamba_track_interval, ns.mamba_chunk_size
    if interval % ps:
        return _must_divide(named, "mamba_track_interval", "page_size")
    if max(chunk, ps) % min(chunk, ps):
        first, second = ("page_size", "mamba_chunk_size")
        if named.set("mamba_chunk_size"):
            first, second = second, first
        return f"{named(first)} and {named(second)}: one must divide the other"
    grid = max(chunk, ps)
    if ns.chunked_prefill_size and ns.chunked_prefill_size < grid:
        return (
            f"{named('chunked_prefill_size')} is below the capture grid {grid} (max of --mamba-chunk-size and"
            f" --page-size): a chunk would never capture a state"
        )
    if ns.overlap and interval < 2:
        return f"{named('mamba_track_interval')} with --overlap: consecutive decode captures would clash; use >= 2"
    if ns.overlap and ns.speculative and interval < 2 * (ns.speculative + 1):
        return (
            f"{named('mamba_track_interval')} with --overlap and --speculative {ns.speculative}: two consecutive"
            f" verifies could both capture into one tracking half; use >= {2 * (ns.speculative + 1)}"
        )
    per_request = 1 + (2 if ns.overlap else 1)
    if ns.mamba_slots < per_request:
        return (
            f"{named('mamba_slots')}: one request under extra_buffer holds {per_request} (a working"
            " slot and its tracking slots)"
        )
    return None


def _engine_problem(ns: argparse.Namespace) -> str | None:
    named = Named(ns)
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
    if mamba_tree and ns.mamba_strategy == "no_buffer" and ns.speculative and ns.overlap:
        return (
            "--speculative with --overlap and the Mamba radix cache in no_buffer (V1) mode: V1 would cache a"
            " working state an in-flight verify already moved; use --mamba-strategy extra_buffer or drop --overlap"
        )
    if mamba_tree and ns.mamba_strategy == "extra_buffer":
        problem = _extra_buffer_problem(ns)
        if problem is not None:
            return problem
    if ns.kv_pool_tokens % ns.page_size:
        return _must_divide(named, "kv_pool_tokens", "page_size")
    if ns.chunked_prefill_size and ns.chunked_prefill_size < ns.page_size:
        return f"{named('chunked_prefill_size')} must be 0 or >= {named('page_size')}"
    needed = _kv_tokens_needed(ns)
    spec = " + the speculative reserve" if ns.speculative else ""
    if needed > ns.kv_pool_tokens:
        return (
            f"every request needs {needed} KV tokens alone (prompt + output{spec}, one spare page) but --kv-pool-tokens"
            f" is {ns.kv_pool_tokens}: all {ns.gsp_num_groups * ns.gsp_prompts_per_group} requests would be"
            f" rejected; use --kv-pool-tokens {needed} or more"
        )
    if ns.speculative and ns.pd:
        return "--speculative does not support --pd runs yet: run speculative decoding without --pd"
    if ns.pd and ns.pd_decode_cache and not ns.no_mamba and ns.page_size > 1:
        return (
            f"--pd-decode-cache with the Mamba pool needs --page-size 1 (got {named('page_size')}): the decode"
            " side caches Mamba states per token; use --page-size 1, or add --no-mamba"
        )
    return None


# ---------------------------------------------------------------------------------- output paths
def write_problem(path: Path, option_name: str) -> str | None:
    """Why the file ``path`` cannot be written, or None (the run writes it: find out now, not after
    minutes). Creates nothing: the directories are made when the run starts."""
    import tempfile

    if path.is_dir():
        return f"{option_name} {path}: is a directory"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{option_name} {path}: {ancestor} is not a directory"
    try:
        if path.exists():
            with open(path, "ab"):
                pass
        elif ancestor == path.parent:
            with tempfile.NamedTemporaryFile(dir=ancestor, prefix=".kvledger-probe-"):
                pass
        else:
            with tempfile.TemporaryDirectory(dir=ancestor, prefix=".kvledger-probe-"):
                pass
    except OSError as exc:
        return f"{option_name} {path}: cannot be written ({exc.strerror or exc})"
    return None


def _plot_problem(path: Path) -> str | None:
    """Why ``path`` cannot be written as an image, or None."""
    from matplotlib.backend_bases import FigureCanvasBase

    if path.is_dir():
        return f"--plot {path}: is a directory"
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        kind = repr(path.suffix) if path.suffix else "no suffix"
        return f"--plot {path}: unsupported image format ({kind}); use one of {', '.join(sorted(formats))}"
    return write_problem(path, "--plot")


def record_paths(record: Path, pd: bool) -> list[Path]:
    """The event logs ``--record`` writes: the file itself, or with ``--pd`` one per instance beside it
    (``NAME.prefill.SUFFIX`` and ``NAME.decode.SUFFIX``, as the PD timelines)."""
    if not pd:
        return [record]
    return [record.with_name(f"{record.stem}.{side}{record.suffix}") for side in ("prefill", "decode")]


def check_options(ns: argparse.Namespace) -> str | None:
    """The first reason the options cannot make a meaningful run, or None. One line, no traceback."""
    for check in (_allocation_problem, _conflict, _engine_problem):
        problem = check(ns)
        if problem is not None:
            return problem
    if ns.record is not None and not ns.no_plot and ns.record.resolve() == ns.plot.resolve():
        return f"--record and --plot both name {ns.record}: give each its own file"
    if ns.record is not None:
        if ns.record.is_dir():
            return f"--record {ns.record}: is a directory"
        for path in record_paths(ns.record, ns.pd):
            problem = write_problem(path, "--record")
            if problem is not None:
                return problem
    if not ns.no_plot:
        return _plot_problem(ns.plot)
    return None
