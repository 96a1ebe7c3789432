"""The fuzz campaign (``scripts/campaign.py``): pytest-xdist workers that share one example database.

Run as a process (the campaign is pytest itself, with workers): two workers hunt an exhibit, and the
failure one of them finds is in the shared database directory; a later campaign that generates nothing
and only replays the database fails the same way. The examples/s figures are measured by the script
(README "Campaigns"), never asserted here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import settings

from kvledger.campaign import local_redis_server
from kvledger.campaign.database import KEY_PREFIX
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


@pytest.mark.slow
@pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")
@pytest.mark.timeout(1800)
def test_a_failure_found_by_one_process_is_replayed_by_two_others_through_a_real_redis_server(
    tmp_path: Path,
) -> None:
    """Issue 40: the campaign's Redis path against a real server (started here, stopped at the end). One
    campaign process finds the exhibit's failure and saves it in Redis; a second campaign, another process
    with two workers that generate nothing, replays it from Redis on both workers; the repro scripts it
    writes fail naming the same invariant. Bounded by examples, never by the clock."""
    with local_redis_server() as url:
        common = ["--db", url, "--machines", "scheduler", "--exhibit", "B1"]
        rc, found = _campaign("--workers", "1", "--shards", "1", "--examples", "40", *common)
        assert rc == 1 and found["failures"], found
        assert found["db"] == url
        client = redis.Redis.from_url(url)
        assert client.keys(KEY_PREFIX.decode() + "*"), "the failure was not saved in Redis"
        client.close()

        repros = tmp_path / "repros"
        rc, replay = _campaign(
            "--workers",
            "2",
            "--shards",
            "2",
            "--examples",
            "1",
            "--replay-only",
            "--repros",
            str(repros),
            *common,
        )
    assert rc == 1 and set(replay["examples_by_worker"]) == {"gw0", "gw1"}, replay
    assert len(replay["failures"]) == 2, replay  # each worker replayed what the first process saved
    breaks = exhibit("B1").breaks
    for failure in replay["failures"]:
        assert any(i in failure["failure"] for i in breaks), failure
        script = Path(failure["repro"])
        proc = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
        )
        assert proc.returncode != 0 and any(i in proc.stderr + proc.stdout for i in breaks), proc.stderr[
            -2000:
        ]


def _hypofuzz_keys(client: redis.Redis, suffix: bytes) -> set[bytes]:
    """The tests (their 48-byte database keys) that hold a HypoFuzz entry of this kind."""
    start = len(KEY_PREFIX)
    return {k[start : start + 48] for k in client.scan_iter(match=KEY_PREFIX + b"*" + suffix + b"*")}


@contextlib.contextmanager
def _hypofuzz(
    url: str, machine: str, **env_extra: str
) -> Iterator[tuple[redis.Redis, subprocess.Popen[bytes]]]:
    """``hypothesis fuzz`` on one machine's target, into the Redis store at ``url``, for the block's life
    (HypoFuzz runs until stopped: its process group is killed at the end); yields a client of the store."""
    env = dict(
        os.environ, KVLEDGER_CAMPAIGN="1", HYPOTHESIS_PROFILE="fuzz", KVLEDGER_FUZZ_DB=url, **env_extra
    )
    cmd = [str(Path(sys.executable).parent / "hypothesis"), "fuzz", "-n", "1", "--no-dashboard", "--"]
    cmd += ["tests/campaign/test_fuzz_targets.py", "-k", machine, "-p", "no:cacheprovider"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    client = redis.Redis.from_url(url)
    try:
        yield client, proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        client.close()


def _wait_for(fuzzing: tuple[redis.Redis, subprocess.Popen[bytes]], suffix: bytes) -> None:
    """Until some test holds a HypoFuzz entry of this kind (900 s only keeps a broken run from hanging)."""
    client, proc = fuzzing
    deadline = time.monotonic() + 900
    while not _hypofuzz_keys(client, suffix) and time.monotonic() < deadline:
        assert proc.poll() is None, f"hypothesis fuzz exited with {proc.returncode}"
        time.sleep(1)


def _replay_while_fuzzing(common: list[str]) -> tuple[int, dict[str, Any]]:
    """``campaign.py --replay-only`` while HypoFuzz still runs, again until it replays a failure (6 tries).

    HypoFuzz records one failure in several Redis writes (its own failure entry, then the example under the
    key Hypothesis replays); stopping it the moment the first one lands could kill it between them on a
    loaded machine, and the replay would find nothing through no fault of either side."""
    rc, replay = 0, {}
    for _ in range(6):
        rc, replay = _campaign("--workers", "1", "--shards", "1", "--examples", "1", "--replay-only", *common)
        if rc != 0:
            break
        time.sleep(5)
    return rc, replay


def test_campaign_items_replay_as_many_steps_as_hypofuzz_draws() -> None:
    """A failure HypoFuzz records at step 45 must replay as a failure in the campaign's items: with a
    smaller ``stateful_step_count`` there, Hypothesis stops the replayed example before the failing step
    and ``--replay-only`` reports a clean run (CI saw exactly that once HypoFuzz took more than 40 steps)."""
    spec = importlib.util.spec_from_file_location(
        "campaign_items", ROOT / "tests" / "campaign" / "test_machines.py"
    )
    assert spec is not None and spec.loader is not None
    items = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(items)
    fuzz = settings.get_profile("fuzz")
    assert items._settings().stateful_step_count == fuzz.stateful_step_count, (
        items._settings().stateful_step_count,
        fuzz.stateful_step_count,
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_hypofuzz_fuzzes_a_machine_into_the_shared_redis_database() -> None:
    """Issue 40: HypoFuzz runs the generic machines (``tests/campaign/test_fuzz_targets.py``, the README's
    recipe) with its own engine, writing its corpus and reports into the campaign's Redis database, and
    on clean code saves no failure. Stopped as soon as it has recorded examples it ran (the 900-second bound only keeps
    a broken run from hanging CI; nothing about speed is asserted)."""
    with local_redis_server() as url, _hypofuzz(url, "Cache") as fuzzing:
        _wait_for(fuzzing, b".hypofuzz.observations")
        client = fuzzing[0]
        reports = _hypofuzz_keys(client, b".hypofuzz.reports")
        ran = _hypofuzz_keys(client, b".hypofuzz.observations")
        failures = _hypofuzz_keys(client, b".hypofuzz.failures") | _hypofuzz_keys(client, b".hypofuzz.fatal")
    assert len(reports) == 1 and ran == reports, (reports, ran)  # the one machine: examples run and reported
    assert not failures, failures


@pytest.mark.slow
@pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")
@pytest.mark.timeout(1800)
def test_a_failure_hypofuzz_finds_is_replayed_by_the_campaign_as_a_repro_script(tmp_path: Path) -> None:
    """Issue 40: the README's way back from HypoFuzz. HypoFuzz fuzzes the scheduler machine with exhibit B1
    installed into a real Redis server until it has saved a failure; then ``scripts/campaign.py
    --replay-only`` (another process, generating nothing) finds that failure in the same store under the
    same key, fails naming B1's invariant, and writes a repro script that fails on its own."""
    breaks = exhibit("B1").breaks
    with local_redis_server() as url:
        repros = tmp_path / "repros"
        common = ["--db", url, "--machines", "scheduler", "--exhibit", "B1", "--repros", str(repros)]
        with _hypofuzz(url, "Scheduler", KVLEDGER_CAMPAIGN_EXHIBIT="B1") as fuzzing:
            _wait_for(fuzzing, b".hypofuzz.failures")
            rc, replay = _replay_while_fuzzing(common)
    assert rc == 1 and len(replay["failures"]) == 1, replay
    failure = replay["failures"][0]
    assert any(i in failure["failure"] for i in breaks), failure
    script = subprocess.run(
        [sys.executable, failure["repro"]], capture_output=True, text=True, timeout=300, check=False
    )
    assert script.returncode != 0 and any(i in script.stderr + script.stdout for i in breaks), script.stderr[
        -2000:
    ]
