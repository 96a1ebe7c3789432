"""The scheduler's bookkeeping, id by id: who it believes holds each id of a pool (a failed check's evidence).

When an identity fails, the accounting asks for a :class:`~kvledger.contracts.diagnosis.Census` of the
pool in question and compares it with the pool's ledger, so the report names the ids in dispute, their
ledger owner, the holder the bookkeeping names, their last moves and the request involved. Built from
the implementation's own structures only (never from the ledger): the pool's free list and free group,
every cache node's KV and state, and every live request's row, Mamba slot and the KV of
``[cache_protected_len, kv_allocated_len)`` read from its ``req_to_token`` row.

O(pool + tree + live requests): only ever built after a check has failed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvledger.contracts.diagnosis import Census
from kvledger.contracts.owners import FREE_LIST, Owner
from kvledger.contracts.pool_kinds import CacheSide
from kvledger.contracts.protocols import IdPool
from kvledger.contracts.tree_checks import collect_nodes
from kvledger.reference.pools.id_free_list import free_list_of
from kvledger.reference.scheduler.request import Req
from kvledger.reference.scheduler.state import SchedulerState


def census(
    s: SchedulerState,
    pool: str,
    obj: IdPool,
    ids_of: Callable[[Req], set[int]],
    *,
    cached: CacheSide | None = None,
) -> Census:
    """Every claim the scheduler's bookkeeping makes on the ids of ``obj`` (the pool called ``pool``).

    ``ids_of`` is what a live request holds of it (its kind's ``held_ids``) and ``cached`` the side of the
    prefix cache that holds ids of it (its kind's ``cached``: ``kv`` pages, ``mamba`` states, or none).
    A kvledger pool's free list is read from its ``IdFreeList``; another implementation's from its
    ``free_ids()`` when it has one (else the census is incomplete: free ids are not judged).
    """
    out = Census(pool)
    try:
        ids = free_list_of(obj)
    except TypeError:  # another implementation (an adapter): its free list, if it shows one
        free_ids = getattr(obj, "free_ids", None)
        if free_ids is None:
            out.complete = False
        else:
            out.claim([int(i) for i in free_ids()], FREE_LIST)
    else:
        out.claim(ids.free_ids().tolist(), FREE_LIST)
        if ids.pending:
            out.claim(np.concatenate(ids.pending).tolist(), obj.ledger.pending_owner)
    tree = s.tree
    if tree is not None and cached is not None:
        page = s.config.page_size
        comp = None if cached == "kv" else tree.component(cached)  # the kind's tree component
        for node in collect_nodes(tree.root):
            if comp is None:
                out.claim({t // page for t in node.value.tolist()}, node.kv_owner)
            elif (held := comp.held(node)) is not None:
                out.claim(*held)
    for r in s.live_requests():
        out.claim(ids_of(r), r.owner)
    return out


def describe_owner(s: SchedulerState, owner: Owner) -> str | None:
    """What the scheduler knows about a request owner (its state, whether it was released)."""
    if owner.kind != "req":
        return None
    req = s.requests.get(owner.key) if isinstance(owner.key, int) else None
    if req is None or req.owner is not owner:
        return "a request the scheduler no longer keeps (ended, out of the finished window)"
    released = "released: its bookkeeping holds nothing" if req.released else "not released"
    return f"{req!r}, {released}"
