"""The watch on SGLang 0.5.5.x's pools and tree: the row API and the tree insert of that era.

:func:`kvledger.engines.sglang.attach.watch` mirrors the request-pool APIs of 0.5.9 on (``alloc(reqs)``
/ ``free(req)``, then ``alloc_rows`` / ``free_rows``) and ``insert(InsertParams)``. 0.5.5.x differs in
three places, handled here by a subclass of the watch (the shared attach is not edited):

* rows: ``HybridReqToTokenPool.alloc(need_size, reqs)`` hands out ``need_size`` rows (and, per request
  without one, a Mamba slot); ``free(free_index, free_mamba_cache=True)`` returns rows by index and,
  unless told not to, the Mamba slot each row maps to. The Mamba free goes through the watched
  ``MambaPool.free``, so a slot freed twice, or freed while a request still names it, is mirrored too;
* ``MambaRadixCache.insert(key, value, mamba_value)`` returning ``(prefix_len, mamba_exist)``;
* id domains: rows and Mamba slots are numbered from 0 (``list(range(size))``, ``torch.arange(size)``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from kvledger.contracts.ledger import Ledger, as_id_array
from kvledger.contracts.owners import FREE_LIST
from kvledger.engines.sglang.attach import Watch
from kvledger.engines.sglang.leaks import returned


def uses_row_api(req_pool: Any) -> bool:
    """True for 0.5.5.x's request pool: ``alloc(need_size, reqs)`` (rows by count, not by request)."""
    alloc = getattr(req_pool, "alloc", None)
    return alloc is not None and "need_size" in inspect.signature(alloc).parameters


class RowApiWatch(Watch):
    """:class:`~kvledger.engines.sglang.attach.Watch` for 0.5.5.x (see the module docstring)."""

    def _attach_req_pool(self, req_pool: Any) -> None:
        self.req_pool = req_pool
        self.rows = Ledger("req", range(0, int(req_pool.size)))
        w = self._wrapper(req_pool)

        def alloc(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(need_size: int, *args: Any, **kwargs: Any) -> Any:
                assert self.rows is not None
                before = len(req_pool.free_slots)
                out = original(need_size, *args, **kwargs)
                if out is not None:
                    rows = np.asarray(list(out), dtype=np.int64)
                    self._record_alloc(self.rows, rows, before - len(req_pool.free_slots), "alloc(rows)")
                return out

            return call

        def free(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(free_index: Any, *args: Any, **kwargs: Any) -> Any:
                assert self.rows is not None
                rows = as_id_array(free_index).reshape(-1)
                if not rows.size:
                    return original(free_index, *args, **kwargs)
                self.calls += 1
                # the row first: a row freed twice is named before SGLang touches its Mamba mapping
                self.rows.transfer(rows, self._holder, FREE_LIST, "free(rows)")
                before = len(req_pool.free_slots)
                out = original(free_index, *args, **kwargs)
                returned(self.rows, "free(rows)", rows, len(req_pool.free_slots) - before)
                return out

            return call

        w.wrap("alloc", alloc)
        w.wrap("free", free)

    def attach_parts(self, allocator: Any, req_pool: Any, tree: Any) -> None:
        """Watch 0.5.5.x's parts: the KV allocator, the hybrid request pool (its rows, and its Mamba pool
        as both the Mamba allocator and the state pool) and the tree."""
        self._attach_allocator(allocator)
        self._attach_req_pool(req_pool)
        self._attach_mamba(req_pool.mamba_pool, req_pool.mamba_pool)
        self._attach_tree(tree)

    def _attach_mamba(self, mamba_allocator: Any, mamba_pool: Any) -> None:
        super()._attach_mamba(mamba_allocator, mamba_pool)
        self.slots = Ledger("mamba", range(0, int(mamba_allocator.size)))

    def _insert(self, original: Callable[..., Any]) -> Callable[..., Any]:
        wrapped_new = super()._insert(lambda params: _as_result(original(*params.args, **params.kwargs)))

        def call(*args: Any, **kwargs: Any) -> Any:
            params = _as_params(args, kwargs)
            result = wrapped_new(params)
            return result.raw

        return call


def _as_params(args: tuple[Any, ...], kwargs: dict[str, Any]) -> SimpleNamespace:
    """``insert(key, value=None, mamba_value=None)`` as the fields ``insert(InsertParams)`` has."""
    names = ("key", "value", "mamba_value")
    bound = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    return SimpleNamespace(
        key=bound["key"],
        value=bound.get("value"),
        mamba_value=bound.get("mamba_value"),
        args=args,
        kwargs=kwargs,
    )


def _as_result(raw: Any) -> SimpleNamespace:
    """0.5.5.x's ``(prefix_len, mamba_exist)`` (``MambaRadixCache``) or ``prefix_len`` (``RadixCache``)."""
    if isinstance(raw, tuple):
        return SimpleNamespace(prefix_len=int(raw[0]), mamba_exist=bool(raw[1]), raw=raw)
    return SimpleNamespace(prefix_len=int(raw), mamba_exist=False, raw=raw)


def watch_row_api(*, allocator: Any, req_pool: Any, tree: Any, audit_each: bool = False) -> Watch:
    """The watch over 0.5.5.x's KV allocator, hybrid request pool (rows and Mamba slots) and tree."""
    w = RowApiWatch(audit_each=audit_each)
    w.attach_parts(allocator, req_pool, tree)
    return w
