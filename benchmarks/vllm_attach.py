"""Cost of kvledger's vLLM attach: the same scheduler-shaped workload on vLLM's hybrid KVCacheManager,
bare and watched (every call mirrored into the shared-ownership ledger and checked).

"Bare" runs the identical driver with the attach's read-back disabled (a subclass whose ``_observe``
does nothing), so the difference is the read-back plus the checks. "watched" reads the whole pool
back after every call (``audit_every=1``); "incremental" reads only the touched blocks, with a full
audit every ``--audit-every`` calls. Best of ``--repeat`` CPU times.

    python benchmarks/vllm_attach.py [--quick] [--repeat N] [--blocks N] [--audit-every N]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from kvledger.engines.vllm.attach import WatchedHybrid
from kvledger.engines.vllm.build import HybridLayout, build_hybrid
from kvledger.engines.vllm.drive import HybridDriver


class BareHybrid(WatchedHybrid):
    """The attach's forwarding with no read-back or check: vLLM's own cost plus the call overhead."""

    def _observe(
        self, op: str, touched: tuple[str, ...] = (), released: tuple[str, ...] = (), audit: bool = False
    ) -> None:
        self.calls += 1


def workload(driver: HybridDriver, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    prefixes = [list(range(1000 * k, 1000 * k + 64)) for k in range(4)]
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.25 or not driver.running:
            rid = driver.arrive([*prefixes[rng.randrange(4)][: rng.randint(8, 64)], rng.randrange(9)])
            driver.admit(rid)
        elif roll < 0.85:
            driver.decode(rng.choice(sorted(driver.running)), rng.randrange(9))
        elif roll < 0.9 and driver.waiting:
            driver.admit(rng.choice(sorted(driver.waiting)))
        elif roll < 0.95:
            driver.preempt(rng.choice(sorted(driver.running)))
        else:
            driver.finish(rng.choice(sorted(driver.running)))


def run(kind: type[WatchedHybrid], layout: HybridLayout, steps: int, audit_every: int = 1) -> tuple[float, int]:
    driver = HybridDriver(kind(build_hybrid(layout), audit_every=audit_every))
    start = time.process_time()
    workload(driver, steps, seed=7)
    return time.process_time() - start, driver.watched.calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=256)
    parser.add_argument("--audit-every", type=int, default=100)
    args = parser.parse_args()
    steps = 300 if args.quick else 3000
    layout = HybridLayout(num_blocks=args.blocks, block_size=16, max_model_len=1024)
    modes = (("bare", BareHybrid, 1), ("watched", WatchedHybrid, 1), ("incremental", WatchedHybrid, args.audit_every))
    best: dict[str, Any] = {}
    for _ in range(args.repeat):
        for name, kind, audit_every in modes:
            seconds, calls = run(kind, layout, steps, audit_every)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, calls)
    bare, watched, incremental = best["bare"], best["watched"], best["incremental"]
    print(
        json.dumps(
            {
                "benchmark": "vllm_attach",
                "vllm": build_hybrid(layout).modules.version,
                "num_blocks": args.blocks,
                "block_size": layout.block_size,
                "steps": steps,
                "manager_calls": watched[1],
                "bare_cpu_s": round(bare[0], 4),
                "watched_cpu_s": round(watched[0], 4),
                "bare_us_per_call": round(1e6 * bare[0] / bare[1], 1),
                "watched_us_per_call": round(1e6 * watched[0] / watched[1], 1),
                "slowdown": round(watched[0] / bare[0], 2),
                "audit_every": args.audit_every,
                "incremental_cpu_s": round(incremental[0], 4),
                "incremental_us_per_call": round(1e6 * incremental[0] / incremental[1], 1),
                "incremental_slowdown": round(incremental[0] / bare[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
