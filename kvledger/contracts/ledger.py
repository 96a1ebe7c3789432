"""The ownership ledger of one pool: the owner of every id, the accounts, and the history of moves.

A ledger shadows a pool (KV tokens, KV pages, request rows, Mamba slots). It is the executable form of
I-PARTITION: every id of the pool's domain has exactly one owner (I-EXCLUSIVE by construction: one
entry per id), the owners' holdings are disjoint and cover the domain, and the per-account counts sum
to the domain size (I-COUNT). Ids change owner only through :meth:`Ledger.transfer`, which first
checks that every id is held by the claimed source (no double free: I-NODUP-FREE; no foreign free) and
raises :class:`ContractViolation` naming the id, its real owner and its last moves otherwise.

How it stays cheap enough to leave on (issue 12):

* The owner table is a numpy array of small integer *codes*, one per id; an owner registry maps codes
  to :class:`Owner` objects. A transfer is one gather and one comparison over its ids (plus an O(n)
  duplicate check), never a Python loop per id.
* Per-owner and per-account counts are kept incrementally; holdings (the ids of one owner) are
  resolved from the table only when an audit or a report asks.
* Codes are recycled: an owner that holds nothing is dropped from the registry (and the owner forgets
  the ledger), so owners of finished requests do not stay registered (issue 17).
* The move log is a ring of ``history`` entries (:data:`DEFAULT_HISTORY`, or ``KVLEDGER_LEDGER_HISTORY``)
  that records owners by serial number and name, not by reference. Reports walk it only when a check
  fails or a test asks.
* I-COUNT is checked at the ledger's public boundaries that change counts (each transfer and retag),
  never on per-id accessors such as :meth:`owner_of`.
* A move of one id (a decode token's slot, one page: the alloc/free pair of issue 24) is one call,
  :meth:`Ledger.move_one`, on Python ints: the same check, log entry and I-COUNT as every move.

The ledger never looks at tensors' contents; it is told about moves by the pool and recounts the pool's
own structures only in :meth:`Ledger.audit`. Ids may be given as a numpy array, a torch tensor (any
device; moved to the host), a sequence of ints or one int.
"""

from __future__ import annotations

import os
import sys
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kvledger.contracts.errors import ContractViolation, DuplicateIds, ForeignSlot
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import FREE, FREE_LIST, PENDING_FREE, Account, Owner
from kvledger.contracts.switch import ensure, ledger_level


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

NO_OWNER, FREE_CODE, PENDING_CODE = 0, 1, 2  # codes every ledger reserves

SMALL_MOVE = 16

BYTE_TESTS = 512
"""Up to this many ids, a move's sign test reads each id's high byte (a bytes slice), not a reduction."""

HIGH_BYTES = slice(7, None, 8) if sys.byteorder == "little" else slice(0, None, 8)
"""The most significant byte of each int64 in a ``tobytes()`` copy (zero for ids in ``[0, 2**56)``)."""
"""Moves of at most this many ids take the owner table's Python path (:class:`OwnerTable`)."""


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
        return f"{when}: {self.op}: {self.src}[{self.src_account.name}] -> {self.dst}[{self.dst_account.name}]"


class MoveObserver(Protocol):
    """Told about every change a ledger records, after its checks passed (``Ledger.observer``).

    ``moved``: ``ids`` (a numpy array) went from ``src`` to ``dst``, or to ``dst[i]`` each for a batched
    hand-out; ``retagged``: ``owner`` changed account. The event-log recorder
    (:mod:`kvledger.audit.record`) is one; None (the default) costs one attribute test per move.
    """

    def moved(self, ledger: Ledger, ids: np.ndarray, src: Owner, dst: Owner | list[Owner], op: str) -> None: ...

    def retagged(self, ledger: Ledger, owner: Owner, old: Account, new: Account, op: str) -> None: ...


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
        return (e[0] + i, e[1], (int(e[2][i]),), e[3], e[4], e[5], e[6], e[7][i], e[8][i], e[9][i], e[10][i], e[11])

    @staticmethod
    def _move(e: tuple[Any, ...]) -> Move:
        if MoveLog._is_batch(e):
            e = MoveLog._one(e, len(e[7]) - 1)
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

    def raw_reversed(self) -> Iterator[tuple[Any, ...]]:
        out: Iterator[tuple[Any, ...]] = reversed(self._entries)
        return out


def _name(kind: str, key: Any) -> str:
    """:attr:`Owner.name` from its parts."""
    return kind if key is None else f"{kind}#{key}"


def as_id_list(ids: Any) -> list[int]:
    """Ids as a list of Python ints, from a tensor, an array, a sequence or a single int."""
    if isinstance(ids, int):
        return [ids]
    tolist = getattr(ids, "tolist", None)
    if tolist is not None:
        out = tolist()
        return [out] if isinstance(out, int) else list(out)
    return [int(i) for i in ids]


def as_id_array(ids: Any) -> np.ndarray:
    """Ids as a 1-D int64 numpy array on the host (zero-copy for CPU tensors and int64 arrays)."""
    if isinstance(ids, np.ndarray):
        a = ids
    elif isinstance(ids, int):
        return np.array((ids,), dtype=np.int64)
    elif hasattr(ids, "is_cpu"):  # a torch tensor: host it first (a no-op on CPU)
        a = ids.numpy() if ids.is_cpu else ids.cpu().numpy()
    else:
        try:
            a = np.asarray(ids, dtype=np.int64)
        except OverflowError:  # an int beyond int64 is certainly not an id: keep it visible, as objects
            return np.asarray(list(ids), dtype=object)
    if a.dtype != np.int64:
        a = a.astype(np.int64)
    return a.reshape(-1)


def _plain(ids: Any) -> list[int]:
    """Ids for a message: Python ints (works for object arrays holding huge ints too)."""
    return [int(i) for i in as_id_list(ids)]


