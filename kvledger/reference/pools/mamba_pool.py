"""``MambaPool``: per-slot recurrent state (conv + temporal, every linear-attention layer).

Slot 0 is reserved padding (2026 SGLang, I-DIAG-DOMAIN: the domain is ``1..size`` everywhere).
``alloc`` zeroes the states it hands out, so a new request never inherits another's state (the
llama.cpp/ik_llama #1696 bug). ``copy_from`` and ``fork_from`` are the copy-on-write primitives: a cached
state is never shared, only copied (I-MAMBA-VALUE). Tensor contents move only through
``kvledger.kernels``.

Zeroing and copies are *scheduled* and applied as one batch (spec/mamba-cache-vs-sglang.md §4), as
SGLang defers them to the forward pass: ownership moves at once, the bytes move before anyone can tell
the difference. The batch is applied before any read of the state tensors (``conv_state``,
``temporal_state``, ``states``, ``poisoned``), before a slot a scheduled copy reads is released, before
a copy that would read a scheduled destination (or overwrite a scheduled source), on ``flush()``, and
every ``FLUSH_AT`` scheduled writes. Releasing a slot cancels its scheduled write. The data-integrity
contracts are checked where the bytes move: I-NO-POISON-READ on every source, I-ZERO-ON-ALLOC and I-COPY
on every destination, per batch.
"""

from __future__ import annotations

import math

import torch

from kvledger import kernels
from kvledger.contracts.errors import ContractViolation, InvalidArgument, KVLedgerError
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import FREE, Owner
from kvledger.contracts.protocols import Ids
from kvledger.contracts.seams import seam
from kvledger.contracts.switch import ensure, invariant, require, snapshot
from kvledger.reference.config_fields import allocating, check_fits_memory, check_size
from kvledger.reference.pools.base import IdPool
from kvledger.reference.pools.id_free_list import HELD
from kvledger.reference.pools.kv_buffer import check_float_dtype
from kvledger.reference.pools.validate import (
    as_index_tensor,
    check_count,
    check_in_range,
    check_owner,
    check_unique,
)
from kvledger.reference.pools.write_schedule import ZERO, WriteSchedule


def check_state_shape(shape: object, what: str) -> tuple[int, ...]:
    """The per-slot shape of a state tensor: a tuple of ints >= 1 (possibly empty: a scalar per slot)."""
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 1 for d in shape):
        raise InvalidArgument(f"MambaPool: {what} must be a tuple of ints >= 1, got {shape!r}")
    return shape


