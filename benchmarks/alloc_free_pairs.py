#!/usr/bin/env python
"""Cost of the contracts: alloc/free pairs with ``KVLEDGER_CONTRACTS=0`` and ``=1``, one JSON line.

The switch is read once at import, so the script runs itself twice as a child process, once per
setting, and prints a single JSON object: per pool (``token``: ``TokenToKVPoolAllocator``; ``paged``:
``PagedTokenToKVPoolAllocator``) the total seconds and microseconds per pair with contracts off and on,
and the ratio on/off (wall time; ``cpu_ratio_on_off`` uses process CPU time, steadier on a shared
machine). A pair is ``ids = pool.alloc(n, owner); pool.free(ids, owner)``, the allocator's hot path
(validation, state mask, free-list concatenation; plus, with contracts on, the ledger transfer, the
icontract pre/postconditions and the class invariants).

    benchmarks/alloc_free_pairs.py                 # 10**5 pairs per pool and setting
    benchmarks/alloc_free_pairs.py --pairs 20000
    benchmarks/alloc_free_pairs.py --quick         # 2000 pairs: a smoke run for tests
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, ratio

QUICK_PAIRS = 2000


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from kvledger.contracts import switch
    from kvledger.contracts.owners import REQ_RUNNING, Owner
    from kvledger.reference.pools import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    torch.set_num_threads(1)
    owner = Owner("req", 0, REQ_RUNNING)
    pools: dict[str, tuple[Any, int]] = {
        "token": (TokenToKVPoolAllocator(args.size), args.tokens),
        "paged": (PagedTokenToKVPoolAllocator(args.size, args.page_size), args.page_size * args.pages),
    }
    out: dict[str, Any] = {"contracts": switch.ENABLED}
    for name, (pool, n) in pools.items():
        full = pool.available_size()
        for _ in range(min(args.pairs, 1000)):  # warm-up: allocator caches, lazy imports
            pool.free(pool.alloc(n, owner), owner)
        best, best_cpu = float("inf"), float("inf")
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.pairs):
                ids = pool.alloc(n, owner)
                pool.free(ids, owner)
            best = min(best, time.perf_counter() - start)
            best_cpu = min(best_cpu, time.process_time() - start_cpu)
        assert pool.available_size() == full, f"{name}: the pairs leaked"
        pool.audit()
        out[name] = {
            "ledger": type(pool.ledger).__name__,
            "tokens_per_alloc": n,
            "total_s": best,
            "us_per_pair": best / args.pairs * 1e6,
            "cpu_s": best_cpu,
        }
    return out


def _run_child(contracts: str, args: argparse.Namespace) -> dict[str, Any]:
    # KVLEDGER_CHECKS wins over KVLEDGER_CONTRACTS: an inherited one would put both children at its level.
    env = {k: v for k, v in os.environ.items() if k != "KVLEDGER_CHECKS"} | {"KVLEDGER_CONTRACTS": contracts}
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        f"--pairs={args.pairs}",
        f"--size={args.size}",
        f"--page-size={args.page_size}",
        f"--pages={args.pages}",
        f"--tokens={args.tokens}",
        f"--repeat={args.repeat}",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child with KVLEDGER_CONTRACTS={contracts} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=100_000, help="alloc/free pairs per pool and setting")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_PAIRS} pairs, one repeat")
    parser.add_argument("--size", type=int, default=4096, help="pool size in tokens")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--pages", type=int, default=1, help="pages per paged alloc")
    parser.add_argument("--tokens", type=int, default=1, help="tokens per alloc on the token allocator")
    parser.add_argument("--repeat", type=int, default=1, help="timed passes per pool; the best one counts")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.repeat = QUICK_PAIRS, 1
    if args.pairs < 1 or args.repeat < 1:
        parser.error("--pairs and --repeat must be >= 1")
    if args.child:
        print(json.dumps(_child(args)))
        return 0

    off, on = _run_child("0", args), _run_child("1", args)
    if off["contracts"] is not False or on["contracts"] is not True:
        raise SystemExit(f"the children did not see the switch: off={off['contracts']}, on={on['contracts']}")
    result: dict[str, Any] = {
        "benchmark": "alloc_free_pairs",
        "pairs": args.pairs,
        "repeat": args.repeat,
        "pool_size": args.size,
        "page_size": args.page_size,
    }
    for name in ("token", "paged"):
        result[name] = {
            "tokens_per_alloc": on[name]["tokens_per_alloc"],
            "off": {k: off[name][k] for k in ("ledger", "total_s", "us_per_pair", "cpu_s")},
            "on": {k: on[name][k] for k in ("ledger", "total_s", "us_per_pair", "cpu_s")},
            "ratio_on_off": ratio(on[name]["total_s"], off[name]["total_s"]),
            # process CPU time: less sensitive than wall time to other load on a shared machine
            "cpu_ratio_on_off": ratio(on[name]["cpu_s"], off[name]["cpu_s"]),
        }
    result["figures"] = [
        figure(
            "alloc_free_pairs",
            f"us per alloc/free pair ({name}, {result[name]['tokens_per_alloc']} tok)",
            "us (CPU)",
            release=off[name]["cpu_s"] / args.pairs * 1e6,
            contracts_on=on[name]["cpu_s"] / args.pairs * 1e6,
            higher_is_better=False,
            target="on/off <= 2",
        )
        for name in ("token", "paged")
    ]
    result["python"] = platform.python_version()
    result["cpus"] = os.cpu_count()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
