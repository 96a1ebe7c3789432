"""The cost of ``attach_scheduler``: SGLang's real Scheduler loop bare and attached, the same steps.

One release per process (``--release``, default 0.5.10). Each seed's generic workload
(``kvledger.engines.sglang.scheduler.workload.run``: arrivals with shared prefixes, follow-up turns, one
loop step at a time, SGLang's strict idle check on) runs on a fresh bare scheduler, then on a fresh
attached one (every id move mirrored into the ledgers, the queue identity and a full audit after every
step). The two runs must draw the same operations. Prints JSON: CPU seconds of the loop (the import and
the build are not counted), operations per CPU second, and attached / bare.

    python benchmarks/sglang_scheduler_attach.py [--release 0.5.10] [--seeds N] [--ops N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def measure(release: str, seeds: int, ops: int) -> dict[str, Any]:
    from kvledger.engines.sglang.scheduler.build import SchedulerShape, build_attached, build_scheduler
    from kvledger.engines.sglang.scheduler.workload import run

    bare_s = attached_s = 0.0
    steps = checked = 0
    for seed in range(seeds):
        bare = run(build_scheduler(release, SchedulerShape(seed=seed)), seed, ops)
        scheduler = build_attached(release, SchedulerShape(seed=seed))
        attached = run(scheduler, seed, ops)
        if bare.ops != attached.ops or (bare.finding is None) != (attached.finding is None):
            raise SystemExit(f"seed {seed}: the attached run drew different operations than the bare one")
        bare_s += bare.cpu_seconds
        attached_s += attached.cpu_seconds
        steps += bare.steps
        checked += scheduler.kvledger_watch.steps
    return {
        "benchmark": "sglang_scheduler_attach",
        "release": release,
        "seeds": seeds,
        "ops": steps,
        "scheduler_steps_checked": checked,
        "bare_cpu_s": round(bare_s, 3),
        "attached_cpu_s": round(attached_s, 3),
        "bare_ops_per_cpu_s": round(steps / bare_s, 1),
        "attached_ops_per_cpu_s": round(steps / attached_s, 1),
        "attached_over_bare": round(attached_s / bare_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--release", default="0.5.10")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="2 seeds x 100 operations")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.ops = 2, 100
    from kvledger.contracts.errors import InvalidArgument
    from kvledger.engines.sglang.scheduler.release import release_dir

    try:  # a side-by-side folder, or the venv's own release (0.5.23)
        release_dir(args.release)
    except InvalidArgument as missing:
        print(json.dumps({"benchmark": "sglang_scheduler_attach", "skipped": str(missing)}))
        return
    os.environ.setdefault("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE", "1")
    print(json.dumps(measure(args.release, args.seeds, args.ops)))


if __name__ == "__main__":
    main()
