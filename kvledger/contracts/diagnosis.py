"""Naming the culprit of a failed identity: the ids in dispute, who holds them, who is said to, and how.

A count identity (I-COUNT, I-CAP) only says *how many* ids are unaccounted for. To say *which*, two
independent views of one pool are compared id by id:

* the **bookkeeping**: what the implementation's own structures say (its free list, its free group, the
  ids each cache node keeps, each request's row, slot and KV). The implementation lists them in a
  :class:`Census`: one *claim* (id, holder) per id it believes held, with the holder as the
  :class:`Owner` it uses for that holder (``req.owner``, ``node.kv_owner``, ``FREE_LIST``, ...);
* the **ledger**: the owner recorded by every move (:class:`~kvledger.contracts.ledger.Ledger`).

An id is *in dispute* when the two disagree: no claim but a ledger owner (a leak: nobody in the
bookkeeping holds it), a claim by someone other than the ledger owner (a foreign or stale claim), or
several claims (counted twice). Without a ledger (contracts off) only the census is read: ids nobody
claims and ids claimed twice are still named, without owners or history.

Resolved only when a check has failed (O(pool size)): a passing check never builds a census. The module
knows no implementation: a census is filled by whoever owns the structures (the scheduler's
accounting, an adapter for another engine), and an owner is described through a callback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvledger.contracts.owners import FREE_LIST, Owner

SHOWN_GROUPS = 4
"""Groups of disputed ids (same ledger owner, same claim) listed per report; the rest are counted."""
SAMPLES_PER_GROUP = 2
"""Ids per group whose last moves are shown."""

NO_CLAIM = "no holder (not free, not pending, held by no cache node and no live request)"


class LedgerView(Protocol):
    """What a report reads from a ledger (real or null): the owner of an id and its last moves."""

    enabled: bool
    pool: str

    def owner_of(self, slot: int) -> Owner | None: ...

    def describe(self, slots: Iterable[int], headline: str, claims: dict[int, str] | None = None) -> str: ...

    def describe_slots(self, slots: Iterable[int], claims: dict[int, str] | None = None) -> list[str]: ...


@dataclass
class Census:
    """The bookkeeping's claims on one pool's ids: for each id, the holders that say they hold it."""

    pool: str
    claims: dict[int, list[Owner]] = field(default_factory=dict)
    complete: bool = True  # False: some holder could not be read (a foreign pool's free list)

    def claim(self, ids: Iterable[int], holder: Owner) -> None:
        """``holder`` says it holds ``ids`` (ints)."""
        claims = self.claims
        for i in ids:
            found = claims.get(i)
            if found is None:
                claims[i] = [holder]
            else:
                found.append(holder)

    def holders(self, slot: int) -> list[Owner]:
        return self.claims.get(slot, [])


@dataclass(frozen=True)
class Dispute:
    """One id the two views disagree on."""

    slot: int
    ledger_owner: Owner | None  # None: no ledger, or an id the ledger does not own
    claimed: tuple[Owner, ...]  # the bookkeeping's holders (empty: nobody)

    @property
    def kind(self) -> str:
        if not self.claimed:
            return "leaked"  # the ledger has an owner; the bookkeeping has none
        if len(self.claimed) > 1:
            return "claimed twice"
        return "claimed by another"


def find_disputes(census: Census, domain: Sequence[int] | range, ledger: LedgerView) -> list[Dispute]:
    """Every id of ``domain`` on which the census and the ledger disagree (census alone without a ledger)."""
    out: list[Dispute] = []
    claims = census.claims
    with_ledger = bool(ledger.enabled)
    for slot in domain:
        held = claims.get(slot)
        if with_ledger:
            owner = ledger.owner_of(slot)
            if held is not None and len(held) == 1 and held[0] is owner:
                continue
            if held is None and not census.complete and owner is FREE_LIST:
                continue  # the free list could not be read: a free id is not a dispute
            out.append(Dispute(slot, owner, tuple(held or ())))
        elif held is None:
            if census.complete:
                out.append(Dispute(slot, None, ()))
        elif len(held) > 1:
            out.append(Dispute(slot, None, tuple(held)))
    return out


def _claim_text(d: Dispute, no_claim: str = NO_CLAIM) -> str:
    if not d.claimed:
        return no_claim
    if len(d.claimed) == 1:
        return f"held by {d.claimed[0]!r}"
    return "held by " + " and ".join(repr(o) for o in d.claimed) + " (counted twice)"


def _ids(ids: Sequence[int]) -> str:
    return f"{list(ids[:8])}{'...' if len(ids) > 8 else ''}"


def explain_disputes(
    census: Census,
    disputes: Sequence[Dispute],
    ledger: LedgerView,
    *,
    describe_owner: Callable[[Owner], str | None] | None = None,
    no_claim: str = NO_CLAIM,
    view: str = "the bookkeeping",
) -> str:
    """The report: the disputed ids grouped by (ledger owner, the bookkeeping's claim), what is known of
    each owner involved (``describe_owner``: e.g. a request's state), then the last moves of a few ids
    of each group, so the culprit is named by id, owner and history."""
    pool = census.pool
    if not disputes:
        if not ledger.enabled and not census.complete:
            return f"[{pool}] culprit not resolved: no ledger (contracts off) and an incomplete census"
        return f"[{pool}] no id in dispute: the ledger and the bookkeeping agree id by id"
    groups: dict[tuple[int, tuple[int, ...]], list[Dispute]] = {}
    for d in disputes:
        groups.setdefault((id(d.ledger_owner), tuple(map(id, d.claimed))), []).append(d)
    no_ledger = "" if ledger.enabled else " (no ledger: contracts off, so no owner or history)"
    lines = [f"[{pool}] {len(disputes)} id(s) in dispute between the ledger and {view}{no_ledger}:"]
    notes: dict[int, str] = {}
    sample: list[Dispute] = []
    for members in list(groups.values())[:SHOWN_GROUPS]:
        first = members[0]
        owner = f"ledger owner {first.ledger_owner!r}; " if ledger.enabled else ""
        lines.append(
            f"  {first.kind} {_ids([d.slot for d in members])} ({len(members)}): {owner}"
            f"{view} says {_claim_text(first, no_claim)}"
        )
        sample += members[:SAMPLES_PER_GROUP]
        for o in (first.ledger_owner, *first.claimed):
            if describe_owner is not None and o is not None and o is not FREE_LIST and id(o) not in notes:
                note = describe_owner(o)
                if note:
                    notes[id(o)] = f"    {o.name}: {note}"
                    lines.append(notes[id(o)])
    if len(groups) > SHOWN_GROUPS:
        lines.append(f"  ... and {len(groups) - SHOWN_GROUPS} more group(s)")
    if ledger.enabled:
        lines.append("  last moves:")
        lines += [f"  {line}" for line in ledger.describe_slots([d.slot for d in sample])]
    return "\n".join(lines)


def diagnose(
    census: Census,
    domain: Sequence[int] | range,
    ledger: LedgerView,
    *,
    describe_owner: Callable[[Owner], str | None] | None = None,
) -> str:
    """:func:`find_disputes` then :func:`explain_disputes`: the culprit report for one pool."""
    return explain_disputes(
        census, find_disputes(census, domain, ledger), ledger, describe_owner=describe_owner
    )


def free_list_report(ledger: Any, free_ids: Iterable[int], pending_ids: Iterable[int] = ()) -> str:
    """The pool's free list and free group against the ledger's ``free`` and ``pending_free`` owners.

    For a pool whose own counters disagree with its ledger (a class invariant, an audit): the ids the pool
    lists as free that the ledger gives to someone, and the ids the ledger calls free that the pool does
    not list, each with its owner and moves.
    """
    census = Census(ledger.pool)
    census.claim((int(i) for i in free_ids), FREE_LIST)
    census.claim((int(i) for i in pending_ids), ledger.pending_owner)
    claimed = census.claims
    disputes = []
    for slot in ledger.domain:
        owner = ledger.owner_of(slot)
        held = claimed.get(slot)
        in_free = owner is FREE_LIST or owner is ledger.pending_owner
        if held is None and not in_free:
            continue  # held in both views: not the free list's business
        if held is not None and len(held) == 1 and held[0] is owner:
            continue
        disputes.append(Dispute(slot, owner, tuple(held or ())))
    if not disputes:
        return f"[{ledger.pool}] the free list and free group agree with the ledger id by id"
    shown = disputes[: SHOWN_GROUPS * SAMPLES_PER_GROUP]
    claims = {
        d.slot: (
            f"the bookkeeping says the pool lists it as {_claim_text(d)[len('held by ') :]}"
            if d.claimed
            else "the bookkeeping says the pool does not list it as free or pending"
        )
        for d in shown
    }
    listed = [d.slot for d in disputes if d.claimed]
    missing = [d.slot for d in disputes if not d.claimed]
    text: str = ledger.describe(
        [d.slot for d in shown],
        f"free list vs ledger: listed as free but owned by someone {listed[:8]},"
        f" free in the ledger but not listed {missing[:8]}",
        claims=claims,
    )
    return text
