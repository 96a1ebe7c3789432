"""Scheduler steps/s on the ``kvledger simulate`` workloads, contracts on vs off, in one invocation.

Workloads: ``default`` (the ``kvledger simulate`` default: 8 groups x 16 prompts) and ``10x`` (8 groups x
160 prompts: ten times the requests, same shapes and arrival rate). Contracts are fixed at import, so
each setting runs in its own subprocess of this script; the parent prints one JSON line with both
figures and their ratios (wall time, and process CPU time, which a shared machine disturbs less).

    python benchmarks/scheduler_steps.py [--quick] [--overlap] [--workload default|10x]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, ratio

WORKLOADS = {"default": 16, "10x": 160}  # prompts per group (8 groups)


def _child(workload: str, quick: bool, overlap: bool, strategy: str) -> dict[str, object]:
    import time

    from kvledger.sim.simulate import SimOptions, run_simulation
    from kvledger.sim.workload import GSPWorkload

    if quick:
        wl = GSPWorkload(num_groups=2, prompts_per_group=4 if workload == "default" else 12, output_len=16)
    else:
        wl = GSPWorkload(prompts_per_group=WORKLOADS[workload])
    cpu = time.process_time()
    result = run_simulation(SimOptions(workload=wl, overlap=overlap, mamba_strategy=strategy))  # type: ignore[arg-type]
    cpu = time.process_time() - cpu
    return {
        "requests": result.requests,
        "steps": result.steps,
        "wall_s": result.wall_s,
        "cpu_s": cpu,
        "steps_per_s": result.steps_per_s,
        "violations": result.violations,
        "contract_checks": result.contract_checks,
    }


def _run(workload: str, flag: str, ns: argparse.Namespace) -> dict[str, Any]:
    args = [sys.executable, __file__, "--child", f"--workload={workload}"]
    args += (["--quick"] if ns.quick else []) + (["--overlap"] if ns.overlap else [])
    args += [f"--mamba-strategy={ns.mamba_strategy}"]
    out = subprocess.run(
        args, env=dict(os.environ, KVLEDGER_CONTRACTS=flag), check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--overlap", action="store_true")
    p.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    p.add_argument(
        "--mamba-strategy",
        choices=["no_buffer", "extra_buffer"],
        default="extra_buffer",
        help="the Mamba radix cache: V1 (no_buffer) or V2 (extra_buffer, simulate's default)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.child:
        print(json.dumps(_child(ns.workload, ns.quick, ns.overlap, ns.mamba_strategy)))
        return
    names = list(WORKLOADS) if ns.workload == "all" else [ns.workload]
    out: dict[str, Any] = {
        "benchmark": "scheduler_steps",
        "quick": ns.quick,
        "overlap": ns.overlap,
        "mamba_strategy": ns.mamba_strategy,
    }
    figures = []
    for name in names:
        off, on = _run(name, "0", ns), _run(name, "1", ns)
        out[name] = {
            "contracts_off": off,
            "contracts_on": on,
            "on_off_time_ratio": ratio(float(on["wall_s"]), float(off["wall_s"])),
            "on_off_cpu_ratio": ratio(float(on["cpu_s"]), float(off["cpu_s"])),
        }
        figures.append(
            figure(
                "scheduler_steps",
                f"steps/s, {name} simulate workload, {ns.mamba_strategy}"
                f" ({off['requests']} requests, {off['steps']} steps)",
                "steps/s (CPU)",
                release=off["steps"] / off["cpu_s"] if off["cpu_s"] > 0 else None,
                contracts_on=on["steps"] / on["cpu_s"] if on["cpu_s"] > 0 else None,
                target="on/off <= 1.5",
                note=f"wall on/off {_fmt(out[name]['on_off_time_ratio'])}",
            )
        )
    # The first workload's figures at the top level, as before (one workload per key otherwise).
    first = out[names[0]]
    out.update(contracts_off=first["contracts_off"], contracts_on=first["contracts_on"])
    out["on_off_time_ratio"] = first["on_off_time_ratio"]
    out["figures"] = figures
    print(json.dumps(out))


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    main()
