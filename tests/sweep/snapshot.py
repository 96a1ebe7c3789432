"""A full snapshot of everything a rejected call could have disturbed, for any pools, caches and schedulers.

``take(*roots)`` walks from the given objects to everything they hold (a scheduler: its pools, tree,
queues and requests; a cache: its allocator and Mamba pool) and records, per component, a plain value
that compares by ``==``:

* every pool: the free list in reuse order, the per-id state mask, an open free group's buffer, the
  installed data-plane hooks, the ledger (owner of every id, account sizes, step, log length) and the
  raw bytes of its tensors (``req_to_token``, Mamba states *without* applying the write schedule, and
  the schedule itself; a KV buffer's K and V);
* every cache: each node (key, ids, locks, state, access times, parent, children, accounts), both LRU
  orders, the counters, the clock and the live-lock registry;
* every scheduler: the queues (waiting, running, chunked, last prefill, in-flight batches with their
  fields), the request table, every request's fields and account, stats, step number, token ratio,
  batch counter, fault injector and the accounting's check count.

Raw bytes, not values: freed slots hold NaN poison, and NaN != NaN. Owners and nodes are recorded by
identity (the objects live as long as the test), so a swap of two owners is a change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from kvledger.contracts.ledger import Ledger
from kvledger.reference.disagg.channel import TransferChannel
from kvledger.reference.pools.id_free_list import IdFreeList
from kvledger.reference.pools.mamba_pool import MambaPool
from kvledger.reference.radix.base import RadixTreeBase

Snapshot = dict[str, Any]


def _bits(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    c = t.detach().contiguous().cpu()
    return (str(c.dtype), tuple(c.shape), c.view(torch.uint8).numpy().tobytes() if c.numel() else b"")


def _plain(value: Any) -> Any:
    """A comparable stand-in: tensors by bits, containers recursively, other objects by identity."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", _bits(value))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted(((repr(k), _plain(v)) for k, v in value.items()), key=lambda kv: kv[0]))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(map(repr, value))))
    name = getattr(value, "name", None)
    if type(value).__name__ == "ReqState" or type(value).__name__ == "Account":
        return (type(value).__name__, name if name is not None else repr(value))
    return ("obj", type(value).__name__, id(value))


def free_list_of(pool: Any) -> IdFreeList | None:
    """The pool's public free list (every kvledger pool is a ``pools.base.IdPool``); None for other objects."""
    found = getattr(pool, "free_list", None)
    return found if isinstance(found, IdFreeList) else None


def ledger_state(ledger: Any) -> Any:
    if not isinstance(ledger, Ledger):
        return None
    holdings = tuple(sorted((id(o), tuple(sorted(ledger.holdings(o)))) for o in ledger.owners()))
    return (
        tuple(map(id, ledger.owner_table())),
        holdings,
        tuple(sorted(ledger.account_sizes().items())),
        ledger.step,
        ledger.logged_moves(),
        ledger.registered_owners(),
    )


