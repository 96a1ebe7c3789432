"""``MetadataBufferPool``: PD metadata slots (SGLang ``ReqToMetadataIdxAllocator`` + ``MetadataBuffers``).

Each side of a prefill/decode pair gives every request in flight one metadata slot: the prefill writes
the request's first output token and its ``bootstrap_room`` there (``set_buf``) and sends the slot with
its last KV chunk; the decode side receives into its own slot and, before committing the transfer,
checks the room it finds (0: nothing landed; another room: a slot collision). Slots ``0..size-1`` (no
reserved slot, as SGLang's allocator); one owner per slot in the ledger, like every other pool.

Upstream checks nothing here: a leaked slot only shows as lost concurrency (#28236, a decode-side abort
leaving the prefill's waiting entry holding its slot). Contents move only through ``kvledger.kernels``:
a slot is zeroed when handed out (room 0 = "nothing landed") and poisoned when given back (debug builds).
"""

from __future__ import annotations

import torch

from kvledger import kernels
from kvledger.contracts.errors import InvalidArgument, SlotOutOfRange
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import FREE, Owner
from kvledger.contracts.protocols import Ids
from kvledger.contracts.switch import ensure, invariant, snapshot
from kvledger.reference.config_fields import allocating, check_fits_memory, check_size
from kvledger.reference.pools.base import IdPool
from kvledger.reference.pools.id_free_list import HELD, IdFreeList
from kvledger.reference.pools.validate import (
    as_index_tensor,
    check_count,
    check_in_range,
    check_name,
    check_owner,
    check_unique,
    resolve_device,
)

INT64_MAX = 2**63 - 1
"""Rooms and output ids are stored as int64."""

SLOT_BYTES = 2 * 8 + 25
"""Host bytes per slot at least: room and output id (int64 each), the free list's arrays."""


