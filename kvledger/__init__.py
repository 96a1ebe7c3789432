"""kvledger: formal-invariant-checked reference implementation of LLM-serving memory bookkeeping.

The supported surface, importable from here (``from kvledger import Scheduler, Ledger, audit_file``):

* pools: :class:`TokenToKVPoolAllocator`, :class:`PagedTokenToKVPoolAllocator`, :class:`ReqToTokenPool`,
  :class:`MambaPool`, :class:`KVBufferPool`;
* caches: :class:`RadixCache`, :class:`MambaRadixCache` (and what they return: :class:`MatchResult`,
  :class:`LockRef`, :class:`InsertResult`);
* the scheduler: :class:`Scheduler`, :class:`SchedulerConfig`, :class:`Req`, :class:`ReqState`, and
  :func:`build_engine` with its :class:`EngineSpec`;
* ownership: :class:`Ledger`, :class:`NullLedger`, :func:`make_ledger`, :class:`Owner`, :class:`Account`,
  the standard accounts (``FREE``, ``PENDING_FREE``, ``CACHE_EVICTABLE``, ``CACHE_PROTECTED``,
  ``REQ_WAITING``, ``REQ_CHUNKED``, ``REQ_RUNNING``, ``BATCH_INFLIGHT``) and ``FREE_LIST``;
* what the checks raise: :class:`ContractViolation` (a bug), :class:`IdentityFailure` (the same, found
  with contracts off), :class:`KVLedgerError` (bad input), :class:`EventLogError` (a bad event log);
* diagnostics: :class:`Census` and :func:`diagnose` (the culprit of a failed identity);
* the protocols other implementations plug in through: :class:`KVAllocator`, :class:`PagedKVAllocator`,
  :class:`ReqRowPool`, :class:`MambaStatePool`, :class:`PrefixCache`, :class:`MambaPrefixCache`;
* the audit of a recorded run: :func:`audit_file`, :func:`audit_lines`, :class:`Auditor`,
  :class:`AuditReport`, :class:`AuditViolation`, :class:`Recorder`.

Names are loaded on first use, so ``import kvledger`` (and ``import kvledger.kernels``) stays light:
torch and the reference implementation are imported only when one of their names is asked for, and
``__version__`` is read from the installed metadata when it is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # pools
    "TokenToKVPoolAllocator": "kvledger.reference.pools",
    "PagedTokenToKVPoolAllocator": "kvledger.reference.pools",
    "ReqToTokenPool": "kvledger.reference.pools",
    "MambaPool": "kvledger.reference.pools",
    "KVBufferPool": "kvledger.reference.pools",
    # caches
    "RadixCache": "kvledger.reference.radix",
    "MambaRadixCache": "kvledger.reference.radix",
    "MatchResult": "kvledger.reference.radix",
    "LockRef": "kvledger.reference.radix",
    "InsertResult": "kvledger.reference.radix",
    # scheduler
    "Scheduler": "kvledger.reference.scheduler",
    "SchedulerConfig": "kvledger.reference.scheduler",
    "Req": "kvledger.reference.scheduler",
    "ReqState": "kvledger.reference.scheduler",
    "build_engine": "kvledger.reference.engine",
    "EngineSpec": "kvledger.reference.engine",
    # prefill/decode disaggregation
    "build_pd": "kvledger.reference.disagg",
    "PDSpec": "kvledger.reference.disagg",
    "PDSystem": "kvledger.reference.disagg",
    "PrefillScheduler": "kvledger.reference.disagg",
    "DecodeScheduler": "kvledger.reference.disagg",
    "TransferChannel": "kvledger.reference.disagg",
    "ChannelConfig": "kvledger.reference.disagg",
    "MetadataBufferPool": "kvledger.reference.pools",
    # ownership
    "Ledger": "kvledger.contracts.ledger",
    "NullLedger": "kvledger.contracts.null_ledger",
    "make_ledger": "kvledger.contracts.ledger_by_level",
    "Owner": "kvledger.contracts.owners",
    "Account": "kvledger.contracts.owners",
    "FREE_LIST": "kvledger.contracts.owners",
    "FREE": "kvledger.contracts.owners",
    "PENDING_FREE": "kvledger.contracts.owners",
    "CACHE_EVICTABLE": "kvledger.contracts.owners",
    "CACHE_PROTECTED": "kvledger.contracts.owners",
    "REQ_WAITING": "kvledger.contracts.owners",
    "REQ_CHUNKED": "kvledger.contracts.owners",
    "REQ_RUNNING": "kvledger.contracts.owners",
    "BATCH_INFLIGHT": "kvledger.contracts.owners",
    # errors
    "ContractViolation": "kvledger.contracts.errors",
    "IdentityFailure": "kvledger.contracts.errors",
    "KVLedgerError": "kvledger.contracts.errors",
    "EventLogError": "kvledger.contracts.errors",
    # diagnostics
    "Census": "kvledger.contracts.diagnosis",
    "diagnose": "kvledger.contracts.diagnosis",
    # protocols
    "KVAllocator": "kvledger.contracts.protocols",
    "PagedKVAllocator": "kvledger.contracts.protocols",
    "ReqRowPool": "kvledger.contracts.protocols",
    "MambaStatePool": "kvledger.contracts.protocols",
    "PrefixCache": "kvledger.contracts.protocols",
    "MambaPrefixCache": "kvledger.contracts.protocols",
    # the audit
    "audit_file": "kvledger.audit",
    "audit_lines": "kvledger.audit",
    "Auditor": "kvledger.audit",
    "AuditReport": "kvledger.audit",
    "AuditViolation": "kvledger.audit",
    "Recorder": "kvledger.audit",
}

__all__ = ["__version__", *_EXPORTS]


def _version() -> str:
    """The installed distribution's version (importlib.metadata costs tens of milliseconds: asked for, not
    paid by every ``kvledger`` command at start-up)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvledger")
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = globals()["__version__"] = _version()
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, "__version__"})


