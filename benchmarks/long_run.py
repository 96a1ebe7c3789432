#!/usr/bin/env python
"""Resident memory over a long ``kvledger simulate`` run: is it flat? Contracts off and on, one JSON line.

Issue 17: a contract-enabled build must be able to run for days, so its memory must not grow with the
number of requests served. Each setting runs in its own child process (the switch is read at
import): a steady generated-shared-prefix workload (``--requests``, 40,000 by default; short prompts so
the run takes minutes, closed-loop arrivals so the waiting queue stays bounded as in a server at steady
load), through the same ``run_simulation`` that ``kvledger simulate`` uses (timeline, peak use, the
after-step identity). Resident memory (``/proc/self/statm``) is sampled every ``--sample-every``
finished requests. After the warm-up (``--warmup`` requests, half the run by default, and at least
until every ledger's move log is full: pools, caches, logs and the timeline then have their steady
size; the allocator's arenas take a few thousand more requests to settle) a least-squares line
through the samples gives the **slope in KiB per 1,000 requests**, with its standard error. Flat
means a slope within about two standard errors of 0.

The child also reports what a run would accumulate if something leaked: requests the scheduler still
holds, owners registered in each ledger, the ledgers' log lengths, requests the accounting follows and
the timeline's length.

    benchmarks/long_run.py                  # 40,000 requests per setting, the slope over the last 20,000
    benchmarks/long_run.py --quick          # 400 requests: a smoke run for tests
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure

QUICK_REQUESTS = 400


def rss_kib() -> int:
    """Current resident set size of this process (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def slope_per_1000(samples: list[tuple[int, int]]) -> tuple[float | None, float | None]:
    """Least-squares slope of RSS (KiB) over requests, per 1,000 requests, and its standard error."""
    n = len(samples)
    if n < 3:
        return None, None
    xs = [r / 1000 for r, _ in samples]
    ys = [float(k) for _, k in samples]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None, None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, (resid / (n - 2) / sxx) ** 0.5


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import kvledger.sim.simulate as sim
    from kvledger.contracts import switch
    from kvledger.sim.workload import GSPWorkload

    groups = 8
    workload = GSPWorkload(
        num_groups=groups,
        prompts_per_group=-(-args.requests // groups),
        system_prompt_len=128,
        question_len=32,
        output_len=16,
        arrivals_per_step=4,
    )
    engines: list[Any] = []

    def keep(spec: Any) -> Any:  # the engine kept, to read the scheduler's bookkeeping sizes at the end
        engines.append(sim.build_engine(spec))
        return engines[-1]

    samples: list[tuple[int, int]] = []
    steady_from: list[int] = []  # the first sample at which every ledger's move log is full
    nxt = [0]

    def logs_full() -> bool:
        sched = engines[-1]
        pools = (sched.kv_allocator, sched.req_to_token_pool, sched.mamba_pool)
        return all(
            len(p.ledger._log) >= p.ledger._log.size for p in pools if p is not None and p.ledger.enabled
        )

    def progress(done: int, total: int) -> None:
        if done >= nxt[0]:
            samples.append((done, rss_kib()))
            nxt[0] = done + args.sample_every
            if not steady_from and logs_full():
                steady_from.append(done)

    opts = sim.SimOptions(workload=workload, max_waiting=32, max_steps=50 * workload.total)
    start, cpu = time.perf_counter(), time.process_time()
    result = sim.run_simulation(opts, progress=progress, build=keep)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    # Samples are taken while requests are served (the end of the run releases memory: not a sample).
    # Warm-up: the first half, and until every move log is full (their fixed size is reached then).
    warmup = max(args.warmup, steady_from[0] if steady_from else workload.total)
    after = [s for s in samples if s[0] >= warmup]
    slope, stderr = slope_per_1000(after)
    sched = engines[-1]
    pools = {"kv": sched.kv_allocator, "req": sched.req_to_token_pool, "mamba": sched.mamba_pool}
    return {
        "contracts": switch.ENABLED,
        "requests": result.requests,
        "finished": result.finished,
        "steps": result.steps,
        "violations": result.violations,
        "wall_s": wall,
        "cpu_s": cpu,
        "warmup_requests": warmup,
        "rss_kib_first": samples[0][1],
        "rss_kib_at_warmup": after[0][1] if after else None,
        "rss_kib_last": samples[-1][1],
        "slope_kib_per_1000_requests": slope,
        "slope_stderr": stderr,
        "samples": samples,
        "retained": {
            "requests_in_scheduler": len(sched.requests),
            "tracked_by_accounting": sched.accounting.tracked_requests(),
            "timeline_points": len(result.timeline),
            "owners_registered": {k: p.ledger.registered_owners() for k, p in pools.items() if p is not None},
            "ledger_log_entries": {
                k: len(p.ledger._log) if p.ledger.enabled else 0 for k, p in pools.items() if p is not None
            },
        },
    }


def _run_child(contracts: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        f"--requests={args.requests}",
        f"--warmup={args.warmup}",
        f"--sample-every={args.sample_every}",
    ]
    env = dict(os.environ, KVLEDGER_CONTRACTS=contracts)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child with KVLEDGER_CONTRACTS={contracts} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=40_000)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS} requests")
    parser.add_argument("--warmup", type=int, default=None, help="requests before the slope is fitted (1/2)")
    parser.add_argument("--sample-every", type=int, default=None, help="requests between RSS samples")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests = QUICK_REQUESTS
    if args.requests < 100:
        parser.error("--requests must be >= 100")
    args.warmup = args.warmup if args.warmup is not None else args.requests // 2
    args.sample_every = args.sample_every or max(args.requests // 100, 10)
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    off, on = _run_child("0", args), _run_child("1", args)
    result: dict[str, Any] = {
        "benchmark": "long_run",
        "requests": args.requests,
        "warmup_requests": args.warmup,
        "sample_every": args.sample_every,
        "contracts_off": off,
        "contracts_on": on,
        "figures": [
            figure(
                "long_run",
                "RSS slope after warm-up",
                "KiB/1000 req",
                release=off["slope_kib_per_1000_requests"],
                contracts_on=on["slope_kib_per_1000_requests"],
                ratio=False,
                target="0 within noise",
                note=(
                    f"stderr {_fmt(off['slope_stderr'])} / {_fmt(on['slope_stderr'])};"
                    f" {args.requests} requests"
                ),
            ),
            figure(
                "long_run",
                "RSS at the end",
                "MiB",
                release=off["rss_kib_last"] / 1024,
                contracts_on=on["rss_kib_last"] / 1024,
                ratio=False,
            ),
            figure(
                "long_run",
                "requests/s",
                "req/s",
                release=off["requests"] / off["wall_s"] if off["wall_s"] > 0 else None,
                contracts_on=on["requests"] / on["wall_s"] if on["wall_s"] > 0 else None,
                higher_is_better=True,
            ),
        ],
    }
    print(json.dumps(result))
    return 0


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


if __name__ == "__main__":
    sys.exit(main())
