"""I-HANDLE-OWNED: every id a holder's handles name is owned by that holder in the ledger.

A *handle* is a field through which an owner will use an id later without allocating it again: a
request's row (``req_pool_idx``), its Mamba working slot (``mamba_pool_idx``), its metadata slot, and
(Mamba V2) its ping-pong slots. SGLang's allocators trust a set handle (``alloc(req)`` reuses
``req.mamba_pool_idx`` if it is not None), so a release path that frees the id and leaves the handle set
makes the id free and in use at once: the seed bug (#12432, a chunk boundary freeing the working slot)
and the ping-pong leak (#26941). The counting identity stays balanced at that moment (the slot is
counted once, as free, or twice only after a second free); an exact check of "handle implies ownership"
fires at the first bad step and names the slot, the holder whose handle still names it, and the slot's
last moves.

Cost: one ``owner_of`` per id named, so O(live holders) per check, never O(pool). The claims come from
the implementation (``Req.handles()``); this module knows no implementation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import Owner


@dataclass(frozen=True)
class HandleClaim:
    """``owner``'s field ``handle`` names ``ids`` of ``pool``."""

    owner: Owner
    handle: str
    pool: str
    ids: Sequence[int]


def check_handles_owned(claims: Iterable[HandleClaim], ledgers: Mapping[str, Any]) -> int:
    """Raise ContractViolation at the first claim whose id is not owned by the claimant.

    ``ledgers`` maps a claim's pool name to that pool's ledger; pools without a real ledger (contracts
    off) are skipped. Returns the number of ids checked (for the tests that the check is not vacuous).
    """
    checked = 0
    for claim in claims:
        ledger = ledgers.get(claim.pool)
        if ledger is None or not ledger.enabled:
            continue
        checked += len(claim.ids)
        holds = getattr(ledger, "holds", None)  # the fast answer for the common case: all owned
        if holds is not None and holds(claim.ids, claim.owner):
            continue
        # Every id of the handle is resolved, so that the message names all the stale ones at once
        # (a ping-pong handle names two slots; both were freed by the same release path).
        stale = [i for i in claim.ids if ledger.owner_of(i) is not claim.owner]
        if stale:
            holders = sorted({repr(ledger.owner_of(i)) for i in stale})
            raise ContractViolation(
                ledger.describe(
                    stale,
                    f"I-HANDLE-OWNED: {claim.owner!r}.{claim.handle} names {claim.pool} ids {stale},"
                    f" owned by {', '.join(holders)}: released (or handed on) while the handle still"
                    " names them",
                )
            )
    return checked
