"""The pool side of the SGLang attach: holders, method wrappers, and the pools' calls mirrored.

:class:`PoolWatch` holds what every watch has (the holder of the ids handed out, the wrappers on SGLang's
instances and their removal, the per-request owners and their handles) and mirrors the KV allocator's,
the request pool's and the Mamba pool's calls into one ledger per pool. The tree side, and the function
users call, are in :mod:`kvledger.engines.sglang.attach` (:class:`~kvledger.engines.sglang.attach.Watch`,
:func:`~kvledger.engines.sglang.attach.watch`), which says what each call is checked for.
"""


from __future__ import annotations

import contextlib
import functools
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.handles import HandleClaim, check_handles_owned
from kvledger.contracts.ledger import FREE_CODE, PENDING_CODE, Ledger, as_id_array
from kvledger.contracts.owners import CACHE_EVICTABLE, FREE_LIST, REQ_RUNNING, Account, Owner
from kvledger.engines.sglang import shapes
from kvledger.engines.sglang.leaks import check_everything_came_back, check_released, returned

CALLER = "caller"


def page_ids(ids: Any, page_size: int) -> np.ndarray:
    """Token ids -> the pages they lie on (SGLang frees whole pages, once per call): distinct and sorted
    above page 1, the ids as given at page 1."""
    a = as_id_array(ids)
    # Page 1: the ids themselves, unsorted (no O(n log n) unique per call): the ledger's move refuses a
    # repeated id (I-NODUP-FREE) and an allocation's I-COUNT counts one handed out twice.
    return np.unique(a // page_size) if page_size > 1 else a


SMALL = 8  # a call that moves at most this many ids takes the Python-int path (a decode step: one)


def small_ids(ids: Any) -> list[int] | None:
    """The ids of a call that moves at most :data:`SMALL` of them (a tensor, any shape) as Python ints,
    repeats kept; else None (the numpy path)."""
    if type(ids) is not torch.Tensor or ids.numel() > SMALL:
        return None
    lst = ids.tolist()
    if type(lst) is int:
        return [lst]
    return lst if not lst or type(lst[0]) is int else ids.reshape(-1).tolist()


def small_pages(ids: Any, page_size: int) -> list[int] | None:
    """:func:`page_ids` as sorted distinct Python ints for a call of at most :data:`SMALL` ids, else
    None: a decode step's one id costs no numpy call."""
    lst = small_ids(ids)
    if lst is None or len(lst) == 1:
        return lst if lst is None or page_size == 1 else [lst[0] // page_size]
    if page_size > 1:
        lst = [i // page_size for i in lst]
    return sorted(set(lst))


@dataclass
class Wrapped:
    obj: Any
    names: list[str] = field(default_factory=list)
    restore: dict[str, Any] = field(default_factory=dict)  # instance attributes the wrap replaced

    def wrap(self, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(self.obj, name)
        setattr(self.obj, name, make(original))
        self.names.append(name)

    def undo(self) -> None:
        for name in self.names:
            if name in self.restore:
                setattr(self.obj, name, self.restore[name])
                continue
            with contextlib.suppress(AttributeError):
                delattr(self.obj, name)
        self.names.clear()
        self.restore.clear()


class PoolWatch:
    """The pool side of a :class:`~kvledger.engines.sglang.attach.Watch`: holders, wrappers, and the KV
    allocator's, request pool's and Mamba pool's calls mirrored into their ledgers."""

    def __init__(self, *, audit_each: bool = False) -> None:
        self.audit_each = audit_each
        self.caller = Owner(CALLER, None, REQ_RUNNING)
        self._holder = self.caller
        self._holders: dict[Any, Owner] = {}
        self.tree_kv = Owner("tree", "kv", CACHE_EVICTABLE)
        self.tree_state = Owner("tree", "state", CACHE_EVICTABLE)
        # slots pre-allocated for a batch's matches (MambaSlotAllocator.alloc_group_begin), not yet handed out
        self.slot_group = Owner("alloc_group", "mamba", Account("mamba.alloc_group"))
        self._tree_frees = 0  # > 0 inside evict / match: frees come from the tree
        self._depth: Counter[str] = Counter()  # reentrancy per pool: only the outermost call is mirrored
        self._wrapped: list[Wrapped] = []
        self.kv: Ledger | None = None
        self.rows: Ledger | None = None
        self.slots: Ledger | None = None
        self.allocator: Any = None
        self.req_pool: Any = None
        self.mamba_allocator: Any = None
        self.mamba_pool: Any = None
        self.tree: Any = None
        self.page_size = 1
        self._group_open = False
        self.locks: Counter[Any] = Counter()  # live locks taken through inc_lock_ref, per node key
        self._locked_nodes: dict[Any, Any] = {}  # node key -> the node, while it has a live lock
        self._evicting = False  # inside a watched evict with live locks
        self._evict_guard: np.ndarray | None = (
            None  # the KV pages of locked paths, read at evict's first free
        )
        # the last lock and unlock calls per node key (bounded), for the tree's violation messages
        self._lock_calls: OrderedDict[Any, deque[tuple[str, Any, Any]]] = OrderedDict()
        self._lock_took_state: dict[
            tuple[Any, Owner], list[bool]
        ] = {}  # per (node, holder): took the state lock
        self.calls = 0
        # SGLang Req objects whose handles are checked (I-HANDLE-OWNED): id(req) -> (req, its owner)
        self._requests: dict[int, tuple[Any, Owner]] = {}
        self._request_calls = 0  # > 0 inside a scheduler-level call (cache_finished_req, alloc(reqs), ...)

    # ------------------------------------------------------------------ holders
    @contextlib.contextmanager
    def holder(self, key: Any) -> Iterator[Owner]:
        """Attribute the ids handed out (and claim the ids freed) inside the block to request ``key``."""
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            raise InvalidArgument(f"Watch.holder: a request key is a str or an int, got {type(key).__name__}")
        owner = self._holders.get(key)
        if owner is None:
            owner = self._holders[key] = Owner("req", key, REQ_RUNNING)
        previous, self._holder = self._holder, owner
        try:
            yield owner
        finally:
            self._holder = previous

    def owner_of_request(self, key: Any) -> Owner:
        """The owner of request ``key`` (made on first use, as :meth:`holder` does)."""
        with self.holder(key) as owner:
            return owner

    def track(self, req: Any, key: Any) -> Owner:
        """Check the handles of SGLang request object ``req`` (held by request ``key``) after every
        scheduler-level call and every tree call outside one: every row or Mamba slot its
        ``req_pool_idx``, ``mamba_pool_idx`` and ``mamba_ping_pong_track_buffer`` name must be held by
        ``key`` (I-HANDLE-OWNED; kvledger's own requests are held to the same rule every step)."""
        if not hasattr(req, "req_pool_idx") and not hasattr(getattr(req, "kv", None), "req_pool_idx"):
            raise InvalidArgument(
                f"Watch.track: {type(req).__name__} is not an SGLang request (no req_pool_idx)"
            )
        owner = self.owner_of_request(key)
        self._requests[id(req)] = (req, owner)
        return owner

    def untrack(self, req: Any) -> None:
        """Stop checking ``req`` (a request that left the engine: finished or aborted for good)."""
        self._requests.pop(id(req), None)

    def retire(self, key: Any) -> None:
        """Request ``key`` has left the engine (finished or aborted for good, its release done): it must
        hold nothing in any watched pool, else the ids it kept are named with their moves
        (I-OWNER-RELEASE). Call it after the release (``cache_finished_req`` then ``release_kv_cache`` /
        ``free(req)``); the key may be used again afterwards, by a new request."""
        owner = self._holders.pop(key, None)
        if owner is None:
            return  # never held anything through this watch
        for req_id, (_, tracked) in list(self._requests.items()):
            if tracked is owner:
                del self._requests[req_id]
        check_released(self._ledgers(), owner)

    def check_idle(self) -> None:
        """With no request live: everything came back (every id free or the tree's, no free group open,
        no lock held: I-IDLE-IDENTITY), then the full :meth:`audit`. The end of a run."""
        check_everything_came_back(self._ledgers(), (self.tree_kv, self.tree_state), self.locks)
        self.audit()

    def _ledgers(self) -> dict[str, Ledger | None]:
        return {"kv": self.kv, "req": self.rows, "mamba": self.slots}

    def request_owner(self, req: Any) -> Owner | None:
        entry = self._requests.get(id(req))
        return None if entry is None else entry[1]

    def check_handles(self) -> int:
        """I-HANDLE-OWNED over the tracked requests; the number of ids checked."""
        ledgers = {"req": self.rows, "mamba": self.slots}
        claims = []
        for req, owner in self._requests.values():
            for handle, pool, ids in shapes.handles(req):
                if ledgers.get(pool) is not None:
                    claims.append(HandleClaim(owner, handle, pool, ids))
        return check_handles_owned(claims, {k: v for k, v in ledgers.items() if v is not None})

    @contextlib.contextmanager
    def _request_call(self, req: Any = None) -> Iterator[None]:
        """A scheduler-level call on request ``req``: its ids are attributed to its owner (when tracked)
        and the handles are checked once, when the outermost such call returns (inside one, SGLang
        moves a slot before it clears the handle that named it)."""
        owner = self.request_owner(req) if req is not None else None
        previous = self._holder
        if owner is not None:
            self._holder = owner
        self._request_calls += 1
        try:
            yield
        finally:
            self._request_calls -= 1
            self._holder = previous
        if not self._request_calls:
            if self.audit_each:
                self.audit()
            self.check_handles()

    def _claimant(self, state: bool = False) -> Owner:
        if self._tree_frees:
            return self.tree_state if state else self.tree_kv
        return self._holder

    # ------------------------------------------------------------------ wrapping helpers
    def _wrapper(self, obj: Any) -> Wrapped:
        w = Wrapped(obj)
        self._wrapped.append(w)
        return w

    @contextlib.contextmanager
    def _outermost(self, pool: str) -> Iterator[bool]:
        self._depth[pool] += 1
        try:
            yield self._depth[pool] == 1
        finally:
            self._depth[pool] -= 1

    def detach(self) -> None:
        """Remove every wrapper: the objects behave exactly as before :func:`watch`."""
        for w in self._wrapped:
            w.undo()
        self._wrapped.clear()

    # ------------------------------------------------------------------ KV allocator
    def _attach_allocator(self, allocator: Any) -> None:
        self.allocator = allocator
        ps = int(allocator.page_size)
        self.page_size = ps
        pages = int(allocator.size) // ps
        self.kv = Ledger("kv", range(1, pages + 1), unit=ps)
        w = self._wrapper(allocator)
        for name in ("alloc", "alloc_extend", "alloc_decode"):
            if hasattr(allocator, name):
                w.wrap(name, self._kv_alloc)
        for name in ("free", "free_segment", "free_full"):
            if hasattr(allocator, name):
                w.wrap(name, functools.partial(self._kv_free, op=name, pages_given=False))
        if hasattr(allocator, "free_page_ids"):
            w.wrap("free_page_ids", functools.partial(self._kv_free, op="free_page_ids", pages_given=True))
        w.wrap("free_group_begin", self._kv_group_begin)
        w.wrap("free_group_end", self._kv_group_end)

    def _free_pages_now(self) -> int:
        return int(self.allocator.available_size()) // self.page_size

    def _kv_alloc(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # The hot path of a decode step (one id per call): no context manager, no numpy for a few ids,
        # two available_size() reads for I-COUNT (issue 38: the attach's per-call cost).
        depth = self._depth
        available = self.allocator.available_size
        ps = self.page_size

        def alloc(*args: Any, **kwargs: Any) -> Any:
            if depth["kv"]:
                return original(*args, **kwargs)
            depth["kv"] = 1
            try:
                before = available()
                out = original(*args, **kwargs)
                if out is None:
                    return out
                taken = (before - available()) // ps
                few = small_pages(out, ps)
                if few is None:
                    self._record_alloc(self.kv, page_ids(out, ps), taken, "alloc")
                else:
                    self._record_alloc_few(few, taken)
                return out
            finally:
                depth["kv"] = 0

        return alloc

    def _record_alloc_few(self, pages: list[int], taken: int, ledger: Any = None, op: str = "alloc") -> None:
        """:meth:`_record_alloc` for a few ids as Python ints (a decode step's one id, a request's Mamba
        slot): the same checks, the ledger's few-id move (any doubt: its general move, with the evidence)."""
        ledger = self.kv if ledger is None else ledger
        mv = ledger.owner_code_view
        top = len(mv)
        if any(not 0 <= i < top for i in pages):
            self._record_alloc(ledger, np.array(pages, dtype=np.int64), taken, op)
            return
        self.calls += 1
        fresh = [i for i in pages if mv[i] == FREE_CODE]
        held = [i for i in pages if mv[i] != FREE_CODE] if len(fresh) < len(pages) else None
        if len(fresh) != taken:
            raise ContractViolation(
                ledger.describe(
                    fresh[:4],
                    f"{op}: the free list shrank by {taken} but {len(fresh)} free id(s) were handed out"
                    f" (I-COUNT): {fresh[:8]}",
                )
            )
        holder = self._holder
        if fresh and not ledger.move_few(fresh, FREE_LIST, holder, op):
            ledger.transfer(fresh, FREE_LIST, holder, op)  # checked again: raises with evidence
        if held:
            cont = f"{op} (continues its own page)"  # a decode step inside the holder's partial last page
            if not ledger.move_few(held, holder, holder, cont):
                ledger.transfer(held, holder, holder, cont)  # not the holder's: raises with evidence

    def _record_alloc(self, ledger: Any, pages: np.ndarray, taken: int, op: str) -> None:
        """``pages`` were handed out; the free list shrank by ``taken``. New ones leave the free list;
        pages already held (a partial last page an extend continues) must be the holder's own."""
        self.calls += 1
        own = ledger.owner_codes
        owners = own.take(pages, mode="clip") if pages.size and int(pages.min()) >= 0 else None
        if owners is not None and int(pages.max()) >= len(own):
            owners = None  # an id off the pool: the move below names it
        is_free = None if owners is None else owners == FREE_CODE
        if is_free is None or is_free.all():
            fresh, held = pages, None
        else:
            fresh, held = pages[is_free], pages[~is_free]
        if fresh.size != taken:
            raise ContractViolation(
                ledger.describe(
                    fresh.tolist()[:4],
                    f"{op}: the free list shrank by {taken} but {fresh.size} free id(s) were handed out"
                    f" (I-COUNT): {fresh.tolist()[:8]}",
                )
            )
        ledger.transfer(fresh, FREE_LIST, self._holder, op)
        if held is not None and held.size:
            ledger.transfer(held, self._holder, self._holder, f"{op} (continues its own page)")

    def _kv_free(self, original: Callable[..., Any], op: str, *, pages_given: bool) -> Callable[..., Any]:
        depth = self._depth
        available = self.allocator.available_size
        ps = self.page_size

        def free(ids: Any, *args: Any, **kwargs: Any) -> Any:
            if depth["kv"] or ids is None or not ids.numel():
                return original(ids, *args, **kwargs)
            depth["kv"] = 1
            try:
                grouped = self._group_open
                given = self._record_free(ids, op, pages_given)
                before = available()
                out = original(ids, *args, **kwargs)
                if not grouped:
                    assert self.kv is not None
                    returned(self.kv, op, given, (available() - before) // ps)
                return out
            finally:
                depth["kv"] = 0

        return free

    def _record_free(self, ids: Any, op: str, pages_given: bool) -> Any:
        """Mirror a free into the ledger before SGLang's runs; returns the pages the ledger freed (a list
        of ints for a few, else an array)."""
        assert self.kv is not None
        few = None if pages_given or self._evicting or self._group_open else small_pages(ids, self.page_size)
        if few is not None:
            self.calls += 1
            src = self._claimant()
            if not self.kv.move_few(few, src, FREE_LIST, op):
                self.kv.transfer(np.array(few, dtype=np.int64), src, FREE_LIST, op)  # raises with evidence
            return few
        self.calls += 1
        if pages_given:
            pages = as_id_array(ids)
            if pages.size != np.unique(pages).size:
                dups = sorted(int(i) for i, c in Counter(pages.tolist()).items() if c > 1)
                raise ContractViolation(
                    self.kv.describe(dups, f"{op}: page ids repeated (I-NODUP-FREE): {dups[:8]}")
                )
        else:
            pages = page_ids(ids, self.page_size)
        if self._evicting:
            self._refuse_locked_eviction(pages, op)
        src = self._claimant()
        if self._group_open:
            pending = self.kv.pending_owner
            own = self.kv.owner_codes[pages] if int(pages.max()) < len(self.kv.owner_codes) else None
            if own is not None:
                pages = pages[own != PENDING_CODE]  # SGLang merges a group's frees by page
            self.kv.transfer(pages, src, pending, f"{op} (free group)")
            return pages
        self.kv.transfer(pages, src, FREE_LIST, op)
        return pages

    def _kv_group_begin(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def begin(*args: Any, **kwargs: Any) -> Any:
            if self._group_open:
                raise ContractViolation("[kv] free_group_begin: a free group is already open (I-PENDING)")
            out = original(*args, **kwargs)
            self._group_open = True
            return out

        return begin

    def _kv_group_end(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def end(*args: Any, **kwargs: Any) -> Any:
            assert self.kv is not None
            if not self._group_open:
                raise ContractViolation("[kv] free_group_end: no free group is open (I-PENDING)")
            self._group_open = False
            pending = self.kv.holdings(self.kv.pending_owner)
            if pending:
                self.kv.transfer(
                    np.array(sorted(pending), dtype=np.int64),
                    self.kv.pending_owner,
                    FREE_LIST,
                    "free_group_end",
                )
            with self._outermost("kv"):
                return original(*args, **kwargs)

        return end

    # ------------------------------------------------------------------ request rows
    def _attach_req_pool(self, req_pool: Any) -> None:
        if not hasattr(req_pool, "alloc_rows"):
            # releases before 0.5.19 hand out rows per request object: alloc(reqs), free(req)
            self._attach_req_pool_per_request(req_pool)
            return
        self.req_pool = req_pool
        self.rows = Ledger("req", range(1, int(req_pool.size) + 1))
        w = self._wrapper(req_pool)

        def alloc_rows(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(need: int) -> Any:
                before = req_pool.available_size()
                out = original(need)
                if out:
                    self._record_alloc(
                        self.rows,
                        np.asarray(out, dtype=np.int64),
                        before - req_pool.available_size(),
                        "alloc_rows",
                    )
                return out

            return call

        def free_rows(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(indices: Any) -> Any:
                assert self.rows is not None
                rows = np.asarray(list(indices), dtype=np.int64)
                if not rows.size:
                    return original(indices)
                self.calls += 1
                self.rows.transfer(rows, self._holder, FREE_LIST, "free_rows")
                before = req_pool.available_size()
                out = original(indices)
                returned(self.rows, "free_rows", rows, req_pool.available_size() - before)
                return out

            return call

        w.wrap("alloc_rows", alloc_rows)
        w.wrap("free_rows", free_rows)

    def _attach_req_pool_per_request(self, req_pool: Any) -> None:
        """``alloc(reqs)`` gives each request without a row one (a request with a row keeps it: a chunk
        continues) and, on a ``HybridReqToTokenPool``, its Mamba slots; ``free(req)`` returns the row.
        Each row goes to (and comes back from) the request's tracked owner, else the current holder."""
        self.req_pool = req_pool
        self.rows = Ledger("req", range(1, int(req_pool.size) + 1))
        w = self._wrapper(req_pool)

        def alloc(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(reqs: Any, *args: Any, **kwargs: Any) -> Any:
                assert self.rows is not None
                fresh = [r for r in reqs if r.req_pool_idx is None]
                with self._request_call(reqs[0] if len(reqs) == 1 else None):
                    before = req_pool.available_size()
                    out = original(reqs, *args, **kwargs)
                    if out is not None and fresh:
                        taken = before - req_pool.available_size()
                        if taken != len(fresh):
                            raise ContractViolation(
                                f"[req] alloc: {len(fresh)} request(s) without a row, the free list shrank by"
                                f" {taken} (I-COUNT)"
                            )
                        self.calls += 1
                        for r in fresh:
                            owner = self.request_owner(r) or self._holder
                            self.rows.transfer(
                                np.array([int(r.req_pool_idx)]), FREE_LIST, owner, "alloc(reqs)"
                            )
                    return out

            return call

        def free(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(req: Any, *args: Any, **kwargs: Any) -> Any:
                assert self.rows is not None
                with self._request_call(req):
                    if req.req_pool_idx is None:
                        return original(req, *args, **kwargs)
                    self.calls += 1
                    row = np.array([int(req.req_pool_idx)])
                    self.rows.transfer(row, self._holder, FREE_LIST, "free(req)")
                    before = req_pool.available_size()
                    out = original(req, *args, **kwargs)
                    returned(self.rows, "free(req)", row, req_pool.available_size() - before)
                    return out

            return call

        w.wrap("alloc", alloc)
        w.wrap("free", free)
        if hasattr(req_pool, "free_mamba_cache"):
            w.wrap("free_mamba_cache", self._request_level("free_mamba_cache"))

    def _request_level(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Wrap a scheduler-level call whose first argument is an SGLang ``Req``."""

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(req: Any, *args: Any, **kwargs: Any) -> Any:
                self.calls += 1
                with self._request_call(req):
                    return original(req, *args, **kwargs)

            return call

        return make

    # ------------------------------------------------------------------ Mamba slots
    def _attach_mamba(self, mamba_allocator: Any, mamba_pool: Any) -> None:
        self.mamba_allocator = mamba_allocator
        self.mamba_pool = mamba_pool
        self.slots = Ledger("mamba", range(1, int(mamba_allocator.size) + 1))
        w = self._wrapper(mamba_allocator)

        def alloc(original: Callable[..., Any]) -> Callable[..., Any]:
            depth = self._depth
            available = mamba_allocator.available_size

            def call(need: int) -> Any:
                assert self.slots is not None
                if depth["mamba"]:
                    return original(need)
                depth["mamba"] = 1
                try:
                    before = available()
                    out = original(need)
                    if out is not None:
                        self._record_mamba_alloc(out, before, available)
                    return out
                finally:
                    depth["mamba"] = 0

            return call

        def group_begin(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(num_reqs: int) -> Any:
                assert self.slots is not None
                with self._outermost("mamba"):
                    before = as_id_array(mamba_allocator.free_slots).copy()
                    out = original(num_reqs)
                    taken = before.size - mamba_allocator.available_size()
                    if taken > 0:  # SGLang takes the batch off the front of its free list
                        self.calls += 1
                        self.slots.transfer(before[:taken], FREE_LIST, self.slot_group, "alloc_group_begin")
                    return out

            return call

        def group_end(original: Callable[..., Any]) -> Callable[..., Any]:
            def call() -> Any:
                assert self.slots is not None
                with self._outermost("mamba"):
                    out = original()
                    left = sorted(self.slots.holdings(self.slot_group))
                    if left:  # the unused rest went back to the free list
                        self.calls += 1
                        self.slots.transfer(
                            np.array(left, dtype=np.int64), self.slot_group, FREE_LIST, "alloc_group_end"
                        )
                    return out

            return call

        w.wrap("alloc", alloc)
        w.wrap("free", self._mamba_free)
        if hasattr(mamba_allocator, "alloc_group_begin"):
            w.wrap("alloc_group_begin", group_begin)
            w.wrap("alloc_group_end", group_end)
        if mamba_pool is not None and hasattr(mamba_pool, "copy_from"):
            self._wrapper(mamba_pool).wrap("copy_from", self._copy_from)

    def _record_mamba_alloc(self, out: Any, before: int, available: Callable[[], int]) -> None:
        """Slots handed out: those of the batch ``alloc_group_begin`` pre-allocated move from the group,
        the rest leave the free list (I-COUNT against the free list's shrink)."""
        slots = self.slots
        assert slots is not None
        few = small_ids(out)
        if few is not None and all(slots.owner_of(i) is not self.slot_group for i in few):
            self._record_alloc_few(few, before - available(), slots, "mamba alloc")
            return
        got = as_id_array(out)
        grouped = np.array([i for i in got.tolist() if slots.owner_of(i) is self.slot_group], dtype=np.int64)
        if grouped.size:  # handed out of the batch pre-allocated by alloc_group_begin
            self.calls += 1
            slots.transfer(grouped, self.slot_group, self._holder, "mamba alloc (group)")
            got = np.setdiff1d(got, grouped)
        if got.size:
            self._record_alloc(slots, got, before - available(), "mamba alloc")

    def _mamba_free(self, original: Callable[..., Any]) -> Callable[..., Any]:
        depth = self._depth

        def call(ids: Any) -> Any:
            slots = self.slots
            assert slots is not None
            if depth["mamba"] or not ids.numel():
                return original(ids)
            depth["mamba"] = 1
            try:
                self.calls += 1
                src = self._claimant(state=True)
                few = small_ids(ids)  # repeats kept: the ledger's move refuses one (I-NODUP-FREE)
                given: Any = few
                if few is None or not slots.move_few(few, src, FREE_LIST, "mamba free"):
                    given = as_id_array(ids)
                    slots.transfer(given, src, FREE_LIST, "mamba free")
                before = self.mamba_allocator.available_size()
                out = original(ids)
                returned(slots, "mamba free", given, self.mamba_allocator.available_size() - before)
                return out
            finally:
                depth["mamba"] = 0

        return call

    def _copy_from(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(src: Any, dst: Any) -> Any:
            assert self.slots is not None
            s, d = as_id_array(src), as_id_array(dst)
            free_src = [int(i) for i in s.tolist() if self.slots.owner_of(int(i)) is FREE_LIST]
            if free_src:
                raise ContractViolation(
                    self.slots.describe(
                        free_src, f"copy_from: the source slot(s) {free_src} are free (I-COW-SOURCE)"
                    )
                )
            bad_dst = [
                int(i) for i in d.tolist() if self.slots.owner_of(int(i)) in (FREE_LIST, self.tree_state)
            ]
            if bad_dst:
                raise ContractViolation(
                    self.slots.describe(
                        bad_dst,
                        f"copy_from: destination slot(s) {bad_dst} are free or the tree's (I-EXCLUSIVE)",
                    )
                )
            self.calls += 1
            return original(src, dst)

        return call

    def _refuse_locked_eviction(self, pages: np.ndarray, op: str) -> None:
        """A free inside a watched ``evict`` of a page on a locked path (I-EVICT-LOCKED): the tree side
        (:class:`~kvledger.engines.sglang.attach.Watch`) fills it in; with no tree watched there is none."""

    # ------------------------------------------------------------------ audit
    def audit(self) -> None:
        """Recount every watched pool against its ledger (O(pool)); raises ContractViolation."""
        if self.kv is not None:
            free = shapes.all_free_pages(self.allocator)
            pending: list[int] = []
            # Only an open group's lists are pending: some releases (0.5.9, 0.5.10) free the pages at
            # free_group_end but clear the list at the next begin, and a stale list is not pending.
            if self._group_open:
                for part in getattr(self.allocator, "free_group", None) or ():
                    pending.extend(page_ids(part, self.page_size).tolist())
                for part in getattr(self.allocator, "free_page_ids_group", None) or ():
                    pending.extend(as_id_array(part).tolist())
            self.kv.audit(free.tolist(), sorted(set(pending)))
        if self.rows is not None:
            self.rows.audit(list(self.req_pool.free_slots))
        if self.slots is not None:
            self.slots.audit(as_id_array(self.mamba_allocator.free_slots).tolist())
