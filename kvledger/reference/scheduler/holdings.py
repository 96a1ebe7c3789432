"""What a request holds, one manager per pool kind, under one coordinator (issue 36 item 1).

Each manager owns one kind of a request's holdings and is the only code that writes the request fields
naming them:

* :class:`RowHoldings`: the ``req_to_token`` row (``req_pool_idx``);
* :class:`MambaSlotHoldings`: the Mamba working slot (``mamba_pool_idx``);
* :class:`PathHoldings`: what the cache path hands a request besides (Mamba V2's tracking slots, taken by
  :class:`~kvledger.reference.scheduler.tracking.MambaTracking`) and, at release, the lock;
* :class:`KVHoldings`: KV positions and the lengths that name them (``kv_allocated_len``,
  ``kv_committed_len``, ``cache_protected_len``), for an extend, a decode step, a verify's over-allocation
  and the rejected tail;
* a PD decode instance adds its own (the tracking slots it holds with no tracking path), and a new pool
  kind adds one: :meth:`HoldingsCoordinator.add`.

:class:`HoldingsCoordinator` runs them: :meth:`~HoldingsCoordinator.reserve` opens a
:class:`Reservation` that remembers what every manager took for every request, so that
:meth:`Reservation.rollback` gives all of it back and restores every field, and
:meth:`Reservation.commit` keeps it (all or nothing, I-ATOMIC-ADMISSION). Releases go through
:meth:`~HoldingsCoordinator.release`, in the order the event log has always recorded (KV first, the row
last).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import torch

from kvledger.contracts.arith import ceil_to_page, extend_page_plan
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import Owner
from kvledger.contracts.protocols import KVAllocator, MambaStatePool, NodeLike, PagedKVAllocator, ReqRowPool
from kvledger.reference.scheduler.request import Req

Free = Callable[[Any, Owner], None]
"""A pool's ``free`` (its ids argument is the pool's own id type: a tensor or a list of rows)."""

Undo = list[tuple[Free, "torch.Tensor | list[int]", Req]]
"""What a reservation took so far: the ``free`` to call, the ids, whose they are."""


class AllocationFailed(Exception):
    """Raised while a reservation takes memory, to trigger its rollback; never escapes the memory side."""


class HoldingsManager(Protocol):
    """One pool kind's holdings on the request side.

    Invariant: the fields :attr:`fields` names are written by this manager only (a reservation's rollback
    restores them through :meth:`restore`)."""

    name: str
    fields: tuple[str, ...]

    def save(self, req: Req) -> object:
        """What :meth:`restore` needs to put ``req``'s fields back as they are now."""
        ...

    def restore(self, req: Req, saved: object) -> None:
        """Pre: everything taken since :meth:`save` was freed. Post: the fields are as saved."""
        ...

    def take(self, req: Req, undo: Undo) -> None:
        """Admission: take what ``req`` lacks of this kind, appending each take to ``undo`` (a
        :class:`Reservation`'s). Raises :class:`AllocationFailed` (the reservation rolls back) when short."""
        ...

    def release(self, req: Req, tree_len: int) -> None:
        """Give back what ``req`` holds of this kind and clear its fields. ``tree_len``: the KV positions
        below it are the tree's (not the request's to free)."""
        ...


class Reservation:
    """What one all-or-nothing allocation took so far, for a rollback."""

    def __init__(self, reqs: Sequence[Req], managers: Sequence[HoldingsManager]) -> None:
        self.reqs = list(reqs)
        self.managers = tuple(managers)
        self.saved = [[m.save(r) for m in self.managers] for r in self.reqs]
        self.undo: Undo = []
        self.open = True

    def rollback(self) -> None:
        """Free everything taken, newest first, then put every request's fields back.
        Post: each request holds exactly what it held at :meth:`HoldingsCoordinator.reserve`."""
        self._close()
        for free, ids, req in reversed(self.undo):
            free(ids, req.owner)
        for req, saved in zip(self.reqs, self.saved, strict=True):
            for manager, value in zip(self.managers, saved, strict=True):
                manager.restore(req, value)

    def commit(self) -> None:
        """Keep everything taken."""
        self._close()

    def _close(self) -> None:
        if not self.open:
            raise ContractViolation("I-ATOMIC-ADMISSION: a reservation was committed or rolled back twice")
        self.open = False


