"""The campaign's example database from one piece of text: a directory, or a Redis URL.

``--db DIR`` (and ``KVLEDGER_FUZZ_DB=DIR``) keeps Hypothesis's directory database, safe for several
processes of one machine. ``--db redis://HOST:PORT[/N]`` (``rediss://`` for TLS, ``unix:///PATH`` for a
socket) puts every process, on any machine, on one Redis server through Hypothesis's
``RedisExampleDatabase``: what one worker saves, every other reads on its next example of that test.
The keys carry kvledger's prefix, so a server shared with other projects keeps them apart, and they
never expire unless asked (Hypothesis's default drops a failure after 8 days without a touch, which
would lose a nightly campaign's finding over a long weekend).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

REDIS_SCHEMES = ("redis", "rediss", "unix")
KEY_PREFIX = b"kvledger-example:"
# "never" in practice: a failure stays until a fix makes its replay pass and Hypothesis deletes it
NO_EXPIRY = datetime.timedelta(days=3650)


class DatabaseSpecError(ValueError):
    """The ``--db`` text names neither a directory nor a usable Redis URL."""


def is_redis_url(spec: str) -> bool:
    return urlsplit(spec).scheme in REDIS_SCHEMES


def _check_redis_url(spec: str) -> None:
    parts = urlsplit(spec)
    if parts.scheme == "unix":
        if not parts.path:
            raise DatabaseSpecError(f"{spec!r}: a unix socket URL needs a path (unix:///run/redis.sock)")
        return
    if not parts.hostname:
        raise DatabaseSpecError(f"{spec!r}: a Redis URL needs a host (redis://HOST:PORT)")
    try:
        parts.port  # noqa: B018 - urllib raises on a port that is not a number in range
    except ValueError as exc:
        raise DatabaseSpecError(f"{spec!r}: {exc}") from None


def example_database(spec: str, *, expire_after: datetime.timedelta = NO_EXPIRY) -> ExampleDatabase:
    """The database ``spec`` names. A Redis URL builds the client only; the first read or write connects
    (so building a campaign's settings never waits on the network)."""
    if not spec.strip():
        raise DatabaseSpecError("the example database is empty text: give a directory or a Redis URL")
    if not is_redis_url(spec):
        return DirectoryBasedExampleDatabase(Path(spec).expanduser())
    _check_redis_url(spec)
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as exc:  # the campaign extra is missing
        raise DatabaseSpecError(
            f"{spec!r} needs the redis client: pip install -e '.[campaign]' (scripts/setup.sh installs it)"
        ) from exc
    client = redis.Redis.from_url(spec)
    return RedisExampleDatabase(client, expire_after=expire_after, key_prefix=KEY_PREFIX)


def describe(spec: str) -> str:
    """What a report says of the database: the URL as given (no password), or the directory's path."""
    if not is_redis_url(spec):
        return str(Path(spec).expanduser().resolve())
    parts = urlsplit(spec)
    if parts.password:
        netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return spec
