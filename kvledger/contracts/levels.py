"""Checking levels: how much of kvledger's checking a process (or one engine) runs.

Four levels, each doing everything the one before it does (spec/checking-levels.md has the measured
cost and what each catches):

* ``release``: counts only. No owner per id: the pools check ranges, duplicates and double frees
  against their own free lists, and the scheduler checks its count identities after every step. A free
  by an owner that does not hold the ids is accepted.
* ``owners``: who holds every id, as a small integer owner code per slot of every pool (a numpy array),
  checked with one vectorised gather on every call that names ids. Foreign frees, foreign inserts,
  adopted Mamba slots and continued foreign pages are typed errors (``ForeignSlot``), state unchanged.
  No move history, no poisoning of freed slots.
* ``ledger``: plus the history of moves (violations name the culprit and the slot's last moves), and
  every move checked, the pools' internal ones included.
* ``full``: plus icontract pre/postconditions and class invariants, the scheduler's incremental
  identity cross-checked against the ledgers after every step, and the data checks: freed KV and Mamba
  slots are poisoned and handed-out ones zeroed, the tiny model's runner checks what its reads see
  (the debug build of earlier releases).

``full`` is special: icontract's decorators are applied when a module is imported, so whether they run
is fixed for the whole process (:data:`kvledger.contracts.switch.LEVEL`). The three others differ only
in the ledger object each pool is given when it is built, so an engine may be built at a lower level
than its process (``EngineSpec.checks``); never at ``full`` in a process that is not.

This module is torch-free and import-light (the switch imports it, and CrossHair imports the switch).
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class CheckLevel(enum.IntEnum):
    """One checking level; ordered, so ``level >= CheckLevel.OWNERS`` reads as "owners or more"."""

    RELEASE = 0
    OWNERS = 1
    LEDGER = 2
    FULL = 3

    @property
    def label(self) -> str:
        """The name users type (``--checks owners``, ``KVLEDGER_CHECKS=owners``)."""
        return self.name.lower()

    @property
    def tracks_owners(self) -> bool:
        """Pools know who holds each id (a ledger object, not the no-op one)."""
        return self >= CheckLevel.OWNERS

    @property
    def keeps_history(self) -> bool:
        """Ledgers keep the move log and check every move."""
        return self >= CheckLevel.LEDGER

    @property
    def contracts(self) -> bool:
        """icontract's conditions and the scheduler's per-step cross-checks run (import-time choice)."""
        return self is CheckLevel.FULL

    def __str__(self) -> str:
        return self.label

    def __bool__(self) -> bool:
        return True  # a level is a setting, not a number: ``release`` must not read as "no level"


LEVEL_NAMES: tuple[str, ...] = tuple(level.label for level in CheckLevel)


class LevelDoc(NamedTuple):
    """What one level is, in the words every place that names it uses: ``--checks``'s help, the summary
    of ``kvledger simulate`` and the table of spec/checking-levels.md (:func:`levels_table`, which a test
    keeps equal to the page's table)."""

    short: str  # a few words: the CLI's help and the run summary
    pools_get: str  # the ledger object a pool is built with
    runs: str  # what runs, beyond the level before
    foreign: str  # what becomes of a foreign free, insert, adopted slot or continued page


LEVEL_DOCS: dict[CheckLevel, LevelDoc] = {
    CheckLevel.RELEASE: LevelDoc(
        short="counts and input validation (no owner per id)",
        pools_get="`NullLedger`",
        runs=(
            "input validation from each pool's own structures (types, ranges, repeats, double frees against"
            " the free list's per-slot state), for the pools and for the ids handed to the caches; the count"
            " identities after every scheduler step (I-COUNT, I-CAP per pool; I-IDLE-IDENTITY at quiescence)"
        ),
        foreign="accepted: nothing knows who holds an id",
    ),
    CheckLevel.OWNERS: LevelDoc(
        short="who holds every id: foreign frees, inserts and adoptions refused",
        pools_get="`OwnerTable`",
        runs=(
            "plus an owner code per slot of every pool (a numpy `int32` array, one entry per id), checked on"
            " every call that names ids: frees, inserts into the radix caches, Mamba slot donations and"
            " adoptions, `alloc_extend` / `alloc_decode` continuing a page, row writes, PD metadata"
        ),
        foreign="`ForeignSlot` (a `KVLedgerError`), state unchanged",
    ),
    CheckLevel.LEDGER: LevelDoc(
        short="owners, plus every move checked and its history kept",
        pools_get="`Ledger`",
        runs=(
            "plus the ring of moves (a violation names each disputed id, its owner and its last moves), every"
            " move checked, internal ones included (an allocation too), I-COUNT at every move"
        ),
        foreign="the same, the message with the moves",
    ),
    CheckLevel.FULL: LevelDoc(
        short="ledger, plus icontract, per-step cross-checks and data checks (poisoned frees)",
        pools_get="`Ledger`",
        runs=(
            "plus icontract's pre/postconditions and class invariants on every public method of pools,"
            " caches and schedulers; after every scheduler step the busy identity cross-checked account by"
            " account against the ledgers, I-HANDLE-OWNED (verified for the requests whose handles or"
            " holdings changed since their last verification: the only ways a handle goes stale),"
            " I-OWNER-RELEASE, Mamba V2's I-REQ-MAMBA / I-STATE-BOUND, I-REQ-LADDER; full audits at"
            " quiescence; the data checks: freed KV and Mamba slots poisoned and handed-out ones zeroed"
            " (I-POISON-ON-FREE: every element of a freed slot), the tiny model's reads checked"
        ),
        foreign="the same",
    ),
}


def checks_help() -> str:
    """``--checks``'s help: each level's short description, from :data:`LEVEL_DOCS`."""
    levels = "; ".join(f"{level.label}: {LEVEL_DOCS[level].short}" for level in CheckLevel)
    return f"checking level ({levels})"


def levels_table() -> str:
    """The table of spec/checking-levels.md ("The levels"), from :data:`LEVEL_DOCS`."""
    head = [
        "| level | pools get | what runs | a foreign free, insert, adopted slot or continued page |",
        "|---|---|---|---|",
    ]
    rows = [f"| `{lv.label}` | {d.pools_get} | {d.runs} | {d.foreign} |" for lv, d in LEVEL_DOCS.items()]
    return "\n".join(head + rows)

DEFAULT_LEVEL = CheckLevel.FULL
"""The level of a process that sets neither ``KVLEDGER_CHECKS`` nor ``KVLEDGER_CONTRACTS``."""


LEVEL_ENV_VAR = "KVLEDGER_CHECKS"
CONTRACTS_ENV_VAR = "KVLEDGER_CONTRACTS"  # the alias of earlier releases: 1 is full, 0 is release


def read_switch(value: str | None, name: str = CONTRACTS_ENV_VAR) -> bool:
    """Parse an on/off variable: unset, ``1``, ``true``, ``on`` mean on; ``0``, ``false``, ``off`` mean off."""
    if value is None:
        return True
    normalised = value.strip().lower()
    if normalised in ("1", "true", "on", "yes"):
        return True
    if normalised in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{name} must be 0 or 1, got {value!r}")


def read_level(checks: str | None, contracts: str | None) -> CheckLevel:
    """The process's level: ``KVLEDGER_CHECKS`` when set, else its alias ``KVLEDGER_CONTRACTS`` (``1``:
    ``full``, ``0``: ``release``), else the default. ``KVLEDGER_CHECKS`` wins when both are set, so an
    unreadable alias beside a valid level is not looked at. ValueError names the variable and the choices."""
    if checks is not None and checks.strip():
        try:
            return parse_level(checks)
        except ValueError as exc:
            raise ValueError(f"{LEVEL_ENV_VAR}: {exc}") from None
    if contracts is None:
        return DEFAULT_LEVEL
    return CheckLevel.FULL if read_switch(contracts) else CheckLevel.RELEASE


def parse_level(value: str) -> CheckLevel:
    """A level from its name (case and surrounding blanks ignored); ValueError names the choices."""
    normalised = value.strip().lower()
    for level in CheckLevel:
        if level.label == normalised:
            return level
    raise ValueError(f"unknown checking level {value!r}: one of {', '.join(LEVEL_NAMES)}")