Inject = Callable[[str], None]
"""Raises :class:`AllocationFailed` when the fault injector fails an allocation of the named kind."""


class RowHoldings:
    """The request's ``req_to_token`` row; at admission the matched prefix is written into it."""

    name = "req"
    fields: tuple[str, ...] = ("req_pool_idx",)

    def __init__(self, rows: ReqRowPool, inject: Inject) -> None:
        self.rows = rows
        self.inject = inject

    def save(self, req: Req) -> object:
        return req.req_pool_idx

    def restore(self, req: Req, saved: object) -> None:
        req.req_pool_idx = cast("int | None", saved)

    def take(self, req: Req, undo: Undo) -> None:
        if req.req_pool_idx is not None:
            return
        self.inject("row")
        rows = self.rows.alloc(1, req.owner)
        if rows is None:
            raise AllocationFailed("row")
        undo.append((self.rows.free, rows, req))
        req.req_pool_idx = row = rows[0]
        if req.prefix_indices is not None and req.prefix_indices.numel():
            self.rows.write(row, 0, req.prefix_indices)

    def release(self, req: Req, tree_len: int) -> None:
        if req.req_pool_idx is not None:
            self.rows.free(req.req_pool_idx, req.owner)
            req.req_pool_idx = None


class MambaSlotHoldings:
    """The request's Mamba working slot (its copy-on-write slot while it waits)."""

    name = "mamba"
    fields: tuple[str, ...] = ("mamba_pool_idx",)

    def __init__(self, pool: MambaStatePool | None, inject: Inject, evict_for: Callable[[int], None]) -> None:
        self.pool = pool
        self.inject = inject
        self.evict_for = evict_for

    def save(self, req: Req) -> object:
        return req.mamba_pool_idx

    def restore(self, req: Req, saved: object) -> None:
        req.mamba_pool_idx = cast("torch.Tensor | None", saved)

    def take(self, req: Req, undo: Undo) -> None:
        if self.pool is None or req.mamba_pool_idx is not None:
            return
        self.inject("mamba")
        self.evict_for(1)
        slot = self.pool.alloc(1, req.owner)
        if slot is None:
            raise AllocationFailed("mamba")
        undo.append((self.pool.free, slot, req))
        req.mamba_pool_idx = slot

    def set_cow(self, req: Req, slot: torch.Tensor | None) -> None:
        """A match copied a cached state into ``slot`` for the waiting request (or it gave its copy back)."""
        req.mamba_pool_idx = slot

    def release(self, req: Req, tree_len: int) -> None:
        if req.mamba_pool_idx is not None:
            self.pool_for(req).free(req.mamba_pool_idx, req.owner)
            req.mamba_pool_idx = None

    def pool_for(self, req: Req) -> MambaStatePool:
        """The Mamba pool, for a request that holds a slot of it (a slot without the pool is a bug)."""
        if self.pool is None:
            raise ContractViolation(
                f"I-REQ-MAMBA: {req.owner!r} holds a Mamba slot, but the scheduler has no Mamba pool"
            )
        return self.pool


class _CachePathSide(Protocol):
    def needs_tracking_slots(self, req: Req) -> bool: ...
    def alloc_tracking_slots(self, req: Req) -> torch.Tensor | None: ...
    def release(self, req: Req) -> None: ...


class PathHoldings:
    """What the cache path hands a request: Mamba V2's tracking slots at admission (their fields are
    written by the path's :class:`~kvledger.reference.scheduler.tracking.MambaTracking`), and at release
    the tracking slots and the lock."""

    name = "path"
    fields: tuple[str, ...] = ("mamba_ping_pong_track_buffer",)

    def __init__(self, path: _CachePathSide, slots: MambaSlotHoldings, inject: Inject) -> None:
        self.path = path
        self.slots = slots
        self.inject = inject

    def save(self, req: Req) -> object:
        return req.mamba_ping_pong_track_buffer

    def restore(self, req: Req, saved: object) -> None:
        req.mamba_ping_pong_track_buffer = cast("torch.Tensor | None", saved)

    def take(self, req: Req, undo: Undo) -> None:
        if not self.path.needs_tracking_slots(req):
            return
        self.inject("mamba")
        track = self.path.alloc_tracking_slots(req)
        if track is None:
            raise AllocationFailed("mamba tracking")
        undo.append((self.slots.pool_for(req).free, track, req))

    def release(self, req: Req, tree_len: int) -> None:
        self.path.release(req)


