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
device; moved to the host), a sequence of ints or one int (:mod:`kvledger.contracts.id_arrays`).

The ledger's relatives live beside it: the move log (:mod:`~kvledger.contracts.move_log`), the
``owners`` level's :class:`~kvledger.contracts.owner_table.OwnerTable`, the ``release`` level's
:class:`~kvledger.contracts.null_ledger.NullLedger`, and the choice among them by level
(:func:`~kvledger.contracts.ledger_by_level.make_ledger`).
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from kvledger.contracts.errors import ContractViolation, DuplicateIds, ForeignSlot
from kvledger.contracts.id_arrays import BYTE_TESTS as BYTE_TESTS
from kvledger.contracts.id_arrays import HIGH_BYTES as HIGH_BYTES
from kvledger.contracts.id_arrays import SMALL_MOVE as SMALL_MOVE
from kvledger.contracts.id_arrays import as_id_array as as_id_array
from kvledger.contracts.id_arrays import as_id_list as as_id_list
from kvledger.contracts.id_arrays import message_ids
from kvledger.contracts.move_log import DEFAULT_HISTORY as DEFAULT_HISTORY
from kvledger.contracts.move_log import MOVES_PER_SLOT_IN_REPORT as MOVES_PER_SLOT_IN_REPORT
from kvledger.contracts.move_log import Move as Move
from kvledger.contracts.move_log import MoveLog
from kvledger.contracts.owners import FREE, FREE_LIST, PENDING_FREE, Account, Owner
from kvledger.contracts.switch import ensure

NO_OWNER, FREE_CODE, PENDING_CODE = 0, 1, 2  # codes every ledger reserves


class MoveObserver(Protocol):
    """Told about every change a ledger records, after its checks passed (``Ledger.observer``).

    ``moved``: ``ids`` (a numpy array) went from ``src`` to ``dst``, or to ``dst[i]`` each for a batched
    hand-out; ``retagged``: ``owner`` changed account. The event-log recorder
    (:mod:`kvledger.audit.record`) is one; None (the default) costs one attribute test per move.
    """

    def moved(
        self, ledger: Ledger, ids: np.ndarray, src: Owner, dst: Owner | list[Owner], op: str
    ) -> None: ...

    def retagged(self, ledger: Ledger, owner: Owner, old: Account, new: Account, op: str) -> None: ...


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
        self.id_noun = (
            "page" if unit > 1 else "slot"
        )  # what an id names in reports (a paged pool's are pages)
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
        owner.attach_ledger(self)
        return code

    def _release_code(self, code: int) -> None:
        """An owner that holds nothing here leaves the registry; its code is reused."""
        owner = self._owners[code]
        assert owner is not None
        self._owners[code] = None
        del self._codes[owner]
        self._spare.append(code)
        owner.detach_ledger(self)

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
    @property
    def owner_codes(self) -> np.ndarray:
        """Each id's owner code (FREE_CODE, PENDING_CODE or a registered owner's), for an adapter that
        gathers over a batch of ids before it moves them (the attach telling fresh ids from held ones).
        Read only: every write goes through a move, which keeps the held counts and the log with it."""
        return self._own

    @property
    def owner_code_view(self) -> memoryview:
        """:attr:`owner_codes` as a memoryview (a few ids read as Python ints, cheaper than numpy there).
        Read only, like :attr:`owner_codes`."""
        return self._mv

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
        owner = self.owner_of(slot)
        return self._log.history_of(slot, None if owner is None else owner.serial, limit)

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
            return message_ids(a)
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
        if few and self.move_few(few, src, dst, op):
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
            self._count[dst.account] += n
            self._settle(src, src_code, n)  # type: ignore[arg-type]  # _check_move proved it registered
        self._append(
            (self.step, op, tuple(lst) if lst is not None else a.astype(np.int32), src.serial, src.kind,
             src.key, src.account.name, dst.serial, dst.kind, dst.key, dst.account.name, self.epoch)
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
        if not self.move_few(ids, owner, dst, op):
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
            count[dst.account] += 1
            count[src.account] -= 1
            if not held[src_code] and src_code > PENDING_CODE:
                self._release_code(src_code)
            if src.giver is not None:
                src.giver(src)
        self._append(
            (self.step, op, (i,), src.serial, src.kind, src.key, src.account.name,
             dst.serial, dst.kind, dst.key, dst.account.name, self.epoch)
        )  # fmt: skip
        self.step += 1
        if self.observer is not None:
            self.observer.moved(self, np.array((i,), dtype=np.int64), src, dst, op)
        counts = self._count_values
        if sum(counts) != self.size or min(counts) < 0:
            self._check_count(op)  # raises, naming the counts
        return True

    def move_few(self, lst: list[int], src: Owner, dst: Owner, op: str) -> bool:
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
            count[dst.account] += n
            count[src.account] -= n
            if not held[src_code] and src_code > PENDING_CODE:
                self._release_code(src_code)
            if src.giver is not None:
                src.giver(src)
        self._append(
            (self.step, op, tuple(lst), src.serial, src.kind, src.key, src.account.name,
             dst.serial, dst.kind, dst.key, dst.account.name, self.epoch)
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
        return all(0 <= i < top and mv[i] == code for i in lst) and (
            len(lst) == 1 or len(set(lst)) == len(lst)
        )

    def _check_move(
        self, a: np.ndarray, src_code: int | None, src: Owner, dst: Owner | None, op: str
    ) -> None:
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
            raise ContractViolation(
                self.describe(dups, f"{op}: ids repeated within one transfer: {dups[:8]}")
            )

    def _settle(self, src: Owner, src_code: int, n: int) -> None:
        """The source gives up ``n`` ids; an owner left with none leaves the registry."""
        self._held[src_code] -= n
        self._count[src.account] -= n
        if not self._held[src_code] and src_code > PENDING_CODE:
            self._release_code(src_code)
        if src.giver is not None:
            src.giver(src)

    def on_retag(self, owner: Owner, old: Account, new: Account, op: str) -> None:
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
            raise ContractViolation(
                self.describe(shown, "owner table and holdings disagree for " + "; ".join(parts))
            )
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
