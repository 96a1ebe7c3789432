"""The ledger of the ``owners`` level: the owner of every id, checked on every move, and no history.

:class:`OwnerTable` is a :class:`~kvledger.contracts.ledger.Ledger` with its history and per-move
I-COUNT check taken out, and a Python path for moves of a few ids (a decode step's). Every foreign free,
foreign insert and adopted slot is refused with the same typed errors as at ``ledger``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kvledger.contracts.id_arrays import SMALL_MOVE, as_id_array
from kvledger.contracts.ledger import FREE_CODE, MOVES_PER_SLOT_IN_REPORT, PENDING_CODE, Ledger
from kvledger.contracts.move_log import Move
from kvledger.contracts.owners import FREE, FREE_LIST, Account, Owner


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
            # _moved, inline: a page-1 alloc/free pair at ``owners`` is two of these (issue 38: per path)
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
        count[dst.account] += n  # a plain slot: no call per move
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
            count[d.account] += 1
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
        account = dsts[0].account
        n = len(dsts)
        if all(d.account is account for d in dsts):  # a decode batch: every request running
            count[account] += n
        else:
            for d in dsts:
                count[d.account] += 1
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

    def on_retag(self, owner: Owner, old: Account, new: Account, op: str) -> None:
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
            lines.append(
                f"  slot {slot}: owner {self.owner_of(slot)!r}" + ("" if claim is None else f"; {claim}")
            )
        lines.append(
            "    (checking level owners: no move history; run at the level ledger for the last moves)"
        )
        return lines

    def __repr__(self) -> str:
        return f"OwnerTable({self.pool}, size={self.size}, {self.account_sizes()})"