class Ledger:
    """Ownership of the ids ``domain`` of one pool. ``unit`` converts ids to tokens (page size).

    I-COUNT (the accounts sum to the size) is checked after every transfer and retag; :meth:`audit`
    recounts everything against the pool's own structures.
    """

    enabled = True

    def __init__(
        self, pool: str, domain: range, *, unit: int = 1, history: int | None = None, debug: bool = True
    ) -> None:
        if domain.step != 1 or domain.start < 0 or len(domain) == 0:
            raise ValueError(f"ledger domain must be a non-empty contiguous range of ids >= 0, got {domain}")
        self.pool = pool
        self.domain = domain
        self.size = len(domain)
        self.unit = unit
        self.id_noun = "page" if unit > 1 else "slot"  # what an id names in reports (a paged pool's are pages)
        # The data checks ride on this flag: the pool poisons freed slots and zeroes handed-out ones, the
        # tiny model checks what its reads see (the level ``full``; a pool's ledger gets it from
        # make_ledger).
        self.debug = debug
        self.step = 0
        # The clock of whoever drives the pool, recorded with every move so reports date moves in its
        # terms: the scheduler sets ``epoch`` to its step number (``clock`` "scheduler step"), an audit to
        # the event number ("event"). None: moves are dated by the ledger's own move counter ``step``.
        self.epoch: int | None = None
        self.clock = "step"
        self.observer: MoveObserver | None = None  # told about every move and retag (a recorder)
        self.pending_owner = Owner("free_group", pool, PENDING_FREE)
        # Owner codes per id: 0 for ids outside the domain (reserved padding ids), else a registry code.
        self._own = np.zeros(domain.stop, dtype=np.int32)
        self._own[domain.start :] = FREE_CODE
        self._mv: memoryview = self._own.data  # the same int32 buffer, indexed as Python ints (few ids)
        self._owners: list[Owner | None] = [None, FREE_LIST, self.pending_owner]
        self._codes: dict[Owner, int] = {FREE_LIST: FREE_CODE, self.pending_owner: PENDING_CODE}
        self._held: list[int] = [0, self.size, 0]  # ids held per code
        self._spare: list[int] = []  # codes of owners that hold nothing any more, for reuse
        # Ids per account: a defaultdict, whose item updates run at dict speed (a Counter's are twice as
        # slow, and every move makes two of them).
        self._count: defaultdict[Account, int] = defaultdict(int, {FREE: self.size})
        # A live view of the counts, for I-COUNT's sum at every move (one attribute read, no method call).
        self._count_values = self._count.values()
        self._log = MoveLog(DEFAULT_HISTORY if history is None else history)
        # The log's own append, bound once: a move appends straight to the ring, not through a method.
        self._append = self._log.entries_append()
        # Scratch for the O(n) duplicate check: positions scattered by id and read back.
        self._scratch = np.zeros(domain.stop, dtype=np.int32)
        self._positions = np.arange(domain.stop, dtype=np.int32)

    # ------------------------------------------------------------------ registry
    def _code_of(self, owner: Owner) -> int:
        """The code of ``owner``, registering it (and attaching the ledger to it) on first use."""
        code = self._codes.get(owner)
        return self._register(owner) if code is None else code

    def _register(self, owner: Owner) -> int:
        """A code for ``owner``, not registered yet (a pair of one id registers its owner each time)."""
        spare = self._spare
        if spare:
            code = spare.pop()  # a released code: its held count is 0 (released only when it reached 0)
            self._owners[code] = owner
        else:
            code = len(self._owners)
            self._owners.append(owner)
            self._held.append(0)
        self._codes[owner] = code
        ledgers = owner._ledgers  # Owner._attach, inline
        if self not in ledgers:
            ledgers.append(self)
        return code

    def _release_code(self, code: int) -> None:
        """An owner that holds nothing here leaves the registry; its code is reused."""
        owner = self._owners[code]
        assert owner is not None
        self._owners[code] = None
        del self._codes[owner]
        self._spare.append(code)
        ledgers = owner._ledgers  # Owner._detach, inline
        if self in ledgers:
            ledgers.remove(self)

    def logged_moves(self) -> int:
        """Entries in the bounded move log (at most its size, ``history``): what a long run must bound."""
        return len(self._log)

    def registered_owners(self) -> int:
        """Owners in the registry (the free list and the free group included): what a long run must bound."""
        return len(self._codes)

    def registered(self) -> list[Owner]:
        """The registered owners themselves (every one holds at least one id, but for the two fixed ones)."""
        return list(self._codes)

    # ------------------------------------------------------------------ queries
    def owner_of(self, slot: int) -> Owner | None:
        """The owner of ``slot``; None for ids outside the domain (reserved ids)."""
        if 0 <= slot < len(self._own):
            return self._owners[int(self._own[slot])]
        return None

    def owner_table(self) -> list[Owner | None]:
        """The owner of every id ``0 .. domain.stop - 1`` (O(size); for tests and reports)."""
        owners = self._owners
        return [owners[c] for c in self._own.tolist()]

    def holdings(self, owner: Owner) -> frozenset[int]:
        """The ids ``owner`` holds (O(size): resolved from the owner table when asked)."""
        code = self._codes.get(owner)
        if code is None:
            return frozenset()
        return frozenset(np.flatnonzero(self._own == code).tolist())

    def held_count(self, owner: Owner) -> int:
        code = self._codes.get(owner)
        return 0 if code is None else self._held[code]

    def count(self, account: Account) -> int:
        """Ids in ``account`` (multiply by ``unit`` for tokens)."""
        return self._count.get(account, 0)

    def account_sizes(self) -> dict[str, int]:
        """Every non-empty account with its size in ids."""
        return {acct.name: n for acct, n in self._count.items() if n}

    def owners(self) -> list[Owner]:
        """Owners that hold at least one id."""
        return [o for o, c in self._codes.items() if self._held[c]]

    def all_held_by(self, ids: Any, owner: Owner) -> bool:
        """Whether every id is held by ``owner`` (vectorised; the postcondition of :meth:`transfer`)."""
        a = as_id_array(ids)
        return a.size == 0 or self._held_by(a, self._codes.get(owner))

    def holds(self, ids: Sequence[int], owner: Owner) -> bool:
        """Whether ``owner`` holds every id of a short list of ints (a handle's): Python ints, no numpy."""
        code = self._codes.get(owner)
        if code is None:
            return not ids
        mv, top = self._mv, len(self._mv)
        return all(type(i) is int and 0 <= i < top and mv[i] == code for i in ids)

    def held_mask(self, ids: np.ndarray, owner: Owner) -> np.ndarray:
        """Per id of an int64 array (any values), whether ``owner`` holds it: one gather, False for ids
        outside the table (I-ROW-WRITE's look at the overwritten cells of a row)."""
        code = self._codes.get(owner)
        out = np.zeros(ids.shape, dtype=bool)
        if code is None:
            return out
        inside = (ids >= 0) & (ids < len(self._own))
        out[inside] = self._own[ids[inside]] == code
        return out

    def all_held_each(self, ids: Any, owners: Sequence[Owner]) -> bool:
        """Whether ``ids[i]`` is held by ``owners[i]`` for every i (vectorised)."""
        a = as_id_array(ids)
        if a.size != len(owners) or a.dtype != np.int64:
            return False
        if a.size == 0:
            return True
        if int(a.view(np.uint64).max()) >= len(self._own):
            return False
        got, codes = self._own[a].tolist(), self._codes
        return all(codes.get(o, -1) == c for o, c in zip(owners, got, strict=True))

    def history_of(self, slot: int, limit: int = MOVES_PER_SLOT_IN_REPORT) -> list[Move]:
        """The last ``limit`` moves that touched ``slot``: its transfers, and retags of whoever held it.

        Walks the log backwards from the present, tracking the holder at each point in time: before a
        transfer of ``slot`` the holder was that transfer's source.
        """
        found: list[tuple[Any, ...]] = []
        owner = self.owner_of(slot)
        holder = None if owner is None else owner.serial
        for e in self._log.raw_reversed():
            ids = e[2]
            if ids is None:
                if e[3] == holder:
                    found.append(e)
            elif slot in ids:
                if MoveLog._is_batch(e):
                    e = MoveLog._one(e, int(np.flatnonzero(ids == slot)[0]))
                found.append(e)
                holder = e[3]
            if len(found) >= limit:
                break
        found.reverse()
        return [MoveLog._move(e) for e in found]

    def describe(self, slots: Iterable[int], headline: str, claims: Mapping[int, str] | None = None) -> str:
        """A violation report: the headline, then each slot's current owner and last moves.

        ``claims`` adds, per slot, what the other side of a dispute says about it, as a phrase ("the
        bookkeeping says it is free", "the log says req#3 holds it"), so the report shows both sides.
        """
        return "\n".join([f"[{self.pool}] {headline}", *self.describe_slots(slots, claims)])

    def describe_slots(self, slots: Iterable[int], claims: Mapping[int, str] | None = None) -> list[str]:
        """:meth:`describe` without the headline: per slot (at most 8), owner, claim and last moves."""
        lines = []
        for slot in list(slots)[:8]:
            claim = None if claims is None else claims.get(slot)
            lines.append(
                f"  {self.id_noun} {slot}: owner {self.owner_of(slot)!r}"
                + ("" if claim is None else f"; {claim}")
            )
            moves = self.history_of(slot)
            if not moves:
                lines.append("    (no recorded moves: held since construction or older than the log)")
            lines.extend(f"    {m.describe(self.clock)}" for m in moves)
        return lines

    # ------------------------------------------------------------------ vectorised checks
    def _not_held_by(self, a: np.ndarray, code: int | None) -> list[int]:
        """The ids of ``a`` that are not held by ``code`` (out of range, reserved or someone else's)."""
        if a.dtype != np.int64:  # huge ints: certainly not ids
            return _plain(a)
        n_own = len(self._own)
        inside = (a >= 0) & (a < n_own)
        wrong = ~inside
        if code is None:
            wrong[:] = True
        else:
            wrong[inside] = self._own[a[inside]] != code
        out: list[int] = a[wrong].tolist()
        return out

    def _held_by(self, a: np.ndarray, code: int | None) -> bool:
        """Fast path: every id of ``a`` (non-empty) is held by ``code``."""
        if code is None or a.dtype != np.int64:
            return False
        n = a.size
        if n == 1:
            i = int(a[0])
            return 0 <= i < len(self._own) and int(self._own[i]) == code
        # Byte comparisons instead of numpy reductions (a reduction's fixed cost is several gathers'):
        # no id is negative (numpy would wrap it onto another id) when every high byte is zero; the
        # gather raises IndexError past the table; every code read is ``code`` when the bytes match.
        if n <= BYTE_TESTS:
            if a.tobytes()[HIGH_BYTES] != bytes(n):
                return False
        elif int(a.view(np.uint64).max()) >= len(self._own):
            return False
        try:
            return bool(self._own[a].tobytes() == code.to_bytes(4, sys.byteorder) * n)
        except IndexError:
            return False

    def _has_duplicates(self, a: np.ndarray) -> bool:
        """O(n), no sort: scatter each position at its id, read back; a repeated id loses one write."""
        n = a.size
        if n < 2:
            return False
        if n > len(self._positions):
            return True  # more ids than the domain holds: some id repeats
        pos = self._positions[:n]
        scratch = self._scratch
        scratch[a] = pos
        return bool(scratch[a].tobytes() != pos.tobytes())

    # ------------------------------------------------------------------ checks that raise typed errors
    def require_held_by(self, ids: Any, owner: Owner, op: str, *, distinct: bool = False) -> None:
        """Input validation: every id is held by ``owner``; else :class:`ForeignSlot` and no change.

        With ``distinct``, a repeated id is :class:`DuplicateIds` first (the O(n) scatter check, no sort).
        """
        if type(ids) is list and len(ids) <= SMALL_MOVE:  # a few ints (a pool's free): no numpy
            code = self._codes.get(owner)
            mv = self._mv
            top = len(mv)
            if (
                code is not None
                and all(type(i) is int and 0 <= i < top and mv[i] == code for i in ids)
                and (not distinct or len(set(ids)) == len(ids))
            ):
                return
        a = as_id_array(ids)
        if a.size == 0:
            return
        code = self._codes.get(owner)
        if self._held_by(a, code):
            if distinct and self._has_duplicates(a):
                dups = sorted(i for i, c in Counter(a.tolist()).items() if c > 1)
                raise DuplicateIds(f"[{self.pool}] {op}: ids repeat: {dups[:8]}")
            return
        if distinct and a.dtype == np.int64 and self._has_duplicates_any(a):
            dups = sorted(i for i, c in Counter(a.tolist()).items() if c > 1)
            raise DuplicateIds(f"[{self.pool}] {op}: ids repeat: {dups[:8]}")
        wrong = self._not_held_by(a, code)
        raise ForeignSlot(self.describe(wrong, f"{op}: ids not held by {owner!r}: {wrong[:8]}"))

    def has_repeats(self, ids: Any) -> bool:
        """Whether an id repeats in ``ids`` (ids of the domain: the O(n) scatter check, no sort)."""
        a = as_id_array(ids)
        if a.size > 1 and (a.dtype != np.int64 or int(a.min()) < 0 or int(a.max()) >= len(self._own)):
            return self._has_duplicates_any(a)
        return self._has_duplicates(a)

    @staticmethod
    def _has_duplicates_any(a: np.ndarray) -> bool:
        """Repeats among ids that may lie outside the domain (error path only: sorts)."""
        return bool(np.unique(a).size != a.size)

    def require_held_each(self, ids: Any, owners: Sequence[Owner], op: str) -> None:
        """Input validation: ``ids[i]`` is held by ``owners[i]``; else :class:`ForeignSlot` and no change."""
        if self.all_held_each(ids, owners):
            return
        a = as_id_array(ids)
        wrong = [i for i, o in zip(a.tolist(), owners, strict=True) if self.owner_of(i) is not o]
        raise ForeignSlot(self.describe(wrong, f"{op}: ids not held by their claimed owners: {wrong[:8]}"))

    # ------------------------------------------------------------------ moves
    @ensure(lambda self, ids, dst: self.all_held_by(ids, dst))
    def transfer(self, ids: Any, src: Owner, dst: Owner, op: str) -> None:
        """Move ``ids`` from ``src`` to ``dst``. Checks everything before changing anything.

        A mismatch is a bug in the caller (input validation happened upstream), hence
        :class:`ContractViolation` with the evidence, and the ledger is unchanged.
        """
        if type(ids) is list:
            few: list[int] | None = ids if len(ids) <= SMALL_MOVE else None
        elif type(ids) is np.ndarray and ids.size <= SMALL_MOVE and ids.dtype == np.int64 and ids.ndim == 1:
            few = ids.tolist()
        else:
            few = None
        if few and self._move_few(few, src, dst, op):
            return
        a = as_id_array(ids)
        n = a.size
        if n == 0:
            return
        src_code = self._codes.get(src)
        mv = self._mv
        # A few ids: checked, moved and logged as Python ints through the memoryview (cheaper than the
        # numpy calls of the general path, which any doubt falls through to for the evidence).
        lst: list[int] | None = a.tolist() if n <= SMALL_MOVE and a.dtype == np.int64 else None
        if lst is None or src_code is None or not self._small_held(lst, src_code):
            self._check_move(a, src_code, src, dst, op)
            lst = None
        if dst is not src:  # a move to oneself only leaves a trace in the log
            dst_code = self._code_of(dst)
            if lst is None:
                self._own[a] = dst_code
            else:
                for i in lst:
                    mv[i] = dst_code
            self._held[dst_code] += n
            self._count[dst._account] += n
            self._settle(src, src_code, n)  # type: ignore[arg-type]  # _check_move proved it registered
        self._append(
            (self.step, op, tuple(lst) if lst is not None else a.astype(np.int32), src.serial, src.kind,
             src.key, src._account.name, dst.serial, dst.kind, dst.key, dst._account.name, self.epoch)
        )  # fmt: skip
        self.step += 1
        if self.observer is not None:
            self.observer.moved(self, a, src, dst, op)
        self._check_count(op)

    # The move of ids require_held_by has just confirmed ``owner`` holds, in the same call of the same pool
    # (which also refused repeats): a Ledger checks it again, as every move (the ``ledger`` level promises
    # that), so it is ``transfer`` itself, no extra call; the OwnerTable only records it.
    move_held = transfer

    def give_back(self, ids: list[int], owner: Owner, dst: Owner, op: str) -> None:
        """A pool's release of a few ids (Python ints, validated against the pool's own state): the
        input check of :meth:`require_held_by` (``ForeignSlot`` when ``owner`` does not hold them) and
        the move to ``dst`` (the free list, or a free group's pending owner) in one pass."""
        if not self._move_few(ids, owner, dst, op):
            self.require_held_by(ids, owner, op)  # raises ForeignSlot with the evidence
            self.transfer(ids, owner, dst, op)

    @ensure(
        lambda self, i, dst, result: not result or self.owner_of(i) is dst,
        "I-PARTITION: a moved id is its new owner's",
    )
    def move_one(self, i: int, src: Owner, dst: Owner, op: str) -> bool:
        """:meth:`transfer` of one id (a Python int) from ``src`` to ``dst``, checked, logged and followed
        by I-COUNT as every move; False, with nothing changed, when ``src`` does not hold ``i`` (or ``i`` is
        not an int of the table). The caller then asks :meth:`transfer` (a move the pool makes itself: an
        allocation) or :meth:`give_back` (a caller's free: ``ForeignSlot``) for the error with the evidence.

        The ``ledger`` level's page-1 alloc/free pair is two of these (issue 24): one call, no list.
        """
        codes = self._codes
        src_code = codes.get(src)
        mv = self._mv
        if src_code is None or type(i) is not int or not 0 <= i < len(mv) or mv[i] != src_code:
            return False
        if dst is not src:  # a move to oneself only leaves a trace in the log
            dst_code = codes.get(dst) or self._register(dst)
            mv[i] = dst_code
            held = self._held
            held[dst_code] += 1
            held[src_code] -= 1
            count = self._count
            count[dst._account] += 1
            count[src._account] -= 1
            if not held[src_code] and src_code > PENDING_CODE:
                self._release_code(src_code)
            if src.giver is not None:
                src.giver(src)
        self._append(
            (self.step, op, (i,), src.serial, src.kind, src.key, src._account.name,
             dst.serial, dst.kind, dst.key, dst._account.name, self.epoch)
        )  # fmt: skip
        self.step += 1
        if self.observer is not None:
            self.observer.moved(self, np.array((i,), dtype=np.int64), src, dst, op)
        counts = self._count_values
        if sum(counts) != self.size or min(counts) < 0:
            self._check_count(op)  # raises, naming the counts
        return True

    def _move_few(self, lst: list[int], src: Owner, dst: Owner, op: str) -> bool:
        """:meth:`transfer` of a short list of Python ints (a decode step's id, a request's pages), checked
        and moved through the memoryview, the log entry and I-COUNT as in the general path; False, with
        nothing changed, when any doubt (an odd type, an id out of range or not ``src``'s, a repeat)
        sends the move to the general path for the evidence.

        The ``ledger`` level's hot path (issue 24) for a few ids (one id: :meth:`move_one`), so every call
        and attribute read here is a measurable share of a decode step's moves.
        """
        src_code = self._codes.get(src)
        if src_code is None:
            return False
        mv = self._mv
        top = len(mv)
        n = len(lst)
        if n == 1:
            i = lst[0]
            if type(i) is not int or not 0 <= i < top or mv[i] != src_code:
                return False
        else:
            for i in lst:
                if type(i) is not int or not 0 <= i < top or mv[i] != src_code:
                    return False
            if len(set(lst)) != n:
                return False
        if dst is not src:  # a move to oneself only leaves a trace in the log
            dst_code = self._codes.get(dst) or self._register(dst)
            for i in lst:
                mv[i] = dst_code
            held = self._held
            held[dst_code] += n
            held[src_code] -= n
            count = self._count
            count[dst._account] += n
            count[src._account] -= n
            if not held[src_code] and src_code > PENDING_CODE:
                self._release_code(src_code)
            if src.giver is not None:
                src.giver(src)
        self._append(
            (self.step, op, tuple(lst), src.serial, src.kind, src.key, src._account.name,
             dst.serial, dst.kind, dst.key, dst._account.name, self.epoch)
        )  # fmt: skip
        self.step += 1
        if self.observer is not None:
            self.observer.moved(self, np.asarray(lst, dtype=np.int64), src, dst, op)
        counts = self._count_values
        if sum(counts) != self.size or min(counts) < 0:
            self._check_count(op)  # raises, naming the counts
        return True

    def transfer_each(self, ids: Any, src: Owner, dsts: Sequence[Owner], op: str) -> None:
        """Move ``ids[i]`` from ``src`` to ``dsts[i]`` for every i: one check for the batch, one log entry per id.

        The batched form of :meth:`transfer` for allocations that hand one id to each of many owners
        (a decode step). Same checks, same all-or-nothing behaviour.
        """
        a = as_id_array(ids)
        n = a.size
        if not self._batch_shape_ok(n, src, dsts, op):
            return
        src_code = self._codes.get(src)
        self._check_move(a, src_code, src, dsts[0] if n == 1 else None, op)
        get = self._codes.get
        codes = [get(d) or self._code_of(d) for d in dsts]
        self._own[a] = codes
        held = self._held
        for c in codes:
            held[c] += 1
        accounts = [d.account for d in dsts]
        count = self._count
        for acct in accounts:
            count[acct] += 1
        # One log entry for the batch: the destinations as parallel tuples (see MoveLog).
        self._log.append(
            (self.step, op, a.astype(np.int32), src.serial, src.kind, src.key, src.account.name,
             tuple(d.serial for d in dsts), tuple(d.kind for d in dsts), tuple(d.key for d in dsts),
             tuple(acct.name for acct in accounts), self.epoch)
        )  # fmt: skip
        self._settle(src, src_code, n)  # type: ignore[arg-type]
        self.step += n
        if self.observer is not None:
            self.observer.moved(self, a, src, list(dsts), op)
        self._check_count(op)

    def _batch_shape_ok(self, n: int, src: Owner, dsts: Sequence[Owner], op: str) -> bool:
        """A batched hand-out names one owner per id, none of them the source; False: nothing to move."""
        if n != len(dsts):
            raise ContractViolation(f"[{self.pool}] {op}: {n} ids for {len(dsts)} owners")
        if any(d is src for d in dsts):
            raise ContractViolation(f"[{self.pool}] {op}: {src!r} cannot hand ids to itself in a batch")
        return n > 0

    def _small_held(self, lst: list[int], code: int) -> bool:
        """Every id of a short list of ints is held by ``code``, none repeated."""
        mv, top = self._mv, len(self._mv)
        return all(0 <= i < top and mv[i] == code for i in lst) and (len(lst) == 1 or len(set(lst)) == len(lst))

    def _check_move(self, a: np.ndarray, src_code: int | None, src: Owner, dst: Owner | None, op: str) -> None:
        """Every id held by ``src``, none repeated; else ContractViolation with the evidence."""
        n = a.size
        if 1 < n <= SMALL_MOVE and src_code is not None and a.dtype == np.int64:
            # A few ids (a request's pages, a decode step's): Python ints through the memoryview beat the
            # handful of numpy calls below; any doubt falls through to them for the evidence.
            lst = a.tolist()
            mv, top = self._mv, len(self._mv)
            if all(0 <= i < top and mv[i] == src_code for i in lst) and len(set(lst)) == n:
                return
        if not self._held_by(a, src_code):
            wrong = self._not_held_by(a, src_code)
            to = f" on their way to {dst!r}" if dst is not None else ""
            raise ContractViolation(
                self.describe(
                    wrong,
                    f"{op}: {len(wrong)} id(s) expected to be held by {src!r}{to}"
                    f" are not (I-NODUP-FREE / I-EXCLUSIVE): {wrong[:8]}",
                )
            )
        if self._has_duplicates(a):
            dups = sorted(i for i, c in Counter(a.tolist()).items() if c > 1)
            raise ContractViolation(self.describe(dups, f"{op}: ids repeated within one transfer: {dups[:8]}"))

    def _settle(self, src: Owner, src_code: int, n: int) -> None:
        """The source gives up ``n`` ids; an owner left with none leaves the registry."""
        self._held[src_code] -= n
        self._count[src.account] -= n
        if not self._held[src_code] and src_code > PENDING_CODE:
            self._release_code(src_code)
        if src.giver is not None:
            src.giver(src)

    def _on_retag(self, owner: Owner, old: Account, new: Account, op: str) -> None:
        """Called by :meth:`Owner.set_account`: the owner's ids change account, not owner."""
        code = self._codes.get(owner)
        n = 0 if code is None else self._held[code]
        count = self._count
        if n:
            count[old] -= n
            count[new] += n
        self._log.append(
            (self.step, op, None, owner.serial, owner.kind, owner.key, old.name,
             owner.serial, owner.kind, owner.key, new.name, self.epoch)
        )  # fmt: skip
        self.step += 1
        if self.observer is not None:
            self.observer.retagged(self, owner, old, new, op)
        counts = count.values()
        if sum(counts) != self.size or min(counts) < 0:
            self._check_count(op)  # raises, naming the counts

    def _check_count(self, op: str) -> None:
        """I-COUNT at the boundary: the accounts sum to the pool size, none negative."""
        counts = self._count.values()
        if sum(counts) == self.size and min(counts) >= 0:
            return
        raise ContractViolation(
            f"[{self.pool}] {op}: I-COUNT: the accounts sum to the pool size violated:"
            f" {dict(self._count)} sum to {sum(self._count.values())}, size {self.size}"
        )

    def return_to_free_list(self, ids: Any, op: str) -> None:
        """Move ``ids`` (held by whoever holds them) back to the free list, owner by owner (rollback)."""
        a = as_id_array(ids)
        if a.size == 0:
            return
        codes = self._own[a]
        for code in np.unique(codes).tolist():
            owner = self._owners[code]
            if owner is None:
                raise ContractViolation(self.describe(a[codes == code].tolist(), f"{op}: ids with no owner"))
            self.transfer(a[codes == code], owner, FREE_LIST, op)

    # ------------------------------------------------------------------ audit
    def audit(self, free_ids: Iterable[int], pending_ids: Iterable[int] = ()) -> None:
        """Full recount (O(size)) against the pool's own free structure. Raises ContractViolation.

        Checks I-PARTITION: the pool's free list has no duplicates (I-NODUP-FREE) and equals the
        ledger's FREE holdings; pending ids equal the pending owner's holdings; ids outside the domain
        are unowned; every owner code in the table is registered and the owner table agrees with the
        per-owner counts; the per-owner counts cover the domain and the account counts agree with them.
        """
        free_list = as_id_array(list(free_ids) if not hasattr(free_ids, "tolist") else free_ids)
        dup_free = sorted(i for i, c in Counter(free_list.tolist()).items() if c > 1)
        if dup_free:
            raise ContractViolation(
                self.describe(dup_free, f"free list holds ids twice (I-NODUP-FREE): {dup_free[:8]}")
            )
        own = self._own
        start = self.domain.start
        reserved = np.flatnonzero(own[:start] != NO_OWNER).tolist()
        if reserved:
            i = reserved[0]
            raise ContractViolation(
                self.describe([i], f"reserved id {i} has an owner {self._owners[int(own[i])]!r}")
            )
        codes = own[start:]
        if int(codes.min()) < FREE_CODE or int(codes.max()) >= len(self._owners):
            bad = (np.flatnonzero((codes < FREE_CODE) | (codes >= len(self._owners))) + start).tolist()
            raise ContractViolation(self.describe(bad[:4], f"ids {bad[:8]} have no registered owner"))
        held_total = sum(h for c, h in enumerate(self._held) if c != NO_OWNER and self._owners[c] is not None)
        if held_total != self.size:
            raise ContractViolation(
                f"[{self.pool}] holdings cover {held_total} ids, domain has {self.size} (I-PARTITION)"
            )
        recount = np.bincount(codes, minlength=len(self._owners)).tolist()
        released = [c for c, o in enumerate(self._owners) if o is None and c != NO_OWNER and recount[c]]
        if released:
            ids = (np.flatnonzero(np.isin(codes, released)) + start).tolist()
            raise ContractViolation(self.describe(ids[:4], f"ids {ids[:8]} have a released owner code"))
        # Owners whose table entries exceed their count first: the stray ids are among theirs.
        disagree = sorted(
            (c for c, o in enumerate(self._owners) if o is not None and recount[c] != self._held[c]),
            key=lambda c: self._held[c] - recount[c],
        )
        if disagree:
            parts: list[str] = []
            shown: list[int] = []
            for c in disagree:
                ids = (np.flatnonzero(codes == c) + start).tolist()
                shown.extend(ids[:4] if not shown else [])
                parts.append(
                    f"{self._owners[c]!r}: the table gives it ids {ids[:8]}{'...' if len(ids) > 8 else ''}"
                    f" ({len(ids)}), its count says {self._held[c]}"
                )
            raise ContractViolation(self.describe(shown, "owner table and holdings disagree for " + "; ".join(parts)))
        self._compare("free list", set(free_list.tolist()), FREE_LIST)
        self._compare("free group", set(as_id_array(list(pending_ids)).tolist()), self.pending_owner)
        by_account: Counter[Account] = Counter()
        for code, owner in enumerate(self._owners):
            if owner is not None and self._held[code]:
                by_account[owner.account] += self._held[code]
        if +by_account != +Counter(self._count):
            raise ContractViolation(
                f"[{self.pool}] account counts {dict(+Counter(self._count))} != recount {dict(+by_account)}"
            )

    def _compare(self, what: str, actual: set[int], owner: Owner) -> None:
        expected = set(self.holdings(owner))
        if actual != expected:
            extra = sorted(actual - expected)
            missing = sorted(expected - actual)
            claims = {i: f"the bookkeeping says it is in the pool's {what}" for i in extra[:4]}
            claims.update({i: f"the bookkeeping says it is not in the pool's {what}" for i in missing[:4]})
            raise ContractViolation(
                self.describe(
                    extra[:4] + missing[:4],
                    f"{what} disagrees with the ledger (I-PARTITION): in pool but not in ledger {extra[:8]},"
                    f" in ledger but not in pool {missing[:8]}",
                    claims=claims,
                )
            )

    def __repr__(self) -> str:
        return f"Ledger({self.pool}, size={self.size}, {self.account_sizes()})"


