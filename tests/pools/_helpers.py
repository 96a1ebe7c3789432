"""Shared helpers for the pool tests: full-state snapshots and "rejected without a trace" checks.

A snapshot captures everything a bad call could have disturbed: the free list (order included), the
per-id state mask, an open free group's buffer, the ledger (owner table, holdings, account counts,
step counter and log length) and the pool's tensor contents (``req_to_token``, Mamba states). Two
snapshots compare equal only if the pool and its ledger are exactly as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from kvledger.contracts.errors import KVLedgerError
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.owners import Owner
from kvledger.reference.pools.id_free_list import IdFreeList

_FREE_LIST_ATTRS = ("_ids", "_pages", "_rows", "_slots")
_CONTENT_ATTRS = ("req_to_token", "conv_state", "temporal_state")


def id_list_of(pool: Any) -> IdFreeList:
    """The :class:`IdFreeList` a pool is built on, whatever the pool calls it."""
    for attr in _FREE_LIST_ATTRS:
        found = getattr(pool, attr, None)
        if isinstance(found, IdFreeList):
            return found
    raise AssertionError(f"{pool!r} has no IdFreeList")


@dataclass(frozen=True)
class LedgerState:
    owner_table: tuple[Owner | None, ...]
    holdings: tuple[tuple[Owner, frozenset[int]], ...]
    account_sizes: tuple[tuple[str, int], ...]
    step: int
    log_len: int

    @staticmethod
    def of(ledger: Ledger) -> LedgerState:
        holdings = tuple(sorted(((o, ledger.holdings(o)) for o in ledger.owners()), key=lambda p: id(p[0])))
        return LedgerState(
            owner_table=tuple(ledger.owner_table()),
            holdings=holdings,
            account_sizes=tuple(sorted(ledger.account_sizes().items())),
            step=ledger.step,
            log_len=ledger.logged_moves(),
        )


@dataclass(frozen=True)
class PoolSnapshot:
    free: tuple[int, ...]
    state: tuple[int, ...]
    pending: tuple[int, ...] | None
    available: int
    ledger: LedgerState | None
    contents: dict[str, torch.Tensor] = field(compare=False)

    def assert_same(self, other: PoolSnapshot, what: str = "") -> None:
        """Field by field, so a failure says which part changed."""
        where = f" after {what}" if what else ""
        assert other.free == self.free, f"free list changed{where}: {self.free} -> {other.free}"
        assert other.state == self.state, f"state mask changed{where}: {self.state} -> {other.state}"
        assert other.pending == self.pending, (
            f"free-group buffer changed{where}: {self.pending} -> {other.pending}"
        )
        assert other.available == self.available, f"available_size changed{where}"
        assert other.ledger == self.ledger, f"ledger changed{where}:\n  {self.ledger}\n  {other.ledger}"
        assert self.contents.keys() == other.contents.keys()
        for name, tensor in self.contents.items():
            assert same_bits(tensor, other.contents[name]), f"{name} contents changed{where}"


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality: freed Mamba slots hold NaN poison, and NaN != NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        bits = _BITS[a.element_size()]
        return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return torch.equal(a, b)


def snapshot(pool: Any) -> PoolSnapshot:
    ids = id_list_of(pool)
    ledger = ids.ledger
    pending = None if ids.pending is None else tuple(i for t in ids.pending for i in t.tolist())
    return PoolSnapshot(
        free=tuple(ids.free.tolist()),
        state=tuple(ids.state.tolist()),
        pending=pending,
        available=pool.available_size(),
        ledger=LedgerState.of(ledger) if isinstance(ledger, Ledger) else None,
        contents={a: getattr(pool, a).clone() for a in _CONTENT_ATTRS if hasattr(pool, a)},
    )


def expect_rejected(
    pool: Any, error: type[KVLedgerError], call: Callable[[], object], what: str = ""
) -> KVLedgerError:
    """``call()`` raises ``error`` (a typed operating error) and leaves ``pool`` exactly as before."""
    assert issubclass(error, KVLedgerError)
    before = snapshot(pool)
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, KVLedgerError)
    before.assert_same(snapshot(pool), what or error.__name__)
    return info.value
