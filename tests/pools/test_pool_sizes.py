"""A pool too big for its id type or for the machine is a typed error raised before anything is allocated
(numpy and torch fail half-way: ``MemoryError``, a torch ``RuntimeError``, once a ``SystemError``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvledger.contracts.errors import SizeOutOfRange
from kvledger.reference.config_fields import MAX_SIZE
from kvledger.reference.pools import (
    MambaPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)

HUGE = 2**40

CASES: dict[str, Callable[[], Any]] = {
    "token slots beyond int32": lambda: TokenToKVPoolAllocator(HUGE),
    "token slots at the edge (id size+1 overflows)": lambda: TokenToKVPoolAllocator(MAX_SIZE),
    "paged slots beyond int32": lambda: PagedTokenToKVPoolAllocator(HUGE, 4),
    "request rows beyond the machine": lambda: ReqToTokenPool(HUGE, 8),
    "a context beyond int32": lambda: ReqToTokenPool(8, HUGE),
    "rows x context beyond the machine": lambda: ReqToTokenPool(2**20, 2**20),
    "Mamba slots beyond int32": lambda: MambaPool(
        HUGE, num_layers=1, conv_state_shape=(1,), temporal_state_shape=(1,)
    ),
    "Mamba states beyond the machine": lambda: MambaPool(
        2**20, num_layers=64, conv_state_shape=(64, 64), temporal_state_shape=(64,)
    ),
}


@pytest.mark.parametrize("build", CASES.values(), ids=CASES.keys())
def test_an_impossible_pool_is_refused_before_allocation(build: Callable[[], Any]) -> None:
    with pytest.raises(SizeOutOfRange, match="I-TYPED-INPUT"):
        build()


def test_the_largest_usable_sizes_are_still_accepted_where_they_fit() -> None:
    assert TokenToKVPoolAllocator(4096).size == 4096
    assert ReqToTokenPool(4, 2**16).max_context_len == 2**16