class OwnerTable(Ledger):
    """The ledger of the ``owners`` level: who holds every id, checked on every move, and nothing else.

    The same owner codes, registry, counts and checks as :class:`Ledger` (so every foreign free, foreign
    insert or adopted slot is refused the same way, with the same typed errors), without what makes a
    ledger a debugging tool: no move log (a report names the id and its owner, not its last moves), no
    I-COUNT check at each move (the scheduler's count identities check the counts after every step).

    Moves of a few ids (a decode step's: one id per request) stay in Python ints, read and written through
    a memoryview of the owner table: a handful of numpy calls on a tiny array cost more than the loop.
    An allocation (a move out of the free list, ids as the pool's own numpy array) is recorded without
    re-checking that the ids were free: the pool's free list took them, and its state bytes refuse a
    double free at every level. So this table is for a pool's own bookkeeping; a ledger that watches
    another implementation's allocator (``kvledger.engines.sglang``, the audit's replay) is a
    :class:`Ledger`, which checks every move.
    """

    def __init__(self, pool: str, domain: range, *, unit: int = 1) -> None:
        super().__init__(pool, domain, unit=unit, history=1, debug=False)

    def _small(self, ids: Any) -> list[int] | None:
        """``ids`` as a short list of in-range ints, or None (many ids, odd types or out of range)."""
        if type(ids) is list:
            lst = ids
        else:
            n = ids.size if isinstance(ids, np.ndarray) else ids.numel() if hasattr(ids, "numel") else None
            if n is None or n > SMALL_MOVE:
                return None
            lst = ids.tolist()
            if type(lst) is not list:
                return None
        if len(lst) > SMALL_MOVE:
            return None
        top = len(self._own)
        for i in lst:
            if type(i) is not int or not 0 <= i < top:
                return None
        return lst

    def transfer(self, ids: Any, src: Owner, dst: Owner, op: str) -> None:
        codes = self._codes
        if src is FREE_LIST and type(ids) is np.ndarray and dst is not src:
            # An allocation: ids the pool took off its own free list (see transfer_each).
            n = ids.size
            if n:
                dst_code = codes.get(dst) or self._register(dst)
                if n <= SMALL_MOVE:
                    mv = self._mv
                    for i in ids.tolist():
                        mv[i] = dst_code
                else:
                    self._own[ids] = dst_code
                self._moved(FREE_LIST, FREE_CODE, dst, dst_code, n)
                if self.observer is not None:
                    self.observer.moved(self, ids, src, dst, op)
            return
        src_code = codes.get(src)
        lst = self._small(ids)
        if lst is not None and src_code is not None:
            mv = self._mv
            n = len(lst)
            if n == 0:
                return
            ok = True
            for i in lst:
                if mv[i] != src_code:
                    ok = False
                    break
            if ok and (n == 1 or len(set(lst)) == n):
                if dst is not src:
                    dst_code = codes.get(dst) or self._register(dst)
                    for i in lst:
                        mv[i] = dst_code
                    self._moved(src, src_code, dst, dst_code, n)
                if self.observer is not None:
                    self.observer.moved(self, np.asarray(lst, dtype=np.int64), src, dst, op)
                return
        a = as_id_array(ids)
        n = a.size
        if n == 0:
            return
        self._check_move(a, src_code, src, dst, op)  # the general path: raises with the evidence
        if dst is not src:
            dst_code = codes.get(dst) or self._register(dst)
            self._own[a] = dst_code
            self._moved(src, src_code, dst, dst_code, n)  # type: ignore[arg-type]  # checked: registered
        if self.observer is not None:
            self.observer.moved(self, a, src, dst, op)

    def give_back(self, ids: list[int], owner: Owner, dst: Owner, op: str) -> None:
        # One pass: ``transfer``'s check of a few ints is require_held_by's; any doubt (the check fails,
        # or the ids are not a short list of in-range ints) re-runs require_held_by for ForeignSlot.
        codes = self._codes
        code = codes.get(owner)
        if code is not None and type(ids) is list and 0 < len(ids) <= SMALL_MOVE:
            mv, top = self._mv, len(self._mv)
            if all(type(i) is int and 0 <= i < top and mv[i] == code for i in ids) and (
                len(ids) == 1 or len(set(ids)) == len(ids)
            ):
                if dst is not owner:
                    dst_code = codes.get(dst) or self._register(dst)
                    for i in ids:
                        mv[i] = dst_code
                    self._moved(owner, code, dst, dst_code, len(ids))
                if self.observer is not None:
                    self.observer.moved(self, np.asarray(ids, dtype=np.int64), owner, dst, op)
                return
        self.require_held_by(ids, owner, op)
        self.transfer(ids, owner, dst, op)

    def move_one(self, i: int, src: Owner, dst: Owner, op: str) -> bool:
        # One id, checked whatever the source (one comparison; a free naming the free list as its owner
        # must not pass as an allocation): False, nothing changed, when ``src`` does not hold it.
        codes = self._codes
        src_code = codes.get(src)
        mv = self._mv
        if src_code is None or type(i) is not int or not 0 <= i < len(mv) or mv[i] != src_code:
            return False
        if dst is not src:
            dst_code = codes.get(dst) or self._register(dst)
            mv[i] = dst_code
            self._moved(src, src_code, dst, dst_code, 1)
        if self.observer is not None:
            self.observer.moved(self, np.array((i,), dtype=np.int64), src, dst, op)
        return True

    def move_held(self, ids: Any, owner: Owner, dst: Owner, op: str) -> None:
        # require_held_by passed in this same call (and the pool refused repeats): only record the move.
        code = self._codes.get(owner)
        if code is None or dst is owner:
            self.transfer(ids, owner, dst, op)
            return
        if type(ids) is list:
            n = len(ids)
            if n == 0:
                return
            dst_code = self._codes.get(dst) or self._register(dst)
            mv = self._mv
            for i in ids:
                mv[i] = dst_code
        else:
            a = as_id_array(ids)
            n = a.size
            if n == 0:
                return
            dst_code = self._codes.get(dst) or self._register(dst)
            self._own[a] = dst_code
        self._moved(owner, code, dst, dst_code, n)
        if self.observer is not None:
            self.observer.moved(self, as_id_array(ids), owner, dst, op)

    def _moved(self, src: Owner, src_code: int, dst: Owner, dst_code: int, n: int) -> None:
        held = self._held
        held[dst_code] += n
        held[src_code] -= n
        count = self._count
        count[dst.account] += n
        count[src.account] -= n
        if not held[src_code] and src_code > PENDING_CODE:
            self._release_code(src_code)
        if src.giver is not None:
            src.giver(src)

    def transfer_each(self, ids: Any, src: Owner, dsts: Sequence[Owner], op: str) -> None:
        if src is FREE_LIST and type(ids) is np.ndarray and ids.size == len(dsts):
            # A hand-out from the free list (a decode step's allocation): the pool took these ids off its
            # own free list, whose state bytes already refuse a double free, so the owner table only
            # records the new owners (the ``ledger`` level checks this move too).
            self._hand_out(ids, dsts)
            if self.observer is not None:
                self.observer.moved(self, ids, src, list(dsts), op)
            return
        a = as_id_array(ids)
        n = a.size
        if not self._batch_shape_ok(n, src, dsts, op):
            return
        src_code = self._codes.get(src)
        lst = self._small(a) if n <= SMALL_MOVE else None
        mv = self._mv
        if lst is None or src_code is None or any(mv[i] != src_code for i in lst) or len(set(lst)) != n:
            self._check_move(a, src_code, src, dsts[0] if n == 1 else None, op)
            lst = a.tolist()
        get = self._codes.get
        held = self._held
        for i, d in zip(lst, dsts, strict=True):
            c = get(d) or self._code_of(d)
            mv[i] = c
            held[c] += 1
        count = self._count
        for d in dsts:
            count[d._account] += 1
        self._settle(src, src_code, n)  # type: ignore[arg-type]
        if self.observer is not None:
            self.observer.moved(self, a, src, list(dsts), op)

    def _hand_out(self, a: np.ndarray, dsts: Sequence[Owner]) -> None:
        get = self._codes.get
        found = list(map(get, dsts))
        codes: list[int] = (
            [c if c is not None else self._code_of(d) for c, d in zip(found, dsts, strict=True)]
            if None in found  # an owner's first id in this pool: register it
            else found  # type: ignore[assignment]  # no None in it
        )
        mv, held, count = self._mv, self._held, self._count
        for i, c in zip(a.tolist(), codes, strict=True):
            mv[i] = c
            held[c] += 1
        account = dsts[0]._account
        n = len(dsts)
        if all(d._account is account for d in dsts):  # a decode batch: every request running
            count[account] += n
        else:
            for d in dsts:
                count[d._account] += 1
        held[FREE_CODE] -= n
        count[FREE] -= n

    def require_held_by(self, ids: Any, owner: Owner, op: str, *, distinct: bool = False) -> None:
        lst = self._small(ids)
        code = self._codes.get(owner)
        if lst is not None and code is not None:
            mv = self._mv
            if all(mv[i] == code for i in lst) and (not distinct or len(set(lst)) == len(lst)):
                return
        super().require_held_by(ids, owner, op, distinct=distinct)

    def _on_retag(self, owner: Owner, old: Account, new: Account, op: str) -> None:
        code = self._codes.get(owner)
        n = 0 if code is None else self._held[code]
        if n:
            self._count[old] -= n
            self._count[new] += n
        if self.observer is not None:
            self.observer.retagged(self, owner, old, new, op)

    def history_of(self, slot: int, limit: int = MOVES_PER_SLOT_IN_REPORT) -> list[Move]:
        return []

    def describe_slots(self, slots: Iterable[int], claims: Mapping[int, str] | None = None) -> list[str]:
        lines = []
        for slot in list(slots)[:8]:
            claim = None if claims is None else claims.get(slot)
            lines.append(f"  slot {slot}: owner {self.owner_of(slot)!r}" + ("" if claim is None else f"; {claim}"))
        lines.append("    (checking level owners: no move history; run at the level ledger for the last moves)")
        return lines

    def __repr__(self) -> str:
        return f"OwnerTable({self.pool}, size={self.size}, {self.account_sizes()})"


