"""``TokenToKVPoolAllocator``: token-granular KV slots (page size 1), SGLang's semantics with owners.

Slot 0 is reserved padding; slots ``1..size`` are handed out. ``alloc(n)`` is all-or-nothing and
returns None when short; ``free`` refuses a double free, an out-of-range or reserved id, a repeated id
and (with the ledger on) a slot held by another owner, each with a typed error and no change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import FREE, Owner
from kvledger.contracts.switch import ensure, invariant, snapshot
from kvledger.reference.pools.base import IdPool
from kvledger.reference.pools.id_free_list import FreeListSnapshot, IdFreeList
from kvledger.reference.pools.kv_buffer import check_kv_buffer
from kvledger.reference.pools.validate import (
    as_index_tensor,
    check_count,
    check_decode_batch,
    check_owner,
    check_positive,
    check_snapshot,
    ids_within,
)


def _ledger_agrees(ids: IdFreeList) -> bool:
    """I-COUNT for a pool: the ledger's FREE account equals the pool's own free list length."""
    return not ids.ledger.enabled or ids.ledger.count(FREE) == ids.available()


@invariant(
    lambda self: _ledger_agrees(self._ids),
    "I-COUNT: ledger free account == available_size()",
    error=lambda self: self._ids.ledger_disagreement("I-COUNT: ledger free account != available_size()"),
)
@invariant(lambda self: 0 <= self._ids.available() + self._ids.pending_count() <= self.size, "I-CAP")
class TokenToKVPoolAllocator(IdPool):
    """KV token slots ``1..size`` on ``device``; slot 0 is the padding slot kernels may write to."""

    page_size = 1

    def __init__(
        self, size: int, *, device: str | torch.device = "cpu", name: str = "kv", checks: CheckLevel | None = None
    ) -> None:
        check_positive(size, "size")
        self.size = size
        self._ids = self._init_pool(name, device, 1, size, reuse="fifo", checks=checks)
        self._free_what = f"{name}.free"
        self._on_cpu = self.device.type == "cpu"

    @snapshot(lambda self: self._ids.available(), name="available")
    @ensure(lambda self, n, result: result is None or result.numel() == n)
    @ensure(lambda self, n, OLD, result: (result is None) == (n > OLD.available))
    @ensure(lambda self, n, OLD, result: result is None or self.available_size() == OLD.available - n)
    @ensure(lambda self, result: result is None or ids_within(result, 1, self.size))
    @ensure(
        lambda self, OLD, result: result is not None or self.available_size() == OLD.available,
        "I-NO-PARTIAL: a refused allocation changes nothing",
    )
    def alloc(self, n: int, owner: Owner) -> torch.Tensor | None:
        """``n`` slots for ``owner`` (int64, on the pool's device), or None if fewer than ``n`` are free."""
        check_count(n)
        if type(owner) is not Owner:  # one comparison on the fast path
            check_owner(owner)
        return self._ids.alloc(n, owner)

    @snapshot(lambda self: self._ids.available(), name="available")
    @ensure(
        lambda self, owners, OLD, result: (
            self._ids.available() == OLD.available and len(owners) > OLD.available
            if result is None
            else result.numel() == len(owners) and self._ids.available() == OLD.available - len(owners)
        ),
        "all or nothing: one slot per owner taken off the free list, or None (nothing taken) when short",
    )
    @ensure(
        lambda self, owners, result: (
            result is None
            or (
                ids_within(result, 1, self.size)
                and (not self._ids.ledger.enabled or self._ids.ledger.all_held_each(result, owners))
            )
        ),
        "each owner holds the slot handed to it, a slot of the pool",
    )
    def alloc_decode(
        self, seq_lens: Sequence[int], last_loc: Sequence[int], owners: Sequence[Owner]
    ) -> torch.Tensor | None:
        """One slot per request for a decode step (``owners[i]`` gets ``result[i]``), all or none.

        The same signature as :meth:`PagedTokenToKVPoolAllocator.alloc_decode`; at page size 1 every new
        token opens a new "page", so ``last_loc`` is not read. One call (one ledger check) for the batch.
        """
        check_decode_batch(seq_lens, last_loc, owners, self.name)
        return self._ids.alloc_each(owners, "alloc_decode")

    @snapshot(lambda self: self._ids.available() + self._ids.pending_count(), name="reclaimable")
    @ensure(
        lambda self, ids, OLD: (
            self._ids.available() + self._ids.pending_count()
            == OLD.reclaimable + as_index_tensor(ids, self.device, "free").numel()
        ),
        "every freed slot is free or pending exactly once",
    )
    def free(self, ids: Any, owner: Owner) -> None:
        """Return ``owner``'s slots. Inside a free group they are buffered until ``free_group_end``."""
        # A 1-D int64 CPU tensor (what alloc returns) skips as_index_tensor's call (issue 38: release's free).
        if type(ids) is torch.Tensor and ids.dtype is torch.int64 and ids.is_cpu and self._on_cpu and ids.dim() == 1:
            t = ids
        else:
            t = as_index_tensor(ids, self.device, self._free_what)
        if type(owner) is not Owner:  # one comparison on the fast path
            check_owner(owner)
        self._ids.free_checked(t, owner, "free", "slot")

    def _free_unchecked(self, ids: torch.Tensor, owner: Owner, op: str = "free") -> None:
        """Release without input validation: the path internal callers use once they have validated.

        Only the ledger stands between a bookkeeping bug here and a corrupted free list, which is the
        point: with contracts on, a wrong owner or a double free raises ContractViolation.
        """
        self._ids.release(ids, owner, op)

    def attach_kv_buffer(self, buffer: Any) -> None:
        """Debug builds (a real ledger): zero KV slots when handed out, poison them when given back."""
        check_kv_buffer(buffer, self.size + 1, self.device, self.name)
        if self._ids.ledger.debug:
            self._ids.on_alloc = buffer.zero_slots
            self._ids.on_release = buffer.poison_slots

    def free_group_begin(self) -> None:
        self._ids.free_group_begin()

    def free_group_end(self) -> None:
        self._ids.free_group_end()

    def backup_state(self) -> FreeListSnapshot:
        return self._ids.backup()

    def restore_state(self, state: FreeListSnapshot) -> None:
        self._ids.restore(check_snapshot(state, self.name))
