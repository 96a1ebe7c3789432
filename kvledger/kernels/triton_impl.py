"""Triton kernels for slot bookkeeping, with thin launchers. Importing this module requires triton.

The launchers are *unchecked*: they trust that the caller ran the host-side checks in ``_checks``
(the public functions in ``kvledger.kernels`` do). Conventions every kernel follows, because the
interpreter hides their violations (tooling-notes §2):

* every loaded index is widened with ``.to(tl.int64)`` before it is multiplied by a stride;
* strides are passed explicitly (the interpreter ignores a tensor's own strides);
* data is moved as same-width integers (a bits view), so NaN payloads survive and one compiled
  kernel serves all dtypes of a width;
* the grid is ``(items, layers, feature blocks)`` with items on axis 0, the only axis allowed more
  than 65535 programs.

``INTERPRET`` is read here, at import, from the same knob ``@triton.jit`` reads at decoration time,
so it says which kind of kernel the decorators below produced.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from kvledger.kernels import _checks, _hashing

INTERPRET: bool = bool(triton.knobs.runtime.interpret)

MIN_BLOCK = 64  # few distinct BLOCK values -> few compilations on a GPU (and in Hypothesis runs)
MAX_BLOCK = 2048
MAX_GRID_YZ = 65535  # CUDA limit for grid axes 1 and 2

_PHI: tl.constexpr = tl.constexpr(_hashing.PHI)
_M1: tl.constexpr = tl.constexpr(_hashing.M1)
_M2: tl.constexpr = tl.constexpr(_hashing.M2)
_SHIFT: tl.constexpr = tl.constexpr(_hashing.SHIFT)
_LOW_MASK: tl.constexpr = tl.constexpr(_hashing.LOW_MASK)


# --------------------------------------------------------------------------------------- kernels


@triton.jit
def _copy_slots_kernel(ptr, src_ptr, dst_ptr, stride_l, stride_s, F, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(2).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < F
    src = tl.load(src_ptr + i).to(tl.int64)
    dst = tl.load(dst_ptr + i).to(tl.int64)
    base = ptr + layer * stride_l + offs
    x = tl.load(base + src * stride_s, mask=mask)
    tl.store(base + dst * stride_s, x, mask=mask)


@triton.jit
def _fill_slots_kernel(ptr, slot_ptr, value, stride_l, stride_s, F, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(2).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < F
    slot = tl.load(slot_ptr + i).to(tl.int64)
    vals = (tl.zeros([BLOCK], dtype=tl.int64) + value).to(ptr.dtype.element_ty)
    tl.store(ptr + layer * stride_l + slot * stride_s + offs, vals, mask=mask)


@triton.jit
def _match_slots_kernel(
    ptr, slot_ptr, all_ptr, any_ptr, value, stride_l, stride_s, F, L, NFB,
    IS_NAN: tl.constexpr, WIDTH_MASK: tl.constexpr, ABS_MASK: tl.constexpr, NAN_ABOVE: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    fb = tl.program_id(2).to(tl.int64)
    offs = fb * BLOCK + tl.arange(0, BLOCK)
    mask = offs < F
    slot = tl.load(slot_ptr + i).to(tl.int64)
    x = tl.load(ptr + layer * stride_l + slot * stride_s + offs, mask=mask)  # lanes ~mask: see tl.where
    bits = x.to(tl.int64) & WIDTH_MASK  # unsigned raw bits, as in the fingerprint
    if IS_NAN:  # noqa: SIM108  (a constexpr branch: only one side is compiled)
        hit = (bits & ABS_MASK) > NAN_ABOVE  # any NaN payload, either sign (_checks.nan_rule)
    else:
        hit = bits == value
    hit = hit.to(tl.int32)
    out = (i * L + layer) * NFB + fb
    tl.store(all_ptr + out, tl.min(tl.where(mask, hit, 1), axis=0))
    tl.store(any_ptr + out, tl.max(tl.where(mask, hit, 0), axis=0))


@triton.jit
def _element_hash(bits, pos):
    # Bit-for-bit the torch formulation in _hashing.element_hash (see the definition there).
    x = bits ^ ((pos + 1) * _PHI)
    x = x ^ ((x >> _SHIFT) & _LOW_MASK)
    x = x * _M1
    x = x ^ ((x >> _SHIFT) & _LOW_MASK)
    x = x * _M2
    return x ^ ((x >> _SHIFT) & _LOW_MASK)


@triton.jit
def _fingerprint_kernel(
    ptr, slot_ptr, out_ptr, stride_l, stride_s, F, L, NFB,
    WIDTH_MASK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    fb = tl.program_id(2).to(tl.int64)
    offs = fb * BLOCK + tl.arange(0, BLOCK)
    mask = offs < F
    slot = tl.load(slot_ptr + i).to(tl.int64)
    x = tl.load(ptr + layer * stride_l + slot * stride_s + offs, mask=mask)  # lanes ~mask: see tl.where
    bits = x.to(tl.int64) & WIDTH_MASK
    h = _element_hash(bits, layer * F + offs)
    tl.store(out_ptr + (i * L + layer) * NFB + fb, tl.sum(tl.where(mask, h, 0), axis=0))


@triton.jit
def _store_kv_kernel(
    kb_ptr, vb_ptr, loc_ptr, k_ptr, v_ptr, kb_stride_s, vb_stride_s, k_stride_t, v_stride_t, FK, FV,
    BLOCK: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(loc_ptr + t).to(tl.int64)
    mk = offs < FK
    tl.store(kb_ptr + slot * kb_stride_s + offs, tl.load(k_ptr + t * k_stride_t + offs, mask=mk), mask=mk)
    mv = offs < FV
    tl.store(vb_ptr + slot * vb_stride_s + offs, tl.load(v_ptr + t * v_stride_t + offs, mask=mv), mask=mv)


# ------------------------------------------------------------------------------------- launchers


def pick_block(features: int, block: int | None = None) -> int:
    """A power-of-two block width in ``[MIN_BLOCK, MAX_BLOCK]`` covering ``features`` if it can.

    ``block`` overrides it (tests use small blocks to exercise multi-block masking cheaply).
    """
    if block is not None:
        if block < 1 or block & (block - 1):
            raise ValueError(f"block must be a power of two, got {block}")
        return block
    return max(MIN_BLOCK, min(MAX_BLOCK, triton.next_power_of_2(max(features, 1))))


def _grid(items: int, layers: int, features: int, block: int) -> tuple[int, int, int]:
    nfb = triton.cdiv(features, block)
    if layers > MAX_GRID_YZ or nfb > MAX_GRID_YZ:
        raise ValueError(f"{layers} layers x {nfb} feature blocks exceed the grid limit {MAX_GRID_YZ}")
    return items, layers, nfb


def _on(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Launch on the tensor's own GPU: Triton launches on the *current* device, which may differ."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _bits(view: torch.Tensor) -> torch.Tensor:
    return view.view(_checks.bits_dtype(view.dtype))


def copy_slots(view: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, *, block: int | None = None) -> None:
    """Copy slot ``src[i]`` to ``dst[i]`` in every layer of a ``[L, S, F]`` view (unchecked)."""
    layers, _, features = view.shape
    blk = pick_block(features, block)
    grid = _grid(src.numel(), layers, features, blk)
    if 0 in grid:
        return
    bits = _bits(view)
    with _on(bits.device):
        _copy_slots_kernel[grid](
            bits, src.contiguous(), dst.contiguous(), bits.stride(0), bits.stride(1), features, BLOCK=blk
        )


def fill_slots(view: torch.Tensor, slots: torch.Tensor, value_bits: int, *, block: int | None = None) -> None:
    """Set every element of the given slots to the raw bits ``value_bits`` (unchecked)."""
    layers, _, features = view.shape
    blk = pick_block(features, block)
    grid = _grid(slots.numel(), layers, features, blk)
    if 0 in grid:
        return
    bits = _bits(view)
    with _on(bits.device):
        _fill_slots_kernel[grid](
            bits, slots.contiguous(), value_bits, bits.stride(0), bits.stride(1), features, BLOCK=blk
        )


def match_slots(
    view: torch.Tensor, slots: torch.Tensor, *, block: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(all_poison, any_poison)`` bool ``[n]`` for the given slots (unchecked).

    Each program reduces one (slot, layer, feature block); the host folds the partial results, which
    keeps the kernel free of atomics and the result independent of program order.
    """
    layers, _, features = view.shape
    n = slots.numel()
    blk = pick_block(features, block)
    grid = _grid(n, layers, features, blk)
    all_part = torch.ones(grid, dtype=torch.int32, device=view.device)
    any_part = torch.zeros(grid, dtype=torch.int32, device=view.device)
    if 0 not in grid:
        is_nan = view.dtype.is_floating_point
        abs_mask, nan_above = _checks.nan_rule(view.dtype) if is_nan else (0, 0)
        wmask = _hashing.width_mask(view.element_size())
        value = 0 if is_nan else _checks.poison_bits(view.dtype) & wmask
        bits = _bits(view)
        with _on(bits.device):
            _match_slots_kernel[grid](
                bits, slots.contiguous(), all_part, any_part, value, bits.stride(0), bits.stride(1),
                features, layers, grid[2], IS_NAN=is_nan, WIDTH_MASK=wmask, ABS_MASK=abs_mask,
                NAN_ABOVE=nan_above, BLOCK=blk,
            )  # fmt: skip
    return all_part.flatten(1).bool().all(dim=1), any_part.flatten(1).bool().any(dim=1)


