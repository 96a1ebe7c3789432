"""Snapshot what refactorings must keep: `kvledger simulate --json` figures and recorded event logs.

Runs a few default workloads (the plain default, PD, speculative decoding, no Mamba) and writes, per
workload, the JSON report with its timing fields removed and the recorded event log, into a folder.
Two snapshots taken before and after a refactoring must compare equal (``diff -r``); wall-clock fields
and the output paths are the only ones dropped because they are the only ones that differ between two runs of
the same code.

    PYTHONPATH=$PWD .venv/bin/python scripts/behaviour_snapshot.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WORKLOADS = {
    "default": [],
    "pd": ["--pd"],
    "speculative": ["--speculative", "2"],
    "no_mamba": ["--no-mamba"],
    "faults": ["--alloc-fault-rate", "0.05", "--abort-rate", "0.05"],
}
TIMING_KEYS = {"wall_s", "steps_per_s", "record", "records"}  # record(s): output paths, not figures


def _strip(value: object) -> object:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_KEYS and not k.endswith("_s")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, args in WORKLOADS.items():
        events = out / f"{name}.events"
        cmd = [
            sys.executable,
            "-m",
            "kvledger",
            "simulate",
            "--json",
            "--no-plot",
            "--no-progress",
            "--record",
            str(events),
            *args,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ, check=False)
        report = json.loads(done.stdout) if done.stdout.strip() else {"stderr": done.stderr[-2000:]}
        (out / f"{name}.json").write_text(json.dumps(_strip(report), indent=1, sort_keys=True) + "\n")
        print(name, done.returncode, flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
