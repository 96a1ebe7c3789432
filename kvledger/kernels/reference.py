"""Torch reference implementations of the slot kernels: the semantics the Triton kernels must match.

Plain advanced indexing on any device. These are also the CPU fallback the dispatcher in
``kvledger.kernels`` uses, so they validate their arguments with the same host-side checks as the
Triton path (see ``_checks``): both backends accept and reject exactly the same calls.
"""

from __future__ import annotations

import numpy as np
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
    "transfer_slots",
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


def _host_bits(view: torch.Tensor) -> np.ndarray | None:
    """A ``[L, S, F]`` CPU view's raw bits as a numpy array sharing its memory (None: not on the host).

    Slot moves on the host go through numpy: for the few slots a call touches, a numpy fancy-index
    assignment costs a fraction of torch's, and moving raw bits keeps NaN payloads and -0.0 exact.
    """
    if not view.is_cpu or view.requires_grad:
        return None
    return view.view(_checks.bits_dtype(view.dtype)).numpy()


def copy_slots(state: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """``state[:, dst[i]] = state[:, src[i]]`` in every layer (``dst`` distinct, disjoint from ``src``)."""
    view = _checks.check_copy(state, src, dst)
    if src.numel() == 0:
        return
    bits = _host_bits(view)
    if bits is not None:
        bits[:, dst.numpy()] = bits[:, src.numpy()]
        return
    state[:, dst] = state[:, src]


def zero_slots(state: torch.Tensor, slots: torch.Tensor) -> None:
    """Zero every element of the given slots in every layer (all-zero bits, so +0.0 for floats)."""
    view = _checks.check_fill_slots(state, slots)
    if slots.numel() == 0:
        return
    bits = _host_bits(view)
    if bits is not None:
        bits[:, slots.numpy()] = 0
        return
    state[:, slots] = 0


def poison_slots(state: torch.Tensor, slots: torch.Tensor) -> None:
    """Fill the given slots with :func:`poison_value` so that any later read of them is detectable."""
    value = poison_value(state.dtype)
    view = _checks.check_fill_slots(state, slots)
    if slots.numel() == 0:
        return
    bits = _host_bits(view)
    if bits is not None:
        bits[:, slots.numpy()] = _checks.poison_bits(state.dtype)
        return
    state[:, slots] = value


# On the host, numpy does the per-slot arithmetic: a slot check touches a few hundred elements, where
# numpy's per-call cost is a fraction of torch's. Same definitions, bit-identical results.
_NUMPY_FLOATS = (torch.float32, torch.float64)


def _host_slots(view: torch.Tensor, slots: torch.Tensor) -> np.ndarray | None:
    """The selected slots of a ``[L, S, F]`` CPU view as a numpy ``[L, n, F]`` gather (None: not a host
    array numpy can read). The gather is numpy's: torch's advanced indexing costs several times more
    for the few slots a call names (the poison read-back runs on every freed Mamba slot at ``full``)."""
    if not view.is_cpu or view.requires_grad:
        return None
    return view.numpy()[:, slots.numpy()]


def _host_rows(view: torch.Tensor, slots: torch.Tensor) -> np.ndarray:
    """The selected slots of a ``[L, S, F]`` CPU view as a ``[n, L * F]`` numpy array."""
    layers, _, features = view.shape
    gathered = _host_slots(view, slots)
    if gathered is None:
        gathered = view[:, slots].numpy()
    return gathered.transpose(1, 0, 2).reshape(slots.numel(), layers * features)


def _slot_hits(state: torch.Tensor, slots: torch.Tensor) -> np.ndarray | torch.Tensor:
    """Bool ``[L, n, F]``: which elements of each selected slot hold poison (any NaN for floats)."""
    value = poison_value(state.dtype)
    view = _checks.check_slots(state, slots)
    if state.dtype in _NUMPY_FLOATS or not state.dtype.is_floating_point:
        gathered = _host_slots(view, slots)
        if gathered is not None:
            return np.isnan(gathered) if state.dtype.is_floating_point else gathered == value
    selected = view[:, slots]
    if state.dtype.is_floating_point:
        return torch.isnan(selected.float())
    return selected == value


def _per_slot(hits: np.ndarray | torch.Tensor, every: bool) -> torch.Tensor:
    """Reduce ``[L, n, F]`` hits to ``[n]``: every element (``every``) or any element of each slot."""
    if isinstance(hits, np.ndarray):
        reduced = hits.all(axis=(0, 2)) if every else hits.any(axis=(0, 2))
        return torch.from_numpy(np.ascontiguousarray(reduced))
    return hits.all(dim=2).all(dim=0) if every else hits.any(dim=2).any(dim=0)


def poisoned_mask(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Bool ``[n]``: True where every element of the slot, in every layer, is poison (NaN-aware)."""
    return _per_slot(_slot_hits(state, slots), every=True)


def any_poisoned(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Bool ``[n]``: True where any element of the slot is poison (a read of a poisoned slot leaked)."""
    return _per_slot(_slot_hits(state, slots), every=False)


def fingerprint_slots(state: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Int64 ``[n]``: the per-slot checksum defined in ``kvledger.kernels._hashing``."""
    view = _checks.check_slots(state, slots)
    layers, _, features = view.shape
    if state.is_cpu:
        bits_np = _host_rows(view.view(_checks.bits_dtype(state.dtype)), slots).astype(np.int64)
        bits_np &= _hashing.width_mask(state.element_size())
        pos_np = np.arange(layers * features, dtype=np.int64)
        return torch.from_numpy(_hashing.element_hash_np(bits_np, pos_np).sum(axis=1, dtype=np.int64))
    bits = view.view(_checks.bits_dtype(state.dtype))[:, slots].transpose(0, 1)  # [n, L, F]
    bits64 = bits.to(torch.int64) & _hashing.width_mask(state.element_size())
    pos = torch.arange(layers * features, dtype=torch.int64, device=state.device).view(layers, features)
    return _hashing.element_hash(bits64, pos).sum(dim=(1, 2), dtype=torch.int64)


def transfer_slots(
    src: torch.Tensor, src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor
) -> None:
    """``dst[:, dst_idx[i]] = src[:, src_idx[i]]`` in every layer, bit-exact, across tensors and devices."""
    sv, dv = _checks.check_transfer(src, src_idx, dst, dst_idx)
    if src_idx.numel() == 0:
        return
    bits = sv.view(_checks.bits_dtype(sv.dtype))[:, src_idx.to(sv.device)]
    dv.view(_checks.bits_dtype(dv.dtype))[:, dst_idx] = bits.to(dv.device)
