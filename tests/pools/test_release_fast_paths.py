"""The release level's fast free paths refuse what the general path refuses (issue 24).

``free`` at ``release`` (no ledger) validates more than a handful of ids with byte comparisons (the high
byte of each id for the sign, the gathered state bytes for "held", scattered positions for repeats),
and the paged pool recognises whole pages listed in slot order. Each test frees through a pool built
without a ledger (``checks=CheckLevel.RELEASE``), the level where these paths run, and checks the typed
error and that nothing changed; the accepted cases check the free list afterwards.
"""

from __future__ import annotations

import pytest
import torch

from kvledger.contracts.errors import DoubleFree, DuplicateIds, ForeignSlot, SlotOutOfRange
from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.reference.pools import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from tests.levels import debug_level

from ._helpers import expect_rejected, id_list_of

A = Owner("req", 1, REQ_RUNNING)
B = Owner("req", 2, REQ_RUNNING)
PAGE = 4


def _token_pool() -> tuple[TokenToKVPoolAllocator, torch.Tensor]:
    pool = TokenToKVPoolAllocator(64, checks=debug_level(False))
    ids = pool.alloc(20, A)
    assert ids is not None
    return pool, ids


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (-1, SlotOutOfRange),  # numpy would read another id's state for a negative index
        (-64, SlotOutOfRange),  # wraps onto id 1, which is held
        (2**60, SlotOutOfRange),  # the high byte is not zero
        (65, SlotOutOfRange),  # one past the last id
        (0, SlotOutOfRange),  # the reserved padding slot
    ],
)
def test_a_long_free_with_one_bad_id_is_refused_whole(bad: int, error: type) -> None:
    pool, ids = _token_pool()
    call = torch.cat((ids[:12], torch.tensor([bad], dtype=torch.int64)))
    expect_rejected(pool, error, lambda: pool.free(call, A))


def test_a_long_free_with_a_repeat_is_refused() -> None:
    pool, ids = _token_pool()
    call = torch.cat((ids[:12], ids[5:6]))
    expect_rejected(pool, DuplicateIds, lambda: pool.free(call, A))


def test_a_long_free_of_an_id_already_free_is_a_double_free() -> None:
    pool, ids = _token_pool()
    pool.free(ids[:1], A)  # the one-id path
    expect_rejected(pool, DoubleFree, lambda: pool.free(ids[:12], A))


def test_long_and_single_frees_keep_fifo_order() -> None:
    pool, ids = _token_pool()
    before = pool.free_ids()
    pool.free(ids[10:20], A)
    pool.free(ids[3:4], A)
    assert pool.free_ids() == before + ids[10:20].tolist() + [ids[3].item()]
    pool.free(torch.cat((ids[:3], ids[4:10])), A)
    assert pool.available_size() == 64
    pool.audit()


def _paged_pool(ledger: bool = False) -> tuple[PagedTokenToKVPoolAllocator, torch.Tensor]:
    pool = PagedTokenToKVPoolAllocator(16 * PAGE, PAGE, checks=debug_level(ledger))
    tokens = pool.alloc(4 * PAGE, A)
    assert tokens is not None
    return pool, tokens


def test_whole_pages_repeated_in_one_free_are_freed_once() -> None:
    pool, tokens = _paged_pool()
    first_page = tokens[:PAGE]
    pool.free(torch.cat((first_page, first_page, tokens[PAGE : 2 * PAGE])), A)
    assert pool.available_size() == 14 * PAGE
    pool.audit()


@pytest.mark.parametrize("pages", [1, 3])
def test_whole_pages_not_held_are_a_double_free(pages: int) -> None:
    pool, tokens = _paged_pool()
    pool.free(tokens[: pages * PAGE], A)
    expect_rejected(pool, DoubleFree, lambda: pool.free(tokens[: pages * PAGE], A))


