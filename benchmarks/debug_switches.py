"""What each debug-build switch costs: process CPU seconds of one ``kvledger simulate`` run per setting.

The settings (the ``KVLEDGER_...`` variables of docs/debug-builds.md): release (contracts off), the
debug default (contracts on), contracts on with ``KVLEDGER_FAST_CONTRACTS=0``, with
``KVLEDGER_RECOUNT_EVERY_STEP=1``, and with ``KVLEDGER_LEDGER_HISTORY=1024``. The switches are read at
import, so each run is a fresh subprocess; the settings are interleaved ``--reps`` times in this one
invocation so that all of them see the same machine load, and the median CPU time is reported (CPU time
of the run itself, import excluded: steadier than wall time on a shared machine), with the peak
resident memory of the process.

    python benchmarks/debug_switches.py [--quick] [--reps N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, ratio

SETTINGS: dict[str, dict[str, str]] = {
    "release": {"KVLEDGER_CONTRACTS": "0"},
    "debug": {"KVLEDGER_CONTRACTS": "1"},
    "debug, KVLEDGER_FAST_CONTRACTS=0": {"KVLEDGER_CONTRACTS": "1", "KVLEDGER_FAST_CONTRACTS": "0"},
    "debug, KVLEDGER_RECOUNT_EVERY_STEP=1": {"KVLEDGER_CONTRACTS": "1", "KVLEDGER_RECOUNT_EVERY_STEP": "1"},
    "debug, KVLEDGER_LEDGER_HISTORY=1024": {"KVLEDGER_CONTRACTS": "1", "KVLEDGER_LEDGER_HISTORY": "1024"},
}
SWITCHES = ("KVLEDGER_CONTRACTS", "KVLEDGER_FAST_CONTRACTS", "KVLEDGER_RECOUNT_EVERY_STEP", "KVLEDGER_LEDGER_HISTORY")


def _child(quick: bool) -> dict[str, Any]:
    import resource
    import time

    from kvledger.sim.simulate import SimOptions, run_simulation
    from kvledger.sim.workload import GSPWorkload

    workload = GSPWorkload(num_groups=2, prompts_per_group=4, output_len=16) if quick else GSPWorkload()
    cpu = time.process_time()
    result = run_simulation(SimOptions(workload=workload))
    cpu = time.process_time() - cpu
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {"steps": result.steps, "cpu_s": cpu, "peak_rss_mib": rss_mib, "violations": result.violations}


def _run(setting: str, quick: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES} | SETTINGS[setting]
    args = [sys.executable, __file__, "--child"] + (["--quick"] if quick else [])
    out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="a tiny workload, one repetition")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default: 3)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.child:
        print(json.dumps(_child(ns.quick)))
        return
    reps = 1 if ns.quick else ns.reps
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
    for _ in range(reps):
        for name in SETTINGS:
            runs[name].append(_run(name, ns.quick))
    cpu = {name: statistics.median(r["cpu_s"] for r in rs) for name, rs in runs.items()}
    rss = {name: max(r["peak_rss_mib"] for r in rs) for name, rs in runs.items()}
    figures = [
        figure(
            "debug_switches",
            f"simulate run, {name}",
            "CPU s",
            release=cpu["release"],
            contracts_on=cpu[name],
            higher_is_better=False,
            note=f"vs the debug default {ratio(cpu[name], cpu['debug']) or 0:.2f}x; peak RSS {rss[name]:.0f} MiB",
        )
        for name in SETTINGS
        if name != "release"
    ]
    out = {
        "benchmark": "debug_switches",
        "quick": ns.quick,
        "reps": reps,
        "steps": runs["release"][0]["steps"],
        "cpu_s_median": cpu,
        "peak_rss_mib": rss,
        "load_average": os.getloadavg(),
        "figures": figures,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
