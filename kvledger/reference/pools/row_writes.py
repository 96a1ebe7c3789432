"""I-ROW-WRITE: a write of a request's row range never covers an id that request still owns.

A row position the request has filled holds a KV slot id; while the request owns that id (its own KV, not
yet given to the tree or freed), the position is the only record of where the id is used. Writing over it
loses the id (a leak the count identity sees only later, as ids nobody's bookkeeping holds) or makes two
positions name one slot. Legitimate rewrites are of positions whose ids changed hands first: the
re-match after an insert (``cache_unfinished_req``) points the row at the tree's ids once the tree adopted
the request's or freed the duplicates. An id the write itself puts back into the row is not lost: a
speculative over-allocation continuing a kept partial page rewrites the page's own ids, and a rejected
tail's ids, freed and taken again by the next verify, may land where their stale copies still stand.

:class:`RowWriteGuard` checks it at the write, where the two ledgers meet: the row's owner in the row
pool's ledger, each overwritten id's owner in the KV allocator's. Only positions the row's current owner
has written since the row was handed out, and not given back since, are considered (a reused row still
holds its previous owner's ids past that mark, and a rolled-back allocation or a freed speculative tail
leaves stale cells above the owner's allocated length: ``ReqToTokenPool.forget_tail`` lowers the mark).
Debug builds only (both ledgers real); a few numpy operations on the positions actually overwritten,
which the reference's own writes keep empty but for the re-match.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.ledger_by_level import AnyLedger
from kvledger.contracts.protocols import KVAllocator

CELLS_IN_PYTHON = 64
"""Up to this many cells, :meth:`RowWriteGuard.check_cells` reads and writes the marks as Python ints."""


class RowWriteGuard:
    """Per row, how far its current owner has written; and the check of a write against the KV ledger."""

    def __init__(self, rows: int, row_ledger: AnyLedger, kv_allocator: KVAllocator) -> None:
        self.filled = np.zeros(rows, dtype=np.int64)
        # The same marks as Python ints through a memoryview: a decode step writes one cell per request,
        # and a handful of numpy calls on ten cells cost more than the loop (issue 24, level owners).
        self._marks: memoryview = self.filled.data
        self.row_ledger = row_ledger
        self.kv_allocator = kv_allocator

    def handed_out(self, rows: Sequence[int]) -> None:
        """New owners: nothing of theirs is written yet."""
        self.filled[list(rows)] = 0

    def written_to(self, row: int) -> int:
        """How far the row's current owner has written (its mark)."""
        return int(self._marks[row])

    def forget_tail(self, row: int, start: int) -> None:
        """Positions ``start..`` no longer hold anything of the owner's (``ReqToTokenPool.forget_tail``)."""
        if self._marks[row] > start:
            self._marks[row] = start

    def check_span(self, table: np.ndarray, row: int, start: int, values: np.ndarray) -> None:
        """Before ``table[row, start:start+len(values)] = values``; then records the new mark."""
        end = start + len(values)
        stop = min(end, int(self.filled[row]))
        if stop > start:
            self._check(row, start, table[row, start:stop], values)
        if end > self._marks[row]:
            self._marks[row] = end

    def check_cells(
        self, table: np.ndarray, rows: Sequence[int], positions: Sequence[int], values: np.ndarray
    ) -> None:
        """Before ``table[rows[i], positions[i]] = values[i]`` (distinct rows); then records the new marks."""
        if len(rows) > CELLS_IN_PYTHON:
            r = np.asarray(rows, dtype=np.int64)
            p = np.asarray(positions, dtype=np.int64)
            over = p < self.filled[r]
            if over.any():
                for row, pos, k in zip(r[over].tolist(), p[over].tolist(), np.flatnonzero(over).tolist(), strict=True):
                    self._check(row, pos, table[row, pos : pos + 1], values[k : k + 1])
            self.filled[r] = np.maximum(self.filled[r], p + 1)
            return
        marks = self._marks
        again = [k for k, (row, pos) in enumerate(zip(rows, positions, strict=True)) if pos < marks[row]]
        if again:  # a position the owner wrote before: checked first, nothing recorded if it is refused
            for k in again:
                row, pos = rows[k], positions[k]
                self._check(row, pos, table[row, pos : pos + 1], values[k : k + 1])
        for row, pos in zip(rows, positions, strict=True):
            if pos >= marks[row]:
                marks[row] = pos + 1

    def _check(self, row: int, start: int, slots: np.ndarray, written: np.ndarray) -> None:
        """Refuse the write if an overwritten cell (``slots``, the row's cells from position ``start``)
        holds an id the row's owner owns and the write does not put back somewhere in the span
        (``written``): that id would be lost. One gather of the owner codes of the overwritten slots;
        only cells the owner holds are looked at one by one."""
        owner = self.row_ledger.owner_of(row)
        kv_ledger = self.kv_allocator.ledger
        if owner is None or not kv_ledger.held_count(owner):
            return  # the row's owner holds no KV: no overwritten id can be its own
        page = self.kv_allocator.page_size
        slots = slots.astype(np.int64)
        mine = np.flatnonzero(kv_ledger.held_mask(slots // page if page > 1 else slots, owner) & (slots != 0))
        if not mine.size:
            return
        kept = set(written.tolist())
        owned = [
            (start + k, slot)
            for k, slot in zip(mine.tolist(), slots[mine].tolist(), strict=True)
            if slot not in kept
        ]
        if owned:
            ids = sorted({slot // page for _, slot in owned})
            held = f"KV slot(s) {[s for _, s in owned][:8]}" + (f" of page(s) {ids[:8]}" if page > 1 else "")
            raise ContractViolation(
                kv_ledger.describe(
                    ids[:4],
                    f"I-ROW-WRITE: a write of row {row} ({owner!r}) covers position(s)"
                    f" {[pos for pos, _ in owned][:8]} holding {held} that {owner!r} still owns: the write"
                    " would lose them",
                )
            )
