"""Host-side argument checks shared by the torch reference and the Triton launchers.

Why on the host: the Triton interpreter does not detect out-of-bounds loads (they silently return
garbage), ``tl.device_assert`` is a no-op there, and it runs programs sequentially so a write-write
or read-write race between programs is invisible. Checking here, before either backend runs, gives
both backends the same contract and the same exceptions (``ValueError`` for bad values and shapes,
``TypeError`` for unsupported dtypes).

Each check costs a device synchronisation on CUDA (``.item()``); the ledger is a reference
implementation and prefers a loud error to a silent corruption.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

INDEX_DTYPES = (torch.int32, torch.int64)

# The same-width integer dtype a state dtype's raw bits are reinterpreted as (by element size).
_BITS_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@functools.cache
def bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype of the same width as ``dtype``: kernels move raw bits, never values.

    Moving bits keeps NaN payloads and -0.0 intact on every backend and means one compiled kernel
    serves every 4-byte dtype, for example.
    """
    size = torch.empty((), dtype=dtype).element_size()
    if size not in _BITS_DTYPES:
        raise TypeError(f"unsupported state dtype {dtype}: element size {size} has no integer twin")
    return _BITS_DTYPES[size]


def state_view(state: torch.Tensor, name: str = "state") -> torch.Tensor:
    """Return ``state`` (shape ``[L, S, *F]``) as a ``[L, S, F]`` view sharing its storage.

    Writes through the view land in ``state``, so the feature tail must flatten without a copy and
    be unit-stride (layer and slot strides are free: a slice of a bigger buffer is fine).
    """
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(state).__name__}")
    if state.dim() < 2:
        raise ValueError(f"{name} must have shape [L, S, *F], got {tuple(state.shape)}")
    bits_dtype(state.dtype)
    if state.dim() == 3:  # already [L, S, F] (every pool's layout): the view would be the tensor itself
        if state.shape[2] > 1 and state.stride(2) != 1:
            raise ValueError(f"{name}'s feature tail must be unit-stride, got strides {state.stride()}")
        return state
    layers, slots = state.shape[0], state.shape[1]
    features = math.prod(state.shape[2:])
    try:
        view = state.view(layers, slots, features)
    except RuntimeError as exc:
        raise ValueError(
            f"{name}'s feature tail {tuple(state.shape[2:])} is not flattenable in place"
        ) from exc
    if features > 1 and view.stride(2) != 1:
        raise ValueError(f"{name}'s feature tail must be unit-stride, got strides {state.stride()}")
    return view


def check_index(idx: torch.Tensor, name: str, size: int, device: torch.device) -> None:
    """A 1-D int32/int64 index tensor on ``device`` with every entry in ``[0, size)``."""
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(idx).__name__}")
    if idx.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(idx.shape)}")
    if idx.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {idx.dtype}")
    if idx.device != device:
        raise ValueError(f"{name} is on {idx.device} but the buffer is on {device}")
    if idx.numel() == 0:
        return
    if idx.is_cpu:
        if idx.numel() <= 16:  # a few host indices (a Mamba slot per request): Python's min/max beat numpy's
            values = idx.tolist()
            lo_i, hi_i = min(values), max(values)
            if lo_i >= 0 and hi_i < size:
                return
            raise ValueError(f"{name} has entries in [{lo_i}, {hi_i}], outside [0, {size})")
        # Host indices: one unsigned reduction in numpy (a negative entry reads as a huge one).
        a = idx.numpy()
        if int(a.astype(np.int64, copy=False).view(np.uint64).max()) < size:
            return
        lo_i, hi_i = int(a.min()), int(a.max())
    else:
        lo, hi = torch.aminmax(idx)
        lo_i, hi_i = int(lo.item()), int(hi.item())
    if lo_i < 0 or hi_i >= size:
        raise ValueError(f"{name} has entries in [{lo_i}, {hi_i}], outside [0, {size})")


def check_distinct(idx: torch.Tensor, name: str) -> None:
    """No repeated entry: two programs writing one slot race on a GPU."""
    n = idx.numel()
    if n < 2:
        return
    if idx.is_cpu:
        repeated = len(set(idx.tolist())) != n if n <= 16 else np.unique(idx.numpy()).size != n
    else:
        repeated = torch.unique(idx).numel() != n
    if repeated:
        raise ValueError(f"{name} has repeated entries; concurrent writes to one slot would race")


