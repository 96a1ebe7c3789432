"""The ledger of the ``release`` level: the same interface as a ledger, and nothing recorded.

Pools call their ledger unconditionally; at ``release`` that ledger is :class:`NullLedger`, whose moves
are no-ops and whose queries answer "nothing recorded" (callers test ``enabled`` before trusting them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kvledger.contracts.owners import PENDING_FREE, Account, Owner


class NullLedger:
    """The ledger of the ``release`` level: every method is a no-op, every query answers 'unknown'."""

    enabled = False
    debug = False

    def __init__(self, pool: str, domain: range, *, unit: int = 1) -> None:
        self.pool = pool
        self.domain = domain
        self.size = len(domain)
        self.unit = unit
        self.pending_owner = Owner("free_group", pool, PENDING_FREE)

    def transfer(self, ids: Any, src: Owner, dst: Owner, op: str) -> None:
        return None

    def transfer_each(self, ids: Any, src: Owner, dsts: Sequence[Owner], op: str) -> None:
        return None

    def return_to_free_list(self, ids: Any, op: str) -> None:
        return None

    def give_back(self, ids: list[int], owner: Owner, dst: Owner, op: str) -> None:
        return None

    def move_one(self, i: int, src: Owner, dst: Owner, op: str) -> bool:
        return True

    def move_held(self, ids: Any, owner: Owner, dst: Owner, op: str) -> None:
        return None

    def require_held_by(self, ids: Any, owner: Owner, op: str, *, distinct: bool = False) -> None:
        return None

    def require_held_each(self, ids: Any, owners: Sequence[Owner], op: str) -> None:
        return None

    def audit(self, free_ids: Iterable[int], pending_ids: Iterable[int] = ()) -> None:
        return None

    def owner_of(self, slot: int) -> Owner | None:
        return None

    def held_mask(self, ids: np.ndarray, owner: Owner) -> np.ndarray:
        return np.zeros(ids.shape, dtype=bool)

    # Queries answer "nothing recorded": callers check ``enabled`` before trusting them.
    def count(self, account: Account) -> int:
        return 0

    def account_sizes(self) -> dict[str, int]:
        return {}

    def holdings(self, owner: Owner) -> frozenset[int]:
        return frozenset()

    def held_count(self, owner: Owner) -> int:
        return 0

    def registered_owners(self) -> int:
        return 0

    def registered(self) -> list[Owner]:
        return []

    def describe(self, slots: Iterable[int], headline: str, claims: Mapping[int, str] | None = None) -> str:
        return f"[{self.pool}] {headline} (no ledger: checking level release)"

    def describe_slots(self, slots: Iterable[int], claims: Mapping[int, str] | None = None) -> list[str]:
        return []

    def __repr__(self) -> str:
        return f"NullLedger({self.pool})"
