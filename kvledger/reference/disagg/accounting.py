"""The PD-aware busy check: each instance's identity per pool with every PD holder term.

Per instance and pool (KV, rows, Mamba, and the metadata slots SGLang never checks)::

    free + pending + evictable + protected
         + req.waiting + req.chunked + req.running + batch.inflight
         + pd.prefill.bootstrap + pd.prefill.inflight + pd.prefill.lease             (prefill)
         + pd.decode.prealloc + pd.decode.transfer + pd.decode.waiting
         + pd.decode.retracted + pd.decode.lease                                      (decode)  == size

The held terms come from each live request's own bookkeeping grouped by its account: the scheduler's
``Accounting`` keeps every pool kind the instance lists incrementally (a PD request is a request: its
tracked fields and its owner's account changes mark it), the metadata slots among them (``METADATA``,
from each request's ``metadata_idx``: at most one slot each). A PD holder missing from the terms (SGLang's busy
check counts only the running batch: §2.5 of the background) is a leak by this identity and a mismatch
by the ledger cross-check, which names the request.
"""

from __future__ import annotations

from typing import Protocol

from kvledger.reference.pools.metadata_pool import MetadataBufferPool
from kvledger.reference.scheduler.accounting import Accounting
from kvledger.reference.scheduler.state import SchedulerState


class PDSchedulerState(SchedulerState, Protocol):
    """A PD instance as its accounting sees it: a scheduler with a metadata-slot pool."""

    @property
    def metadata_pool(self) -> MetadataBufferPool: ...


class PDAccounting(Accounting):
    """The scheduler's accounting over the instance's ``pool_kinds``, metadata slots included
    (:data:`kvledger.contracts.pool_kinds.METADATA`: one slot per request whose ``metadata_idx`` is set),
    so the identity, the ledger cross-check, the counters and the event log treat them as any pool."""

    def __init__(self, scheduler: PDSchedulerState) -> None:
        super().__init__(scheduler)
        self.metadata_pool = scheduler.metadata_pool
