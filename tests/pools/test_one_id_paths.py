"""The one-id paths of alloc and free refuse what the general paths refuse, at every level (issue 24).

An allocation or a free of one id (a decode token, one page) skips the lists and numpy arrays of the
general path: the free list takes the id as a Python int and the ledger moves it with ``move_one``
(checked, logged, I-COUNT at the move at ``ledger``; checked at ``owners``). Each test builds its pool
at the level it names (``checks=``; ``full`` needs a process started at ``full``, where the
same paths run under icontract) and checks the typed error and that nothing changed, or, for a bug inside
the bookkeeping, the ``ContractViolation`` with nothing changed; the accepted cases check the log and the
registry afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, DoubleFree, ForeignSlot, SlotOutOfRange
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owner_table import OwnerTable
from kvledger.contracts.owners import FREE, FREE_LIST, REQ_RUNNING, REQ_WAITING, Owner
from kvledger.reference.pools import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

from ._helpers import expect_rejected, id_list_of, snapshot

PAGE = 4
SIZE = 16  # token slots of the token pool, pages of the paged one
BELOW_FULL = [CheckLevel.RELEASE, CheckLevel.OWNERS, CheckLevel.LEDGER]
LEVELS = BELOW_FULL + ([CheckLevel.FULL] if switch.ENABLED else [])
OWNING = [level for level in LEVELS if level.tracks_owners]

Pool = TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator


def _pool(kind: str, level: CheckLevel) -> Pool:
    if kind == "token":
        return TokenToKVPoolAllocator(SIZE, checks=level)
    return PagedTokenToKVPoolAllocator(SIZE * PAGE, PAGE, checks=level)


def _unit(pool: Pool) -> int:
    """Tokens per alloc/free of one id: one slot, or one page."""
    return pool.page_size


def _one(pool: Pool, owner: Owner) -> torch.Tensor:
    ids = pool.alloc(_unit(pool), owner)
    assert ids is not None and ids.numel() == _unit(pool)
    return ids


def _id_of(pool: Pool, ids: torch.Tensor) -> int:
    """The free list's id of a one-id allocation (the slot, or the page of the tokens)."""
    return int(ids[0].item()) // pool.page_size


def _expect_violation(pool: Pool, call: Callable[[], object]) -> ContractViolation:
    """A bug inside the bookkeeping: ContractViolation with the evidence, and nothing changed."""
    before = snapshot(pool)
    with pytest.raises(ContractViolation) as info:
        call()
    before.assert_same(snapshot(pool), "ContractViolation")
    return info.value


