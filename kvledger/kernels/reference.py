"""Torch reference implementations of the slot kernels: the semantics the Triton kernels must match.

Plain advanced indexing on any device. These are also the CPU fallback the dispatcher in
``kvledger.kernels`` uses, so they validate their arguments with the same host-side checks as the
Triton path (see ``_checks``): both backends accept and reject exactly the same calls.
"""

from __future__ import annotations

import torch

from kvledger.kernels import _checks, _hashing
from kvledger.kernels._checks import poison_value

__all__ = [
    "any_poisoned",
    "copy_slots",
    "fingerprint_slots",
    "poison_slots",
    "poison_value",
    "poisoned_mask",
    "store_kv",
    "zero_slots",
]


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    layer: int,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """``k_buffer[layer, loc] = k`` and ``v_buffer[layer, loc] = v`` (``loc`` distinct)."""
    _checks.check_store_kv(k_buffer, v_buffer, layer, loc, k, v)
    if loc.numel() == 0:
        return
    k_buffer[layer, loc] = k
    v_buffer[layer, loc] = v


def copy_slots(state: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """``state[:, dst[i]] = state[:, src[i]]`` in every layer (``dst`` distinct, disjoint from ``src``)."""
    _checks.check_copy(state, src, dst)
    if src.numel() == 0:
        return
    state[:, dst] = state[:, src]


def zero_slots(state: torch.Tensor, slots: torch.Tensor) -> None:
    """Zero every element of the given slots in every layer (all-zero bits, so +0.0 for floats)."""
    _checks.check_fill_slots(state, slots)
    if slots.numel() == 0:
        return
    state[:, slots] = 0


def poison_slots(state: torch.Tensor, slots: torch.Tensor) -> None:
    """Fill the given slots with :func:`poison_value` so that any later read of them is detectable."""
    value = poison_value(state.dtype)
    _checks.check_fill_slots(state, slots)
    if slots.numel() == 0:
        return
    state[:, slots] = value


def _per_slot_hits(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Bool ``[n, L * F]``: which elements of each selected slot hold poison (any NaN for floats)."""
    value = poison_value(state.dtype)
    view = _checks.check_slots(state, slots)
    layers, _, features = view.shape
    selected = view[:, slots].transpose(0, 1).reshape(slots.numel(), layers * features)
    if state.dtype.is_floating_point:
        return torch.isnan(selected.float())
    return selected == value


def poisoned_mask(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Bool ``[n]``: True where every element of the slot, in every layer, is poison (NaN-aware)."""
    return _per_slot_hits(state, slots).all(dim=1)


def any_poisoned(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Bool ``[n]``: True where any element of the slot is poison (a read of a poisoned slot leaked)."""
    return _per_slot_hits(state, slots).any(dim=1)


def fingerprint_slots(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Int64 ``[n]``: the per-slot checksum defined in ``kvledger.kernels._hashing``."""
    view = _checks.check_slots(state, slots)
    layers, _, features = view.shape
    bits = view.view(_checks.bits_dtype(state.dtype))[:, slots].transpose(0, 1)  # [n, L, F]
    bits64 = bits.to(torch.int64) & _hashing.width_mask(state.element_size())
    pos = torch.arange(layers * features, dtype=torch.int64, device=state.device).view(layers, features)
    return _hashing.element_hash(bits64, pos).sum(dim=(1, 2), dtype=torch.int64)
