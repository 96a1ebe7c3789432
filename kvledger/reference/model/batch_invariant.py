"""Arithmetic whose result for one token never depends on the other tokens computed with it.

The tiny model must give bit-identical results for a token whether it is computed alone, in a chunk
of a prefill, next to other requests in a decode batch, or after a prefix-cache hit. Library matmuls,
sums and transcendental functions do not promise that: a BLAS picks kernels (and accumulation orders)
by shape and alignment, a vectorised reduction groups its terms by the tensor's length, and torch's
CPU ``exp`` runs a SIMD polynomial on full vectors but the C library's ``expf`` on the tail, so the same
input can round differently at another offset in the tensor.

So every value is computed in one of three ways whose result depends on its own inputs only:

* elementwise operations that IEEE-754 rounds correctly (``+ - * /``, ``max``, ``round``, selection,
  integer bit operations): the same bits whatever the shape, the layout or the SIMD lane;
* reductions over small, fixed dimensions accumulated term by term in a fixed order (:func:`linear`);
* reductions over long or variable dimensions (positions, the head) as *exact* integer arithmetic:
  both operands hold integers on a bounded grid (:func:`to_grid`), so every product and every partial
  sum is an integer the float format represents exactly (:func:`exact_bound_ok`). No rounding ever
  happens, so any summation order, blocking, FMA or BLAS kernel gives the same bits, and zeros added
  for masked or padded positions change nothing.
"""

from __future__ import annotations

import torch

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # ln 2 split in two so that n * _LN2_HI is exact for |n| < 2**8
_LN2_LO = 1.4286068203094173e-06
_EXP_COEFFS = (1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0, 1.0)  # e**r on |r| <= ln(2)/2, Horner order
_EXP_MIN, _EXP_MAX = -87.0, 88.0  # 2**n stays a normal float32 and e**x finite

EXACT_INTEGERS = {torch.float32: 2**24, torch.float64: 2**53}  # every integer below is representable


def exact_bound_ok(terms: int, bound_a: float, bound_b: float, dtype: torch.dtype) -> bool:
    """Whether ``terms`` products of integers bounded by ``bound_a`` and ``bound_b`` sum exactly in
    ``dtype`` in any order: every partial sum is then an integer of magnitude below 2**mantissa."""
    return terms * bound_a * bound_b < EXACT_INTEGERS[dtype]


def to_grid(x: torch.Tensor, scale: float | torch.Tensor, bound: int) -> torch.Tensor:
    """``round(x * scale)`` clamped to ``[-bound, bound]``: integers held in ``x``'s float dtype."""
    return torch.round(x * scale).clamp(-bound, bound)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [..., n] @ w [n, m]``, accumulated in the order ``k = 0, 1, ..., n - 1`` for every output."""
    acc = x[..., 0, None] * w[0]
    for k in range(1, w.shape[0]):
        acc = acc + x[..., k, None] * w[k]
    return acc


def exp(x: torch.Tensor) -> torch.Tensor:
    """``e**x`` (float32, relative error ~1e-7) from correctly rounded elementwise operations only.

    ``x`` is clamped to ``[-87, 88]``; ``e**x = 2**n * e**r`` with ``n = round(x / ln 2)``, ``e**r``
    by a degree-6 polynomial, ``2**n`` built from its exponent bits (exact). NaN stays NaN.
    """
    x = x.clamp(_EXP_MIN, _EXP_MAX)
    n = torch.round(x * _LOG2E)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = torch.full_like(r, _EXP_COEFFS[0])
    for c in _EXP_COEFFS[1:]:
        p = p * r + c
    two_n = ((n.to(torch.int32) + 127) << 23).view(torch.float32)
    return p * two_n


def silu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(x)`` as ``x / (1 + e**-x)``, with the :func:`exp` above."""
    return x / (exp(-x) + 1.0)
