"""The fuzz campaign (``scripts/campaign.py``): pytest-xdist workers that share one example database.

Run as a process (the campaign is pytest itself, with workers): two workers hunt an exhibit, and the
failure one of them finds is in the shared database directory; a later campaign that generates nothing
and only replays the database fails the same way. The examples/s figures are measured by the script
(README "Campaigns"), never asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvledger.contracts import switch
from kvledger.museum import exhibit

ROOT = Path(__file__).resolve().parents[2]


def _campaign(*args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "campaign.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")
@pytest.mark.timeout(1800)
def test_two_workers_share_one_database_and_a_replay_fails_the_same_way(tmp_path: Path) -> None:
    db = tmp_path / "db"
    common = ["--db", str(db), "--machines", "scheduler", "--exhibit", "B1"]
    rc, doc = _campaign("--workers", "2", "--shards", "2", "--examples", "40", *common)
    assert rc == 1 and doc["workers"] == 2 and doc["items"] == 2, doc
    assert set(doc["examples_by_worker"]) == {"gw0", "gw1"}, doc  # both workers ran an item
    failures = doc["failures"]
    assert failures and all(any(i in f["failure"] for i in exhibit("B1").breaks) for f in failures), failures
    assert any(db.iterdir()), "the failure was not saved in the shared database"

    rc, replay = _campaign("--workers", "1", "--shards", "1", "--examples", "1", "--replay-only", *common)
    assert rc == 1 and replay["failures"], replay  # generated nothing: the failure came from the database
