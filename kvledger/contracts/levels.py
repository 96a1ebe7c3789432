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

DEFAULT_LEVEL = CheckLevel.FULL
"""The level of a process that sets neither ``KVLEDGER_CHECKS`` nor ``KVLEDGER_CONTRACTS``."""


def parse_level(value: str) -> CheckLevel:
    """A level from its name (case and surrounding blanks ignored); ValueError names the choices."""
    normalised = value.strip().lower()
    for level in CheckLevel:
        if level.label == normalised:
            return level
    raise ValueError(f"unknown checking level {value!r}: one of {', '.join(LEVEL_NAMES)}")
