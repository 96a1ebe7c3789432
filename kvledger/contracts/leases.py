"""I-WRITER-LEASE and its reader twin: no id is reallocated while a transfer may still write or read it.

A PD transfer is an asynchronous one-sided copy: once dispatched it writes the decode side's ids (KV
pages, the Mamba slot, the metadata slot; the row that maps them) and reads the prefill side's, whatever
either scheduler has decided since. So an id touched by a dispatched, unresolved message must stay with
the request of that message's room (in whatever account: a live queue or a lease) until the message
resolves; the prefill's tree pages it reads must stay protected (locked). SGLang #24527 (decode freed
the pages on abort, the late write landed in another request's KV), #38961 (the deferred release
defeated; the prefill's source pages freed while a send still read them).

Checked for every message in flight after every step and again at the moment a message lands.
Cost: O(ids of the messages in flight).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import Owner


def check_lease(
    ledger: Any,
    ids: Iterable[int],
    holder: Owner | None,
    what: str,
    *,
    also_allowed: Callable[[Owner | None], bool] | None = None,
) -> None:
    """Every id is owned by ``holder`` (or by an owner ``also_allowed`` accepts); ContractViolation otherwise.

    ``holder`` None means the room's request has already been released on that side: any id still
    touched is a violation. ``what`` says which message and which side, for the report.
    """
    if not ledger.enabled:
        return
    for i in ids:
        owner = ledger.owner_of(i)
        if holder is not None and owner is holder:
            continue
        if also_allowed is not None and also_allowed(owner):
            continue
        expected = "no live request (already released)" if holder is None else repr(holder)
        raise ContractViolation(
            ledger.describe(
                [i],
                f"I-WRITER-LEASE: {what} id {i}, which is owned by {owner!r}, not by the room's request"
                f" {expected}: it was released (and may be reused) while the transfer can still touch it",
            )
        )
