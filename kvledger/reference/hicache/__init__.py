"""The host-memory tier (SGLang's HiCache): host pools, the host tree component, write policies, load-back.

spec/hicache.md describes the model and what differs from SGLang."""

from kvledger.reference.hicache.component import HostKVComponent
from kvledger.reference.hicache.copies import HostCopy, HostHit, path_key
from kvledger.reference.hicache.host_pool import HostPool
from kvledger.reference.hicache.load_back import LoadBack, PendingLoad, match_with_host
from kvledger.reference.hicache.policy import WRITE_POLICIES, WritePolicy

__all__ = [
    "WRITE_POLICIES",
    "HostCopy",
    "HostHit",
    "HostKVComponent",
    "HostPool",
    "LoadBack",
    "PendingLoad",
    "WritePolicy",
    "match_with_host",
    "path_key",
]