def fingerprint_slots(view: torch.Tensor, slots: torch.Tensor, *, block: int | None = None) -> torch.Tensor:
    """Int64 ``[n]`` fingerprints of the given slots (unchecked); see ``_hashing``."""
    layers, _, features = view.shape
    n = slots.numel()
    blk = pick_block(features, block)
    grid = _grid(n, layers, features, blk)
    part = torch.zeros(grid, dtype=torch.int64, device=view.device)
    if 0 not in grid:
        bits = _bits(view)
        with _on(bits.device):
            _fingerprint_kernel[grid](
                bits, slots.contiguous(), part, bits.stride(0), bits.stride(1), features, layers, grid[2],
                WIDTH_MASK=_hashing.width_mask(view.element_size()), BLOCK=blk,
            )  # fmt: skip
    return part.flatten(1).sum(dim=1, dtype=torch.int64)


def store_kv(
    kb: torch.Tensor,
    vb: torch.Tensor,
    layer: int,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block: int | None = None,
) -> None:
    """Scatter ``k``/``v`` (``[T, *F]``) into slots ``loc`` of ``[L, S, F]`` views at ``layer``, unchecked."""
    num = loc.numel()
    fk, fv = kb.shape[2], vb.shape[2]
    blk = pick_block(max(fk, fv), block)
    nfb = triton.cdiv(max(fk, fv), blk)
    if num == 0 or nfb == 0:
        return
    if nfb > MAX_GRID_YZ:
        raise ValueError(f"{nfb} feature blocks exceed the grid limit {MAX_GRID_YZ}")
    kl, vl = _bits(kb[layer]), _bits(vb[layer])
    k2, v2 = _rows(k, fk), _rows(v, fv)
    with _on(kl.device):
        _store_kv_kernel[(num, nfb)](
            kl, vl, loc.contiguous(), k2, v2, kl.stride(0), vl.stride(0), k2.stride(0), v2.stride(0), fk, fv,
            BLOCK=blk,
        )  # fmt: skip


def _rows(x: torch.Tensor, features: int) -> torch.Tensor:
    """``x`` as ``[T, F]`` integer bits with unit feature stride (copies only if it must)."""
    rows = x.reshape(x.shape[0], features)
    if features > 1 and rows.stride(1) != 1:
        rows = rows.contiguous()
    return _bits(rows)
