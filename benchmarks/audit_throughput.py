"""``kvledger audit`` throughput: events per CPU second, replaying a recorded ``kvledger simulate`` run.

The log is recorded once (the ``kvledger simulate`` default workload, ``--record``), then audited in a
fresh process with contracts off and with them on (the replay's ledger carries icontract
postconditions when they are on), alternating, in one invocation. Each child audits the log
``--repeat`` times and reports the best CPU time (the steadiest figure on a shared machine).

    python benchmarks/audit_throughput.py [--quick] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, per_second


def _record(path: Path, quick: bool) -> int:
    from kvledger.sim.simulate import SimOptions, run_simulation
    from kvledger.sim.workload import GSPWorkload

    wl = GSPWorkload(num_groups=2, prompts_per_group=4, output_len=16) if quick else GSPWorkload()
    with open(path, "w", encoding="utf-8") as f:
        result = run_simulation(SimOptions(workload=wl), record=f)
    assert result.violation is None, result.violation
    return result.steps


def _child(path: str, repeat: int) -> dict[str, Any]:
    from kvledger.audit import audit_file

    best = None
    report = None
    for _ in range(repeat):
        report = audit_file(path)
        assert report.clean, report.violation
        best = report.cpu_s if best is None else min(best, report.cpu_s)
    assert report is not None and best is not None
    return {"events": report.events, "cpu_s": best, "by_kind": report.by_kind}


def _audit(path: Path, flag: str, repeat: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(path), f"--repeat={repeat}"],
        env=dict(os.environ, KVLEDGER_CONTRACTS=flag),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeat", type=int, default=None, help="audits per setting (default: 5, quick: 2)")
    p.add_argument("--child", metavar="LOG", default=None, help=argparse.SUPPRESS)
    ns = p.parse_args()
    repeat = ns.repeat or (2 if ns.quick else 5)
    if ns.child:
        print(json.dumps(_child(ns.child, repeat)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "run.jsonl"
        steps = _record(log, ns.quick)
        size = log.stat().st_size
        off = _audit(log, "0", repeat)
        on = _audit(log, "1", repeat)
    events = off["events"]
    release, contracts_on = per_second(events, off["cpu_s"]), per_second(events, on["cpu_s"])
    print(
        json.dumps(
            {
                "benchmark": "audit_throughput",
                "quick": ns.quick,
                "events": events,
                "steps": steps,
                "log_bytes": size,
                "by_kind": off["by_kind"],
                "contracts_off": off,
                "contracts_on": on,
                "events_per_s_contracts_off": release,
                "events_per_s_contracts_on": contracts_on,
                "figures": [
                    figure(
                        "audit_throughput",
                        f"kvledger audit: events/s replaying a recorded simulate run ({events} events,"
                        f" {steps} steps, {size / 1e6:.1f} MB)",
                        "events/s (CPU)",
                        release=release,
                        contracts_on=contracts_on,
                        note=f"best of {repeat} audits per setting",
                    )
                ],
            }
        )
    )


if __name__ == "__main__":
    main()
