"""PD figures, one JSON line: ``kvledger simulate --pd`` steps/s contracts on vs off (one invocation), or
the PD state machine's system steps/s and whether its runs were clean.

Contracts are fixed at import, so each setting runs in its own subprocess of this script.

    python benchmarks/pd_steps.py [--quick] [--fault-rate F] [--abort-rate A]
    python benchmarks/pd_steps.py --machine EXAMPLES STEPS [--model]     # randomised, like the deep profile
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, per_second, ratio

ROOT = Path(__file__).resolve().parents[1]


def _simulate(quick: bool, fault_rate: float, abort_rate: float) -> dict[str, object]:
    from kvledger.sim.pd import PDSimOptions, run_pd_simulation
    from kvledger.sim.simulate import SimOptions
    from kvledger.sim.workload import GSPWorkload

    workload = GSPWorkload(num_groups=2, prompts_per_group=4, output_len=16) if quick else GSPWorkload()
    cpu = time.process_time()
    result = run_pd_simulation(
        PDSimOptions(base=SimOptions(workload=workload), fault_rate=fault_rate, abort_rate=abort_rate)
    )
    cpu = time.process_time() - cpu
    return {
        "requests": result.requests,
        "steps": result.steps,
        "wall_s": result.wall_s,
        "cpu_s": cpu,
        "steps_per_s": per_second(result.steps, result.wall_s),
        "finished": result.finished,
        "violations": result.violations,
    }


def _machine(examples: int, steps: int, model: bool) -> dict[str, object]:
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    sys.path.insert(0, str(ROOT))
    from tests.disagg.test_pd_machine import PDMachine, PDModelMachine

    machine = PDModelMachine if model else PDMachine
    start = time.perf_counter()
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize=False,
            database=None,
            print_blob=True,
            suppress_health_check=list(HealthCheck),
        ),
    )
    wall = time.perf_counter() - start
    return {
        "machine": machine.__name__,
        "examples": examples,
        "stateful_step_count": steps,
        "system_steps": machine.steps_run,
        "wall_s": wall,
        "system_steps_per_s": per_second(machine.steps_run, wall),
        "clean": True,  # a failing run raises and prints its reproduction instead
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--fault-rate", type=float, default=0.02)
    p.add_argument("--abort-rate", type=float, default=0.02)
    p.add_argument("--machine", nargs=2, type=int, metavar=("EXAMPLES", "STEPS"))
    p.add_argument("--model", action="store_true", help="the machine with the tiny hybrid model")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.machine:
        print(json.dumps({"benchmark": "pd_machine", **_machine(*ns.machine, ns.model)}))
        return
    if ns.child:
        print(json.dumps(_simulate(ns.quick, ns.fault_rate, ns.abort_rate)))
        return
    figures: dict[str, dict[str, object]] = {}
    for label, flag in (("contracts_off", "0"), ("contracts_on", "1")):
        args = [sys.executable, __file__, "--child", "--fault-rate", str(ns.fault_rate)]
        args += ["--abort-rate", str(ns.abort_rate), *(["--quick"] if ns.quick else [])]
        out = subprocess.run(
            args, env=dict(os.environ, KVLEDGER_CONTRACTS=flag), check=True, capture_output=True, text=True
        ).stdout
        figures[label] = json.loads(out.strip().splitlines()[-1])
    off, on = figures["contracts_off"], figures["contracts_on"]
    wall_ratio = ratio(float(on["wall_s"]), float(off["wall_s"]))  # type: ignore[arg-type]
    row = figure(
        "pd_steps",
        f"PD system steps/s, simulate --pd workload ({off['requests']} requests, {off['steps']} steps,"
        f" {ns.fault_rate:.0%} faults, {ns.abort_rate:.0%} aborts)",
        "steps/s (CPU)",
        release=per_second(float(off["steps"]), float(off["cpu_s"])),  # type: ignore[arg-type]
        contracts_on=per_second(float(on["steps"]), float(on["cpu_s"])),  # type: ignore[arg-type]
        note=f"wall on/off {'n/a' if wall_ratio is None else f'{wall_ratio:.2f}'}",
    )
    print(
        json.dumps(
            {
                "benchmark": "pd_steps",
                "quick": ns.quick,
                "fault_rate": ns.fault_rate,
                "abort_rate": ns.abort_rate,
                **figures,
                "on_off_time_ratio": wall_ratio,
                "figures": [row],
            }
        )
    )


if __name__ == "__main__":
    main()
