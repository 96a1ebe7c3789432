"""Write kvledger's event log (spec/event-log.md) from a :class:`~.attach.Watch` on SGLang's components.

The recorder observes the watch's ledgers (``Ledger.observer``): every alloc, free, move and free group
of SGLang's pools becomes an event, so ``kvledger audit`` replays a run of SGLang's own allocators, pools
and trees through fresh ledgers. Holders: a request holder (``Watch.holder``) is a ``req#<key>`` with a
``req`` event (running) when it first appears; the ``caller`` and the tree's two owners (``tree#kv``,
``tree#state``) are other holders, declared by ``account`` events. Tree structure and locks are not
logged (the attach sees node ids but not the splits and deletions inside SGLang's calls): the log is the
pools' ownership history. :meth:`SGLangRecorder.close` writes the end-of-log marker (how the run ended)
and detaches.
"""

from __future__ import annotations

import json
from typing import IO, Any

import numpy as np

from kvledger.audit import events as E
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.owners import FREE_LIST, Account, Owner
from kvledger.engines.sglang.attach import Watch

UNITS = {"kv": "tokens", "req": "rows", "mamba": "slots"}


class SGLangRecorder:
    """Writes the event log of the pools a :class:`Watch` observes to ``out``."""

    def __init__(self, watch: Watch, out: IO[str], *, source: str = "sglang") -> None:
        self.out = out
        self.events = 0
        self._ledgers: dict[int, str] = {}
        self._declared: dict[int, str] = {}
        self._open: set[str] = set()
        self._emit(E.header(source))
        for name, ledger in (("kv", watch.kv), ("req", watch.rows), ("mamba", watch.slots)):
            if ledger is None:
                continue
            if ledger.observer is not None:
                raise ValueError(f"pool {name!r} already has a ledger observer")
            ledger.observer = self
            self._ledgers[id(ledger)] = name
            d = ledger.domain
            self._emit(
                {"ev": "pool", "pool": name, "first": d.start, "size": len(d), "unit": ledger.unit,
                 "unit_name": UNITS[name]}
            )  # fmt: skip
        self._watched = [led for led in (watch.kv, watch.rows, watch.slots) if led is not None]

    def _emit(self, ev: dict[str, Any]) -> None:
        self.out.write(json.dumps(ev, separators=(",", ":")))
        self.out.write("\n")
        self.events += 1

    def _declare(self, owner: Owner) -> None:
        if owner.kind == E.REQ_KIND:
            if owner.serial not in self._declared:
                self._declared[owner.serial] = "running"
                self._emit({"ev": "req", "rid": owner.key, "state": "running"})
            return
        if self._declared.get(owner.serial) != owner.account.name:
            self._declared[owner.serial] = owner.account.name
            self._emit({"ev": "account", "owner": owner.name, "account": owner.account.name})

    def moved(self, ledger: Ledger, ids: np.ndarray, src: Owner, dst: Owner | list[Owner], op: str) -> None:
        pool = self._ledgers[id(ledger)]
        ids_list = ids.tolist()
        if isinstance(dst, list):
            for d in dst:
                self._declare(d)
            self._emit({"ev": "alloc", "pool": pool, "ids": ids_list, "to": [d.name for d in dst]})
        elif src is FREE_LIST:
            self._declare(dst)
            self._emit({"ev": "alloc", "pool": pool, "ids": ids_list, "to": dst.name})
        elif dst is ledger.pending_owner:
            if pool not in self._open:
                self._open.add(pool)
                self._emit({"ev": "free_group", "pool": pool, "open": True})
            self._emit({"ev": "free", "pool": pool, "ids": ids_list, "from": src.name})
        elif src is ledger.pending_owner:
            self._open.discard(pool)
            self._emit({"ev": "free_group", "pool": pool, "open": False})
        elif dst is FREE_LIST:
            self._emit({"ev": "free", "pool": pool, "ids": ids_list, "from": src.name})
        elif dst is not src:
            self._declare(dst)
            self._emit(
                {"ev": "move", "pool": pool, "ids": ids_list, "from": src.name, "to": dst.name, "op": op}
            )

    def retagged(self, ledger: Ledger, owner: Owner, old: Account, new: Account, op: str) -> None:
        self._declare(owner)

    def close(self, outcome: str = "completed") -> None:
        """Detach from the ledgers and write the end-of-log marker (spec/event-log.md): ``outcome`` is how
        the run ended, ``"completed"`` (every request released: the audit checks the idle state),
        ``"stopped"`` (cut short with requests live) or ``"violation"``. Without the marker the audit
        calls the log incomplete, never clean."""
        if outcome not in E.OUTCOMES:
            raise InvalidArgument(
                f"SGLangRecorder.close: outcome must be one of {E.OUTCOMES}, got {outcome!r}"
            )
        for ledger in self._watched:
            if ledger.observer is self:
                ledger.observer = None
        self._watched = []
        self._emit(E.end(self.events, outcome))
