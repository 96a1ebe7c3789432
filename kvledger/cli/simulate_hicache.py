"""``kvledger simulate --hicache``: the host tier's options and its engine (kvledger/sim/hicache.py)."""

from __future__ import annotations

import argparse
from typing import Any

from kvledger.cli.options import UsageError, bounded_help, int_in, probability

POLICIES = ("write_through", "write_through_selective", "write_back")


def add_options(s: Any) -> None:
    h = s.add_argument_group("host tier (HiCache, spec/hicache.md)")
    h.add_argument(
        "--hicache",
        action="store_true",
        help=(
            "a host-memory tier below the KV pool (needs --no-mamba and --page-size 1): cached prefixes are"
            " backed up to the host, evicted there, and loaded back on a host hit; the summary, the timeline"
            " and every step's identity cover both tiers"
        ),
    )
    h.add_argument(
        "--hicache-policy",
        choices=POLICIES,
        default="write_through",
        help="write policy (default: %(default)s)",
    )
    h.add_argument(
        "--host-kv-tokens",
        metavar="TOKENS",
        type=int_in(1, 2**25),
        default=None,
        help=bounded_help(
            "host pool size in tokens", 1, 2**25, "2 x --kv-pool-tokens, SGLang's hicache_ratio"
        ),
    )
    h.add_argument(
        "--hicache-delay",
        metavar="POLLS",
        type=int_in(0, 2**16),
        default=0,
        help=bounded_help(
            "polls a load-back's transfer takes (the match waits for it)", 0, 2**16, "%(default)s"
        ),
    )
    h.add_argument(
        "--hicache-fail-rate",
        metavar="P",
        type=probability,
        default=0.0,
        help="probability that a load-back's transfer fails (recomputed instead) (default: %(default)s)",
    )


def builder(ns: argparse.Namespace) -> Any:
    """The engine builder for ``--hicache``; usage errors for what the tier does not model."""
    from kvledger.sim.hicache import HostTierSpec

    if ns.record is not None:
        raise UsageError("--record with --hicache: the event log has no host-tier events yet")
    if not ns.no_mamba or ns.page_size != 1 or ns.no_radix_cache:
        raise UsageError(
            "--hicache models a KV-only engine with a radix cache: give --no-mamba, --page-size 1"
        )
    return HostTierSpec(ns.host_kv_tokens, ns.hicache_policy, ns.hicache_delay, ns.hicache_fail_rate, ns.seed)


def report(build: Any, summary: dict[str, Any] | None, out: Any) -> None:
    """The host tier's counts: into the JSON summary, or printed after the table."""
    counts = build.report()
    if summary is not None:
        summary["hicache"] = counts
        return
    out.print("host tier: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
