"""The recorder: writes the event log (``kvledger/audit/events.py``) of a running kvledger engine.

What kvledger's reference engine would emit from a debug build, gathered without touching its code:

* every ownership move of every pool, from the pools' ledgers (:attr:`Ledger.observer`): ``alloc`` (from
  the free list), ``free`` (to the free list or the open free group), ``move`` (insert, split, the
  tree adopting a request's KV or state), ``free_group`` open and close;
* the cache's structure and locks, from its methods (wrapped on the instance): ``insert`` (a new leaf),
  ``split``, ``evict``, ``lock``/``unlock`` (``inc_lock_ref``/``dec_lock_ref``), ``cow`` (a state copied
  into a request's slot);
* each request's state (``req``: waiting, chunked, running, inflight, released) from its owner's
  account changes and the scheduler's release, and a ``step`` event with the scheduler's own identity
  terms after every step.

An event whose consequences happen inside the same call is written first (``insert`` before the leaf
adopts its KV, ``split`` before the new node takes its part, ``unlock`` before the tombstones it prunes
are evicted); ``evict`` is written after the node's KV and state were freed. The ledgers must be real
(at the level ``ledger`` or above, whatever the process runs at): the recorder observes them.

:meth:`Recorder.close` writes the ``end`` marker (the count of lines before it and how the run ended) and
undoes every hook; :meth:`Recorder.detach` undoes the hooks without it, for a run that was cut off (an
interrupt, an unexpected error): the auditor then calls the log incomplete, as it is. Used as a context
manager, the recorder closes on a normal exit, closes with ``outcome="violation"`` when a
:class:`ContractViolation` leaves the block, and only detaches on any other exception.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from kvledger.audit import events as E
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.owners import FREE_LIST, Account, Owner
from kvledger.contracts.pool_kinds import MAMBA, POOL_KINDS, PoolKind

POOLS: tuple[PoolKind, ...] = POOL_KINDS
"""The pool kinds a plain scheduler has (the recorder logs those its scheduler's accounting covers)."""


class Recorder:
    """Writes the event log of ``scheduler`` (a :class:`kvledger.reference.scheduler.Scheduler`) to ``out``."""

    def __init__(self, scheduler: Any, out: IO[str], *, source: str = "kvledger") -> None:
        _check_recordable(scheduler, out, source)  # all checks before the header or any observer
        self.s = scheduler
        self.out = out
        self.events = 0
        self._stack: list[list[dict[str, Any]]] = []  # events of calls whose own event goes first
        self._pools: dict[int, str] = {}
        self._ledgers: list[Ledger] = []
        self._patched: list[tuple[Any, str]] = []
        self._undo: list[Callable[[], None]] = []  # removers of the hooks the tree installed for us
        self._open_groups: set[str] = set()
        self._accounts: dict[int, str] = {}  # other owners: the last account written, by serial
        self.closed = False
        self._on_step_before = scheduler.on_step
        self._emit(E.header(source))
        units = scheduler.accounting.units()
        for kind in getattr(scheduler.accounting, "kinds", POOLS):
            name = kind.name
            pool = getattr(scheduler, kind.attr, None)
            if pool is None:
                continue
            ledger = pool.ledger
            if not getattr(ledger, "enabled", False):
                raise ValueError(
                    "recording needs the pools' ledgers: build the engine at checks=CheckLevel.LEDGER or above"
                )
            if ledger.observer is not None:
                raise ValueError(f"pool {name!r} already has a ledger observer")
            ledger.observer = self
            self._ledgers.append(ledger)
            self._pools[id(ledger)] = name
            d = ledger.domain
            self._emit(
                {"ev": "pool", "pool": name, "first": d.start, "size": len(d), "unit": ledger.unit,
                 "unit_name": units.get(name, "ids")}
            )  # fmt: skip
        tree = scheduler.tree
        if tree is not None:
            self._emit({"ev": "tree", "root": tree.root.id})
            # The structural steps through the tree's own hook (copy_state: the Mamba tree only).
            steps = {
                "new_leaf": self._new_leaf,
                "split": self._split,
                "unlink_leaf": self._unlink_leaf,
                "copy_state": self._copy_state,
            }
            self._undo.append(tree.observe_steps(steps))
            self._wrap(tree, "inc_lock_ref", self._inc_lock_ref)
            self._wrap(tree, "dec_lock_ref", self._dec_lock_ref)
        self._wrap(scheduler, "add_request", self._add_request)
        self._wrap(scheduler.accounting, "released", self._released)
        scheduler.on_step = self._on_step

    # ------------------------------------------------------------------ plumbing
    def _emit(self, ev: dict[str, Any]) -> None:
        if self._stack:
            self._stack[-1].append(ev)
            return
        self.out.write(json.dumps(ev, separators=(",", ":")))
        self.out.write("\n")
        self.events += 1

    def _wrap(self, obj: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        setattr(obj, name, make(getattr(obj, name)))
        self._patched.append((obj, name))

    def _first(self, call: Callable[[], Any], event: Callable[[Any], dict[str, Any]]) -> Any:
        """Run ``call``, holding back the events it causes; write ``event(result)`` first, then them."""
        self._stack.append([])
        try:
            result = call()
        except BaseException:
            for ev in self._stack.pop():
                self._emit(ev)
            raise
        inner = self._stack.pop()
        self._emit(event(result))
        for ev in inner:
            self._emit(ev)
        return result

    def close(self, outcome: str | None = None) -> None:
        """Write the ``end`` marker, undo every hook and flush; the engine runs on unobserved. A second
        call does nothing.

        ``outcome``: how the run ended (:data:`kvledger.audit.events.OUTCOMES`): ``"violation"`` when the
        engine stopped on a contract violation; by default ``"completed"`` if the engine is quiescent,
        else ``"stopped"``. A run that did not end (an interrupt) calls :meth:`detach` instead.

        Without an ``outcome``, a close from a ``finally`` (or an ``except``) while an exception is on its
        way out decides by it: a :class:`ContractViolation` is the outcome ``"violation"``; anything else
        (Ctrl-C, an unexpected error) means the run did not end, so the close only detaches and the log
        stays incomplete, as it is."""
        if self.closed:
            return
        if outcome is None:
            pending = sys.exc_info()[1]
            if pending is None:
                outcome = "completed" if self.s.is_quiescent() else "stopped"
            elif isinstance(pending, ContractViolation):
                outcome = "violation"
            else:
                self.detach()
                return
        elif outcome not in E.OUTCOMES:
            raise InvalidArgument(f"Recorder.close: outcome must be one of {E.OUTCOMES}, got {outcome!r}")
        self.detach()
        self._emit(E.end(self.events, outcome))
        self.out.flush()

    def detach(self) -> None:
        """Undo every hook and flush, without the end marker: the log stays visibly incomplete."""
        if self.closed:
            return
        self.closed = True
        for obj, name in reversed(self._patched):
            if name in vars(obj):
                delattr(obj, name)
        self._patched.clear()
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        for ledger in self._ledgers:
            ledger.observer = None
        self._ledgers.clear()
        self.s.on_step = self._on_step_before
        self.out.flush()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close()
        elif issubclass(exc_type, ContractViolation):
            self.close("violation")
        else:
            self.detach()

    # ------------------------------------------------------------------ the ledgers (MoveObserver)
    def moved(self, ledger: Ledger, ids: np.ndarray, src: Owner, dst: Owner | list[Owner], op: str) -> None:
        pool = self._pools[id(ledger)]
        ids_list = ids.tolist()
        if isinstance(dst, list):
            for d in dst:
                self._declare(d)
            self._emit({"ev": "alloc", "pool": pool, "ids": ids_list, "to": [_log_name(d) for d in dst]})
            return
        pending = ledger.pending_owner
        if src is FREE_LIST:
            self._declare(dst)
            self._emit({"ev": "alloc", "pool": pool, "ids": ids_list, "to": _log_name(dst)})
        elif dst is pending:
            if pool not in self._open_groups:
                self._open_groups.add(pool)
                self._emit({"ev": "free_group", "pool": pool, "open": True})
            self._emit({"ev": "free", "pool": pool, "ids": ids_list, "from": _log_name(src)})
        elif src is pending:
            self._open_groups.discard(pool)
            self._emit({"ev": "free_group", "pool": pool, "open": False})
        elif dst is FREE_LIST:
            self._emit({"ev": "free", "pool": pool, "ids": ids_list, "from": _log_name(src)})
        else:
            self._declare(dst)
            self._emit(
                {"ev": "move", "pool": pool, "ids": ids_list, "from": _log_name(src), "to": _log_name(dst), "op": op}
            )

    def retagged(self, ledger: Ledger, owner: Owner, old: Account, new: Account, op: str) -> None:
        """Requests and cache nodes: their accounts are derived by the audit; any other holder: ``account``."""
        if _log_kind(owner) not in (E.REQ_KIND, E.NODE_KIND, E.STATE_KIND):
            self._declare(owner)

    def _declare(self, owner: Owner) -> None:
        """An ``account`` event for a holder whose account the log cannot derive, when it changed."""
        if _log_kind(owner) in (E.REQ_KIND, E.NODE_KIND, E.STATE_KIND):
            return
        name = owner.account.name
        if self._accounts.get(owner.serial) != name:
            self._accounts[owner.serial] = name
            self._emit({"ev": "account", "owner": owner.name, "account": name})

    # ------------------------------------------------------------------ the cache
    def _new_leaf(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def new_leaf(*args: Any, **kwargs: Any) -> Any:
            return self._first(
                lambda: real(*args, **kwargs),
                lambda leaf: {"ev": "insert", "node": leaf.id, "parent": leaf.parent.id},
            )

        return new_leaf

    def _split(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def split(child: Any, m: int) -> Any:
            return self._first(
                lambda: real(child, m), lambda upper: {"ev": "split", "node": child.id, "upper": upper.id}
            )

        return split

    def _unlink_leaf(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def unlink_leaf(node: Any) -> Any:
            out = real(node)
            self._emit({"ev": "evict", "node": node.id})
            return out

        return unlink_leaf

    def _inc_lock_ref(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def inc_lock_ref(node: Any) -> Any:
            return self._first(
                lambda: real(node),
                lambda lock: {"ev": "lock", "node": node.id, "state": bool(lock.took_mamba)},
            )

        return inc_lock_ref

    def _dec_lock_ref(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def dec_lock_ref(lock: Any) -> Any:
            event = {"ev": "unlock", "node": lock.node.id, "state": bool(lock.took_mamba)}
            return self._first(lambda: real(lock), lambda _: event)

        return dec_lock_ref

    def _copy_state(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def copy_state(src: Any, dst: Any) -> Any:
            event = {
                "ev": "cow",
                "node": src.id,
                "pool": MAMBA.name,
                "src": int(src.mamba_value[0]),
                "dst": int(dst),
            }
            out = real(src, dst)
            self._emit(event)
            return out

        return copy_state

    # ------------------------------------------------------------------ requests and steps
    def _add_request(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def add_request(*args: Any, **kwargs: Any) -> Any:
            req = real(*args, **kwargs)
            state = E.STATE_OF_ACCOUNT.get(req.owner.account.name)
            if req.state.is_done or state is None:
                return req  # rejected at arrival: it never holds anything
            self._emit({"ev": "req", "rid": req.rid, "state": state})
            previous = req.owner.watcher

            def watch(owner: Owner) -> None:
                if previous is not None:
                    previous(owner)
                self._emit({"ev": "req", "rid": owner.key, "state": E.STATE_OF_ACCOUNT[owner.account.name]})

            req.owner.watcher = watch
            return req

        return add_request

    def _released(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def released(req: Any) -> Any:
            out = real(req)
            self._emit({"ev": "req", "rid": req.rid, "state": E.RELEASED})
            return out

        return released

    def _on_step(self, scheduler: Any) -> None:
        if self._on_step_before is not None:
            self._on_step_before(scheduler)
        terms: dict[str, dict[str, int]] = {}
        for t in scheduler.accounting.terms():
            row = {
                "free": t.free,
                "pending_free": t.pending,
                "cache.evictable": t.evictable,
                "cache.protected": t.protected,
                **dict(sorted(t.held.items())),  # sorted: the same run gives the same bytes in every build
            }
            terms[t.pool] = {k: v for k, v in row.items() if v}
        self._emit(
            {"ev": "step", "step": scheduler.step_no, "terms": terms, "quiescent": scheduler.is_quiescent()}
        )


def _log_kind(owner: Owner) -> str:
    """The owner kind the log uses: a PD instance's requests (``prefill.req``, ``decode.req``) are the
    requests of that instance's own log (``req``; kvledger/audit/pd_record.py)."""
    return E.REQ_KIND if owner.kind.endswith("." + E.REQ_KIND) else owner.kind


def _log_name(owner: Owner) -> str:
    return owner.name if owner.kind == _log_kind(owner) else E.owner_name(E.REQ_KIND, owner.key)


def _check_recordable(scheduler: Any, out: Any, source: Any) -> None:
    """A scheduler whose pools all have ledgers with no observer yet, a writable text stream, a str
    source: anything else is InvalidArgument (a ValueError), and nothing is written or installed."""
    if not callable(getattr(out, "write", None)):
        raise InvalidArgument(f"Recorder: out must be a writable text stream, got {type(out).__name__}")
    if not isinstance(source, str):
        raise InvalidArgument(f"Recorder: source must be a str, got {type(source).__name__}")
    if not all(hasattr(scheduler, a) for a in ("accounting", "on_step", "kv_allocator", "req_to_token_pool")):
        raise InvalidArgument(f"Recorder: expected a kvledger Scheduler, got {type(scheduler).__name__}")
    for kind in getattr(getattr(scheduler, "accounting", None), "kinds", POOLS):
        name = kind.name
        pool = getattr(scheduler, kind.attr, None)
        if pool is None:
            continue
        if not getattr(pool.ledger, "enabled", False):
            raise InvalidArgument(
                "recording needs the pools' ledgers: build the engine at checks=CheckLevel.LEDGER or above"
            )
        if pool.ledger.observer is not None:
            raise InvalidArgument(f"pool {name!r} already has a ledger observer")
