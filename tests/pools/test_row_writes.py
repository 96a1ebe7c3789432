"""I-ROW-WRITE (issue 25, item 2): a row write never covers a position holding an id its request still owns."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.reference.pools import PagedTokenToKVPoolAllocator, ReqToTokenPool, TokenToKVPoolAllocator
from tests.levels import debug_level


def pools(page_size: int = 1, n_rows: int = 2) -> tuple[ReqToTokenPool, Any]:
    level = debug_level()  # the row-write guard reads both pools' ledgers, whatever the process's level
    kv = (
        TokenToKVPoolAllocator(32, checks=level)
        if page_size == 1
        else PagedTokenToKVPoolAllocator(32, page_size, checks=level)
    )
    rows = ReqToTokenPool(n_rows, 16, checks=level)
    rows.attach_kv_owners(kv)
    assert rows.row_writes is not None  # both ledgers are real
    return rows, kv


def alloc(kv: Any, n: int, owner: Owner) -> torch.Tensor:
    if kv.page_size == 1:
        return kv.alloc(n, owner)
    return kv.alloc_extend([0], [n], [-1], [owner])


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.fires("I-ROW-WRITE")
def test_a_write_over_positions_holding_the_requests_own_ids_is_named(page_size: int) -> None:
    rows, kv = pools(page_size)
    req = Owner("req", 1, REQ_RUNNING)
    row = rows.alloc(1, req)[0]
    first = alloc(kv, 8, req)
    rows.write(row, 0, first)
    with pytest.raises(
        ContractViolation, match=r"I-ROW-WRITE: a write of row 0 .* covers position\(s\) \[0, 1"
    ):
        rows.write(row, 0, torch.zeros(8, dtype=torch.int64))  # a restart at 0 over its own first chunk
    with pytest.raises(ContractViolation, match=r"I-ROW-WRITE: .* position\(s\) \[7\]"):
        rows.write_each([row], [7], torch.tensor([0]))


def test_rewrites_of_ids_that_changed_hands_and_stale_rows_pass() -> None:
    rows, kv = pools(n_rows=1)  # one row: b reuses a's
    a, b = Owner("req", 1, REQ_RUNNING), Owner("req", 2, REQ_RUNNING)
    row = rows.alloc(1, a)[0]
    ids = alloc(kv, 4, a)
    rows.write(row, 0, ids)
    kv.free(ids[:2], a)  # given away (to the tree, or freed as duplicates)
    rows.write(row, 0, torch.tensor([9, 10], dtype=torch.int64))  # the re-match: not a's any more
    rows.write_each([row], [4], alloc(kv, 1, a))  # past what a wrote: a fresh position
    rows.free([row], a)
    row_b = rows.alloc(1, b)[0]
    assert row_b == row
    mine = alloc(kv, 2, b)
    rows.write(row_b, 3, mine)  # over a's stale ids: b wrote nothing there yet
    rows.write(row_b, 0, torch.tensor([1, 2, 3], dtype=torch.int64))