if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see
    __version__: str
    from kvledger.audit import Auditor as Auditor
    from kvledger.audit import AuditReport as AuditReport
    from kvledger.audit import AuditViolation as AuditViolation
    from kvledger.audit import Recorder as Recorder
    from kvledger.audit import audit_file as audit_file
    from kvledger.audit import audit_lines as audit_lines
    from kvledger.contracts.diagnosis import Census as Census
    from kvledger.contracts.diagnosis import diagnose as diagnose
    from kvledger.contracts.errors import ContractViolation as ContractViolation
    from kvledger.contracts.errors import EventLogError as EventLogError
    from kvledger.contracts.errors import IdentityFailure as IdentityFailure
    from kvledger.contracts.errors import KVLedgerError as KVLedgerError
    from kvledger.contracts.ledger import Ledger as Ledger
    from kvledger.contracts.ledger_by_level import make_ledger as make_ledger
    from kvledger.contracts.null_ledger import NullLedger as NullLedger
    from kvledger.contracts.owners import BATCH_INFLIGHT as BATCH_INFLIGHT
    from kvledger.contracts.owners import CACHE_EVICTABLE as CACHE_EVICTABLE
    from kvledger.contracts.owners import CACHE_PROTECTED as CACHE_PROTECTED
    from kvledger.contracts.owners import FREE as FREE
    from kvledger.contracts.owners import FREE_LIST as FREE_LIST
    from kvledger.contracts.owners import PENDING_FREE as PENDING_FREE
    from kvledger.contracts.owners import REQ_CHUNKED as REQ_CHUNKED
    from kvledger.contracts.owners import REQ_RUNNING as REQ_RUNNING
    from kvledger.contracts.owners import REQ_WAITING as REQ_WAITING
    from kvledger.contracts.owners import Account as Account
    from kvledger.contracts.owners import Owner as Owner
    from kvledger.contracts.protocols import KVAllocator as KVAllocator
    from kvledger.contracts.protocols import MambaPrefixCache as MambaPrefixCache
    from kvledger.contracts.protocols import MambaStatePool as MambaStatePool
    from kvledger.contracts.protocols import PagedKVAllocator as PagedKVAllocator
    from kvledger.contracts.protocols import PrefixCache as PrefixCache
    from kvledger.contracts.protocols import ReqRowPool as ReqRowPool
    from kvledger.reference.disagg import ChannelConfig as ChannelConfig
    from kvledger.reference.disagg import DecodeScheduler as DecodeScheduler
    from kvledger.reference.disagg import PDSpec as PDSpec
    from kvledger.reference.disagg import PDSystem as PDSystem
    from kvledger.reference.disagg import PrefillScheduler as PrefillScheduler
    from kvledger.reference.disagg import TransferChannel as TransferChannel
    from kvledger.reference.disagg import build_pd as build_pd
    from kvledger.reference.engine import EngineSpec as EngineSpec
    from kvledger.reference.engine import build_engine as build_engine
    from kvledger.reference.pools import KVBufferPool as KVBufferPool
    from kvledger.reference.pools import MambaPool as MambaPool
    from kvledger.reference.pools import MetadataBufferPool as MetadataBufferPool
    from kvledger.reference.pools import PagedTokenToKVPoolAllocator as PagedTokenToKVPoolAllocator
    from kvledger.reference.pools import ReqToTokenPool as ReqToTokenPool
    from kvledger.reference.pools import TokenToKVPoolAllocator as TokenToKVPoolAllocator
    from kvledger.reference.radix import InsertResult as InsertResult
    from kvledger.reference.radix import LockRef as LockRef
    from kvledger.reference.radix import MambaRadixCache as MambaRadixCache
    from kvledger.reference.radix import MatchResult as MatchResult
    from kvledger.reference.radix import RadixCache as RadixCache
    from kvledger.reference.scheduler import Req as Req
    from kvledger.reference.scheduler import ReqState as ReqState
    from kvledger.reference.scheduler import Scheduler as Scheduler
    from kvledger.reference.scheduler import SchedulerConfig as SchedulerConfig
