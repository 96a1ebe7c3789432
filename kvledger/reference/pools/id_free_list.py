"""The free list every pool is built on: ids, their free/held state, free groups, backup/restore.

One implementation of alloc/free for token slots, pages, request rows and Mamba slots, so the ownership
rules are written once. Control plane only: it hands out and takes back ids, never touches tensor
contents (the pools do that through ``kvledger.kernels``).

Each id is in one of four states, kept in a ``uint8`` tensor beside the free list so that a double
free is detected in O(len(ids)) without scanning the list:

* ``FREE``: on the free list; ``HELD``: handed out; ``PENDING``: freed inside an open free group,
  back on the free list at ``free_group_end``; ``RESERVED``: padding ids (0) never handed out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvledger.contracts.errors import DoubleFree, FreeGroupError, StaleSnapshot
from kvledger.contracts.ledger import AnyLedger, as_id_list, make_ledger
from kvledger.contracts.owners import FREE_LIST, Owner
from kvledger.reference.pools.validate import check_in_range, check_unique

HELD, FREE, PENDING, RESERVED = 0, 1, 2, 3


@dataclass(frozen=True)
class FreeListSnapshot:
    """What ``backup_state`` returns: the free list at that moment (speculative rollback point)."""

    free: torch.Tensor
    owner: object  # the IdFreeList it came from; restoring into another pool is refused


class IdFreeList:
    """Ids ``first .. first+count-1`` of pool ``name``; ids below ``first`` are reserved padding.

    ``reuse`` is part of the contract (I-REUSE-ORDER) (vLLM #51482 shows reuse order matters): ``"fifo"`` appends freed
    ids at the tail (SGLang's token allocator and Mamba pool), ``"lifo"`` puts them at the head
    (SGLang's paged allocator).
    """

    def __init__(
        self, name: str, first: int, count: int, device: torch.device, *, unit: int = 1, reuse: str = "fifo"
    ) -> None:
        if reuse not in ("fifo", "lifo"):
            raise ValueError(f"reuse must be 'fifo' or 'lifo', got {reuse!r}")
        self.name = name
        self.first = first
        self.last = first + count - 1
        self.count = count
        self.device = device
        self.reuse = reuse
        self.free = torch.arange(first, first + count, dtype=torch.int64, device=device)
        self.state = torch.full((first + count,), FREE, dtype=torch.uint8, device=device)
        self.state[:first] = RESERVED
        self.pending: list[torch.Tensor] | None = None
        self.ledger: AnyLedger = make_ledger(name, range(first, first + count), unit=unit)
        # Data-plane hooks the owning pool installs: zero what is handed out, poison what comes back
        # (debug builds), so a stale read of a freed slot is visible in the data (I-POISON-ON-FREE).
        self.on_alloc: Callable[[torch.Tensor], None] | None = None
        self.on_release: Callable[[torch.Tensor], None] | None = None

    # ------------------------------------------------------------------ queries
    def available(self) -> int:
        return int(self.free.numel())

    def pending_count(self) -> int:
        return 0 if self.pending is None else sum(int(t.numel()) for t in self.pending)

    def in_free_group(self) -> bool:
        return self.pending is not None

    # ------------------------------------------------------------------ alloc
    def alloc(self, n: int, owner: Owner, op: str = "alloc") -> torch.Tensor | None:
        """Take ``n`` ids off the front, all or nothing (None when fewer are free)."""
        if n > self.free.numel():
            return None
        out = self.free[:n]
        self.ledger.transfer(out, FREE_LIST, owner, op)
        self.free = self.free[n:]
        self.state[out] = HELD
        if self.on_alloc is not None and n:
            self.on_alloc(out)
        return out

    # ------------------------------------------------------------------ free
    def validate_release(self, ids: torch.Tensor, owner: Owner, op: str, unit: str = "id") -> None:
        """Everything that makes a free bad input, checked before any change."""
        check_in_range(ids, self.first, self.last, self.name, unit)
        check_unique(ids, self.name, unit)
        if ids.numel():
            states = self.state[ids]
            not_held = states != HELD
            if bool(not_held.any()):
                bad = ids[not_held][:8].tolist()
                where = [
                    "free" if s == FREE else "pending in a free group" for s in states[not_held][:8].tolist()
                ]
                raise DoubleFree(
                    f"[{self.name}] {op}: {unit}(s) {bad} already {sorted(set(where))} (I-NODUP-FREE)"
                )
        self.ledger.require_held_by(ids, owner, op)

    def release(self, ids: torch.Tensor, owner: Owner, op: str = "free") -> None:
        """Return validated ids. The ledger moves first, so a bookkeeping bug leaves the pool as it was.

        Inside a free group the ids go to the group's pending owner (I-PENDING) until ``free_group_end``.
        """
        if ids.numel() == 0:
            return
        if self.pending is not None:
            self.ledger.transfer(ids, owner, self.ledger.pending_owner, op + "(group)")
            if self.on_release is not None:
                self.on_release(ids)
            self.pending.append(ids)
            self.state[ids] = PENDING
            return
        self.ledger.transfer(ids, owner, FREE_LIST, op)
        self._push_free(ids)
        if self.on_release is not None:
            self.on_release(ids)

    def _push_free(self, ids: torch.Tensor) -> None:
        if self.reuse == "fifo":
            self.free = torch.cat((self.free, ids))
        else:
            self.free = torch.cat((ids, self.free))
        self.state[ids] = FREE

    # ------------------------------------------------------------------ free groups
    def free_group_begin(self) -> None:
        if self.pending is not None:
            raise FreeGroupError(f"[{self.name}] free_group_begin inside an open free group")
        self.pending = []

    def free_group_end(self) -> None:
        if self.pending is None:
            raise FreeGroupError(f"[{self.name}] free_group_end without free_group_begin")
        buffered, self.pending = self.pending, None
        if buffered:
            ids = torch.cat(buffered)
            self.ledger.transfer(ids, self.ledger.pending_owner, FREE_LIST, "free_group_end")
            self._push_free(ids)

    # ------------------------------------------------------------------ backup / restore
    def backup(self) -> FreeListSnapshot:
        if self.pending is not None:
            raise FreeGroupError(f"[{self.name}] backup_state inside an open free group")
        return FreeListSnapshot(self.free.clone(), self)

    def restore(self, snap: FreeListSnapshot) -> None:
        """Roll back to ``snap`` (I-ROLLBACK): ids allocated since go back to the free list from their holders.

        Only allocations may have happened since the backup (the speculative-decoding use): an id freed
        since then would have to be taken back from the free list, which no owner asked for, so that
        snapshot is stale and refused.
        """
        if snap.owner is not self:
            raise StaleSnapshot(f"[{self.name}] snapshot belongs to another pool")
        if self.pending is not None:
            raise FreeGroupError(f"[{self.name}] restore_state inside an open free group")
        in_snap = torch.zeros_like(self.state, dtype=torch.bool)
        in_snap[snap.free] = True
        freed_since = (self.state == FREE) & ~in_snap
        if bool(freed_since.any()):
            ids = torch.nonzero(freed_since).reshape(-1)[:8].tolist()
            raise StaleSnapshot(f"[{self.name}] ids {ids} were freed after backup_state; cannot restore")
        taken = torch.nonzero(in_snap & (self.state == HELD)).reshape(-1)
        self._return_to_free_list(taken, "restore_state")
        if self.on_release is not None and taken.numel():
            self.on_release(taken)
        self.free = snap.free.clone()
        self.state[taken] = FREE

    def _return_to_free_list(self, ids: torch.Tensor, op: str) -> None:
        ledger = self.ledger
        if not ledger.enabled or ids.numel() == 0:
            return
        by_owner: dict[Owner, list[int]] = {}
        for i in as_id_list(ids):
            owner = ledger.owner_of(i)
            assert owner is not None
            by_owner.setdefault(owner, []).append(i)
        for owner, owned in by_owner.items():
            ledger.transfer(owned, owner, FREE_LIST, op)

    # ------------------------------------------------------------------ audit
    def audit(self) -> None:
        """Recount the free list and state mask against each other and the ledger (O(size))."""
        from kvledger.contracts.errors import ContractViolation

        free_ids = self.free.tolist()
        pending_ids = [] if self.pending is None else torch.cat(self.pending).tolist() if self.pending else []
        state = self.state.tolist()
        mask_free = [i for i, s in enumerate(state) if s == FREE]
        if sorted(free_ids) != mask_free:
            raise ContractViolation(f"[{self.name}] free list and state mask disagree")
        if sorted(pending_ids) != [i for i, s in enumerate(state) if s == PENDING]:
            raise ContractViolation(f"[{self.name}] free-group buffer and state mask disagree")
        if any(s != RESERVED for s in state[: self.first]):
            raise ContractViolation(f"[{self.name}] a reserved id left the RESERVED state")
        self.ledger.audit(free_ids, pending_ids)
