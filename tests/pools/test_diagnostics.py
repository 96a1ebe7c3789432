"""A pool whose own free list disagrees with its ledger names the ids, both owners and the moves.

One test per pool (KV token slots, KV pages, request rows, Mamba slots): the free list is tampered with
behind the pool's back in both directions (a held id listed as free; a free id dropped from the list)
and the next public call must raise the class invariant I-COUNT with the evidence, not only its kind.
The quiescent audit of the same pool names the same ids.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.reference.pools import (
    MambaPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from tests.levels import debug_level

from ._helpers import id_list_of

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="icontract decorators are off")
PAGE = 4


def _make(kind: str) -> Any:
    if kind == "kv-token":
        return TokenToKVPoolAllocator(8, name="kv", checks=debug_level(True))
    if kind == "kv-paged":
        return PagedTokenToKVPoolAllocator(8 * PAGE, PAGE, name="kv", checks=debug_level(True))
    if kind == "rows":
        return ReqToTokenPool(8, 16, name="req", checks=debug_level(True))
    return MambaPool(
        8, num_layers=1, conv_state_shape=(2,), temporal_state_shape=(2,), name="mamba", checks=debug_level(True)
    )


def _alloc_ids(pool: Any, owner: Owner) -> list[int]:
    """Two ledger ids (pages for the paged pool) for ``owner``."""
    if isinstance(pool, PagedTokenToKVPoolAllocator):
        tokens = pool.alloc(2 * PAGE, owner)
        return sorted({int(t) // PAGE for t in tokens})
    out = pool.alloc(2, owner)
    return [int(i) for i in out]


@needs_contracts
@pytest.mark.fires("I-COUNT")
@pytest.mark.parametrize("kind", ["kv-token", "kv-paged", "rows", "mamba"])
def test_a_held_id_listed_as_free_names_its_owner_and_moves(kind: str) -> None:
    pool = _make(kind)
    owner = Owner("req", 5, REQ_RUNNING)
    held = _alloc_ids(pool, owner)
    ids = id_list_of(pool)
    ids.free = np.concatenate((ids.free_ids(), [held[0]]))  # a held id back on the list, behind the ledger
    with pytest.raises(ContractViolation) as info:
        pool.available_size()
    message = str(info.value)
    assert message.startswith("I-COUNT: "), message
    assert f"listed as free but owned by someone [{held[0]}]" in message, message
    assert re.search(
        rf"^\s+{_noun(pool)} {held[0]}: owner req#5\[req\.running\];"
        r" the bookkeeping says the pool lists it as free_list",
        message,
        re.M,
    ), message
    assert re.search(r"step \d+: alloc\w*: free_list\[free\] -> req#5\[req\.running\]", message), message


@needs_contracts
@pytest.mark.fires("I-COUNT")
@pytest.mark.parametrize("kind", ["kv-token", "kv-paged", "rows", "mamba"])
def test_a_free_id_dropped_from_the_list_is_named(kind: str) -> None:
    pool = _make(kind)
    owner = Owner("req", 5, REQ_RUNNING)
    held = _alloc_ids(pool, owner)
    pool.free(held[0] * PAGE if kind == "kv-paged" else held[0], owner)
    ids = id_list_of(pool)
    lost = int(ids.free_ids()[-1] if ids.reuse == "fifo" else ids.free_ids()[0])  # the id just freed
    ids.free = np.asarray([i for i in ids.free_ids().tolist() if i != lost])
    with pytest.raises(ContractViolation) as info:
        pool.available_size()
    message = str(info.value)
    assert f"free in the ledger but not listed [{lost}]" in message, message
    assert re.search(
        rf"^\s+{_noun(pool)} {lost}: owner free_list\[free\]; the bookkeeping says the pool does not list it",
        message,
        re.M,
    ), message
    assert re.search(r"step \d+: free: req#5\[req\.running\] -> free_list\[free\]", message), message


def _noun(pool: object) -> str:
    """What the pool's ledger calls an id in reports (a paged pool's are pages)."""
    return str(pool.ledger.id_noun)  # type: ignore[attr-defined]


@pytest.mark.fires("I-PARTITION")
@pytest.mark.parametrize("kind", ["kv-token", "kv-paged", "rows", "mamba"])
def test_the_audit_names_the_same_ids(kind: str) -> None:
    """Without the class invariants (they run around public calls), the quiescent audit finds it too."""
    pool = _make(kind)
    owner = Owner("req", 5, REQ_RUNNING)
    held = _alloc_ids(pool, owner)
    ids = id_list_of(pool)
    ids.free = np.concatenate((ids.free_ids(), [held[1]]))
    ids._state[held[1]] = 1  # FREE, as a pool that really lost track of the id would say
    with pytest.raises(ContractViolation) as info:
        ids.audit()
    message = str(info.value)
    assert "I-PARTITION" in message and f"in pool but not in ledger [{held[1]}]" in message, message
    assert re.search(
        rf"{_noun(pool)} {held[1]}: owner req#5\[req\.running\]; the bookkeeping says it is in the pool's free list",
        message,
    ), message
