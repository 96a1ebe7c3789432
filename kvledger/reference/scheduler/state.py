"""What the scheduler's accounting (identities, census, diagnostics) reads of its scheduler: a protocol.

The accounting is built by the scheduler and reads it back; typing that back-reference with this
protocol instead of the ``Scheduler`` class keeps ``scheduler -> accounting`` a one-way import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from kvledger.contracts.owners import Account
from kvledger.contracts.pool_kinds import PoolKind
from kvledger.contracts.protocols import AnyPrefixCache, KVAllocator, MambaStatePool, ReqRowPool
from kvledger.reference.scheduler.batch import ScheduleBatch
from kvledger.reference.scheduler.config import SchedulerConfig
from kvledger.reference.scheduler.memory import ReqMemory
from kvledger.reference.scheduler.request import Req


class CheckCounts(Protocol):
    """The counters the accounting adds to (``SchedulerStats``)."""

    busy_checks: int
    idle_checks: int
    count_checks: int


class SchedulerState(Protocol):
    """The scheduler as its accounting sees it (``Scheduler`` satisfies it)."""

    @property
    def config(self) -> SchedulerConfig: ...

    @property
    def pool_kinds(self) -> tuple[PoolKind, ...]:
        """The pool kinds the identity covers (those whose ``attr`` is None here are left out)."""
        ...

    @property
    def kv_allocator(self) -> KVAllocator: ...

    @property
    def req_to_token_pool(self) -> ReqRowPool: ...

    @property
    def mamba_pool(self) -> MambaStatePool | None: ...

    @property
    def tree(self) -> AnyPrefixCache | None: ...

    @property
    def memory(self) -> ReqMemory: ...

    @property
    def stats(self) -> CheckCounts: ...

    @property
    def step_no(self) -> int: ...

    @property
    def parked_accounts(self) -> frozenset[Account]:
        """Accounts an ended request may still hold ids in (a launched batch, a PD lease)."""
        ...

    @property
    def requests(self) -> Mapping[int, Req]: ...

    @property
    def inflight(self) -> Sequence[ScheduleBatch]: ...

    def live_requests(self) -> list[Req]: ...

    def queued_requests(self) -> Iterable[Req]: ...

    def is_quiescent(self) -> bool: ...

    def describe_queues(self) -> str: ...
