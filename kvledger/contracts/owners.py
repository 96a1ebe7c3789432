"""Owners and accounts: who may hold a slot, and which term of the identity its slots count in.

Every slot of every pool has exactly one owner at every step boundary. An :class:`Owner` is a handle
(a cache node's KV, a cache node's Mamba state, a request, a transfer, the free list); its
:class:`Account` is the term of the identity ``free + evictable + protected + held-by-waiting + ... ==
size`` that its slots are counted in. Owners change account (a node gets locked, a request is
admitted) without their slots moving; slots move between owners only through ledger transfers.

New holders (PD queues, sessions, in-flight DMA) are new accounts, not new code paths: the PD queues
below are declared this way (``PD_ACCOUNTS``), and a holder gets an ``Owner`` in one of them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from typing import ClassVar, Protocol


class Account:
    """One term of the ownership identity. ``name`` is stable: reports and plots key on it.

    Accounts are interned: ``Account("x") is Account("x")``, so equality is identity and hashing is
    the interpreter's own (ledgers count per account on every move). Immutable once made.
    """

    __slots__ = ("name",)
    _interned: ClassVar[dict[str, Account]] = {}

    name: str

    def __new__(cls, name: str) -> Account:
        found = cls._interned.get(name)
        if found is None:
            if not isinstance(name, str):
                raise TypeError(f"an account name is a str, got {type(name).__name__}")
            found = object.__new__(cls)
            object.__setattr__(found, "name", name)
            cls._interned[name] = found
        return found

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"Account {self.name!r} is immutable")

    def __reduce__(self) -> tuple[type[Account], tuple[str]]:
        return (Account, (self.name,))

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

# Prefill/decode disaggregation (spec/pd.md): the queues around each instance's scheduler. A PD prefill
# instance's waiting, chunked and running requests use the accounts above (its waiting requests also
# hold a metadata slot); these are the holders SGLang's busy check does not count.
PD_PREFILL_BOOTSTRAP = Account("pd.prefill.bootstrap")  # handshake pending; holds nothing
PD_PREFILL_INFLIGHT = Account("pd.prefill.inflight")  # prompt done, KV being sent: row, state, tail, lock, meta
PD_PREFILL_LEASE = Account("pd.prefill.lease")  # ended while a send may still read its ids (reader lease)
PD_DECODE_PREALLOC = Account("pd.decode.prealloc")  # handshake / memory pending; holds nothing
PD_DECODE_TRANSFER = Account("pd.decode.transfer")  # pre-allocated row, KV, state, metadata slot; being written
PD_DECODE_WAITING = Account("pd.decode.waiting")  # transferred, prebuilt, not yet running: row, KV, state
PD_DECODE_RETRACTED = Account("pd.decode.retracted")  # retracted to a host copy; holds no pool id
PD_DECODE_LEASE = Account("pd.decode.lease")  # ended while a transfer may still write its ids (writer lease)

PD_ACCOUNTS: tuple[Account, ...] = (
    PD_PREFILL_BOOTSTRAP,
    PD_PREFILL_INFLIGHT,
    PD_PREFILL_LEASE,
    PD_DECODE_PREALLOC,
    PD_DECODE_TRANSFER,
    PD_DECODE_WAITING,
    PD_DECODE_RETRACTED,
    PD_DECODE_LEASE,
)
LEASE_ACCOUNTS: frozenset[Account] = frozenset({PD_PREFILL_LEASE, PD_DECODE_LEASE})
"""Accounts of requests that have ended but may not release yet: a transfer may still touch their ids."""


_serials = itertools.count(1)


class RetagListener(Protocol):
    """What an owner tells about an account change: each ledger its ids are in (``Ledger``) listens.

    A protocol rather than the ledger's class, so this module needs nothing from ``ledger`` (which
    imports it): owners and accounts come first, the ledger builds on them.
    """

    def on_retag(self, owner: Owner, old: Account, new: Account, op: str) -> None:
        """``owner``'s ids here move from account ``old`` to ``new`` (``op`` names the move in the log);
        called by :meth:`Owner.set_account` before the owner's own account changes."""
        ...


class Owner:
    """A holder of slots. Identity is the object itself; ``kind``/``key`` only name it in messages.

    The same owner may hold slots in several pools (a request holds KV, a Mamba slot and a row); its
    account applies to all of them. An owner whose pools need different accounts (a Mamba cache node:
    KV protected by the full lock, state protected by the Mamba lock) uses one owner per component.

    ``serial`` is unique per process: a ledger's move log records owners by serial and name, never by
    reference, so a finished request's owner is not kept alive by the history of its moves.
    """

    __slots__ = ("_ledgers", "account", "giver", "key", "kind", "serial", "watcher")

    def __init__(self, kind: str, key: Hashable, account: Account) -> None:
        self.kind = kind
        self.key = key
        # Read on every move (a plain slot, no property call); written only by :meth:`set_account`, which
        # moves the owner's ids between accounts in every ledger first: a direct write would leave the
        # ledgers' account counts behind (the ledger's audit recount reports it).
        self.account = account
        self.serial = next(_serials)
        # Ledgers in which this owner holds ids right now: a ledger attaches an owner when it receives
        # its first id there and detaches it when it holds none, so retags reach exactly those.
        self._ledgers: list[RetagListener] = []
        # Called with the owner after every account change (the scheduler's incremental identity).
        self.watcher: Callable[[Owner], None] | None = None
        # Called with the owner after ids left it in a ledger (a free, a hand-over): the scheduler's
        # per-step I-HANDLE-OWNED check then looks again at this holder's handles (issue 24).
        self.giver: Callable[[Owner], None] | None = None

    def set_account(self, account: Account, op: str = "retag") -> None:
        """Move this owner (and every slot it holds, in every pool) to another account."""
        old = self.account
        if old == account:
            return
        for ledger in self._ledgers:
            ledger.on_retag(self, old, account, op)
        self.account = account
        if self.watcher is not None:
            self.watcher(self)

    def attach_ledger(self, ledger: RetagListener) -> None:
        """``ledger`` now holds ids of this owner: it hears every later account change (idempotent)."""
        if ledger not in self._ledgers:
            self._ledgers.append(ledger)

    def detach_ledger(self, ledger: RetagListener) -> None:
        """``ledger`` holds none of this owner's ids any more: it stops hearing account changes."""
        if ledger in self._ledgers:
            self._ledgers.remove(ledger)

    @property
    def name(self) -> str:
        """``kind#key`` (just ``kind`` for singletons): how reports name this owner."""
        return self.kind if self.key is None else f"{self.kind}#{self.key}"

    def __repr__(self) -> str:
        return f"{self.name}[{self.account.name}]"


FREE_LIST = Owner("free_list", None, FREE)
"""The owner of every free slot. Shared by all pools: its holdings are per ledger."""
