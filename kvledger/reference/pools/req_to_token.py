"""``ReqToTokenPool``: request rows and the ``req_to_token`` table that maps positions to KV slots.

Rows ``0..size-1`` (no reserved row, as in SGLang's non-PD pool), or ``1..size`` with ``reserved_rows=1``
(row 0 kept as padding, as SGLang's PD decode pool does). A row is owned by one request from
admission to release (2026 semantics, PR #17850: a chunked request keeps its row across chunks, so a
launched forward never sees its row reassigned, I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvledger.contracts.errors import DuplicateIds, InvalidArgument, SlotOutOfRange
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import FREE, Owner
from kvledger.contracts.protocols import Ids, KVAllocator
from kvledger.contracts.switch import ensure, invariant, snapshot
from kvledger.reference.config_fields import allocating, check_fits_memory, check_size
from kvledger.reference.pools.base import IdPool
from kvledger.reference.pools.id_free_list import host_ids
from kvledger.reference.pools.row_writes import RowWriteGuard
from kvledger.reference.pools.validate import (
    INT32_MAX,
    as_index_tensor,
    check_count,
    check_in_range,
    check_int_sequence,
    check_owner,
    check_positive,
    ids_within,
)


@invariant(
    lambda self: not self._rows.ledger.enabled or self._rows.ledger.count(FREE) == self._rows.available(),
    "I-COUNT: ledger free rows == available_size()",
    error=lambda self: self._rows.ledger_disagreement("I-COUNT: ledger free rows != available_size()"),
)
@invariant(lambda self: 0 <= self._rows.available() + self._rows.pending_count() <= self.size, "I-CAP")
class ReqToTokenPool(IdPool):
    """``size`` usable rows of ``max_context_len`` int32 KV-slot ids each, after ``reserved_rows`` padding rows."""

    def __init__(
        self,
        size: int,
        max_context_len: int,
        *,
        device: str | torch.device = "cpu",
        name: str = "req",
        reserved_rows: int = 0,
        checks: CheckLevel | None = None,
    ) -> None:
        check_positive(size, "size")
        check_positive(max_context_len, "max_context_len")
        check_count(reserved_rows, "reserved_rows")
        self.size = size
        self.reserved_rows = reserved_rows
        self.max_context_len = max_context_len
        check_size(max_context_len, "ReqToTokenPool: max_context_len")
        check_fits_memory(4 * (reserved_rows + size) * max_context_len, f"ReqToTokenPool: {size} rows")
        self._rows = self._init_pool(name, device, reserved_rows, size, reuse="fifo", checks=checks)
        with allocating(f"ReqToTokenPool: {size} rows of {max_context_len}"):
            self.req_to_token = torch.zeros(
                (reserved_rows + size, max_context_len), dtype=torch.int32, device=self.device
            )
        # On CPU, a numpy view of the same memory for the batched per-cell reads and writes.
        self._table = self.req_to_token.numpy() if self.device.type == "cpu" else None
        self._free_what = f"{name}.free"
        self.row_writes: RowWriteGuard | None = None  # I-ROW-WRITE, once the KV allocator is attached

    def attach_kv_owners(self, kv_allocator: KVAllocator) -> None:
        """Debug builds (both ledgers real, a host table): check every row write against the KV ledger
        (I-ROW-WRITE, ``kvledger.reference.pools.row_writes``)."""
        if self._table is not None and self._rows.ledger.enabled and kv_allocator.ledger.enabled:
            self.row_writes = RowWriteGuard(self.reserved_rows + self.size, self._rows.ledger, kv_allocator)

    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(lambda self, n, result: result is None or len(result) == n == len(set(result)))
    @ensure(lambda self, n, OLD, result: (result is None) == (n > OLD.available))
    @ensure(lambda self, n, OLD, result: result is None or self.available_size() == OLD.available - n)
    def alloc(self, n: int, owner: Owner) -> list[int] | None:
        """``n`` rows for ``owner``, or None when fewer are free."""
        check_count(n)
        if type(owner) is not Owner:  # one comparison on the fast path
            check_owner(owner)
        rows = self._rows.alloc(n, owner)
        if rows is None:
            return None
        handed = rows.tolist()
        if self.row_writes is not None:
            self.row_writes.handed_out(handed)
        return handed

    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(
        lambda self, rows, OLD: (
            self.available_size() == OLD.available + len(as_index_tensor(rows, self.device, "free"))
        )
    )
    def free(self, rows: Ids, owner: Owner) -> None:
        """Return ``owner``'s rows (an int or a sequence). Contents are left as they are."""
        t = as_index_tensor(rows, self.device, self._free_what)
        if type(owner) is not Owner:  # one comparison on the fast path
            check_owner(owner)
        self._rows.free_checked(t, owner, "free", "row")

    def _free_unchecked(self, rows: torch.Tensor, owner: Owner, op: str = "free") -> None:
        self._rows.release(rows, owner, op)

    @ensure(lambda self, row, start, values: self._holds(row, start, values))
    def write(self, row: int, start: int, values: torch.Tensor) -> None:
        """``req_to_token[row, start:start+len(values)] = values``; the row must be held by someone."""
        values = as_index_tensor(values, self.device, f"{self.name}.write")  # int32/int64, pool device
        self._check_span(row, start, start + values.numel(), "write")
        check_in_range(values, 0, INT32_MAX, self.name, "KV slot id")  # the table is int32
        if self.row_writes is not None and self._table is not None:
            self.row_writes.check_span(self._table, row, start, host_ids(values))
        self.req_to_token[row, start : start + values.numel()] = values.to(torch.int32)

    @ensure(
        lambda self, row, start: self.row_writes is None or self.row_writes.written_to(row) <= start,
        "I-ROW-WRITE: after forget_tail nothing of the row from start on counts as written",
    )
    def forget_tail(self, row: int, start: int) -> None:
        """The row's owner gave back what positions ``start..`` named (an admission or a verify's
        over-allocation rolled back, a rejected speculative tail freed): those cells are stale, no record
        of its KV. The table keeps them (SGLang's does too: every reader stops at the request's allocated
        length); a debug build stops counting them as written, so that a later write over them is not
        taken for one that loses ids (I-ROW-WRITE: at page > 1 a page given back can come back at another
        position, and its stale cells then name ids the owner holds again, elsewhere in the row)."""
        self._check_span(row, start, start, "forget_tail")
        if self.row_writes is not None:
            self.row_writes.forget_tail(row, start)

    @ensure(
        lambda self, rows, positions, values: self._holds_each(rows, positions, values),
        "each row holds its value at its position",
    )
    def write_each(self, rows: Sequence[int], positions: Sequence[int], values: Ids) -> None:
        """``req_to_token[rows[i], positions[i]] = values[i]`` for a batch (a decode step), one call.

        Rows must be distinct and held; positions inside the row; values fit int32. All or nothing.
        """
        vals = as_index_tensor(values, self.device, f"{self.name}.write_each")
        n = self._check_cells(rows, positions, "write_each")
        if vals.numel() != n:
            raise InvalidArgument(f"[{self.name}] write_each: {n} rows and positions, {vals.numel()} values")
        if len(set(rows)) != n:
            raise DuplicateIds(f"[{self.name}] write_each: a row appears twice in one batch: {rows}")
        if not n:
            return
        if not ids_within(vals, 0, INT32_MAX):
            check_in_range(vals, 0, INT32_MAX, self.name, "KV slot id")  # raises, with the offenders
        if self._table is not None:  # CPU: write through the host view, no tensor building
            if self.row_writes is not None:
                self.row_writes.check_cells(self._table, rows, positions, host_ids(vals))
            self._table[rows, positions] = host_ids(vals)
        else:
            row_t = torch.as_tensor(rows, dtype=torch.int64, device=self.device)
            pos_t = torch.as_tensor(positions, dtype=torch.int64, device=self.device)
            self.req_to_token[row_t, pos_t] = vals.to(torch.int32)

    def read_each(self, rows: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """``req_to_token[rows[i], positions[i]]`` for a batch, as int64 (rows held, positions in the row)."""
        self._check_cells(rows, positions, "read_each")
        return self._read_each(rows, positions)

    def _check_row(self, row: object, op: str) -> int:
        """A row some request holds: reading or writing any other is a caller's mistake."""
        held = check_count(row, "row")
        end = self.reserved_rows + self.size
        if held >= end:
            raise SlotOutOfRange(f"[{self.name}] {op}: row {row} outside [0, {end})")
        if not self._rows.is_held(held):
            raise InvalidArgument(f"[{self.name}] {op}: row {row} is not held by any request")
        return held

    def _check_span(self, row: object, start: object, end: object, op: str) -> None:
        """Positions ``[start, end)`` of a held row: ``0 <= start <= end <= max_context_len``."""
        first = check_count(start, "start")
        last = check_count(end, "end")
        if first > last or last > self.max_context_len:
            raise InvalidArgument(
                f"[{self.name}] {op}: positions [{start}, {end}) outside [0, {self.max_context_len}]"
            )
        self._check_row(row, op)

    def _check_cells(self, rows: object, positions: object, op: str) -> int:
        """Equally long lists of held rows and positions inside a row; returns their length. O(n)."""
        row_list = check_int_sequence(rows, f"[{self.name}] {op}: rows")
        pos_list = check_int_sequence(positions, f"[{self.name}] {op}: positions")
        n = len(row_list)
        if len(pos_list) != n:
            raise InvalidArgument(f"[{self.name}] {op}: {n} rows, {len(pos_list)} positions")
        if n:
            if min(pos_list) < 0 or max(pos_list) >= self.max_context_len:
                bad = [p for p in pos_list if not 0 <= p < self.max_context_len][:8]
                raise InvalidArgument(
                    f"[{self.name}] {op}: position(s) {bad} outside [0, {self.max_context_len})"
                )
            end = self.reserved_rows + self.size
            if min(row_list) < 0 or max(row_list) >= end:
                bad = [r for r in row_list if not 0 <= r < end][:8]
                raise SlotOutOfRange(f"[{self.name}] {op}: row(s) {bad} outside [0, {end})")
            is_held = self._rows.is_held
            if not all(map(is_held, row_list)):
                bad = [r for r in row_list if not is_held(r)][:8]
                raise InvalidArgument(f"[{self.name}] {op}: row(s) {bad} are not held by any request")
        return n

    def _read_each(self, rows: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        if self._table is not None:
            return torch.from_numpy(self._table[rows, positions].astype(np.int64))
        row_t = torch.as_tensor(rows, dtype=torch.int64, device=self.device)
        pos_t = torch.as_tensor(positions, dtype=torch.int64, device=self.device)
        return self.req_to_token[row_t, pos_t].to(torch.int64)

    # Postcondition readers: the table's contents compared with what was written, on the host when the
    # table is on the CPU (a numpy compare; no tensors built), else with torch.
    def _holds(self, row: int, start: int, values: torch.Tensor) -> bool:
        vals = torch.as_tensor(values)
        if self._table is not None:
            want = vals.numpy() if vals.is_cpu else vals.cpu().numpy()
            return bool(np.array_equal(self._table[row, start : start + len(want)], want))
        return bool((self.req_to_token[row, start : start + len(vals)] == vals.to(self.device)).all())

    def _holds_each(self, rows: Sequence[int], positions: Sequence[int], values: Ids) -> bool:
        vals = as_index_tensor(values, self.device, "write_each")
        if self._table is not None:
            return bool(np.array_equal(self._table[rows, positions], host_ids(vals)))
        return bool((self._read_each(rows, positions) == vals).all())

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        """The KV slot ids of positions ``[start, end)`` of ``row`` as int64 (a row some request holds)."""
        self._check_span(row, start, end, "read")
        return self.req_to_token[row, start:end].to(torch.int64)
