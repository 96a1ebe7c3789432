"""The decode radix cache's ownership rules (I-PD-PREFIX-LOCK), checked with the decode's per-step checks.

With ``PDSpec.decode_radix_cache`` a decode request's prompt prefix may be the tree's: matched and locked
at pre-allocation, never transferred, never the request's. By queue:

* prealloc: no lock (the match happens at pre-allocation), no cached prefix, nothing held;
* transfer, prebuilt, running: one lock, on the node its prefix ends at; the prefix's KV is the tree's
  (node owners, ``cache.protected``); the request owns the rest of the prompt, then its decode tokens;
* lease (aborted while writes may land, #35049): all of that kept, the lock too, until the ack;
* retracted: no lock (released at retraction; the prefix stays cached, evictable unless another lock
  holds it), nothing held: a host copy of all of its KV.

Every live lock of the decode's tree belongs to exactly one such request (a lock no request holds is a
leak: the prefix could never be evicted again; a request's lock released elsewhere is a double release
waiting to happen). Cost: O(decode requests + their prefix ids) per step, with the ledgers on.
"""

from __future__ import annotations

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import CACHE_PROTECTED, Owner
from kvledger.reference.scheduler.request import Req, ReqState
from kvledger.reference.scheduler.state import SchedulerState

_NO_LOCK = frozenset({ReqState.PREALLOC, ReqState.RETRACTED})


def check_decode_prefixes(sched: SchedulerState) -> int:
    """I-PD-PREFIX-LOCK for a decode instance (``sched``); returns the number of locks checked."""
    tree = sched.tree
    holders: dict[int, Owner] = {}
    for req in list(sched.queued_requests()):  # every request not yet released (parked ones too)
        if req.state in _NO_LOCK or tree is None:
            if req.lock is not None or req.cache_protected_len:
                _fail(req, f"in the {req.state.value} state it holds a lock or a cached prefix ({req.lock!r})")
            continue
        if (req.lock is None) != (req.cache_protected_len == 0):
            _fail(req, f"cached prefix of {req.cache_protected_len} positions with lock {req.lock!r}")
        if req.lock is None:
            continue
        lock = req.lock
        if lock.released or lock.node is not req.last_node or lock.node.depth() != req.cache_protected_len:
            _fail(req, f"its lock {lock!r} is released or not on the node its {req.cache_protected_len}-position"
                  " prefix ends at")
        if id(lock) in holders:
            _fail(req, f"shares its lock with {holders[id(lock)]!r}")
        holders[id(lock)] = req.owner
        _check_prefix_owners(sched, req)
    stray = [lock for lock in tree.live_locks() if id(lock) not in holders] if tree is not None else []
    if stray:
        raise ContractViolation(
            f"I-PD-PREFIX-LOCK: the decode tree holds {len(stray)} lock(s) no live decode request holds"
            f" (released nowhere: the prefix stays protected for ever): {stray[:4]}"
        )
    return len(holders)


def _check_prefix_owners(sched: SchedulerState, req: Req) -> None:
    """The row's prefix ids are tree nodes' and protected (never the request's, never free).

    Per step only the prefix's first and last positions (O(1) a request: a long prefix times many
    requests would cost the step its time); the tree's own audits (I-EVICT-LOCKED, I-PROTECTED-DEF) and
    the ledger cross-check cover the ids between, and the ledger-level build checks every id."""
    ledger = sched.kv_allocator.ledger
    if not ledger.enabled or req.req_pool_idx is None:
        return
    n = req.cache_protected_len
    rows = sched.req_to_token_pool
    slots = rows.read(req.req_pool_idx, 0, n).tolist() if ledger.debug else [
        int(rows.read(req.req_pool_idx, p, p + 1)[0]) for p in {0, n - 1}
    ]
    page = sched.kv_allocator.page_size
    for i in sorted({s // page for s in slots}) if page > 1 else slots:
        owner = ledger.owner_of(i)
        if owner is None or not owner.kind.startswith("node") or owner.account is not CACHE_PROTECTED:
            _fail(req, ledger.describe([i], f"prefix id {i} is owned by {owner!r}, not a protected tree node"))


def _fail(req: Req, what: str) -> None:
    raise ContractViolation(f"I-PD-PREFIX-LOCK: decode {req.owner!r} ({req.state.value}): {what}")
