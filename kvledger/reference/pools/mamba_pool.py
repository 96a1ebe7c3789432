"""``MambaPool``: per-slot recurrent state (conv + temporal, every linear-attention layer).

Slot 0 is reserved padding (2026 SGLang, I-DIAG-DOMAIN: the domain is ``1..size`` everywhere).
``alloc`` zeroes the states it hands out, so a new request never inherits another's state (the
llama.cpp/ik_llama #1696 bug). ``copy_from`` and ``fork_from`` are the copy-on-write primitives: a cached
state is never shared, only copied (I-MAMBA-VALUE). Tensor contents move only through
``kvledger.kernels``.
"""

from __future__ import annotations

from typing import Any

import torch

from kvledger import kernels
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.owners import FREE, Owner
from kvledger.contracts.switch import ensure, invariant, require, snapshot
from kvledger.reference.pools.id_free_list import HELD, IdFreeList
from kvledger.reference.pools.validate import (
    as_index_tensor,
    check_count,
    check_in_range,
    check_unique,
    resolve_device,
)


@invariant(
    lambda self: not self._slots.ledger.enabled or self._slots.ledger.count(FREE) == self._slots.available(),
    "I-COUNT: ledger free slots == available_size()",
)
@invariant(lambda self: 0 <= self._slots.available() + self._slots.pending_count() <= self.size, "I-CAP")
class MambaPool:
    """``size`` state slots; ``conv_state[L, size+1, *conv_shape]``, ``temporal_state[L, size+1, *ssm_shape]``."""

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
    ) -> None:
        check_count(size, "size")
        check_count(num_layers, "num_layers")
        if size < 1 or num_layers < 1:
            raise InvalidArgument(f"MambaPool needs size >= 1 and num_layers >= 1, got {size}, {num_layers}")
        self.size = size
        self.name = name
        self.num_layers = num_layers
        self.device = resolve_device(device)
        self.conv_state = torch.zeros(
            (num_layers, size + 1, *conv_state_shape), dtype=conv_dtype, device=self.device
        )
        self.temporal_state = torch.zeros(
            (num_layers, size + 1, *temporal_state_shape), dtype=ssm_dtype, device=self.device
        )
        self._slots = IdFreeList(name, 1, size, self.device, reuse="fifo")
        self._slots.on_alloc = self._zero  # always: a new owner never inherits a previous state
        if self._slots.ledger.enabled:
            self._slots.on_release = self._poison  # debug builds: a stale read of a freed slot shows

    @property
    def ledger(self) -> Any:
        return self._slots.ledger

    @property
    def states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The state tensors, slot on dim 1 (the layout ``kvledger.kernels`` expects)."""
        return (self.conv_state, self.temporal_state)

    def available_size(self) -> int:
        return self._slots.available()

    def pending_free_size(self) -> int:
        return self._slots.pending_count()

    def free_slots(self) -> list[int]:
        """The free list, in reuse order (what SGLang's leak diagnostic subtracts)."""
        return self._slots.free.tolist()

    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(lambda self, n, result: result is None or result.numel() == n)
    @ensure(lambda self, n, OLD, result: (result is None) == (n > OLD.available))
    @ensure(lambda self, n, OLD, result: result is None or self.available_size() == OLD.available - n)
    @ensure(
        lambda self, result: result is None or all(bool((s[:, result] == 0).all()) for s in self.states),
        "I-ZERO-ON-ALLOC: a slot handed out is zeroed",
    )
    def alloc(self, n: int, owner: Owner) -> torch.Tensor | None:
        """``n`` zeroed slots for ``owner``, or None when fewer are free."""
        check_count(n)
        return self._slots.alloc(n, owner)

    # Hooks run inside IdFreeList operations: they touch the tensors directly, never a public member
    # (icontract would check the class invariant mid-operation).
    def _zero(self, slots: torch.Tensor) -> None:
        kernels.zero_slots(self.conv_state, slots)
        kernels.zero_slots(self.temporal_state, slots)

    @ensure(
        lambda self, slots: bool(self.poisoned(slots).all()),
        "I-POISON-ON-FREE: every freed slot holds the poison value",
    )
    def _poison(self, slots: torch.Tensor) -> None:
        kernels.poison_slots(self.conv_state, slots)
        kernels.poison_slots(self.temporal_state, slots)

    def poisoned(self, slots: torch.Tensor) -> torch.Tensor:
        """Per slot: does any element of its conv or temporal state hold the poison value?"""
        return kernels.any_poisoned(self.conv_state, slots) | kernels.any_poisoned(self.temporal_state, slots)

    @snapshot(lambda self: self.available_size() + self._slots.pending_count(), name="reclaimable")
    @ensure(
        lambda self, slots, OLD: (
            self.available_size() + self._slots.pending_count()
            == OLD.reclaimable + as_index_tensor(slots, self.device, "free").numel()
        )
    )
    def free(self, slots: Any, owner: Owner) -> None:
        """Return ``owner``'s slots."""
        t = as_index_tensor(slots, self.device, f"{self.name}.free")
        self._slots.validate_release(t, owner, "free", "slot")
        self._slots.release(t, owner, "free")

    def _free_unchecked(self, slots: torch.Tensor, owner: Owner, op: str = "free") -> None:
        self._slots.release(slots, owner, op)

    def _check_held(self, slots: torch.Tensor, what: str) -> None:
        check_in_range(slots, 1, self.size, self.name, "slot")
        if slots.numel() and bool((self._slots.state[slots] != HELD).any()):
            raise InvalidArgument(f"[{self.name}] {what}: slot(s) {slots.tolist()[:8]} are not allocated")

    @ensure(
        lambda self, src_index, dst_index: all(
            bool(
                (
                    kernels.fingerprint_slots(s, as_index_tensor(src_index, self.device, "copy"))
                    == kernels.fingerprint_slots(s, as_index_tensor(dst_index, self.device, "copy"))
                ).all()
            )
            for s in self.states
        ),
        "I-COPY: after the copy each destination's fingerprint equals its source's",
    )
    @require(
        lambda self, src_index: (
            not self._slots.ledger.enabled
            or not bool(self.poisoned(as_index_tensor(src_index, self.device, "copy_from")).any())
        ),
        "I-NO-POISON-READ: a copy never reads a freed (poisoned) slot",
    )
    def copy_from(self, src_index: Any, dst_index: Any) -> None:
        """Copy the states of ``src_index`` into ``dst_index`` (every layer, conv and temporal)."""
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
        for state in self.states:
            kernels.copy_slots(state, src, dst)

    @snapshot(lambda self: self.available_size(), name="available")
    @ensure(lambda self, OLD, result: (result is None) == (OLD.available == 0))
    def fork_from(self, src_index: Any, owner: Owner) -> torch.Tensor | None:
        """A new slot for ``owner`` holding a copy of ``src_index``'s state; None when the pool is empty."""
        src = as_index_tensor(src_index, self.device, f"{self.name}.fork_from")
        if src.numel() != 1:
            raise InvalidArgument(f"[{self.name}] fork_from takes one source slot, got {src.numel()}")
        self._check_held(src, "fork_from source")
        dst = self._slots.alloc(1, owner, "fork_from")
        if dst is None:
            return None
        for state in self.states:
            kernels.copy_slots(state, src, dst)
        return dst

    def free_group_begin(self) -> None:
        self._slots.free_group_begin()

    def free_group_end(self) -> None:
        self._slots.free_group_end()

    def audit(self) -> None:
        self._slots.audit()

    def __repr__(self) -> str:
        return f"MambaPool({self.name}, size={self.size}, available={self.available_size()})"
