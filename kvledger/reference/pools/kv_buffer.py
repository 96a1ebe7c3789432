"""``KVBufferPool``: the per-layer K and V tensors, indexed by KV token slot.

Not an ownership pool: its rows are the token slots that ``TokenToKVPoolAllocator`` or
``PagedTokenToKVPoolAllocator`` hand out (slot 0, and page 0's slots, are padding rows kernels may
write). Layout ``[L, num_slots, H, D]`` (slot on dim 1), written only through ``kernels.store_kv``.
"""

from __future__ import annotations

import torch

from kvledger import kernels
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.protocols import Ids, KVAllocator
from kvledger.contracts.switch import ensure
from kvledger.reference.config_fields import allocating, check_fits_memory, check_size
from kvledger.reference.pools.validate import (
    as_index_tensor,
    check_count,
    check_in_range,
    check_positive,
    check_unique,
    resolve_device,
)


def check_float_dtype(dtype: object, what: str) -> torch.dtype:
    """A floating-point ``torch.dtype`` (state and KV tensors hold NaN poison, which integers cannot)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidArgument(f"{what} must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


def check_kv_buffer(buffer: object, rows_needed: int, device: torch.device, pool: str) -> KVBufferPool:
    """A :class:`KVBufferPool` on the allocator's device with a row for every slot it can hand out."""
    if not isinstance(buffer, KVBufferPool):
        raise InvalidArgument(f"[{pool}] attach_kv_buffer: expected a KVBufferPool, got {type(buffer).__name__}")
    if buffer.device != device:
        raise InvalidArgument(f"[{pool}] attach_kv_buffer: the buffer is on {buffer.device}, the pool on {device}")
    if buffer.num_slots < rows_needed:
        raise InvalidArgument(
            f"[{pool}] attach_kv_buffer: the buffer has {buffer.num_slots} rows, the pool needs {rows_needed}"
        )
    return buffer


class KVBufferPool:
    """K and V for ``num_slots`` token slots (padding slots included) of ``num_layers`` attention layers."""

    def __init__(
        self,
        num_slots: int,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        for what, v in (
            ("num_slots", num_slots),
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            check_size(v, f"KVBufferPool: {what}")  # an int in [1, MAX_SIZE], before any allocation
        check_float_dtype(dtype, "KVBufferPool: dtype")
        elements = num_layers * num_slots * num_kv_heads * head_dim
        check_fits_memory(2 * elements * dtype.itemsize, f"KVBufferPool: {num_slots} slots x {num_layers} layers")
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.device = resolve_device(device)
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        with allocating(f"KVBufferPool: shape {shape}"):
            self.k_buffer = torch.zeros(shape, dtype=dtype, device=self.device)
            self.v_buffer = torch.zeros(shape, dtype=dtype, device=self.device)

    @classmethod
    def for_allocator(
        cls,
        allocator: KVAllocator,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> KVBufferPool:
        """A buffer with a row for every slot ``allocator`` can hand out, padding included."""
        page_size = getattr(allocator, "page_size", None)
        size = getattr(allocator, "size", None)
        if page_size is None or size is None:
            raise InvalidArgument(
                f"KVBufferPool.for_allocator: expected a KV allocator (size, page_size), got {type(allocator).__name__}"
            )
        check_positive(page_size, "allocator.page_size")
        check_positive(size, "allocator.size")
        num_slots = (size // page_size + 1) * page_size
        return cls(
            num_slots, num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, device=device
        )

    @ensure(
        lambda self, layer, loc, k: bool(
            (self.k_buffer[layer, as_index_tensor(loc, self.device, "kv")] == k).all()
        )
    )
    def set_kv_buffer(self, layer: int, loc: Ids, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` (``[T, H, D]``) of layer ``layer`` at the token slots ``loc``."""
        self._check_layer(layer)
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            raise InvalidArgument(f"set_kv_buffer: k and v must be tensors, got {type(k).__name__}, {type(v).__name__}")
        idx = as_index_tensor(loc, self.device, "set_kv_buffer")
        check_in_range(idx, 0, self.num_slots - 1, "kv_buffer", "slot")
        check_unique(idx, "kv_buffer", "slot")
        expected = (idx.numel(), *self.k_buffer.shape[2:])
        if tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise InvalidArgument(
                f"set_kv_buffer: k/v must have shape {expected}, got {tuple(k.shape)}, {tuple(v.shape)}"
            )
        if k.dtype != self.k_buffer.dtype or v.dtype != self.v_buffer.dtype:
            raise InvalidArgument(
                f"set_kv_buffer: dtype {k.dtype}/{v.dtype}, buffer is {self.k_buffer.dtype}"
            )
        if k.device != self.device or v.device != self.device:
            raise InvalidArgument(f"set_kv_buffer: k/v on {k.device}, buffer on {self.device}")
        if not (bool(torch.isfinite(k).all()) and bool(torch.isfinite(v).all())):
            # NaN is the poison that marks a freed slot (I-POISON-ON-FREE): a live slot must never hold it
            raise InvalidArgument(
                "set_kv_buffer: k/v hold NaN or infinite values (NaN is the freed-slot poison)"
            )
        kernels.store_kv(self.k_buffer, self.v_buffer, layer, idx, k, v)

    def _check_layer(self, layer: object) -> int:
        index = check_count(layer, "layer")
        if index >= self.num_layers:
            raise InvalidArgument(f"layer {layer} outside [0, {self.num_layers})")
        return index

    def _slots(self, slots: Ids, what: str) -> torch.Tensor:
        """Slot ids of this buffer (padding rows included: kernels may write them)."""
        idx = as_index_tensor(slots, self.device, f"kv_buffer.{what}")
        check_in_range(idx, 0, self.num_slots - 1, "kv_buffer", "slot")
        return idx

    def zero_slots(self, slots: torch.Tensor) -> None:
        """Zero K and V of ``slots`` in every layer (what a debug build does on alloc)."""
        idx = self._slots(slots, "zero_slots")
        kernels.zero_slots(self.k_buffer, idx)
        kernels.zero_slots(self.v_buffer, idx)

    @ensure(
        lambda self, slots: bool(self.poisoned(slots).all()),
        "I-POISON-ON-FREE: every freed slot holds the poison value",
    )
    def poison_slots(self, slots: torch.Tensor) -> None:
        """Poison K and V of ``slots`` (NaN): a later read of a freed slot shows in the data."""
        idx = self._slots(slots, "poison_slots")
        kernels.poison_slots(self.k_buffer, idx)
        kernels.poison_slots(self.v_buffer, idx)

    def poisoned(self, slots: torch.Tensor) -> torch.Tensor:
        """Per slot: does any element of K or V hold the poison value?"""
        idx = self._slots(slots, "poisoned")
        return kernels.any_poisoned(self.k_buffer, idx) | kernels.any_poisoned(self.v_buffer, idx)

    def get_key_buffer(self, layer: int) -> torch.Tensor:
        return self.k_buffer[self._check_layer(layer)]

    def get_value_buffer(self, layer: int) -> torch.Tensor:
        return self.v_buffer[self._check_layer(layer)]
