"""Slot kernels for KV and Mamba state pools: tensors and indices in, tensors out.

Layout: a *state* tensor is ``[L, S, *F]`` (layer-major, slot on dim 1); KV buffers are
``[L, S, H, D]``. Index tensors are 1-D int32/int64 on the buffer's device. Every function checks
its arguments on the host (bounds, distinctness, shapes, dtypes) before either backend runs, and
raises ``ValueError`` (``TypeError`` for an unsupported dtype); an empty index tensor is a no-op.

Backends: the Triton kernels in ``triton_impl`` when the tensor is on CUDA and triton imports, or
when ``TRITON_INTERPRET=1`` was set before this package was imported (the moment ``@triton.jit``
reads it); otherwise the torch reference in ``kvledger.kernels.reference``. ``backend_for`` says
which one a call on a given tensor takes. This package deliberately imports nothing else from
kvledger, so the pools can depend on it and not the other way round.
"""

from __future__ import annotations

import torch

from kvledger.kernels import _checks, reference
from kvledger.kernels._checks import poison_value

try:
    from kvledger.kernels import triton_impl as _triton
except ImportError:  # triton is optional (absent on some platforms): the torch reference serves all
    _triton = None  # type: ignore[assignment]

HAVE_TRITON: bool = _triton is not None
INTERPRET: bool = _triton.INTERPRET if _triton is not None else False

__all__ = [
    "HAVE_TRITON",
    "INTERPRET",
    "any_poisoned",
    "backend_for",
    "copy_slots",
    "fingerprint_slots",
    "poison_slots",
    "poison_value",
    "poisoned_mask",
    "reference",
    "store_kv",
    "transfer_slots",
    "zero_slots",
]


def backend_for(tensor: torch.Tensor) -> str:
    """``"triton"`` or ``"torch"``: the backend the functions below use for ``tensor``."""
    if _triton is not None and (tensor.is_cuda or _triton.INTERPRET):
        return "triton"
    return "torch"


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    layer: int,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """``k_buffer[layer, loc] = k`` and ``v_buffer[layer, loc] = v``.

    ``k``/``v`` are ``[T, H, D]`` in the buffers' dtype (no implicit cast); ``loc`` holds ``T``
    distinct slots.
    """
    if _triton is None or backend_for(k_buffer) == "torch":
        reference.store_kv(k_buffer, v_buffer, layer, loc, k, v)
        return
    kb, vb = _checks.check_store_kv(k_buffer, v_buffer, layer, loc, k, v)
    _triton.store_kv(kb, vb, layer, loc, k, v)


def copy_slots(state: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """``state[:, dst[i]] = state[:, src[i]]`` for every layer, bit-exact.

    Raises ``ValueError`` unless lengths are equal, ``dst`` is distinct and ``src``/``dst`` are
    disjoint: chained or overlapping copies would race on a GPU, and the interpreter (which runs
    programs in order) would hide that race in tests.
    """
    if _triton is None or backend_for(state) == "torch":
        reference.copy_slots(state, src, dst)
        return
    view = _checks.check_copy(state, src, dst)
    _triton.copy_slots(view, src, dst)


def transfer_slots(
    src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor
) -> None:
    """``dst[:, dst_idx[i]] = src[:, src_idx[i]]`` for every layer, bit-exact: the host tier's copies
    (write-through, write-back, load-back) between two pools' tensors, possibly on two devices.

    The torch reference serves both backends: a host <-> device copy is a DMA (SGLang's cache controller
    issues it on its own stream), not a kernel Triton can run over pageable host memory.
    """
    reference.transfer_slots(src, src_idx, dst, dst_idx)


def zero_slots(state: torch.Tensor, slots: torch.Tensor) -> None:
    """Set every element of the given (distinct) slots to all-zero bits, in every layer."""
    if _triton is None or backend_for(state) == "torch":
        reference.zero_slots(state, slots)
        return
    view = _checks.check_fill_slots(state, slots)
    _triton.fill_slots(view, slots, 0)


def poison_slots(state: torch.Tensor, slots: torch.Tensor) -> None:
    """Fill the given (distinct) slots with ``poison_value(state.dtype)``.

    A freed slot is poisoned so that a kernel that reads it anyway produces a detectable value
    (see ``any_poisoned``) instead of silently inheriting a previous request's state.
    """
    if _triton is None or backend_for(state) == "torch":
        reference.poison_slots(state, slots)
        return
    bits = _checks.poison_bits(state.dtype)
    view = _checks.check_fill_slots(state, slots)
    _triton.fill_slots(view, slots, bits)


def poisoned_mask(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Bool ``[len(slots)]``: True where every element of the slot, in every layer, is poison.

    NaN-aware: for floating dtypes any NaN counts as poison, whatever its payload.
    """
    if _triton is None or backend_for(state) == "torch":
        return reference.poisoned_mask(state, slots)
    poison_value(state.dtype)
    view = _checks.check_slots(state, slots)
    return _triton.match_slots(view, slots)[0]


def any_poisoned(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Bool ``[len(slots)]``: True where any element of the slot is poison (a poisoned read leaked)."""
    if _triton is None or backend_for(state) == "torch":
        return reference.any_poisoned(state, slots)
    poison_value(state.dtype)
    view = _checks.check_slots(state, slots)
    return _triton.match_slots(view, slots)[1]


def fingerprint_slots(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Int64 ``[len(slots)]`` checksum of each slot's raw bits over all layers and features.

    Sensitive to every bit and to each element's position, independent of the slot's index (a
    copied slot has its source's fingerprint); bit-identical across backends. Definition in
    ``kvledger.kernels._hashing``.
    """
    if _triton is None or backend_for(state) == "torch":
        return reference.fingerprint_slots(state, slots)
    view = _checks.check_slots(state, slots)
    return _triton.fingerprint_slots(view, slots)