class KVHoldings:
    """The request's KV: positions ``[cache_protected_len, kv_allocated_len)`` of its row, and the three
    lengths of its ladder (I-REQ-LADDER)."""

    name = "kv"
    fields: tuple[str, ...] = ("kv_allocated_len", "kv_committed_len", "cache_protected_len")

    def __init__(
        self,
        kv: KVAllocator,
        rows: ReqRowPool,
        page_size: int,
        inject: Inject,
        evict_for: Callable[[int], None],
    ) -> None:
        self.kv = kv
        self.rows = rows
        self.page_size = page_size
        self.inject = inject
        self.evict_for = evict_for
        self.last_loc: torch.Tensor | None = None  # the ids the last take wrote into the row

    def save(self, req: Req) -> object:
        return req.kv_allocated_len

    def restore(self, req: Req, saved: object) -> None:
        allocated = cast(int, saved)
        row = req.req_pool_idx
        if row is not None and req.kv_allocated_len > allocated:
            self.rows.forget_tail(row, allocated)  # the cells written since are stale
        req.kv_allocated_len = allocated

    def take(self, req: Req, undo: Undo) -> None:
        """Admission: KV up to ``kv_committed_len + extend_input_len`` (after the row manager's take)."""
        start, end = req.kv_allocated_len, req.kv_committed_len + req.extend_input_len
        self.inject("kv")
        if self.page_size == 1:
            self.evict_for(end - start)
        else:
            self.evict_for(extend_page_plan(start, end, self.page_size)[1] * self.page_size)
        if self.grow(req, end, undo) is None:
            raise AllocationFailed("kv")

    def grow(self, req: Req, end: int, undo: Undo) -> torch.Tensor | None:
        """KV for positions ``[kv_allocated_len, end)`` of the request's row (an extend, or a verify's
        over-allocation); returns the ids taken off the free list, None (nothing changed) when short.
        The ids written into the row are left in :attr:`last_loc`."""
        row = _row(req)
        start = req.kv_allocated_len
        if self.page_size == 1:
            loc = self.kv.alloc(end - start, req.owner)
            new = loc
        else:
            last = int(self.rows.read(row, start - 1, start)[0]) if start else -1
            paged = cast(PagedKVAllocator, self.kv)  # page_size > 1: the paged allocator
            loc = paged.alloc_extend([start], [end], [last], [req.owner])
            new = None if loc is None else loc[min(end, ceil_to_page(start, self.page_size)) - start :]
        if loc is None or new is None:
            return None
        if new.numel():
            undo.append((self.kv.free, new, req))
        self.rows.write(row, start, loc)
        req.kv_allocated_len = end
        self.last_loc = loc
        return new

    def decode(self, reqs: Sequence[Req]) -> torch.Tensor | None:
        """One KV slot per request (a new page when the token opens one), all or none (the allocator's
        ``alloc_decode`` is itself all or nothing); the new token is committed at once."""
        rows = [_row(r) for r in reqs]
        positions = [r.kv_allocated_len for r in reqs]
        if self.page_size == 1:
            last_locs = [-1] * len(reqs)  # every decode token opens its own "page": nothing to continue
        else:
            last_locs = self.rows.read_each(rows, [p - 1 for p in positions]).tolist()
        out = self.kv.alloc_decode([p + 1 for p in positions], last_locs, [r.owner for r in reqs])
        if out is None:
            return None
        self.rows.write_each(rows, positions, out)
        for req in reqs:
            req.kv_allocated_len += 1
            req.kv_committed_len = req.kv_allocated_len
        return out

    def commit_all(self, req: Req) -> None:
        """An extend ran: everything allocated is computed."""
        req.kv_committed_len = req.kv_allocated_len

    def set_committed(self, req: Req, committed: int) -> None:
        """A verify's results: ``committed`` positions have their KV computed (the rest is a draft tail)."""
        req.kv_committed_len = committed

    @staticmethod
    def set_matched(req: Req, prefix: torch.Tensor | None, last_node: NodeLike | None) -> None:
        """A match (or a PD pre-allocation's locked prefix; None: none): ``prefix``, the tree's KV ids
        ending at ``last_node``, is computed and the request's to read; nothing else is allocated yet."""
        req.prefix_indices = prefix
        req.last_node = last_node
        n = 0 if prefix is None else int(prefix.numel())
        req.cache_protected_len = req.kv_committed_len = req.kv_allocated_len = n

    def shrink_to(self, req: Req, keep: int) -> int:
        """Give back the KV above ``keep`` (whole pages beyond its page); returns the ids freed."""
        row = _row(req)
        first = ceil_to_page(keep, self.page_size)
        freed = 0
        if req.kv_allocated_len > first:
            tail = self.rows.read(row, first, req.kv_allocated_len)
            self.kv.free(tail, req.owner)
            freed = int(tail.numel())
        self.rows.forget_tail(row, keep)  # the positions above are stale
        req.kv_allocated_len = keep
        return freed

    def release(self, req: Req, tree_len: int) -> None:
        """Free ``[tree_len, kv_allocated_len)`` (page-ceiled); the lengths are cleared by :meth:`clear`,
        once the other managers (which read the row) are done."""
        if req.req_pool_idx is not None and req.kv_allocated_len > tree_len:
            tail = self.rows.read(req.req_pool_idx, tree_len, req.kv_allocated_len)
            self.kv.free(tail, req.owner)

    @staticmethod
    def clear(req: Req) -> None:
        """After a release: no match, no prefix, no lengths."""
        req.last_node = None
        req.prefix_indices = None
        req.cache_protected_len = req.kv_committed_len = req.kv_allocated_len = 0