KINDS = ["token", "paged"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", OWNING, ids=str)
def test_a_one_id_free_by_another_owner_is_foreign(kind: str, level: CheckLevel) -> None:
    pool = _pool(kind, level)
    a, b = Owner("req", 1, REQ_RUNNING), Owner("req", 2, REQ_RUNNING)
    ids = _one(pool, a)
    _one(pool, b)  # b holds ids in the pool too: its code is registered
    expect_rejected(pool, ForeignSlot, lambda: pool.free(ids, b))
    stranger = Owner("req", 3, REQ_RUNNING)  # holds nothing here: not registered at all
    expect_rejected(pool, ForeignSlot, lambda: pool.free(ids, stranger))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", OWNING, ids=str)
def test_a_one_id_free_in_the_free_lists_name_is_foreign(kind: str, level: CheckLevel) -> None:
    """The free list as the claimed owner of a held id must not pass as a move of a free id."""
    pool = _pool(kind, level)
    ids = _one(pool, Owner("req", 1, REQ_RUNNING))
    expect_rejected(pool, ForeignSlot, lambda: pool.free(ids, FREE_LIST))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", LEVELS, ids=str)
def test_a_one_id_double_free_is_refused(kind: str, level: CheckLevel) -> None:
    pool = _pool(kind, level)
    a = Owner("req", 1, REQ_RUNNING)
    ids = _one(pool, a)
    _one(pool, Owner("req", 2, REQ_RUNNING))
    pool.free(ids, a)
    expect_rejected(pool, DoubleFree, lambda: pool.free(ids, a))


@pytest.mark.parametrize("level", LEVELS, ids=str)
@pytest.mark.parametrize("bad", [-1, -SIZE, 0, SIZE + 1, 2**60])
def test_a_one_id_free_out_of_range_is_refused(level: CheckLevel, bad: int) -> None:
    pool = _pool("token", level)
    a = Owner("req", 1, REQ_RUNNING)
    _one(pool, a)
    expect_rejected(pool, SlotOutOfRange, lambda: pool.free(torch.tensor([bad], dtype=torch.int64), a))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", OWNING, ids=str)
def test_a_one_id_alloc_of_an_id_the_ledger_gives_to_someone_is_a_violation(
    kind: str, level: CheckLevel
) -> None:
    """The free list's next id, which the ledger says another owner holds (a bookkeeping bug made on
    purpose): ContractViolation naming it, the pool and the ledger unchanged, at every owning level.

    The ledger swaps two ids (the head of the free list to a squatter, one of a holder's ids to the free
    list), so its free count still equals the free list's length and the pools' class invariants at
    ``full`` do not fire first."""
    pool = _pool(kind, level)
    holder = Owner("req", 8, REQ_RUNNING)
    j = _id_of(pool, _one(pool, holder))
    free_list = id_list_of(pool)
    head = int(free_list.free_ids()[0])
    squatter = Owner("req", 9, REQ_RUNNING)
    free_list.ledger.transfer([head], FREE_LIST, squatter, "tamper")
    free_list.ledger.transfer([j], holder, FREE_LIST, "tamper")
    error = _expect_violation(pool, lambda: pool.alloc(_unit(pool), Owner("req", 1, REQ_RUNNING)))
    assert str(head) in str(error)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", [lv for lv in LEVELS if lv.keeps_history], ids=str)
def test_a_one_id_pair_is_logged_and_leaves_nothing_registered(kind: str, level: CheckLevel) -> None:
    pool = _pool(kind, level)
    ledger = pool.ledger
    assert type(ledger) is Ledger
    a = Owner("req", 1, REQ_RUNNING)
    ids = _one(pool, a)
    i = _id_of(pool, ids)
    assert ledger.owner_of(i) is a and ledger.held_count(a) == 1
    pool.free(ids, a)
    moves = ledger.history_of(i)
    assert [(m.op, m.ids, m.src, m.dst) for m in moves[-2:]] == [
        ("alloc", (i,), "free_list", "req#1"),
        ("free", (i,), "req#1", "free_list"),
    ]
    assert ledger.owner_of(i) is FREE_LIST
    assert ledger.registered_owners() == 2 and a not in ledger.registered()  # the pair's owner left
    pool.audit()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", [lv for lv in LEVELS if lv.keeps_history], ids=str)
@pytest.mark.parametrize("move", ["alloc", "free"])
@pytest.mark.parametrize("skew", ["sum", "negative"])
def test_i_count_is_checked_at_a_one_id_move(kind: str, level: CheckLevel, move: str, skew: str) -> None:
    """A count no move made is named at the very next one-id move, an allocation or a free: a sum off by
    one, or an account below zero with the sum made right by another."""
    pool = _pool(kind, level)
    ledger = pool.ledger
    assert isinstance(ledger, Ledger)
    a = Owner("req", 1, REQ_RUNNING)
    ids = _one(pool, a)
    ledger._count[REQ_WAITING] -= 1
    if skew == "negative":
        ledger._count[FREE] += 1
    with pytest.raises(ContractViolation, match="I-COUNT"):
        if move == "alloc":
            pool.alloc(_unit(pool), a)
        else:
            pool.free(ids, a)


@pytest.mark.parametrize("kind", KINDS)
def test_the_owners_level_moves_one_id_without_a_log(kind: str) -> None:
    pool = _pool(kind, CheckLevel.OWNERS)
    assert type(pool.ledger) is OwnerTable
    a = Owner("req", 1, REQ_RUNNING)
    ids = _one(pool, a)
    i = _id_of(pool, ids)
    assert pool.ledger.owner_of(i) is a
    pool.free(ids, a)
    assert pool.ledger.owner_of(i) is FREE_LIST and pool.ledger.registered_owners() == 2
    pool.audit()
