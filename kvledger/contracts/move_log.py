"""A ledger's history: the bounded ring of moves and retags its violation reports quote.

Owners are recorded by serial number and name, never by reference, so the log keeps no finished
request's owner alive; entries are compact tuples, turned into :class:`Move` objects only when a report
or a test reads them.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvledger.contracts.owners import Account


def _history_setting() -> int:
    raw = os.environ.get("KVLEDGER_LEDGER_HISTORY")
    if raw is None:
        return 16384
    value = int(raw)
    if value < 1:
        raise ValueError(f"KVLEDGER_LEDGER_HISTORY must be >= 1, got {raw!r}")
    return value


DEFAULT_HISTORY = _history_setting()
"""Log entries kept in each ledger's ring (default 16,384; ``KVLEDGER_LEDGER_HISTORY`` overrides it).

An entry is one move, one retag or one batched hand-out. Violations report the last moves of a slot
found in this window (on the default ``kvledger simulate`` run, the KV ledger's window spans about
1,500 scheduler steps); older moves are forgotten, which is what keeps a long run's memory flat. An
entry costs about 150 bytes, plus 4 bytes per id for moves of several ids."""

MOVES_PER_SLOT_IN_REPORT = 6


@dataclass(frozen=True)
class Move:
    """One ledger event. ``ids`` is None for a retag (the owner changed account, its ids did not move).

    Owners are recorded by name and serial (see :attr:`Owner.serial`), so the log keeps no owner alive.
    """

    step: int
    op: str
    ids: tuple[int, ...] | None
    src: str
    dst: str
    src_account: Account
    dst_account: Account
    src_serial: int = 0
    dst_serial: int = 0
    epoch: int | None = None  # the owner of the ledger's clock at the move (a scheduler step, an event)

    def describe(self, clock: str = "step") -> str:
        """One line, dated by :attr:`epoch` under the name ``clock`` when the ledger's owner set one
        (``scheduler step 12``, ``event 340``), else by the ledger's own move counter (``step 7``)."""
        when = f"step {self.step}" if self.epoch is None else f"{clock} {self.epoch}"
        if self.ids is None:
            return f"{when}: {self.op}: {self.src} {self.src_account.name} -> {self.dst_account.name}"
        return (
            f"{when}: {self.op}: {self.src}[{self.src_account.name}] -> {self.dst}[{self.dst_account.name}]"
        )


class MoveLog:
    """The bounded ring of moves: compact tuples inside, :class:`Move` objects when read.

    An entry is one move, one retag, or one batched hand-out (``Ledger.transfer_each``: one id to each of
    several owners, the destinations stored as parallel tuples; it stands for one move per id, with
    consecutive steps). ``size`` counts entries.
    """

    __slots__ = ("_entries",)

    def __init__(self, size: int) -> None:
        # (step, op, ids (an int32 array, a tuple of ints, or None), src serial, kind, key, account name,
        #  dst serial, kind, key, account name): names are formatted only when a move is read. Only
        #  ints, strings and arrays, so the garbage collector untracks the entries once and never
        #  traverses the (long) log again.
        self._entries: deque[tuple[Any, ...]] = deque(maxlen=size)

    @property
    def size(self) -> int:
        return self._entries.maxlen or 0

    def append(self, entry: tuple[Any, ...]) -> None:
        self._entries.append(entry)

    def entries_append(self) -> Callable[[tuple[Any, ...]], None]:
        """The ring's own ``append`` (a ledger binds it once: its moves skip :meth:`append`'s call)."""
        return self._entries.append

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _is_batch(e: tuple[Any, ...]) -> bool:
        return type(e[7]) is tuple

    @staticmethod
    def _one(e: tuple[Any, ...], i: int) -> tuple[Any, ...]:
        """The ``i``-th move of a batch entry, as a plain entry."""
        return (
            e[0] + i,
            e[1],
            (int(e[2][i]),),
            e[3],
            e[4],
            e[5],
            e[6],
            e[7][i],
            e[8][i],
            e[9][i],
            e[10][i],
            e[11],
        )

    @classmethod
    def _move(cls, e: tuple[Any, ...]) -> Move:
        if cls._is_batch(e):
            e = cls._one(e, len(e[7]) - 1)
        step, op, ids, s_serial, s_kind, s_key, s_acct, d_serial, d_kind, d_key, d_acct, epoch = e
        return Move(
            step,
            op,
            None if ids is None else ids if isinstance(ids, tuple) else tuple(ids.tolist()),
            _name(s_kind, s_key),
            _name(d_kind, d_key),
            Account(s_acct),
            Account(d_acct),
            s_serial,
            d_serial,
            epoch,
        )

    def __getitem__(self, index: int) -> Move:
        return self._move(self._entries[index])

    def __iter__(self) -> Iterator[Move]:
        return (self._move(e) for e in self._entries)

    def history_of(self, slot: int, holder: int | None, limit: int) -> list[Move]:
        """The last ``limit`` moves that touched ``slot``, oldest first: its transfers, and the retags of
        whoever held it (``holder``: the serial of its owner now, None when free of owners).

        Walks the ring backwards from the present, tracking the holder at each point in time: before a
        transfer of ``slot`` the holder was that transfer's source. A batched hand-out that included
        ``slot`` is read as its one move of ``slot``.
        """
        found: list[tuple[Any, ...]] = []
        for e in reversed(self._entries):
            ids = e[2]
            if ids is None:
                if e[3] == holder:
                    found.append(e)
            elif slot in ids:
                if self._is_batch(e):
                    e = self._one(e, int(np.flatnonzero(ids == slot)[0]))
                found.append(e)
                holder = e[3]
            if len(found) >= limit:
                break
        found.reverse()
        return [self._move(e) for e in found]


def _name(kind: str, key: Any) -> str:
    """:attr:`Owner.name` from its parts."""
    return kind if key is None else f"{kind}#{key}"
