"""The cost of the count identities that stay on in a release build (issue 10), in one invocation.

With ``KVLEDGER_CONTRACTS=0`` the scheduler still checks I-COUNT and I-CAP for every pool after every step
(and I-IDLE-IDENTITY at quiescence), from its counters and one pass over the live requests. This script
runs the ``kvledger simulate`` default workload in a child process with contracts off, alternating
rounds with the checks on and off (``Accounting.counting``): through the scheduler loop alone (no
timeline: the loop is where the cost would show; scheduler steps per CPU second) and as a whole
``kvledger simulate`` run (whose timeline computes the terms every step anyway; CPU seconds). It prints
both settings and their ratio (>= 1: the checks' cost).

    python benchmarks/count_checks.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, per_second, ratio


def _loop(counting: bool, quick: bool) -> tuple[int, float, int]:
    """One run of the workload: (steps, CPU seconds, count checks run)."""
    from kvledger.reference.engine import build_engine
    from kvledger.sim.simulate import SimOptions
    from kvledger.sim.workload import GSPWorkload

    wl = GSPWorkload(num_groups=2, prompts_per_group=4, output_len=16) if quick else GSPWorkload()
    opts = SimOptions(workload=wl)
    sched = build_engine(opts.engine_spec())
    sched.accounting.counting = counting
    arrivals = wl.stream()
    left = wl.total
    cpu = time.process_time()
    while left or sched.has_work():
        batch = list(itertools.islice(arrivals, wl.arrivals_per_step))
        left -= len(batch)
        for rid, prompt, max_new in batch:
            sched.add_request(rid, prompt, max_new)
        sched.step()
    cpu = time.process_time() - cpu
    return sched.step_no, cpu, sched.stats.count_checks


def _simulate(counting: bool, quick: bool) -> tuple[int, float]:
    """One ``kvledger simulate`` run (timeline included: it computes the terms every step anyway)."""
    import kvledger.sim.simulate as simulate
    from kvledger.sim.workload import GSPWorkload

    def build(spec: Any) -> Any:
        sched = simulate.build_engine(spec)
        sched.accounting.counting = counting
        return sched

    wl = GSPWorkload(num_groups=2, prompts_per_group=4, output_len=16) if quick else GSPWorkload()
    cpu = time.process_time()
    result = simulate.run_simulation(simulate.SimOptions(workload=wl), build=build)
    cpu = time.process_time() - cpu
    assert (result.count_checks > 0) == counting
    return result.steps, cpu


def _child(quick: bool, rounds: int) -> dict[str, Any]:
    from kvledger.contracts import switch

    assert not switch.ENABLED, "run with KVLEDGER_CONTRACTS=0"
    on_cpu = off_cpu = sim_on = sim_off = 0.0
    steps = checks = 0
    for _ in range(rounds):  # alternate, so machine load affects both settings alike
        s_on, c_on, checks = _loop(True, quick)
        _s_off, c_off, none = _loop(False, quick)
        assert none == 0 and checks == s_on
        steps, on_cpu, off_cpu = s_on, on_cpu + c_on, off_cpu + c_off
        sim_on += _simulate(True, quick)[1]
        sim_off += _simulate(False, quick)[1]
    return {
        "steps": steps,
        "rounds": rounds,
        "checks_per_run": checks,
        "on_cpu_s": on_cpu,
        "off_cpu_s": off_cpu,
        "simulate_on_cpu_s": sim_on,
        "simulate_off_cpu_s": sim_off,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=None, help="alternating rounds (default: 3, quick: 2)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args()
    rounds = ns.rounds or (2 if ns.quick else 3)
    if ns.child:
        print(json.dumps(_child(ns.quick, rounds)))
        return
    args = [sys.executable, __file__, "--child", f"--rounds={rounds}"] + (["--quick"] if ns.quick else [])
    out = subprocess.run(
        args, env=dict(os.environ, KVLEDGER_CONTRACTS="0"), check=True, capture_output=True, text=True
    ).stdout
    child: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    total_steps = child["steps"] * child["rounds"]
    with_checks = per_second(total_steps, child["on_cpu_s"])
    without = per_second(total_steps, child["off_cpu_s"])
    cost = ratio(child["on_cpu_s"], child["off_cpu_s"])
    per_check_us = (child["on_cpu_s"] - child["off_cpu_s"]) / total_steps * 1e6 if total_steps else None
    sim_cost = ratio(child["simulate_on_cpu_s"], child["simulate_off_cpu_s"])
    result = {
        "benchmark": "count_checks",
        "quick": ns.quick,
        **child,
        "steps_per_s_with_checks": with_checks,
        "steps_per_s_without_checks": without,
        "cost_ratio": cost,
        "us_per_step_check": per_check_us,
        "simulate_cost_ratio": sim_cost,
        "figures": [
            figure(
                "count_checks",
                f"steps/s, release build, count identities after every step ({child['steps']} steps x"
                f" {child['rounds']} rounds)",
                "steps/s (CPU)",
                release=with_checks,
                ratio=False,
                target=None,  # issue 10 asks for the cost to be measured, not for a bound
                note=(
                    f"without the checks {without or 0:.0f} steps/s; cost {cost or 0:.3f}x,"
                    f" {per_check_us or 0:.1f} us per step"
                ),
                without_checks=without,
                cost_ratio=cost,
            ),
            figure(
                "count_checks",
                "kvledger simulate (default workload, timeline included), release build, count identities on",
                "s (CPU)",
                release=child["simulate_on_cpu_s"] / child["rounds"],
                ratio=False,
                higher_is_better=False,
                target=None,  # issue 10 asks for the cost to be measured, not for a bound
                note=(
                    f"without the checks {child['simulate_off_cpu_s'] / child['rounds']:.3f} s;"
                    f" cost {sim_cost or 0:.3f}x (the timeline computes the terms anyway)"
                ),
                without_checks=child["simulate_off_cpu_s"] / child["rounds"],
                cost_ratio=sim_cost,
            ),
        ],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