def _pool(pool: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ids = free_list_of(pool)
    if ids is not None:
        out["free"] = tuple(ids.free.tolist())
        out["state"] = ids.state.numpy().tobytes()
        out["pending"] = None if ids.pending is None else tuple(tuple(a.tolist()) for a in ids.pending)
        out["pending_n"] = ids.pending_count()
        out["hooks"] = (ids.on_alloc, ids.on_release)
        out["ledger"] = ledger_state(ids.ledger)
    for attr in ("req_to_token", "k_buffer", "v_buffer", "bootstrap_room", "output_id"):
        tensor = getattr(pool, attr, None)
        if isinstance(tensor, torch.Tensor):
            out[attr] = _bits(tensor)
    if isinstance(pool, MambaPool):  # the states as stored (reading `states` would apply the schedule)
        out["states"] = tuple(_bits(t) for t in pool.stored_states())
        out["write_schedule"] = pool.write_schedule()
    return out


def _nodes(cache: Any) -> list[Any]:
    out, stack = [], [cache.root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def _cache(cache: Any) -> dict[str, Any]:
    def node_state(n: Any) -> Any:
        return (
            n.id,
            n.key,
            _bits(n.value),
            n.lock_ref,
            n.mamba_lock_ref,
            None if n.mamba_value is None else _bits(n.mamba_value),
            n.last_access_time,
            n.mamba_access_time,
            n.live,
            None if n.parent is None else n.parent.id,
            tuple(sorted((k, c.id) for k, c in n.children.items())),
            n.kv_owner.account.name,
            None if n.mamba_owner is None else n.mamba_owner.account.name,
        )

    out = {
        "nodes": tuple(sorted(node_state(n) for n in _nodes(cache))),
        "full_lru": tuple(n.id for n in cache.lru_order()),
        "counters": (cache.counts.evictable, cache.counts.protected, cache.clock),
        "locks": tuple(sorted((id(lk), lk.released, lk.took_mamba, lk.node.id) for lk in cache.live_locks())),
    }
    if "mamba" in cache.cached_kinds():
        out["mamba_lru"] = tuple(n.id for n in cache.mamba_lru_order())
        out["mamba_counters"] = (cache.counts.mamba_evictable, cache.counts.mamba_protected)
    return out


def _request(req: Any) -> Any:
    fields = [f.name for f in dataclasses.fields(req) if f.name not in ("watch", "owner")]
    return (id(req), tuple((name, _plain(getattr(req, name))) for name in fields), req.owner.account.name)


def _batch(batch: Any) -> Any:
    fields = [f.name for f in dataclasses.fields(batch)]
    return (id(batch), tuple((name, _plain(getattr(batch, name))) for name in fields))


def _scheduler(sched: Any) -> dict[str, Any]:
    reqs: dict[int, Any] = {}
    for group in (sched.requests.values(), sched.queued_requests(), sched.waiting, sched.running, sched.done):
        for r in group:
            reqs[id(r)] = r
    for batch in sched.inflight:
        for r in (*batch.reqs, *batch.deferred_release):
            reqs[id(r)] = r
    return {
        "waiting": tuple(map(id, sched.waiting)),
        "running": tuple(map(id, sched.running)),
        "chunked_req": id(sched.chunked_req) if sched.chunked_req is not None else None,
        "last_prefill": None if sched.last_prefill is None else _batch(sched.last_prefill),
        "inflight": tuple(_batch(b) for b in sched.inflight),
        "requests": tuple(sorted((rid, id(r)) for rid, r in sched.requests.items())),
        "done": tuple(map(id, sched.done)),
        "live": tuple(sorted((r.rid, id(r)) for r in sched.queued_requests())),
        "request_fields": tuple(sorted(_request(r) for r in reqs.values())),
        "stats": _plain(dataclasses.asdict(sched.stats)),
        "counters": (sched.step_no, sched.new_token_ratio, sched.batches_launched, sched.accounting.checks_run),
        "faults": (tuple(sorted(sched.faults.pending.items())), sched.faults.fired),
        "config": sched.config,
        # a PD instance: its transfer queues and leases, by identity and order
        "pd_queues": tuple(
            (name, tuple(map(id, q))) for name, q in sorted(getattr(sched, "pd_queues", dict)().items())
        ),
    }


def _channel(channel: Any) -> dict[str, Any]:
    """A transfer channel: every room's fields (dataclass reprs), the event queue, faults and clocks."""
    return {
        "rooms": tuple(sorted((k, repr(v)) for k, v in channel.rooms.items())),
        "events": repr(channel._events),
        "clock": (channel.now, channel._seq, repr(channel.stats), repr(channel._injected)),
        "closed": tuple(sorted(channel._closed)),
        "attached": (id(channel.prefill), id(channel.decode)),
    }


def _system(system: Any) -> dict[str, Any]:
    return {
        "pairs": tuple(sorted((rid, id(p), id(d)) for rid, (p, d) in system.pairs.items())),
        "drain": (tuple(sorted(system.undrained.items())), system.drained_aborts, system.longest_drain),
        "step": (system.step_no, id(system.last_prefill_batch)),
    }


def _children(obj: Any) -> Iterable[tuple[str, Any]]:
    """The objects ``obj`` holds that are snapshotted in their own right."""
    attrs = ("kv_allocator", "req_to_token_pool", "mamba_pool", "tree", "token_to_kv_pool_allocator")
    for attr in (*attrs, "metadata_pool", "prefill", "decode", "channel"):
        child = getattr(obj, attr, None)
        if child is not None:
            yield attr, child
    runner = getattr(obj, "runner", None)
    kv_buffer = getattr(runner, "kv_buffer", None)
    if kv_buffer is not None:
        yield "kv_buffer", kv_buffer


def take(*roots: Any) -> Snapshot:
    """One flat dict ``component.part -> value`` for ``roots`` and everything they hold."""
    seen: dict[int, str] = {}
    out: Snapshot = {}
    stack = [(f"root{i}", r) for i, r in reversed(list(enumerate(roots)))]
    while stack:
        name, obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen[id(obj)] = name
        if hasattr(obj, "pairs") and hasattr(obj, "channel"):
            parts = _system(obj)
        elif isinstance(obj, TransferChannel):
            parts = _channel(obj)
        elif hasattr(obj, "inflight") and hasattr(obj, "waiting"):
            parts = _scheduler(obj)
        elif isinstance(obj, RadixTreeBase):
            parts = _cache(obj)
        else:
            parts = _pool(obj)
        out.update({f"{name}.{k}": v for k, v in parts.items()})
        stack.extend((f"{name}.{attr}", child) for attr, child in _children(obj))
    return out


def differences(before: Snapshot, after: Snapshot) -> list[str]:
    """The components that differ (an empty list: nothing changed)."""
    keys = sorted(set(before) | set(after))
    return [k for k in keys if before.get(k, "<absent>") != after.get(k, "<absent>")]
