"""Load-back on a host hit: device slots reserved, the copy in flight, committed only once it landed.

SGLang's ``HiRadixCache.load_back`` asks the device allocator for ``host_hit_length`` slots, queues the
host -> device copy on the cache controller (``load``), and the scheduler starts the request's forward
only after ``ready_to_load_host_cache`` / the load's event fired. Here the transfer is modelled
explicitly, with an injectable delay (in :meth:`LoadBack.poll` calls) and an injectable failure:

* :meth:`LoadBack.start` takes device slots the caller already holds for the request (reserved through
  the holdings coordinator in a scheduler: the load-back opens no second allocation path), pins the
  host copies it reads (host eviction may not free them: I-HOST-EVICT-PINNED) and poisons the device
  slots, which are *pending* until the copy lands;
* :meth:`LoadBack.poll` advances the transfer clock: a due load lands (contents through
  :func:`kvledger.kernels.transfer_slots`) or fails (nothing landed: the caller's slots stay poisoned);
* :meth:`LoadBack.commit` puts a landed load into the tree (the request's slots become the new leaf's,
  the host copies back it again: residency both); a load that has not landed is refused
  (I-HOST-LOAD-ATOMIC); :meth:`LoadBack.abort` rolls one back at any point before its commit;
* :meth:`LoadBack.check_readable` is what a reader calls before a forward: a pending slot is never read
  (I-HOST-LOAD-PENDING).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvledger import kernels
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.owners import Owner
from kvledger.reference.hicache.component import HostKVComponent
from kvledger.reference.hicache.copies import HostHit
from kvledger.reference.radix import RadixCache
from kvledger.reference.radix.results import MatchResult

PENDING, LANDED, COMMITTED, ABORTED, FAILED = "pending", "landed", "committed", "aborted", "failed"

_load_ids = itertools.count(1)


@dataclass(eq=False)
class PendingLoad:
    """One load-back: ``hit``'s host copies -> ``device_ids`` (held by ``owner``), due at ``due``."""

    id: int
    key: tuple[int, ...]
    hit: HostHit
    device_ids: torch.Tensor
    owner: Owner
    due: int
    fail: bool
    state: str = PENDING


def match_with_host(
    tree: RadixCache, comp: HostKVComponent, key: Sequence[int]
) -> tuple[MatchResult, HostHit]:
    """The device match (the tree's ``match_prefix``) and the host-only tail beyond it."""
    result = tree.match_prefix(key)
    return result, comp.match_host(key, result.device_indices.numel(), tree.page_size)


class LoadBack:
    """The host -> device transfers of one host tier, with their in-flight state."""

    def __init__(
        self,
        tree: RadixCache,
        comp: HostKVComponent,
        *,
        delay: int = 1,
        fails: Callable[[PendingLoad], bool] | None = None,
    ) -> None:
        """``delay``: polls until a load lands (0: it lands at the next poll too); ``fails``: which loads
        the transfer loses (failure injection; None: none)."""
        if not isinstance(delay, int) or delay < 0:
            raise InvalidArgument(f"load_back: delay must be an int >= 0, got {delay!r}")
        self.tree, self.comp = tree, comp
        self.delay = delay
        self.fails = fails
        self.clock = 0
        self.loads: dict[int, PendingLoad] = {}
        self.pending_slots: set[int] = set()

    def start(self, key: Sequence[int], hit: HostHit, device_ids: torch.Tensor, owner: Owner) -> PendingLoad:
        """Begin loading ``hit`` into ``device_ids`` (``owner``'s, one per host token). Pre (typed error,
        nothing changed): a non-empty hit, as many slots as it has tokens, none already pending."""
        n = hit.host_len
        if not n or device_ids.dim() != 1 or device_ids.numel() != n:
            raise InvalidArgument(
                f"load_back: {device_ids.numel()} device slots for a host hit of {n} tokens"
            )
        ids = device_ids.tolist()
        if len(set(ids)) != n or self.pending_slots.intersection(ids):
            raise InvalidArgument(f"load_back: device slots {ids} repeat or are already pending")
        load = PendingLoad(
            next(_load_ids), tuple(key), hit, device_ids, owner, self.clock + self.delay, False
        )
        load.fail = bool(self.fails and self.fails(load))
        for copy in hit.copies():
            self.comp.pin(copy)
        kernels.poison_slots(self.comp.device_buffer, device_ids)
        self.pending_slots.update(ids)
        self.loads[load.id] = load
        return load

    def poll(self) -> list[PendingLoad]:
        """One tick of the transfer engine: every due load lands or fails. Returns those that changed."""
        self.clock += 1
        done = [ld for ld in self.loads.values() if ld.state == PENDING and ld.due < self.clock]
        for load in done:
            if load.fail:
                self._release(load, FAILED)
                continue
            kernels.transfer_slots(
                self.comp.pool.buffer, load.hit.host_ids(), self.comp.device_buffer, load.device_ids
            )
            self.pending_slots.difference_update(load.device_ids.tolist())
            load.state = LANDED
        return done

    def commit(self, load: PendingLoad, prefix_value: torch.Tensor, protected_len: int) -> int:
        """Insert a landed load into the tree: ``key[:device_len + host_len]`` -> ``prefix_value`` (the
        device match's ids, of which ``protected_len`` the caller locks) + the loaded slots, adopted from
        ``load.owner``. Returns the insert's ``prefix_len``."""
        if load.state != LANDED:
            raise ContractViolation(
                f"I-HOST-LOAD-ATOMIC: load #{load.id} committed while {load.state}"
                f" (device slots {load.device_ids.tolist()[:8]} of {load.owner.kind}:{load.owner.key})"
            )
        self._release(load, COMMITTED)
        end = load.hit.device_len + load.hit.host_len
        value = torch.cat([prefix_value.to(load.device_ids.device), load.device_ids])
        return self.tree.insert(load.key[:end], value, load.owner, protected_len)

    def abort(self, load: PendingLoad) -> None:
        """Roll a load back before its commit (a request aborted or retracted): the host copies are unpinned
        and nothing enters the tree; the device slots stay the caller's to free."""
        if load.state not in (PENDING, LANDED):
            raise InvalidArgument(f"abort: load #{load.id} is {load.state}")
        self._release(load, ABORTED)

    def _release(self, load: PendingLoad, state: str) -> None:
        for copy in load.hit.copies():
            self.comp.unpin(copy)
        self.pending_slots.difference_update(load.device_ids.tolist())
        load.state = state
        del self.loads[load.id]

    def check_readable(self, device_ids: torch.Tensor, reader: str = "forward") -> None:
        """A reader of ``device_ids`` must not see a slot whose load is pending (ContractViolation)."""
        pending = self.pending_slots.intersection(device_ids.tolist())
        if pending:
            loads = [ld.id for ld in self.loads.values() if pending.intersection(ld.device_ids.tolist())]
            raise ContractViolation(
                f"I-HOST-LOAD-PENDING: {reader} reads device slots {sorted(pending)[:8]} of pending load(s) {loads}"
            )
