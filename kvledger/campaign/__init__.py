"""Fuzz campaigns past one process and one machine: where the example database lives.

A campaign (``scripts/campaign.py``, HypoFuzz under the ``fuzz`` profile) runs the generic machines in
many processes that share one Hypothesis example database, so a failure one process finds is replayed by
every other. :mod:`.database` turns the ``--db`` / ``KVLEDGER_FUZZ_DB`` text into that database (a
directory, or a Redis server for processes on several machines); :mod:`.redis_server` starts and stops a
real Redis server for a campaign that has none. Nothing in the reference imports this package.
"""

from kvledger.campaign.database import DatabaseSpecError, describe, example_database, is_redis_url
from kvledger.campaign.redis_server import RedisServerError, local_redis_server, redis_server_binary

__all__ = [
    "DatabaseSpecError",
    "RedisServerError",
    "describe",
    "example_database",
    "is_redis_url",
    "local_redis_server",
    "redis_server_binary",
]