@invariant(
    lambda self: not self._slots.ledger.enabled or self._slots.ledger.count(FREE) == self._slots.available(),
    "I-COUNT: ledger free slots == available_size()",
    error=lambda self: self._slots.ledger_disagreement("I-COUNT: ledger free slots != available_size()"),
)
@invariant(lambda self: 0 <= self._slots.available() + self._slots.pending_count() <= self.size, "I-CAP")
@invariant(
    lambda self: len(self._writes) < self.FLUSH_AT, "I-WRITE-SCHEDULE: the write schedule stays bounded"
)
class MambaPool(IdPool):
    """``size`` state slots; ``conv_state[L, size+1, *conv_shape]``, ``temporal_state[L, size+1, *ssm_shape]``."""

    FLUSH_AT = 64  # scheduled writes applied together at most

    def __init__(
        self,
        size: int,
        *,
        num_layers: int,
        conv_state_shape: tuple[int, ...],
        temporal_state_shape: tuple[int, ...],
        conv_dtype: torch.dtype = torch.float32,
        ssm_dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        name: str = "mamba",
        checks: CheckLevel | None = None,
    ) -> None:
        check_count(size, "size")
        check_count(num_layers, "num_layers")
        if size < 1 or num_layers < 1:
            raise InvalidArgument(f"MambaPool needs size >= 1 and num_layers >= 1, got {size}, {num_layers}")
        check_state_shape(conv_state_shape, "conv_state_shape")
        check_state_shape(temporal_state_shape, "temporal_state_shape")
        check_float_dtype(conv_dtype, "conv_dtype")
        check_float_dtype(ssm_dtype, "ssm_dtype")
        self.size = size
        self.num_layers = num_layers
        check_size(size, "MambaPool: size")
        per_slot = (
            math.prod(conv_state_shape) * conv_dtype.itemsize
            + math.prod(temporal_state_shape) * ssm_dtype.itemsize
        )
        check_fits_memory(
            num_layers * (size + 1) * per_slot, f"MambaPool: {size} slots x {num_layers} layers"
        )
        self._slots = self._init_pool(name, device, 1, size, reuse="fifo", checks=checks)
        with allocating(f"MambaPool: {size} slots x {num_layers} layers"):
            self._conv = torch.zeros(
                (num_layers, size + 1, *conv_state_shape), dtype=conv_dtype, device=self.device
            )
            self._temporal = torch.zeros(
                (num_layers, size + 1, *temporal_state_shape), dtype=ssm_dtype, device=self.device
            )
        self._writes = WriteSchedule()  # zeroings and copies promised, applied as one batch
        self._slots.on_alloc = self._schedule_zero  # always: a new owner never inherits a previous state
        self._slots.on_release = self._on_release
        self._poison_on_release = bool(self._slots.ledger.debug)  # debug builds: stale reads show

    @property
    def conv_state(self) -> torch.Tensor:
        """``[L, size+1, *conv_shape]``, every scheduled write applied (a reader sees the true contents)."""
        self._flush()
        return self._conv

    @property
    def temporal_state(self) -> torch.Tensor:
        """``[L, size+1, *ssm_shape]``, every scheduled write applied."""
        self._flush()
        return self._temporal

    @property
    def states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The state tensors, slot on dim 1 (the layout ``kvledger.kernels`` expects), up to date."""
        self._flush()
        return (self._conv, self._temporal)

    def stored_states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The state tensors as stored, scheduled writes *not* applied: for a snapshot that must not change
        the pool by reading it (every other reader wants :attr:`states`)."""
        return (self._conv, self._temporal)

    def write_schedule(self) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
        """The zeroings and copies scheduled but not applied (:meth:`WriteSchedule.view`)."""
        return self._writes.view()

    def scheduled_writes(self) -> int:
        """Zeroings and copies scheduled but not yet applied (0 right after any read of the states)."""
        return len(self._writes)

    def free_slots(self) -> list[int]:
        """The free list, in reuse order (what SGLang's leak diagnostic subtracts)."""
        return self._slots.free.tolist()

    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(lambda self, n, result: result is None or result.numel() == n)
    @ensure(lambda self, n, OLD, result: (result is None) == (n > OLD.available))
    @ensure(lambda self, n, OLD, result: result is None or self.available_size() == OLD.available - n)
    @ensure(
        lambda self, result: result is None or self._will_read_zero(result),
        "I-ZERO-ON-ALLOC: a slot handed out is zeroed (or scheduled to be, before anyone reads it)",
    )
    def alloc(self, n: int, owner: Owner) -> torch.Tensor | None:
        """``n`` zeroed slots for ``owner``, or None when fewer are free."""
        check_count(n)
        if type(owner) is not Owner:  # one comparison on the fast path
            check_owner(owner)
        return self._slots.alloc(n, owner)

    # ------------------------------------------------------------------ the schedule
    # Hooks run inside IdFreeList operations: they touch the tensors directly, never a public member
    # (icontract would check the class invariant mid-operation).
    def _schedule_zero(self, slots: torch.Tensor) -> None:
        for slot in slots.tolist():
            self._schedule(slot, ZERO)

    def _schedule(self, dst: int, src: int) -> None:
        """Promise ``dst <- src`` (or a zeroing): applied with the next batch, never after a reader looks."""
        if self._writes.reads(dst):
            self._flush()  # overwriting a slot a scheduled copy still has to read
        self._writes.add(dst, src)
        if len(self._writes) >= self.FLUSH_AT:
            self._flush()

    def _on_release(self, slots: torch.Tensor) -> None:
        """A slot goes back: copies reading it run first; a write into it is dead and is dropped."""
        if self._writes:
            released = slots.tolist()
            if any(self._writes.reads(slot) for slot in released):
                self._flush()
            for slot in released:
                self._writes.drop(slot)
        if self._poison_on_release:
            self._poison(slots)

    @ensure(
        lambda self, slots: all(bool(kernels.poisoned_mask(s, slots).all()) for s in (self._conv, self._temporal)),
        "I-POISON-ON-FREE: every freed slot holds the poison value",
    )
    def _poison(self, slots: torch.Tensor) -> None:
        kernels.poison_slots(self._conv, slots)
        kernels.poison_slots(self._temporal, slots)

    def flush(self) -> None:
        """Apply every scheduled zeroing and copy now, as one batch (the step's data-plane work)."""
        self._flush()

    def _flush(self) -> None:
        if not self._writes:
            return
        zero, src, dst = self._writes.take()
        device = self.device
        self._apply_batch(
            torch.tensor(zero, dtype=torch.int64, device=device),
            torch.tensor(src, dtype=torch.int64, device=device),
            torch.tensor(dst, dtype=torch.int64, device=device),
        )

    @require(
        lambda self, src: not self._poison_on_release or not bool(self._raw_poisoned(src).any()),
        "I-NO-POISON-READ: a copy never reads a freed (poisoned) slot",
    )
    @ensure(
        lambda self, zero: all(bool((s[:, zero] == 0).all()) for s in (self._conv, self._temporal)),
        "I-ZERO-ON-ALLOC: a slot handed out is zeroed",
    )
    @ensure(
        lambda self, src, dst: all(
            bool((kernels.fingerprint_slots(s, src) == kernels.fingerprint_slots(s, dst)).all())
            for s in (self._conv, self._temporal)
        ),
        "I-COPY: after the copy each destination's fingerprint equals its source's",
    )
    def _apply_batch(self, zero: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        for state in (self._conv, self._temporal):
            if zero.numel():
                kernels.zero_slots(state, zero)
            if src.numel():
                kernels.copy_slots(state, src, dst)

    def _will_read_zero(self, slots: torch.Tensor) -> bool:
        """Each slot is scheduled to be zeroed, or (nothing scheduled) reads zero now."""
        for slot in slots.tolist():
            scheduled = self._writes.write_to(slot)
            if scheduled == ZERO:
                continue
            if scheduled is not None or not all(
                bool((s[:, slot] == 0).all()) for s in (self._conv, self._temporal)
            ):
                return False
        return True

    def _will_hold_copy(self, src: torch.Tensor, dst: torch.Tensor) -> bool:
        """Each ``dst[i]`` is scheduled to receive what ``src[i]`` holds (or will hold), or, with nothing
        scheduled for either, already has its fingerprint."""
        for s, d in zip(src.tolist(), dst.tolist(), strict=True):
            scheduled = self._writes.write_to(d)
            if scheduled is not None:  # d must receive what s will hold (s itself, or s's own write)
                if scheduled != self._writes.will_hold(s):
                    return False
                continue
            if self._writes.write_to(s) is not None:
                return False
            one_s = torch.tensor([s], dtype=torch.int64, device=self.device)
            one_d = torch.tensor([d], dtype=torch.int64, device=self.device)
            for state in (self._conv, self._temporal):
                if not bool(
                    (kernels.fingerprint_slots(state, one_s) == kernels.fingerprint_slots(state, one_d)).all()
                ):
                    return False
        return True

    def _raw_poisoned(self, slots: torch.Tensor) -> torch.Tensor:
        return kernels.any_poisoned(self._conv, slots) | kernels.any_poisoned(self._temporal, slots)

    def _source_poisoned(self, slots: torch.Tensor) -> bool:
        """Would a copy read poison from any of ``slots``? A slot with a scheduled write will hold a zero
        or a copy (whose source was checked when it was scheduled), whatever its bytes are now."""
        unwritten = [slot for slot in slots.tolist() if self._writes.write_to(slot) is None]
        if not unwritten:
            return False
        return bool(self._raw_poisoned(torch.tensor(unwritten, dtype=torch.int64, device=self.device)).any())

    def _held_sources_unpoisoned(self, src_index: Ids) -> bool:
        """The precondition's view of a ``copy_from`` source: bad input (not an index, out of range, not
        held) is left to the typed errors of the call itself; held slots must not read as poison."""
        try:
            src = as_index_tensor(src_index, self.device, "copy_from")
        except KVLedgerError:
            return True
        held = [s for s in src.tolist() if 1 <= s <= self.size and int(self._slots.state[s]) == HELD]
        return not held or not self._source_poisoned(
            torch.tensor(held, dtype=torch.int64, device=self.device)
        )

    def poisoned(self, slots: Ids) -> torch.Tensor:
        """Per slot: does any element of its conv or temporal state hold the poison value?

        Any slot of the pool, held or free (a freed slot reads as poisoned in a debug build), named as every
        method of the pool names slots: an int, a sequence of ints or an integer tensor."""
        idx = as_index_tensor(slots, self.device, f"{self.name}.poisoned")
        check_in_range(idx, 1, self.size, self.name, "slot")
        self._flush()
        return self._raw_poisoned(idx)

    @seam
    @snapshot(lambda self: self.available_size() + self._slots.pending_count(), name="reclaimable")
    @ensure(
        lambda self, slots, OLD: (
            self.available_size() + self._slots.pending_count()
            == OLD.reclaimable + as_index_tensor(slots, self.device, "free").numel()
        )
    )
    def free(self, slots: Ids, owner: Owner) -> None:
        """Return ``owner``'s slots."""
        t = as_index_tensor(slots, self.device, f"{self.name}.free")
        if type(owner) is not Owner:  # one comparison on the fast path
            check_owner(owner)
        self._slots.free_checked(t, owner, "free", "slot")

    def _free_unchecked(self, slots: torch.Tensor, owner: Owner, op: str = "free") -> None:
        self._slots.release(slots, owner, op)

    @seam
    def _check_held(self, slots: torch.Tensor, what: str) -> None:
        check_in_range(slots, 1, self.size, self.name, "slot")
        if not self._slots.all_held(slots):
            raise InvalidArgument(f"[{self.name}] {what}: slot(s) {slots.tolist()[:8]} are not allocated")

    @require(
        lambda self, src_index: not self._poison_on_release or self._held_sources_unpoisoned(src_index),
        "I-NO-POISON-READ: a copy never reads a freed (poisoned) slot",
    )
    @ensure(
        lambda self, src_index, dst_index: self._will_hold_copy(
            as_index_tensor(src_index, self.device, "copy"), as_index_tensor(dst_index, self.device, "copy")
        ),
        "I-COPY: after the copy each destination's fingerprint equals its source's (or will, when the"
        " scheduled copy is applied)",
    )
    def copy_from(self, src_index: Ids, dst_index: Ids) -> None:
        """Copy the states of ``src_index`` into ``dst_index`` (every layer, conv and temporal); scheduled,
        applied with the next batch."""
        src = as_index_tensor(src_index, self.device, f"{self.name}.copy_from")
        dst = as_index_tensor(dst_index, self.device, f"{self.name}.copy_from")
        if src.numel() != dst.numel():
            raise InvalidArgument(
                f"[{self.name}] copy_from: {src.numel()} sources for {dst.numel()} destinations"
            )
        self._check_held(src, "copy_from source")
        self._check_held(dst, "copy_from destination")
        check_unique(dst, self.name, "destination slot")
        if set(src.tolist()) & set(dst.tolist()):
            raise InvalidArgument(f"[{self.name}] copy_from: sources and destinations overlap")
        self._copy_unchecked(src, dst)

    @require(
        lambda self, src: not self._poison_on_release or not self._source_poisoned(src),
        "I-NO-POISON-READ: a copy never reads a freed (poisoned) slot",
    )
    @ensure(
        lambda self, src, dst: self._will_hold_copy(src, dst),
        "I-COPY: after the copy each destination's fingerprint equals its source's (or will, when the"
        " scheduled copy is applied)",
    )
    def _copy_unchecked(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """``copy_from`` after validation (held slots, distinct destinations, no overlap); the radix cache's
        copy-on-write calls it directly with a tree slot and the caller's slot."""
        if src.numel() == 1:
            self._schedule(int(dst), int(src))
            return
        for s, d in zip(src.tolist(), dst.tolist(), strict=True):
            self._schedule(d, s)

    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(lambda self, OLD, result: (result is None) == (OLD.available == 0))
    def fork_from(self, src_index: Ids, owner: Owner) -> torch.Tensor | None:
        """A new slot for ``owner`` holding a copy of ``src_index``'s state; None when the pool is empty."""
        src = as_index_tensor(src_index, self.device, f"{self.name}.fork_from")
        if src.numel() != 1:
            raise InvalidArgument(f"[{self.name}] fork_from takes one source slot, got {src.numel()}")
        self._check_held(src, "fork_from source")
        if type(owner) is not Owner:  # one comparison on the fast path
            check_owner(owner)
        if self._poison_on_release and self._source_poisoned(src):
            raise ContractViolation(
                f"I-NO-POISON-READ: [{self.name}] fork_from reads freed slot {src.tolist()}"
            )
        dst = self._slots.alloc(1, owner, "fork_from")
        if dst is None:
            return None
        self._schedule(int(dst), int(src))  # replaces the zeroing alloc scheduled
        return dst

    def free_group_begin(self) -> None:
        self._slots.free_group_begin()

    def free_group_end(self) -> None:
        self._slots.free_group_end()

    def audit(self) -> None:
        """The free list and ledger recount, and the schedule: every scheduled write targets and reads
        held slots only, no destination is also a source, and the source counts match the writes."""
        self._slots.audit()
        scheduled = self._writes.slots()
        if scheduled:
            ids = torch.tensor(sorted(scheduled), dtype=torch.int64, device=self.device)
            not_held = ids[self._slots.state[ids] != HELD].tolist()
            if not_held:
                raise ContractViolation(
                    f"I-WRITE-SCHEDULE: [{self.name}] scheduled writes touch free slots {not_held[:8]}"
                )
        broken = self._writes.inconsistency()
        if broken is not None:
            raise ContractViolation(f"I-WRITE-SCHEDULE: [{self.name}] {broken}")
