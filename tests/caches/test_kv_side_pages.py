"""The radix caches' check that the KV ids a caller hands to ``insert`` are whole pages in slot order
(``KVSide._whole_pages``, run at every checking level since issue 42, so written as byte comparisons)."""

from __future__ import annotations

import numpy as np
import pytest

from kvledger.contracts.errors import InvalidArgument
from kvledger.reference.pools import PagedTokenToKVPoolAllocator
from kvledger.reference.radix.kv_side import KVSide

P = 4


def pages_of(ids: list[int]) -> list[int]:
    return KVSide(PagedTokenToKVPoolAllocator(256, P))._whole_pages(np.asarray(ids, dtype=np.int64), "t").tolist()


@pytest.mark.parametrize(
    ("ids", "pages"),
    [
        ([8, 9, 10, 11], [2]),  # one page
        ([40, 41, 42, 43, 4, 5, 6, 7, 80, 81, 82, 83], [10, 1, 20]),  # pages in any order
        (list(range(0, 4 * 300)), list(range(300))),  # longer than the precomputed steps
    ],
)
def test_whole_pages_give_their_page_ids(ids: list[int], pages: list[int]) -> None:
    assert pages_of(ids) == pages


@pytest.mark.parametrize(
    "ids",
    [
        [9, 10, 11, 12],  # a page's worth, not on a page boundary
        [11, 10, 9, 8],  # a page backwards
        [8, 9, 11, 10],  # two slots swapped inside a page
        [8, 9, 10, 11, 12, 13, 14],  # a partial last page
        [8, 9, 10, 11, 8, 1, 2, 3],  # the second page jumps inside
    ],
)
def test_anything_else_is_refused(ids: list[int]) -> None:
    with pytest.raises(InvalidArgument, match="whole pages"):
        pages_of(ids)