@pytest.mark.parametrize("start", [-PAGE, 0, 17 * PAGE, 2**58])
def test_whole_pages_outside_the_pool_are_out_of_range(start: int) -> None:
    pool, tokens = _paged_pool()
    outside = torch.arange(start, start + PAGE, dtype=torch.int64)
    expect_rejected(pool, SlotOutOfRange, lambda: pool.free(outside, A))
    expect_rejected(pool, SlotOutOfRange, lambda: pool.free(torch.cat((tokens[:PAGE], outside)), A))


def test_whole_pages_of_another_owner_are_refused_with_a_ledger() -> None:
    pool, tokens = _paged_pool(ledger=True)
    expect_rejected(pool, ForeignSlot, lambda: pool.free(tokens[: 2 * PAGE], B))
    expect_rejected(pool, ForeignSlot, lambda: pool.free(tokens[:PAGE], B))


def test_whole_pages_free_in_lifo_order() -> None:
    pool, tokens = _paged_pool()
    before = id_list_of(pool).free_ids().tolist()
    pool.free(tokens[: 2 * PAGE], A)
    pages = (tokens[: 2 * PAGE : PAGE] // PAGE).tolist()
    assert id_list_of(pool).free_ids().tolist() == pages + before
    pool.free(tokens[3 * PAGE :], A)
    assert id_list_of(pool).free_ids().tolist()[0] == tokens[3 * PAGE].item() // PAGE


def test_a_long_free_longer_than_the_pool_is_a_repeat() -> None:
    pool, ids = _token_pool()
    call = ids[:16].repeat(5)  # 80 ids, more than the 64 the pool has: held, in range, repeated
    expect_rejected(pool, DuplicateIds, lambda: pool.free(call, A))


def test_a_long_free_wrapping_around_the_ring_keeps_fifo_order() -> None:
    pool = TokenToKVPoolAllocator(32, checks=debug_level(False))
    first = pool.alloc(24, A)
    assert first is not None
    pool.free(first, A)  # the ring's free ids now start at position 24 and wrap
    ids = pool.alloc(30, A)
    assert ids is not None
    before = pool.free_ids()
    call = ids[:20].flip(0)  # reversed, so that no write lands on the value a position held before
    pool.free(call, A)  # written from position 24: 8 at the end of the ring, 12 from its start
    assert pool.free_ids() == before + call.tolist()
    pool.free(ids[20:], A)
    assert pool.available_size() == 32
    pool.audit()


def test_a_long_free_onto_a_lifo_free_list_goes_to_its_head_in_order() -> None:
    from kvledger.reference.pools.id_free_list import IdFreeList
    from kvledger.reference.pools.validate import resolve_device

    free_list = IdFreeList("lifo", 1, 32, resolve_device("cpu"), reuse="lifo", checks=debug_level(False))
    ids = free_list.alloc(20, A)
    assert ids is not None
    before = free_list.free_ids().tolist()
    free_list.free_checked(ids[:12], A)
    assert free_list.free_ids().tolist() == ids[:12].tolist() + before
    with pytest.raises(DoubleFree):
        free_list.free_checked(ids[5:17], A)
    assert free_list.free_ids().tolist() == ids[:12].tolist() + before  # refused whole
    free_list.free_checked(ids[12:], A)
    assert free_list.available() == 32
    free_list.audit()


# ---- issue 38: a long free reads the host array alloc handed out under the tensor (IdFreeList._host_view)
def _two_blocks() -> tuple[TokenToKVPoolAllocator, torch.Tensor, torch.Tensor]:
    pool = TokenToKVPoolAllocator(64, checks=debug_level(False))
    a, b = pool.alloc(12, A), pool.alloc(12, A)
    assert a is not None and b is not None
    return pool, a, b


def test_a_tensor_written_after_alloc_is_freed_as_it_reads_now() -> None:
    """The remembered array is the tensor's memory, not a copy: an id written into it after alloc is what
    the free validates (here an id already free: a double free, refused whole)."""
    pool, a, b = _two_blocks()
    pool.free(b, A)
    a[3] = b[0]
    expect_rejected(pool, DoubleFree, lambda: pool.free(a, A))
    a[3] = a[4]
    expect_rejected(pool, DuplicateIds, lambda: pool.free(a, A))


def test_views_and_copies_of_a_handed_out_tensor_free_what_they_read() -> None:
    pool, a, b = _two_blocks()
    before = pool.free_ids()
    pool.free(a[:10], A)  # same address, fewer ids: not the remembered array
    pool.free(a[10:], A)
    expect_rejected(pool, DuplicateIds, lambda: pool.free(b.as_strided((12,), (0,)), A))  # same address
    pool.free(b.clone(), A)
    assert pool.free_ids() == before + a.tolist() + b.tolist()
    pool.audit()


def test_the_remembered_arrays_stay_bounded_and_a_forgotten_one_still_frees() -> None:
    from kvledger.reference.pools.id_free_list import HANDED_KEPT

    pool = TokenToKVPoolAllocator(16 * (HANDED_KEPT + 8), checks=debug_level(False))
    blocks = [pool.alloc(16, A) for _ in range(HANDED_KEPT + 8)]
    assert len(pool.free_list._handed) <= HANDED_KEPT
    for ids in blocks:
        assert ids is not None
        pool.free(ids, A)
    assert pool.available_size() == pool.size and not pool.free_list._handed
    pool.audit()


@pytest.mark.parametrize("bad", [-1, -64, -(2**62), 2**60, 65, 66, 0])
def test_a_handed_out_tensor_written_with_a_bad_id_is_refused_whole(bad: int) -> None:
    """Issue 38: the free of a tensor alloc handed out tests range, sign and state in one clipped gather
    once its bytes differ from what alloc handed out; a negative id reads reserved id 0, one past the
    end reads the guard byte, so each is out of range and nothing changes."""
    pool, ids = _token_pool()
    ids[7] = bad
    expect_rejected(pool, SlotOutOfRange, lambda: pool.free(ids, A))


def test_an_unchanged_handed_out_tensor_partly_freed_through_a_view_is_a_double_free() -> None:
    """The tensor's bytes are as alloc handed them out (in range, distinct), but a view freed some of its
    ids already: the held test alone still refuses it whole."""
    pool, ids = _token_pool()
    pool.free(ids[4:6], A)
    expect_rejected(pool, DoubleFree, lambda: pool.free(ids, A))


def test_a_handed_out_tensor_reshaped_in_place_takes_the_general_path() -> None:
    """Same address, same ids, but 2-D after ``unsqueeze_``: refused as any 2-D index tensor is."""
    from kvledger.contracts.errors import InvalidArgument

    pool, ids = _token_pool()
    ids.unsqueeze_(0)
    expect_rejected(pool, InvalidArgument, lambda: pool.free(ids, A))


@pytest.mark.parametrize(("bad", "error"), [(-1, SlotOutOfRange), (64, SlotOutOfRange), (3, DuplicateIds)])
def test_a_long_free_where_id_zero_is_usable_tests_the_sign_first(bad: int, error: type) -> None:
    """A free list whose ids start at 0 (a request pool without a padding row) has no reserved id for a
    clipped negative to land on: release's free tests the high bytes first there."""
    from kvledger.contracts.levels import CheckLevel
    from kvledger.reference.pools.id_free_list import IdFreeList

    ids = IdFreeList("rows", 0, 64, torch.device("cpu"), checks=CheckLevel.RELEASE)
    got = ids.alloc(20, A)
    assert got is not None and got.tolist() == list(range(20))
    call = torch.cat((got[:12], torch.tensor([bad], dtype=torch.int64)))
    before = ids.free_ids().tolist()
    with pytest.raises(error):
        ids.free_checked(call, A)
    assert ids.free_ids().tolist() == before and ids.all_held(got)
    ids.free_checked(got, A)
    ids.audit()