@invariant(
    lambda self: not self._slots.ledger.enabled or self._slots.ledger.count(FREE) == self._slots.available(),
    "I-COUNT: ledger free metadata slots == available_size()",
)
@invariant(lambda self: 0 <= self._slots.available() + self._slots.pending_count() <= self.size, "I-CAP")
class MetadataBufferPool(IdPool):
    """``size`` slots; ``bootstrap_room[1, size, 1]`` and ``output_id[1, size, 1]`` (int64) per slot."""

    def __init__(
        self,
        size: int,
        *,
        device: str | torch.device = "cpu",
        name: str = "metadata",
        checks: CheckLevel | None = None,
    ) -> None:
        check_size(size, "MetadataBufferPool: size")  # an int in [1, MAX_SIZE], before any allocation
        check_fits_memory(size * SLOT_BYTES, f"MetadataBufferPool: size {size}")
        self.size = size
        self.name = check_name(name)
        self.device = resolve_device(device)
        with allocating(f"MetadataBufferPool: size {size}"):
            # Layer-major [L=1, S, F=1] so the slot kernels apply (a store writes both buffers at once).
            self.bootstrap_room = torch.zeros((1, size, 1), dtype=torch.int64, device=self.device)
            self.output_id = torch.zeros((1, size, 1), dtype=torch.int64, device=self.device)
            self._slots = self.free_list = IdFreeList(name, 0, size, self.device, reuse="fifo", checks=checks)
        self._slots.on_alloc = self._zero
        self.ledger = self._slots.ledger  # an attribute, as every pool's (pools/base.py says why)
        if self._slots.ledger.debug:
            self._slots.on_release = self._poison

    def available_size(self) -> int:
        return self._slots.available()

    def pending_free_size(self) -> int:
        return self._slots.pending_count()

    # ------------------------------------------------------------------ alloc / free
    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(lambda self, OLD, result: (result is None) == (OLD.available == 0))
    @ensure(lambda self, OLD, result: result is None or self.available_size() == OLD.available - 1)
    @ensure(
        lambda self, result: result is None or self.read(result) == (0, 0),
        "I-ZERO-ON-ALLOC: a metadata slot is handed out with room 0 (nothing landed)",
    )
    def alloc(self, owner: Owner) -> int | None:
        """One slot for ``owner``, or None when none is free (the caller waits: FIFO admission stops)."""
        check_owner(owner)
        ids = self._slots.alloc(1, owner)
        return None if ids is None else int(ids[0])

    @snapshot(lambda self: self.available_size() + self._slots.pending_count(), name="reclaimable")
    @ensure(lambda self, OLD: self.available_size() + self._slots.pending_count() == OLD.reclaimable + 1)
    def free(self, slot: int, owner: Owner) -> None:
        """Return ``owner``'s slot; DoubleFree / ForeignSlot / SlotOutOfRange on bad input, nothing changed."""
        check_owner(owner)
        t = as_index_tensor(check_count(slot, "slot"), self.device, f"{self.name}.free")
        self._slots.validate_release(t, owner, "free", "slot")
        self._slots.release(t, owner, "free")

    def _free_unchecked(self, slot: int, owner: Owner, op: str = "free") -> None:
        self._slots.release(torch.tensor([slot], dtype=torch.int64, device=self.device), owner, op)

    # ------------------------------------------------------------------ contents
    def _check_held(self, slot: int, what: str) -> torch.Tensor:
        check_count(slot, "slot")
        if slot >= self.size:
            raise InvalidArgument(f"[{self.name}] {what}: slot {slot} outside [0, {self.size})")
        if int(self._slots.state[slot]) != HELD:
            raise InvalidArgument(f"[{self.name}] {what}: slot {slot} is not allocated")
        return torch.tensor([slot], dtype=torch.int64, device=self.device)

    @ensure(lambda self, slot, room, output_id: self.read(slot) == (room, output_id))
    def set_buf(self, slot: int, room: int, output_id: int) -> None:
        """Write a request's ``bootstrap_room`` and first output token into its (held) slot."""
        idx = self._check_held(slot, "set_buf")
        if not 1 <= check_count(room, "room") <= INT64_MAX:
            raise InvalidArgument(
                f"[{self.name}] set_buf: room must be in [1, {INT64_MAX}] (0 marks an empty slot), got {room}"
            )
        if check_count(output_id, "output_id") > INT64_MAX:
            raise InvalidArgument(f"[{self.name}] set_buf: output_id {output_id} does not fit int64")
        self.store(
            idx, torch.tensor([[room]], dtype=torch.int64), torch.tensor([[output_id]], dtype=torch.int64)
        )

    def store(self, slots: torch.Tensor, rooms: torch.Tensor, output_ids: torch.Tensor) -> None:
        """``set_buf`` for ``n`` slots at once: ``[n, 1]`` rooms (each >= 1: 0 marks an empty slot) and
        output ids (each >= 0) at distinct slots some request holds, int tensors on the pool's device;
        checked before anything is written. (A transfer's landing copies the raw contents, poison
        included, through the kernels: ``kvledger.reference.disagg.landing``.)"""
        idx = self._check_slots(slots, "store", held=True)
        n = idx.numel()
        for what, values, low in (("rooms", rooms, 1), ("output_ids", output_ids, 0)):
            if not isinstance(values, torch.Tensor) or values.dtype not in (torch.int32, torch.int64):
                raise InvalidArgument(f"[{self.name}] store: {what} must be an int32/int64 tensor")
            if tuple(values.shape) != (n, 1):
                raise InvalidArgument(
                    f"[{self.name}] store: {what} must have shape [{n}, 1], got {tuple(values.shape)}"
                )
            if values.device != self.device:
                raise InvalidArgument(
                    f"[{self.name}] store: {what} are on {values.device}, the pool on {self.device}"
                )
            if n and int(values.min()) < low:
                raise InvalidArgument(
                    f"[{self.name}] store: {what} must be >= {low}"
                    f"{' (0 marks an empty slot)' if low else ''}, got {int(values.min())}"
                )
        kernels.store_kv(
            self.bootstrap_room,
            self.output_id,
            0,
            idx,
            rooms.to(device=self.device, dtype=torch.int64),
            output_ids.to(device=self.device, dtype=torch.int64),
        )

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``[n, 1]`` rooms and output ids stored at ``slots`` (copies; slots inside the pool)."""
        idx = self._check_slots(slots, "gather", held=False)
        return self.bootstrap_room[0, idx].clone(), self.output_id[0, idx].clone()

    def read(self, slot: int) -> tuple[int, int]:
        """``(bootstrap_room, output_id)`` of one slot (inside the pool; a free slot reads its poison)."""
        self._check_slot(slot, "read")
        return int(self.bootstrap_room[0, slot, 0]), int(self.output_id[0, slot, 0])

    def poisoned(self, slot: int) -> bool:
        self._check_slot(slot, "poisoned")
        idx = torch.tensor([slot], dtype=torch.int64, device=self.device)
        return bool(
            kernels.any_poisoned(self.bootstrap_room, idx)[0] | kernels.any_poisoned(self.output_id, idx)[0]
        )

    def _check_slot(self, slot: object, op: str) -> None:
        """A slot number inside the pool: a negative one would wrap around."""
        if check_count(slot, "slot") >= self.size:
            raise SlotOutOfRange(f"[{self.name}] {op}: slot {slot} outside [0, {self.size})")

    def _check_slots(self, slots: Ids, op: str, *, held: bool) -> torch.Tensor:
        idx = as_index_tensor(slots, self.device, f"{self.name}.{op}")
        check_in_range(idx, 0, self.size - 1, self.name, "slot")
        if held:
            check_unique(idx, self.name, "slot")
            state = self._slots.state
            if not all(int(state[i]) == HELD for i in idx.tolist()):
                raise InvalidArgument(f"[{self.name}] {op}: slot(s) {idx.tolist()[:8]} not all allocated")
        return idx

    def _zero(self, slots: torch.Tensor) -> None:
        kernels.zero_slots(self.bootstrap_room, slots)
        kernels.zero_slots(self.output_id, slots)

    def _poison(self, slots: torch.Tensor) -> None:
        kernels.poison_slots(self.bootstrap_room, slots)
        kernels.poison_slots(self.output_id, slots)

    def audit(self) -> None:
        self._slots.audit()

    def __repr__(self) -> str:
        return f"MetadataBufferPool({self.name}, size={self.size}, available={self.available_size()})"
