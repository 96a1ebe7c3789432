"""Every row of the sweep: the bad calls and the no-argument members, gathered from the area modules."""

from __future__ import annotations

from tests.sweep import cases_caches, cases_pools
from tests.sweep.table import Case, Query

CASES: list[Case] = [*cases_pools.CASES, *cases_caches.CASES]
QUERIES: list[Query] = [*cases_pools.QUERIES, *cases_caches.QUERIES]
