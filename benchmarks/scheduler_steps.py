"""Scheduler steps/s on the default ``kvledger simulate`` workload, contracts on vs off, in one invocation.

Contracts are fixed at import, so each setting runs in its own subprocess of this script; the parent
prints one JSON line with both figures and their ratio.

    python benchmarks/scheduler_steps.py [--quick] [--overlap]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import ratio


def _child(quick: bool, overlap: bool) -> dict[str, object]:
    from kvledger.sim.simulate import SimOptions, run_simulation
    from kvledger.sim.workload import GSPWorkload

    workload = GSPWorkload(num_groups=2, prompts_per_group=4, output_len=16) if quick else GSPWorkload()
    result = run_simulation(SimOptions(workload=workload, overlap=overlap))
    return {
        "steps": result.steps,
        "wall_s": result.wall_s,
        "steps_per_s": result.steps_per_s,
        "violations": result.violations,
        "contract_checks": result.contract_checks,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--overlap", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.child:
        print(json.dumps(_child(ns.quick, ns.overlap)))
        return
    figures: dict[str, dict[str, object]] = {}
    for label, flag in (("contracts_off", "0"), ("contracts_on", "1")):
        args = [
            sys.executable,
            __file__,
            "--child",
            *(["--quick"] if ns.quick else []),
            *(["--overlap"] if ns.overlap else []),
        ]
        out = subprocess.run(
            args, env=dict(os.environ, KVLEDGER_CONTRACTS=flag), check=True, capture_output=True, text=True
        ).stdout
        figures[label] = json.loads(out.strip().splitlines()[-1])
    off, on = figures["contracts_off"], figures["contracts_on"]
    print(
        json.dumps(
            {
                "benchmark": "scheduler_steps",
                "quick": ns.quick,
                "overlap": ns.overlap,
                **figures,
                "on_off_time_ratio": ratio(float(on["wall_s"]), float(off["wall_s"])),  # type: ignore[arg-type]
            }
        )
    )


if __name__ == "__main__":
    main()