def _row(req: Req) -> int:
    """The row of a request that allocates KV (one without is a bug, not a missing value)."""
    if req.req_pool_idx is None:
        raise ContractViolation(f"I-HANDLE-OWNED: {req.owner!r} allocates KV without a row: {req!r}")
    return req.req_pool_idx


class HoldingsCoordinator:
    """The managers of one scheduler, in admission order (``row, mamba, path, kv``, then added kinds).

    Invariant: every manager appears once in :attr:`admit_order` (what admission takes, in order) and at
    most once in :attr:`release_order` (KV, Mamba working slot, path, added kinds, row)."""

    def __init__(self, row: RowHoldings, mamba: MambaSlotHoldings, path: PathHoldings, kv: KVHoldings) -> None:
        self.row, self.mamba, self.path, self.kv = row, mamba, path, kv
        self.admit_order: list[HoldingsManager] = [row, mamba, path, kv]
        self.release_order: list[HoldingsManager] = [kv, mamba, path, row]

    def add(self, manager: HoldingsManager, *, first: bool = False, released_here: bool = True) -> None:
        """A new kind's manager. Admission takes it after the others (``first``: before them) and
        :meth:`release` frees it before the row (``released_here=False``: the scheduler that added it calls
        the manager's release itself, where its own release path needs it). Pre: no manager of that name."""
        if any(m.name == manager.name for m in self.admit_order):
            raise ValueError(f"a holdings manager for {manager.name!r} is already registered")
        if first:
            self.admit_order.insert(0, manager)
        else:
            self.admit_order.append(manager)
        if released_here:
            self.release_order.insert(len(self.release_order) - 1, manager)

    def manager(self, name: str) -> HoldingsManager:
        """The manager of kind ``name`` (KeyError: none)."""
        for m in self.admit_order:
            if m.name == name:
                return m
        raise KeyError(name)

    def reserve(self, reqs: Sequence[Req]) -> Reservation:
        """Open an all-or-nothing allocation over ``reqs``: commit it or roll it back."""
        return Reservation(reqs, self.admit_order)

    def take(self, req: Req, undo: Undo) -> torch.Tensor:
        """Admission of ``req`` (``undo``: its reservation's): every kind it lacks; returns the KV ids its
        extend writes."""
        for manager in self.admit_order:
            manager.take(req, undo)
        loc = self.kv.last_loc
        assert loc is not None
        return loc

    def release(self, req: Req, tree_len: int) -> None:
        """Give back everything ``req`` holds (the KV below ``tree_len`` is the tree's), clear every field."""
        for manager in self.release_order:
            manager.release(req, tree_len)
        self.kv.clear(req)