def check_slots(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Validate a slot list against ``state``; return the ``[L, S, F]`` view."""
    view = state_view(state)
    check_index(slots, "slots", view.shape[1], state.device)
    return view


def check_fill_slots(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """As :func:`check_slots`, plus distinct slots (each is written)."""
    view = check_slots(state, slots)
    check_distinct(slots, "slots")
    return view


def check_copy(state: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Validate a slot copy; return the ``[L, S, F]`` view.

    ``dst`` distinct and disjoint from ``src``: with a chain ``0->1, 1->2`` the result depends on
    program order, which the interpreter fixes (hiding the bug) and a GPU does not. Repeated
    ``src`` entries are fine (forking one state into several slots).
    """
    view = state_view(state)
    check_index(src, "src", view.shape[1], state.device)
    check_index(dst, "dst", view.shape[1], state.device)
    if src.numel() != dst.numel():
        raise ValueError(f"src and dst differ in length: {src.numel()} != {dst.numel()}")
    check_distinct(dst, "dst")
    if src.is_cpu and src.numel() <= 16:
        overlap = bool(set(src.tolist()) & set(dst.tolist()))
    else:
        overlap = bool(src.numel()) and bool(torch.isin(src, dst).any().item())
    if overlap:
        raise ValueError("src and dst overlap; a slot both read and written in one copy would race")
    return view


def check_transfer(
    src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a copy between two state tensors (host <-> device tiers); return their ``[L, S, F]`` views.

    Same layers, features and dtype on both sides; equal lengths; ``dst_idx`` distinct (a repeated
    target would be a write-write race on a GPU); each index on its own tensor's device and in bounds.
    """
    sv, dv = state_view(src, "src"), state_view(dst, "dst")
    if sv.dtype != dv.dtype:
        raise TypeError(f"transfer: src is {sv.dtype}, dst is {dv.dtype} (no implicit cast)")
    if (sv.shape[0], sv.shape[2]) != (dv.shape[0], dv.shape[2]):
        raise ValueError(
            f"transfer: src {tuple(src.shape)} and dst {tuple(dst.shape)} differ beyond the slot dim"
        )
    check_index(src_idx, "src_idx", sv.shape[1], sv.device)
    check_index(dst_idx, "dst_idx", dv.shape[1], dv.device)
    if src_idx.numel() != dst_idx.numel():
        raise ValueError(f"transfer: {src_idx.numel()} source slots for {dst_idx.numel()} targets")
    check_distinct(dst_idx, "dst_idx")
    return sv, dv


def check_store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    layer: int,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a KV store; return the ``[L, S, F]`` views of the two buffers.

    ``k``/``v`` must already have the buffer dtype: the kernels move bits and never convert, so a
    silent down-cast (for example fp32 into a bf16 pool) cannot differ between backends.
    """
    kb = state_view(k_buffer, "k_buffer")
    vb = state_view(v_buffer, "v_buffer")
    if k_buffer.shape[:2] != v_buffer.shape[:2]:
        raise ValueError(
            f"k_buffer {tuple(k_buffer.shape)} and v_buffer {tuple(v_buffer.shape)} differ in [L, S]"
        )
    if v_buffer.device != k_buffer.device:
        raise ValueError("k_buffer and v_buffer are on different devices")
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int, got {type(layer).__name__}")
    if not 0 <= layer < k_buffer.shape[0]:
        raise ValueError(f"layer {layer} outside [0, {k_buffer.shape[0]})")
    check_index(loc, "loc", k_buffer.shape[1], k_buffer.device)
    num = loc.numel()
    for name, x, buf in (("k", k, k_buffer), ("v", v, v_buffer)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != (num, *buf.shape[2:]):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {(num, *buf.shape[2:])}")
        if x.dtype != buf.dtype:
            raise ValueError(f"{name} is {x.dtype} but its buffer is {buf.dtype}; cast before storing")
        if x.device != buf.device:
            raise ValueError(f"{name} is on {x.device} but its buffer is on {buf.device}")
    check_distinct(loc, "loc")
    return kb, vb


def poison_value(dtype: torch.dtype) -> float | int:
    """The value that marks a slot as "must not be read": NaN, or the most negative integer.

    Unsigned and bool dtypes are rejected: their minimum is 0, which a freshly zeroed slot also
    holds, so poison would be indistinguishable from legitimate data.
    """
    if dtype.is_floating_point:
        nan_rule(dtype)  # rejects NaN encodings the kernels' bit test cannot recognise
        return math.nan
    if dtype == torch.bool or dtype.is_complex:
        raise TypeError(f"no poison value for {dtype}")
    info = torch.iinfo(dtype)
    if info.min == 0:
        raise TypeError(f"no poison value for unsigned {dtype}: its minimum 0 is also a zeroed slot")
    return int(info.min)


@functools.cache
def poison_bits(dtype: torch.dtype) -> int:
    """The poison value's raw bits, as a signed integer of the dtype's bits twin."""
    value = torch.tensor(poison_value(dtype), dtype=dtype)
    return int(value.view(bits_dtype(dtype)).item())


@functools.cache
def nan_rule(dtype: torch.dtype) -> tuple[int, int]:
    """``(abs_mask, nan_above)`` such that a value is NaN iff ``(bits & abs_mask) > nan_above``.

    The Triton kernels test NaN on raw bits (an fp8 -> fp32 conversion is not reliable in the
    interpreter). The rule holds for IEEE formats (``nan_above`` = the bits of +inf) and for
    ``float8_e4m3fn`` (no inf; ``nan_above`` = the largest finite value). For formats of at most 16
    bits it is verified against ``torch.isnan`` on every bit pattern; formats where it fails (the
    ``fnuz`` fp8 types, whose only NaN is the negative-zero pattern) are rejected with ``TypeError``.
    """
    if not dtype.is_floating_point:
        raise TypeError(f"{dtype} is not a floating dtype")
    twin = bits_dtype(dtype)
    width = 8 * torch.empty((), dtype=dtype).element_size()
    abs_mask = (1 << (width - 1)) - 1
    if width >= 32:
        return abs_mask, int(torch.tensor(math.inf, dtype=dtype).view(twin).item())
    patterns = torch.arange(1 << width, dtype=torch.int64)
    is_nan = torch.isnan(patterns.to(twin).view(dtype).float())
    magnitude = patterns & abs_mask
    nan_above = int(magnitude[~is_nan].max().item())
    if not torch.equal(is_nan, magnitude > nan_above):
        raise TypeError(f"the NaN encoding of {dtype} is not 'magnitude above a threshold'; unsupported")
    return abs_mask, nan_above
