"""Every row of the sweep: the bad calls and the no-argument members, gathered from the area modules."""

from __future__ import annotations

from tests.sweep import cases_audit, cases_caches, cases_pd, cases_pools, cases_scheduler
from tests.sweep.table import Case, Query

CASES: list[Case] = [
    *cases_pools.CASES,
    *cases_caches.CASES,
    *cases_scheduler.CASES,
    *cases_pd.CASES,
    *cases_audit.CASES,
]
QUERIES: list[Query] = [
    *cases_pools.QUERIES,
    *cases_caches.QUERIES,
    *cases_scheduler.QUERIES,
    *cases_pd.QUERIES,
    *cases_audit.QUERIES,
]
NO_BAD_CALL: dict[str, str] = {
    **cases_scheduler.NO_BAD_CALL,
    **cases_pd.NO_BAD_CALL,
    **cases_audit.NO_BAD_CALL,
}
"""Members that take no argument and are allowed in every state, but change state (so they are not
queries): there is no bad call to make. Each names why."""

NOT_ENTRY_POINTS: dict[str, str] = {
    **cases_pd.NOT_ENTRY_POINTS,
    **cases_audit.NOT_ENTRY_POINTS,
    "ReqToTokenPool.attach_kv_owners": "wiring the engine builder calls once (build_parts), not an operation",
    # Step phases the speculative step shares with the scheduler's own results (issue 36's public seams):
    # called inside step() on requests of a batch in flight, never by a client.
    **{
        f"Scheduler.{m}": "a step phase (the speculative step's seam into the results path), called inside step"
        for m in ("new_batch", "discards_result", "finishes", "finish", "settle_batch")
    },
    "PrefillScheduler.finish": "a step phase (a prompt's last chunk done), called inside step",
    "SchedulerParts.__init__": "the TypedDict of build_parts' collaborators (a plain dict), not an operation",
}
"""Members the sweep does not call, each with why (hooks and step phases; PD rows still pending)."""
