"""Fuzz campaigns past one process and one machine: where the example database lives.

A campaign (``scripts/campaign.py``, HypoFuzz under the ``fuzz`` profile) runs the generic machines in
many processes that share one Hypothesis example database, so a failure one process finds is replayed by
every other. :mod:`.database` turns the ``--db`` / ``KVLEDGER_FUZZ_DB`` text into that database (a
directory, or a Redis server for processes on several machines); :mod:`.redis_server` starts and stops a
real Redis server for a campaign that has none. Nothing in the reference imports this package.
"""

from kvledger.campaign.database import DatabaseSpecError, describe, example_database, is_redis_url
from kvledger.campaign.redis_server import RedisServerError, local_redis_server, redis_server_binary

# One step budget for every process that writes or replays the shared database: HypoFuzz workers (the
# ``fuzz`` profile) and the campaign's own items. A choice sequence is replayed step by step; a process
# with a smaller budget cuts a longer example short and replays a failure found past its last step as a
# pass (the campaign then loses a failure HypoFuzz recorded).
STEPS_PER_EXAMPLE = 60

__all__ = [
    "STEPS_PER_EXAMPLE",
    "DatabaseSpecError",
    "RedisServerError",
    "describe",
    "example_database",
    "is_redis_url",
    "local_redis_server",
    "redis_server_binary",
]
