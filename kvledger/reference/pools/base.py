"""What every pool shares: a name, a device, a size, its free list (an :class:`IdFreeList`) and its ledger.

The id plumbing is the same for token slots, pages, request rows, Mamba slots and PD metadata slots: the
free list hands ids out and takes them back (validation, reuse order, free groups, backup/restore), and
its ledger records who holds each. A pool class adds its unit, its contents (tensors), its own
``alloc``/``free`` signatures and, where SGLang's pool has them, free groups and backup/restore (one-line
delegations to the free list, so a pool's public surface stays SGLang's).

``free_list`` is public on purpose: the scheduler's per-step identity reads its counters directly
(``available()``, ``pending_count()``), because every public method of a pool evaluates the pool's class
invariants (icontract) and the identity already checks those very counters against the ledger after
every step. Everything else reads the pool through its public methods (:class:`~kvledger.contracts.
protocols.IdPool`).
"""

from __future__ import annotations

import numpy as np
import torch

from kvledger.contracts.ledger_by_level import AnyLedger
from kvledger.contracts.levels import CheckLevel
from kvledger.reference.config_fields import allocating, check_fits_memory, check_size
from kvledger.reference.pools.id_free_list import IdFreeList
from kvledger.reference.pools.validate import check_name, resolve_device

ID_BOOKKEEPING_BYTES = 16
"""A lower estimate of what one id costs the free list and the ledger (the free ring's int64, the state
byte, the owner code), to refuse a pool the machine cannot hold before allocating any of it."""


class IdPool:
    """The common part of kvledger's pools (``size`` counts units: tokens for a paged KV pool, else ids)."""

    size: int
    name: str
    device: torch.device
    free_list: IdFreeList
    ledger: AnyLedger
    """Who holds each id (``unit`` units per id); a ``NullLedger`` at the checking level ``release``. A
    plain attribute, not a property: icontract checks a class's invariants around every public property
    read, and the scheduler's per-step checks read it thousands of times a run (issue 24)."""

    def _init_pool(
        self,
        name: str,
        device: str | torch.device,
        first: int,
        count: int,
        *,
        unit: int = 1,
        reuse: str = "fifo",
        checks: CheckLevel | None = None,
    ) -> IdFreeList:
        """Name, device and free list of ids ``first .. first+count-1`` (ids below ``first`` are padding).

        A count beyond ``MAX_SIZE``, or one whose bookkeeping alone would not fit in the machine's memory,
        is a typed error raised before anything is allocated (numpy and torch would fail half-way with a
        ``MemoryError``, or worse). ``checks``: the level the pool is built at, handed down by its builder
        (it picks the ledger; None: the process's level)."""
        self.name = check_name(name)
        self.device = resolve_device(device)
        check_size(first + count, f"{type(self).__name__} {self.name!r}: ids")
        check_fits_memory(ID_BOOKKEEPING_BYTES * (first + count), f"{type(self).__name__} {self.name!r}")
        with allocating(f"{type(self).__name__} {self.name!r}: {count} ids"):
            self.free_list = IdFreeList(
                self.name, first, count, self.device, unit=unit, reuse=reuse, checks=checks
            )
        self.ledger = self.free_list.ledger
        return self.free_list

    def available_size(self) -> int:
        """Free units (a free group's buffered ids are not available until it ends)."""
        return self.free_list.available() * self.free_list.unit

    def pending_free_size(self) -> int:
        """Units freed inside the open free group, back on the free list at ``free_group_end``."""
        return self.free_list.pending_count() * self.free_list.unit

    def free_ids(self) -> list[int]:
        """The ids on the free list, in reuse order (ids, not units: pages for a paged pool)."""
        ids: list[int] = self.free_list.free_ids().tolist()
        return ids

    def pending_ids(self) -> list[int]:
        """The ids freed inside the open free group (empty outside one)."""
        pending = self.free_list.pending
        ids: list[int] = np.concatenate(pending).tolist() if pending else []
        return ids

    def audit(self) -> None:
        """Full recount of the free list, state mask and ledger (quiescence / tests)."""
        self.free_list.audit()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, size={self.size}, available={self.available_size()})"
