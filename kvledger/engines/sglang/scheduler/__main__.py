"""``python -m kvledger.engines.sglang.scheduler {hunt,replay,alias,ci} --release X``: prints one JSON object.

One release per process (two SGLang releases cannot share one). ``hunt``: seeds x ops of the generic
workload (:mod:`.workload`), stops at the first finding and shrinks it. ``replay FILE``: a saved repro
(``repros/*.json``). ``alias``: a control run where two requests are made to share one Mamba slot by a
scoped patch (outside SGLang and outside the reference code), which the fake worker's tags must catch.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvledger.engines.sglang.scheduler.controls import attach_controls
from kvledger.engines.sglang.scheduler.loop import STRICT_IDLE_CHECK

REPROS = Path(__file__).with_name("repros")


def _hunt(release: str, seeds: int, n_ops: int) -> dict[str, Any]:
    from kvledger.engines.sglang.scheduler.build import SchedulerShape, build_attached
    from kvledger.engines.sglang.scheduler.repro import shrink
    from kvledger.engines.sglang.scheduler.workload import run

    cpu, total_ops, requests = time.process_time(), 0, 0
    for seed in range(seeds):
        report = run(build_attached(release, SchedulerShape(seed=seed)), seed, n_ops)
        total_ops += report.steps
        requests += report.requests
        if report.finding is not None:
            small = shrink(
                functools.partial(build_attached, release, SchedulerShape(seed=seed)),
                report.ops[: report.steps],
                report.finding.kind,
            )
            return {
                "release": release,
                "seed": seed,
                "examples": seed + 1,
                "ops": total_ops,
                "requests": requests,
                "cpu_s": round(time.process_time() - cpu, 2),
                "finding": asdict(report.finding),
                "repro_ops": len(small),
                "repro": small,
            }
    return {
        "release": release,
        "examples": seeds,
        "ops": total_ops,
        "requests": requests,
        "cpu_s": round(time.process_time() - cpu, 2),
        "finding": None,
    }


def _replay(release: str, path: str) -> dict[str, Any]:
    from kvledger.engines.sglang.scheduler.build import SchedulerShape, build_attached
    from kvledger.engines.sglang.scheduler.repro import replay

    saved = json.loads(Path(path).read_text())
    found = replay(
        build_attached(release, SchedulerShape(**saved["shape"])), [tuple(o) for o in saved["ops"]]
    )
    return {"release": release, "ops": len(saved["ops"]), "finding": None if found is None else asdict(found)}


def _alias(release: str) -> dict[str, Any]:
    """Two running requests made to share one Mamba slot (the #12432 symptom) must fail a tag check."""
    from kvledger.engines.sglang.scheduler.build import build_scheduler
    from kvledger.engines.sglang.scheduler.loop import arrive, step
    from kvledger.engines.sglang.scheduler.worker import TagMismatch

    scheduler = build_scheduler(release)
    a = arrive(scheduler, "a", list(range(1, 11)), 6)
    b = arrive(scheduler, "b", list(range(50, 58)), 6)
    while not (
        a.req_pool_idx is not None and b.req_pool_idx is not None and len(a.output_ids) and len(b.output_ids)
    ):
        step(scheduler)  # until both are prefilled and decoding
    pool = scheduler.req_to_token_pool
    # the fault, outside SGLang: b's row now maps to a's Mamba slot (a slot handed out twice)
    pool.req_index_to_mamba_index_mapping[b.req_pool_idx] = pool.req_index_to_mamba_index_mapping[
        a.req_pool_idx
    ]
    try:
        step(scheduler)
        return {"release": release, "caught": False, "message": f"{a.output_ids} {b.output_ids}"}
    except TagMismatch as error:
        return {"release": release, "caught": True, "message": str(error)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvledger.engines.sglang.scheduler")
    parser.add_argument("command", choices=["hunt", "replay", "alias", "ci", "machine"])
    parser.add_argument("file", nargs="?")
    parser.add_argument("--release", required=True)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--examples", type=int, default=50, help="machine: Hypothesis examples")
    args = parser.parse_args(argv)
    os.environ.setdefault(STRICT_IDLE_CHECK, "1")
    start = time.perf_counter()
    if args.command == "hunt":
        out = _hunt(args.release, args.seeds, args.ops)
    elif args.command == "replay":
        out = _replay(args.release, args.file or str(REPROS / "issue16067.json"))
    elif args.command == "machine":
        from kvledger.engines.sglang.scheduler.machine import hunt_machine

        out = hunt_machine(args.release, args.examples, args.ops)
    elif args.command == "alias":
        out = _alias(args.release)
    else:  # what CI runs per release, in one process (one import): the repro, a budgeted hunt, the control
        out = {
            "replay": _replay(args.release, str(REPROS / "issue16067.json")),
            "hunt": _hunt(args.release, args.seeds, args.ops),
            "alias": _alias(args.release),
            "attach": attach_controls(args.release),
            "undersized": _replay(args.release, str(REPROS / "observed_0_5_10_mamba_alloc.json")),
        }
    out["wall_s"] = round(time.perf_counter() - start, 2)
    sys.stdout.write("KVLEDGER-JSON " + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