class NullLedger:
    """The ledger of the ``release`` level: every method is a no-op, every query answers 'unknown'."""

    enabled = False
    debug = False

    def __init__(self, pool: str, domain: range, *, unit: int = 1) -> None:
        self.pool = pool
        self.domain = domain
        self.size = len(domain)
        self.unit = unit
        self.pending_owner = Owner("free_group", pool, PENDING_FREE)

    def transfer(self, ids: Any, src: Owner, dst: Owner, op: str) -> None:
        return None

    def transfer_each(self, ids: Any, src: Owner, dsts: Sequence[Owner], op: str) -> None:
        return None

    def return_to_free_list(self, ids: Any, op: str) -> None:
        return None

    def give_back(self, ids: list[int], owner: Owner, dst: Owner, op: str) -> None:
        return None

    def move_one(self, i: int, src: Owner, dst: Owner, op: str) -> bool:
        return True

    def move_held(self, ids: Any, owner: Owner, dst: Owner, op: str) -> None:
        return None

    def require_held_by(self, ids: Any, owner: Owner, op: str, *, distinct: bool = False) -> None:
        return None

    def require_held_each(self, ids: Any, owners: Sequence[Owner], op: str) -> None:
        return None

    def audit(self, free_ids: Iterable[int], pending_ids: Iterable[int] = ()) -> None:
        return None

    def owner_of(self, slot: int) -> Owner | None:
        return None

    def held_mask(self, ids: np.ndarray, owner: Owner) -> np.ndarray:
        return np.zeros(ids.shape, dtype=bool)

    # Queries answer "nothing recorded": callers check ``enabled`` before trusting them.
    def count(self, account: Account) -> int:
        return 0

    def account_sizes(self) -> dict[str, int]:
        return {}

    def holdings(self, owner: Owner) -> frozenset[int]:
        return frozenset()

    def held_count(self, owner: Owner) -> int:
        return 0

    def registered_owners(self) -> int:
        return 0

    def registered(self) -> list[Owner]:
        return []

    def describe(self, slots: Iterable[int], headline: str, claims: Mapping[int, str] | None = None) -> str:
        return f"[{self.pool}] {headline} (no ledger: checking level release)"

    def describe_slots(self, slots: Iterable[int], claims: Mapping[int, str] | None = None) -> list[str]:
        return []

    def __repr__(self) -> str:
        return f"NullLedger({self.pool})"


AnyLedger = Ledger | NullLedger


def make_ledger(pool: str, domain: range, *, unit: int = 1) -> AnyLedger:
    """The ledger of the level pools are built at now (:func:`~kvledger.contracts.switch.ledger_level`):
    a :class:`Ledger` (``ledger``, ``full``), an :class:`OwnerTable` (``owners``) or the no-op one."""
    level = ledger_level()
    if level >= CheckLevel.LEDGER:
        return Ledger(pool, domain, unit=unit, debug=level.contracts)
    if level is CheckLevel.OWNERS:
        return OwnerTable(pool, domain, unit=unit)
    return NullLedger(pool, domain, unit=unit)
