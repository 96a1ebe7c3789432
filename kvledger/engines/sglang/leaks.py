"""The attach's leak checks: a request that left the engine holds nothing; at the end everything came back.

SGLang's allocators never learn which request an id belongs to, so a release path that forgets one id
(a Mamba slot cleared but not freed, one page of an insert's duplicates kept) leaves the pools one id
short and nothing fails until the pool runs dry, or, with SGLang's own idle check, a count off by one
with no name. The ledgers know who holds the id: the request that is gone. These two checks ask them.

* :func:`check_released`: after a request's release (``cache_finished_req`` and ``release_kv_cache``,
  an abort, a retract) its owner holds nothing in any watched pool (I-OWNER-RELEASE).
* :func:`returned`: after SGLang's own ``free`` returns, its free list grew by exactly what the ledger
  gave back (I-COUNT): a bug inside that ``free`` (an id dropped, one pushed twice) is named at the call,
  not at the next audit. Two ``available_size()`` reads per free.
* :func:`check_everything_came_back`: when no request is live, every id is free or the tree's, nothing
  waits in a free group, and no lock is held (I-IDLE-IDENTITY): the end of every driver's run.

The first two are O(pool) and run where a user or a driver says the moment has come: the attach cannot tell a
request that is finished from one still waiting to be scheduled.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.owners import FREE_LIST, Owner


def check_released(ledgers: Mapping[str, Ledger | None], owner: Owner) -> None:
    """I-OWNER-RELEASE: ``owner`` (a request that has left the engine) holds no id of any ledger."""
    for pool, ledger in ledgers.items():
        if ledger is None or not ledger.held_count(owner):
            continue
        held = sorted(ledger.holdings(owner))
        raise ContractViolation(
            ledger.describe(
                held[:4],
                f"{owner!r} left the engine still holding {len(held)} {pool} id(s) {held[:8]}: its release"
                " path gave them neither back to the free list nor to the tree, a leak (I-OWNER-RELEASE)",
            )
        )


def check_everything_came_back(
    ledgers: Mapping[str, Ledger | None], cache_owners: Collection[Owner], locks: Mapping[Any, int]
) -> None:
    """I-IDLE-IDENTITY: with no request live, every id of every ledger is free or held by the cache, none
    is pending in a free group, and no lock taken through ``inc_lock_ref`` is still held."""
    for pool, ledger in ledgers.items():
        if ledger is None:
            continue
        for holder in ledger.owners():
            if holder is FREE_LIST or holder in cache_owners:
                continue
            held = sorted(ledger.holdings(holder))
            raise ContractViolation(
                ledger.describe(
                    held[:4],
                    f"at the end of the run {holder!r} still holds {len(held)} {pool} id(s) {held[:8]}: free"
                    " + cached != size, these never came back (I-IDLE-IDENTITY)",
                )
            )
    live = {key: n for key, n in locks.items() if n}
    if live:
        raise ContractViolation(
            f"at the end of the run {sum(live.values())} lock(s) taken through inc_lock_ref are still held,"
            f" per node: {live} (nothing may be protected when no request is live) (I-IDLE-IDENTITY)"
        )


def returned(ledger: Ledger, op: str, given: np.ndarray | list[int], grew: int) -> None:
    """I-COUNT at a free: SGLang's free list grew by ``grew`` after its ``op`` returned; the ledger gave
    back the distinct ids ``given`` (pages, rows or slots; an array or a list of ints) just before."""
    if grew == len(given):
        return
    ids = sorted(set(given if isinstance(given, list) else given.tolist()))
    raise ContractViolation(
        ledger.describe(
            ids[:4],
            f"{op}: {len(given)} id(s) {ids[:8]} were given back but SGLang's free list grew by {grew}: a bug"
            " inside SGLang's own free (an id dropped, or pushed twice) (I-COUNT)",
        )
    )
