"""The PD-aware busy check: each instance's identity per pool with every PD holder term.

Per instance and pool (KV, rows, Mamba, and the metadata slots SGLang never checks)::

    free + pending + evictable + protected
         + req.waiting + req.chunked + req.running + batch.inflight
         + pd.prefill.bootstrap + pd.prefill.inflight + pd.prefill.lease             (prefill)
         + pd.decode.prealloc + pd.decode.transfer + pd.decode.waiting
         + pd.decode.retracted + pd.decode.lease                                      (decode)  == size

The held terms come from each live request's own bookkeeping grouped by its account: the scheduler's
``Accounting`` keeps KV, rows and Mamba incrementally (a PD request is a request: its tracked fields and
its owner's account changes mark it); this subclass adds the metadata pool, recounted from the live
requests' ``metadata_idx`` (at most one slot each). A PD holder missing from the terms (SGLang's busy
check counts only the running batch: §2.5 of the background) is a leak by this identity and a mismatch
by the ledger cross-check, which names the request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

from kvledger.contracts.identity import PoolTerms
from kvledger.reference.scheduler.accounting import Accounting
from kvledger.reference.scheduler.request import Req
from kvledger.reference.scheduler.state import SchedulerState


class PDSchedulerState(SchedulerState, Protocol):
    """A PD instance as its accounting sees it: a scheduler with a metadata-slot pool."""

    @property
    def metadata_pool(self) -> Any: ...


class PDAccounting(Accounting):
    def __init__(self, scheduler: PDSchedulerState) -> None:
        super().__init__(scheduler)
        self.metadata_pool = scheduler.metadata_pool
        self._ledgers["metadata"] = self.metadata_pool.ledger
        self._sizes["metadata"] = self.metadata_pool.size

    def pools_by_name(self) -> dict[str, Any]:
        pools = super().pools_by_name()
        pools["metadata"] = self.metadata_pool
        return pools

    def _build_terms(self, held: Mapping[str, Mapping[str, int]]) -> list[PoolTerms]:
        return [*super()._build_terms(held), self._metadata_terms()]

    def _metadata_terms(self) -> PoolTerms:
        meta = self.metadata_pool
        held: Counter[str] = Counter()
        for r in self.s.live_requests():
            if getattr(r, "metadata_idx", None) is not None:
                held[r.owner.account.name] += 1
        return PoolTerms(
            "metadata",
            "slots",
            self._sizes["metadata"],
            meta.available_size(),
            pending=meta.pending_free_size(),
            held=dict(held),
        )

    def free_terms(self) -> dict[str, tuple[int, int]]:
        meta = self.metadata_pool
        return {**super().free_terms(), "metadata": (meta.size, meta.available_size() + meta.pending_free_size())}

    def _expected_ids(self, pool: str, r: Req) -> set[int]:
        if pool == "metadata":
            idx = getattr(r, "metadata_idx", None)
            return set() if idx is None else {idx}
        return super()._expected_ids(pool, r)
