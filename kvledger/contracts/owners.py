"""Owners and accounts: who may hold a slot, and which term of the identity its slots count in.

Every slot of every pool has exactly one owner at every step boundary. An :class:`Owner` is a handle
(a cache node's KV, a cache node's Mamba state, a request, a transfer, the free list); its
:class:`Account` is the term of the identity ``free + evictable + protected + held-by-waiting + ... ==
size`` that its slots are counted in. Owners change account (a node gets locked, a request is
admitted) without their slots moving; slots move between owners only through ledger transfers.

New holders (PD queues, sessions, in-flight DMA) are new accounts, not new code paths: declare an
``Account("pd.prefill.inflight")`` and give the holder an ``Owner`` in it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from kvledger.contracts.ledger import Ledger


@dataclass(frozen=True)
class Account:
    """One term of the ownership identity. ``name`` is stable: reports and plots key on it."""

    name: str

    def __repr__(self) -> str:
        return self.name


FREE = Account("free")
PENDING_FREE = Account("pending_free")  # freed inside an open free group, not yet back on the free list
CACHE_EVICTABLE = Account("cache.evictable")
CACHE_PROTECTED = Account("cache.protected")
REQ_WAITING = Account("req.waiting")
REQ_RUNNING = Account("req.running")
REQ_CHUNKED = Account("req.chunked")
BATCH_INFLIGHT = Account("batch.inflight")  # results of a launched batch not yet processed (overlap mode)

# Display order for tables and plots; accounts declared later are appended in the order seen.
STANDARD_ACCOUNTS: tuple[Account, ...] = (
    FREE,
    PENDING_FREE,
    CACHE_EVICTABLE,
    CACHE_PROTECTED,
    REQ_WAITING,
    REQ_CHUNKED,
    REQ_RUNNING,
    BATCH_INFLIGHT,
)


class Owner:
    """A holder of slots. Identity is the object itself; ``kind``/``key`` only name it in messages.

    The same owner may hold slots in several pools (a request holds KV, a Mamba slot and a row); its
    account applies to all of them. An owner whose pools need different accounts (a Mamba cache node:
    KV protected by the full lock, state protected by the Mamba lock) uses one owner per component.
    """

    __slots__ = ("_account", "_ledgers", "key", "kind")

    def __init__(self, kind: str, key: Hashable, account: Account) -> None:
        self.kind = kind
        self.key = key
        self._account = account
        self._ledgers: list[Ledger] = []  # ledgers this owner has ever held slots in

    @property
    def account(self) -> Account:
        return self._account

    def set_account(self, account: Account, op: str = "retag") -> None:
        """Move this owner (and every slot it holds, in every pool) to another account."""
        old = self._account
        if old == account:
            return
        for ledger in self._ledgers:
            ledger._on_retag(self, old, account, op)
        self._account = account

    def _attach(self, ledger: Ledger) -> None:
        if ledger not in self._ledgers:
            self._ledgers.append(ledger)

    @property
    def name(self) -> str:
        """``kind#key`` (just ``kind`` for singletons): how reports name this owner."""
        return self.kind if self.key is None else f"{self.kind}#{self.key}"

    def __repr__(self) -> str:
        return f"{self.name}[{self._account.name}]"


FREE_LIST = Owner("free_list", None, FREE)
"""The owner of every free slot. Shared by all pools: its holdings are per ledger."""
