"""``ReqToTokenPool``: request rows and the ``req_to_token`` table that maps positions to KV slots.

Rows ``0..size-1`` (no reserved row, as in SGLang's non-PD pool). A row is owned by one request from
admission to release (2026 semantics, PR #17850: a chunked request keeps its row across chunks, so a
launched forward never sees its row reassigned, I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT).
"""

from __future__ import annotations

from typing import Any

import torch

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.owners import FREE, Owner
from kvledger.contracts.switch import ensure, invariant, snapshot
from kvledger.reference.pools.id_free_list import HELD, IdFreeList
from kvledger.reference.pools.validate import (
    INT32_MAX,
    as_index_tensor,
    check_count,
    check_in_range,
    check_positive,
    resolve_device,
)


@invariant(
    lambda self: not self._rows.ledger.enabled or self._rows.ledger.count(FREE) == self._rows.available(),
    "I-COUNT: ledger free rows == available_size()",
)
@invariant(lambda self: 0 <= self._rows.available() + self._rows.pending_count() <= self.size, "I-CAP")
class ReqToTokenPool:
    """``size`` rows of ``max_context_len`` int32 KV-slot ids each."""

    def __init__(
        self, size: int, max_context_len: int, *, device: str | torch.device = "cpu", name: str = "req"
    ) -> None:
        check_positive(size, "size")
        check_positive(max_context_len, "max_context_len")
        self.size = size
        self.max_context_len = max_context_len
        self.name = name
        self.device = resolve_device(device)
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=self.device)
        self._rows = IdFreeList(name, 0, size, self.device, reuse="fifo")

    @property
    def ledger(self) -> Any:
        return self._rows.ledger

    def available_size(self) -> int:
        return self._rows.available()

    def pending_free_size(self) -> int:
        return self._rows.pending_count()

    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(lambda self, n, result: result is None or len(result) == n == len(set(result)))
    @ensure(lambda self, n, OLD, result: (result is None) == (n > OLD.available))
    @ensure(lambda self, n, OLD, result: result is None or self.available_size() == OLD.available - n)
    def alloc(self, n: int, owner: Owner) -> list[int] | None:
        """``n`` rows for ``owner``, or None when fewer are free."""
        check_count(n)
        rows = self._rows.alloc(n, owner)
        return None if rows is None else rows.tolist()

    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(
        lambda self, rows, OLD: (
            self.available_size() == OLD.available + len(as_index_tensor(rows, self.device, "free"))
        )
    )
    def free(self, rows: Any, owner: Owner) -> None:
        """Return ``owner``'s rows (an int or a sequence). Contents are left as they are."""
        t = as_index_tensor(rows, self.device, f"{self.name}.free")
        self._rows.validate_release(t, owner, "free", "row")
        self._rows.release(t, owner, "free")

    def _free_unchecked(self, rows: torch.Tensor, owner: Owner, op: str = "free") -> None:
        self._rows.release(rows, owner, op)

    @ensure(
        lambda self, row, start, values: bool(
            (
                self.req_to_token[row, start : start + len(values)] == torch.as_tensor(values).to(self.device)
            ).all()
        )
    )
    def write(self, row: int, start: int, values: torch.Tensor) -> None:
        """``req_to_token[row, start:start+len(values)] = values``; the row must be held by someone."""
        values = as_index_tensor(values, self.device, f"{self.name}.write")  # int32/int64, pool device
        check_count(row, "row")
        check_count(start, "start")
        if row >= self.size:
            raise InvalidArgument(f"[{self.name}] row {row} outside [0, {self.size})")
        if start + values.numel() > self.max_context_len:
            raise InvalidArgument(
                f"[{self.name}] write of {values.numel()} ids at {start} exceeds max_context_len {self.max_context_len}"
            )
        if int(self._rows.state[row]) != HELD:
            raise InvalidArgument(f"[{self.name}] write to row {row}, which no request holds")
        check_in_range(values, 0, INT32_MAX, self.name, "KV slot id")  # the table is int32
        self.req_to_token[row, start : start + values.numel()] = values.to(torch.int32)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        """The KV slot ids of positions ``[start, end)`` of ``row`` as int64."""
        return self.req_to_token[row, start:end].to(torch.int64)

    def audit(self) -> None:
        self._rows.audit()

    def __repr__(self) -> str:
        return f"ReqToTokenPool({self.name}, size={self.size}, available={self.available_size()})"
