"""Leaks injected from outside the reference code: every n-th finished request never gives back one kind of id.

A scoped patch of ``ReqMemory.cache_finished`` (the finish path: the tree adopts, the request frees the
rest). For the chosen requests it forgets one holding, the commonest leak shape in SGLang's history (a
release path that forgets one holder): the ledger still records the request as the owner, nobody's
bookkeeping holds the ids, and the count identity is short by their number.

* ``row``: the row is never freed (``req_to_token_pool.free`` is a no-op for that call);
* ``mamba``: the working slot is forgotten (neither adopted by the tree nor freed);
* ``kv``: the request's KV is neither inserted into the tree nor freed.

``install(kind, nth)`` patches for the rest of the process (the CLI tests start one with contracts off);
``leaking(kind, nth)`` is the same as a context manager. Both return the list of (rid, kind) leaked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from kvledger.reference.scheduler.memory import ReqMemory

KINDS = ("row", "mamba", "kv")
Leaked = list[tuple[int, str]]


def _holds(req: Any, kind: str) -> bool:
    if kind == "row":
        return req.req_pool_idx is not None
    if kind == "mamba":
        return req.mamba_pool_idx is not None
    return req.req_pool_idx is not None and req.kv_allocated_len > req.cache_protected_len


def _leaky(real: Callable[..., None], kind: str, nth: int, leaked: Leaked) -> Callable[..., None]:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def cache_finished(self: ReqMemory, req: Any) -> None:
        if req.rid % nth != nth - 1 or not _holds(req, kind):
            real(self, req)
            return
        leaked.append((req.rid, kind))
        if kind == "row":
            pool = self.req_to_token_pool
            pool.free = lambda ids, owner: (
                None
            )  # this call only: the row stays with the request in the ledger
            try:
                real(self, req)
            finally:
                del pool.free
        elif kind == "mamba":
            req.mamba_pool_idx = None  # forgotten: the tree does not adopt it, nobody frees it
            real(self, req)
        else:
            self._guard_release(req)
            self._free_owned(req, req.kv_allocated_len)  # frees row, slot, lock: no KV at all

    return cache_finished


def install(kind: str, nth: int = 10) -> Leaked:
    """Patch for the rest of the process; returns the list the leaks are recorded in."""
    leaked: Leaked = []
    ReqMemory.cache_finished = _leaky(ReqMemory.cache_finished, kind, nth, leaked)  # type: ignore[method-assign]
    return leaked


@contextlib.contextmanager
def leaking(kind: str, nth: int = 10) -> Iterator[Leaked]:
    real = ReqMemory.cache_finished
    leaked: Leaked = []
    ReqMemory.cache_finished = _leaky(real, kind, nth, leaked)  # type: ignore[method-assign]
    try:
        yield leaked
    finally:
        ReqMemory.cache_finished = real  # type: ignore[method-assign]
