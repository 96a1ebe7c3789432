#!/usr/bin/env python
"""A fuzz campaign over the generic machines: pytest-xdist workers sharing one Hypothesis example database.

Runs ``tests/campaign/test_machines.py`` (each item: one machine, ``--examples`` examples at a random
seed) with ``--workers`` pytest-xdist processes, every one reading and writing the example database
directory ``--db``; prints one JSON document: workers, items, examples, wall seconds, examples per
second, per machine, the failures (each names its invariant) and the load average::

    scripts/campaign.py --workers 2 --shards 4 --examples 50 --db .hypothesis/fuzz-db
    scripts/campaign.py --workers 16 --shards 64 --examples 2000 --db /shared/kvledger-fuzz-db   # nightly

Exit status: pytest's (0: no failure; 1: a machine failed: a bug of the reference, or of the exhibit
installed with ``--exhibit``). The same run without the script:
``KVLEDGER_CAMPAIGN=1 KVLEDGER_FUZZ_DB=DIR python -m pytest -n 2 tests/campaign``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2, help="pytest-xdist worker processes (default: 2)")
    p.add_argument("--shards", type=int, default=4, help="items per machine (default: 4)")
    p.add_argument("--examples", type=int, default=50, help="examples per item (default: 50)")
    p.add_argument("--db", type=Path, default=Path(".hypothesis/fuzz-db"), help="the shared database directory")
    p.add_argument("--machines", default="scheduler,pd,cache", help="comma-separated (default: all three)")
    p.add_argument("--exhibit", default=None, help="a museum exhibit installed for the whole campaign")
    p.add_argument(
        "--replay-only", action="store_true", help="replay the failures the database holds, generate nothing"
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "campaign.json"
        env = dict(
            os.environ,
            KVLEDGER_CAMPAIGN="1",
            KVLEDGER_FUZZ_DB=str(args.db.resolve()),
            KVLEDGER_CAMPAIGN_SHARDS=str(args.shards),
            KVLEDGER_CAMPAIGN_EXAMPLES=str(args.examples),
            KVLEDGER_CAMPAIGN_MACHINES=args.machines,
            KVLEDGER_CAMPAIGN_EXHIBIT=args.exhibit or "",
            KVLEDGER_CAMPAIGN_JSON=str(out),
            KVLEDGER_CAMPAIGN_REPLAY_ONLY="1" if args.replay_only else "0",
        )
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(args.workers)]
        cmd.append("tests/campaign")  # -n 1 too: one worker process, measured like two
        proc = subprocess.run(cmd, cwd=ROOT, env=env, check=False, stdout=sys.stderr)
        doc = json.loads(out.read_text()) if out.exists() else {"error": "the campaign wrote no result"}
    doc["workers"] = args.workers
    doc["db"] = str(args.db)
    doc.pop("items_detail", None)
    print(json.dumps(doc, indent=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
