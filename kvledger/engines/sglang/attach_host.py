"""SGLang's host-memory pools (HiCache's second tier) under a kvledger ledger.

0.5.23's host pools (``MHATokenToKVPoolHost`` for KV pages, ``MambaPoolHost`` for Mamba states; both
``HostKVCache``) hand out host slots with ``alloc(need_size)`` and take them back with ``free(indices)``.
Neither knows who holds a slot: a node's host copy, a write-back still in flight, or nobody. The KV pool
keeps one ``slot_used`` flag per slot and asserts it on free, which misses an id repeated inside one
``free`` (every flag reads "used" before any is cleared, and the id is pushed twice onto the free list);
``MambaPoolHost.free`` checks nothing. :func:`watch_host` puts one :class:`~kvledger.contracts.ledger.Ledger`
per host pool over its pages (the pool's page size is the ledger's unit), with three kinds of owner:

* the free list;
* ``host_write`` of node N: host slots ``HiCacheController.write`` allocated for node N's backup, the
  device-to-host copy in flight (account ``host.write_inflight``);
* ``node_host`` of node N: the host copy of tree node N, once the write's ack has landed
  (:meth:`HostWatch.commit_backup`; account ``host.cached``).

Wrapped on the instances (SGLang's classes untouched; :meth:`HostWatch.detach` removes them): the pool's
``alloc`` and ``free``, and, when a controller is given, ``HiCacheController.write`` (its host
allocation goes to ``host_write`` of its ``node_id``), ``load`` (its device allocation goes to the device
watch's holder ``load:<node_id>``) and ``evict_host`` (its frees must come from node host copies). Each
move is checked before SGLang's own code runs: a slot freed twice (across calls or repeated in one call)
is I-NODUP-FREE, a free of a slot its claimed owner does not hold is I-EXCLUSIVE, a node whose host copy
the tree dropped but that still holds host slots leaked them (I-OWNER-RELEASE, :meth:`node_dropped`),
and at the end every host slot is free or a node's host copy (I-IDLE-IDENTITY, :meth:`check_idle`).
:meth:`audit` recounts the pool's own free list (``free_slots`` + ``release_slots``, and ``slot_used`` on
the KV pool) against the ledger (I-PARTITION).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.ledger import FREE_CODE, Ledger, as_id_array
from kvledger.contracts.owners import FREE_LIST, Account, Owner
from kvledger.engines.sglang.attach_pools import Wrapped, page_ids
from kvledger.engines.sglang.leaks import check_everything_came_back, check_released, returned

HOST_CACHED = Account("host.cached")
HOST_WRITE_INFLIGHT = Account("host.write_inflight")
HOST_CALLER = Account("host.caller")


class HostWatch:
    """A ledger over one SGLang host pool's pages (and the controller's calls that move them).
    Build with :func:`watch_host`.

    Invariant: after every watched call, each page of the pool has exactly one owner in :attr:`ledger`
    (free, a write in flight, or a node's host copy) and the pool's own free count equals the ledger's.
    """

    def __init__(
        self, host_pool: Any, *, label: str, audit_each: bool, controller: Any = None, device: Any = None
    ) -> None:
        self.pool = host_pool
        self.label = label
        self.audit_each = audit_each
        self.page_size = int(getattr(host_pool, "logical_page_size", host_pool.page_size))
        size = int(getattr(host_pool, "logical_size", host_pool.size))
        self.ledger = Ledger(label, range(0, size // self.page_size), unit=self.page_size)
        self.caller = Owner("host_caller", label, HOST_CALLER)
        self._acting: Owner = self.caller  # who allocations go to and frees come from
        self._evicting = 0  # > 0 inside evict_host: frees come from node host copies
        self._owners: dict[tuple[str, Any], Owner] = {}
        self._wrapped: list[Wrapped] = []
        self.device: Any = None  # the device Watch a controller's load allocates under
        self.calls = 0
        self._attach_pool()
        if controller is not None:
            self._attach_controller(controller, device)

    # ------------------------------------------------------------------ owners
    def _owner(self, kind: str, node_id: Any, account: Account) -> Owner:
        owner = self._owners.get((kind, node_id))
        if owner is None:
            owner = self._owners[(kind, node_id)] = Owner(kind, node_id, account)
        return owner

    def writing(self, node_id: Any) -> Owner:
        """The owner of the host slots of node ``node_id``'s backup while its copy is in flight."""
        return self._owner("host_write", node_id, HOST_WRITE_INFLIGHT)

    def node_host(self, node_id: Any) -> Owner:
        """The owner of node ``node_id``'s host copy (its ``host_value``)."""
        return self._owner("node_host", node_id, HOST_CACHED)

    @contextlib.contextmanager
    def acting_for(self, owner: Owner) -> Iterator[Owner]:
        """Inside the block the pool's allocations go to ``owner`` and its frees must come from it."""
        if not isinstance(owner, Owner):
            raise InvalidArgument(f"HostWatch.acting_for: an Owner, got {type(owner).__name__}")
        previous, self._acting = self._acting, owner
        try:
            yield owner
        finally:
            self._acting = previous

    # ------------------------------------------------------------------ the tree's statements
    def commit_backup(self, node_id: Any, host_indices: Any) -> None:
        """The write of node ``node_id`` landed (its ack was taken): its slots become the node's host copy.
        Pre: every page is held by :meth:`writing` (``node_id``); else ContractViolation, nothing moved."""
        pages = self._pages(host_indices)
        self.ledger.transfer(pages, self.writing(node_id), self.node_host(node_id), "write ack (host copy)")
        self._after()

    def node_dropped(self, node_id: Any) -> None:
        """The tree dropped node ``node_id``'s host copy (host eviction, or the node deleted): it must hold
        no host slot now (I-OWNER-RELEASE), nor may its write still hold any."""
        owners = [self.node_host(node_id), self.writing(node_id)]
        for owner in owners:  # no longer the tree's: what it still holds is a leak from now on
            self._owners.pop((owner.kind, node_id), None)
        for owner in owners:
            check_released({self.label: self.ledger}, owner)

    # ------------------------------------------------------------------ wrappers
    def _pages(self, indices: Any) -> np.ndarray:
        a = as_id_array(indices)
        if (
            self.page_size > 1
            and a.size
            and (a.size % self.page_size or np.any(a[:: self.page_size] % self.page_size))
        ):
            raise ContractViolation(
                self.ledger.describe(
                    sorted(set((a // self.page_size).tolist()))[:4],
                    f"host indices {a.tolist()[:16]} are not whole pages of {self.page_size} slots (I-PARTITION)",
                )
            )
        return page_ids(a, self.page_size)

    def _wrapper(self, obj: Any) -> Wrapped:
        w = Wrapped(obj)
        self._wrapped.append(w)
        return w

    def _attach_pool(self) -> None:
        w = self._wrapper(self.pool)
        w.wrap("alloc", self._alloc)
        w.wrap("free", self._free)

    def _alloc(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def alloc(need_size: int, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            out = original(need_size, *args, **kwargs)
            if out is None:
                return out
            pages = self._pages(out)
            self.ledger.transfer(pages, FREE_LIST, self._acting, f"{self.label}.alloc")
            self._after()
            return out

        return alloc

    def _free(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def free(indices: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            a = as_id_array(indices)
            if not a.size:
                return original(indices, *args, **kwargs)
            pages = self._pages(a)
            self._refuse_repeats(a)
            for src, group in self._sources(pages):
                self.ledger.transfer(group, src, FREE_LIST, f"{self.label}.free")
            before = int(self.pool.available_size())
            out = original(indices, *args, **kwargs)
            grew = (int(self.pool.available_size()) - before) // self.page_size
            returned(self.ledger, f"{self.label}.free", pages, grew)
            self._after()
            return out

        return free

    def _refuse_repeats(self, a: np.ndarray) -> None:
        """An id repeated within one free: SGLang's ``slot_used`` check passes it and the free list gets
        it twice (a later double hand-out); the ledger names it here, before SGLang's free runs."""
        uniq, counts = np.unique(a, return_counts=True)
        if uniq.size == a.size:
            return
        rep = uniq[counts > 1]
        pages = sorted(set((rep // self.page_size).tolist()))
        raise ContractViolation(
            self.ledger.describe(
                pages[:4],
                f"{self.label}.free: host slot(s) {rep.tolist()[:8]} (page(s) {pages[:8]}) repeated within one"
                " free: freed twice (I-NODUP-FREE)",
            )
        )

    def _sources(self, pages: np.ndarray) -> list[tuple[Owner, np.ndarray]]:
        """Who a free takes ``pages`` from: the acting owner, or, inside ``evict_host``, the node host
        copies that hold them (a page no node holds is named as the acting owner's, so the move fails)."""
        if not self._evicting:
            return [(self._acting, pages)]
        codes = self.ledger.owner_codes.take(pages, mode="clip")
        groups: list[tuple[Owner, np.ndarray]] = []
        for code in np.unique(codes).tolist():
            group = pages[codes == code]
            owner = None if code == FREE_CODE else self.ledger.owner_of(int(group[0]))
            if owner is None or owner.kind != "node_host":
                # a free page (freed twice) or one a write still holds: the move from a node copy fails
                groups.insert(0, (self.node_host("<no node holds it>"), group))
            else:
                groups.append((owner, group))
        return groups

    def _attach_controller(self, controller: Any, device: Any) -> None:
        self.device = device
        w = self._wrapper(controller)
        w.wrap("write", self._controller_write)
        w.wrap("evict_host", self._controller_evict_host)
        if device is not None:
            w.wrap("load", self._controller_load)

    def _controller_write(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def write(device_indices: Any, *args: Any, node_id: Any = -1, **kwargs: Any) -> Any:
            with self.acting_for(self.writing(node_id)):
                return original(device_indices, *args, node_id=node_id, **kwargs)

        return write

    def _controller_evict_host(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def evict_host(host_indices: Any, *args: Any, **kwargs: Any) -> Any:
            self._evicting += 1
            try:
                return original(host_indices, *args, **kwargs)
            finally:
                self._evicting -= 1

        return evict_host

    def _controller_load(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def load(host_indices: Any, *args: Any, node_id: Any = -1, **kwargs: Any) -> Any:
            with self.device.holder(f"load:{node_id}"):
                return original(host_indices, *args, node_id=node_id, **kwargs)

        return load

    def detach(self) -> None:
        """Remove every wrapper: the objects behave exactly as before :func:`watch_host`."""
        for w in self._wrapped:
            w.undo()
        self._wrapped.clear()

    # ------------------------------------------------------------------ audits
    def _after(self) -> None:
        if self.audit_each:
            self.audit()

    def pool_free_slots(self) -> np.ndarray:
        """The slots on the pool's own free list (``free_slots`` and the lazily merged ``release_slots``)."""
        parts = [self.pool.free_slots, *self.pool.release_slots]
        return as_id_array(torch.cat([p.reshape(-1).cpu() for p in parts]))

    def audit(self) -> None:
        """Recount the pool's free list against the ledger (I-PARTITION, O(pool)); raises ContractViolation."""
        slots = self.pool_free_slots()
        uniq_slots, counts = np.unique(slots, return_counts=True)
        if uniq_slots.size != slots.size:
            twice = uniq_slots[counts > 1]
            pages = sorted(set((twice // self.page_size).tolist()))
            raise ContractViolation(
                self.ledger.describe(
                    pages[:4],
                    f"host slot(s) {twice.tolist()[:8]} are on the pool's free list twice:"
                    " the next allocations hand them out twice (I-PARTITION)",
                )
            )
        uniq = np.unique(uniq_slots // self.page_size)
        mine = self.ledger.holdings(FREE_LIST)
        theirs = set(uniq.tolist())
        if theirs != mine:
            diff = sorted(theirs ^ mine)
            raise ContractViolation(
                self.ledger.describe(
                    diff[:4],
                    f"the pool's free list and the ledger disagree (I-PARTITION): free in the pool"
                    f" only {sorted(theirs - mine)[:8]}, free in the ledger only {sorted(mine - theirs)[:8]}",
                )
            )
        used = getattr(self.pool, "slot_used", None)
        if used is not None:
            used_pages = set((as_id_array(torch.nonzero(used).reshape(-1)) // self.page_size).tolist())
            if used_pages & theirs:
                bad = sorted(used_pages & theirs)
                raise ContractViolation(
                    self.ledger.describe(bad[:4], "pages both free and slot_used (I-PARTITION)")
                )

    def check_idle(self) -> None:
        """The end of a run: every host page is free or a node's host copy, none in a write still in flight,
        none the caller's (free + cached == size, I-IDLE-IDENTITY), then :meth:`audit`."""
        cached = [o for (kind, _), o in self._owners.items() if kind == "node_host"]
        check_everything_came_back({self.label: self.ledger}, cached, {})
        self.audit()


def watch_host(
    host_pool: Any,
    *,
    controller: Any = None,
    device: Any = None,
    label: str | None = None,
    audit_each: bool = False,
) -> HostWatch:
    """Attach a ledger to SGLang host pool ``host_pool`` (a ``HostKVCache``: ``MHATokenToKVPoolHost``,
    ``MambaPoolHost``) and return the :class:`HostWatch`.

    ``controller``: the ``HiCacheController`` over that pool (its ``write``, ``load`` and ``evict_host``
    attribute their moves); ``device``: the device :class:`~kvledger.engines.sglang.attach.Watch` over the
    controller's device allocator (a load-back's device slots go to its holder ``load:<node_id>``).
    """
    for name in ("alloc", "free", "available_size", "free_slots", "release_slots", "page_size"):
        if not hasattr(host_pool, name):
            raise InvalidArgument(f"watch_host: {type(host_pool).__name__} is not a host pool (no {name!r})")
    if controller is not None and getattr(controller, "mem_pool_host", None) is not host_pool:
        raise InvalidArgument("watch_host: the controller's mem_pool_host is not the given host pool")
    if int(host_pool.available_size()) != int(getattr(host_pool, "logical_size", host_pool.size)):
        raise InvalidArgument("watch_host: attach to a host pool with every slot free (after clear())")
    return HostWatch(
        host_pool,
        label=label or type(host_pool).__name__,
        audit_each=audit_each,
        controller=controller,
        device=device,
    )
