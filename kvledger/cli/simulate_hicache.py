"""``kvledger simulate --hicache``: the host tier's options and its run (kvledger/sim/hicache.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvledger.cli.options import UsageError, bounded_help, int_in, probability

POLICIES = ("write_through", "write_through_selective", "write_back")


def add_options(s: Any) -> None:
    h = s.add_argument_group("host tier (HiCache, spec/hicache.md)")
    h.add_argument(
        "--hicache",
        action="store_true",
        help=(
            "run the host-memory tier instead of the scheduler: prompts match the device tree and the host"
            " tier, load back, compute the rest and cache; the summary and the timeline show both tiers"
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
        metavar="STEPS",
        type=int_in(0, 2**16),
        default=1,
        help=bounded_help("steps a load-back's transfer takes", 0, 2**16, "%(default)s"),
    )
    h.add_argument(
        "--hicache-fail-rate",
        metavar="P",
        type=probability,
        default=0.0,
        help="probability that a load-back's transfer fails (default: %(default)s)",
    )


def run_hicache(ns: argparse.Namespace, opts: Any) -> int:
    """The run; ``--record`` is refused (the event log has no host-tier events yet), no plot is drawn."""
    from kvledger.contracts.levels import CheckLevel
    from kvledger.contracts.switch import LEVEL
    from kvledger.sim.hicache import HiCacheOptions, HiCacheSim

    if ns.record is not None:
        raise UsageError("--record with --hicache: the event log has no host-tier events yet")
    host = ns.host_kv_tokens or 2 * ns.kv_pool_tokens
    sim = HiCacheSim(
        HiCacheOptions(
            workload=opts.workload,
            device_tokens=ns.kv_pool_tokens,
            host_tokens=host,
            policy=ns.hicache_policy,
            delay=ns.hicache_delay,
            fail_rate=ns.hicache_fail_rate,
            abort_rate=ns.abort_rate,
            seed=ns.seed,
            checks=max(LEVEL, CheckLevel.LEDGER),
        )
    )
    result = sim.run()
    summary = result.summary()
    if ns.json:
        print(json.dumps({**summary, "final": result.timeline[-1] if result.timeline else {}}))
        return 0
    print(f"host tier: {ns.hicache_policy}, device {ns.kv_pool_tokens} tokens, host {host} tokens")
    for key, value in summary.items():
        print(f"  {key:<28} {value}")
    print(
        "timeline (every step audited; device: free evictable protected loading; host: free evictable protected)"
    )
    stride = max(1, len(result.timeline) // 20)
    for row in result.timeline[::stride]:
        print(
            f"  step {row['step']:>5}  device {row['device_free']:>7} {row['device_evictable']:>7}"
            f" {row['device_protected']:>7} {row['device_loading']:>7}  host {row['host_free']:>7}"
            f" {row['host_evictable']:>7} {row['host_protected']:>7}  loads {row['loads_in_flight']}"
        )
    return 0
