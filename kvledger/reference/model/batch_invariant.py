"""Arithmetic whose result for one token never depends on the other tokens computed with it.

The tiny model must give bit-identical results for a token whether it is computed alone, in a chunk
of a prefill, next to other requests in a decode batch, or after a prefix-cache hit. Library matmuls,
sums and transcendental functions do not promise that: a BLAS picks kernels (and accumulation orders)
by shape and alignment, a vectorised reduction groups its terms by the tensor's length, and torch's
CPU ``exp`` runs a SIMD polynomial on full vectors but the C library's ``expf`` on the tail, so the same
input can round differently at a different offset in the tensor.

Everything here is therefore built only from elementwise IEEE-754 operations that are correctly
rounded (``+ - * /``, ``max``, ``round``, selection, integer bit operations): their result for an element
depends on that element's inputs alone, whatever the shape, the layout or the SIMD lane. Every
reduction is spelled out in a fixed order:

* :func:`linear`: ``x @ w`` accumulated term by term over the (small, fixed) input dimension;
* :func:`tree_sum`: a sum over a variable-length axis as a tree of adjacent pairs, zeros appended on
  the right. Padding the axis with more zeros does not change the result (see the function), so a
  query may be computed against any number of masked trailing positions.
"""

from __future__ import annotations

import torch

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # ln 2 split in two so that n * _LN2_HI is exact for |n| < 2**8
_LN2_LO = 1.4286068203094173e-06
_EXP_COEFFS = (1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0, 1.0)  # e**r on |r| <= ln(2)/2, Horner order
_EXP_MIN, _EXP_MAX = -87.0, 88.0  # 2**n stays a normal float32 and e**x finite


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [..., n] @ w [n, m]``, accumulated in the order ``k = 0, 1, ..., n - 1`` for every output."""
    acc = x[..., 0, None] * w[0]
    for k in range(1, w.shape[0]):
        acc = acc + x[..., k, None] * w[k]
    return acc


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over ``dim`` by adjacent pairs ``(0, 1), (2, 3), ...``, level by level; ``dim`` is removed.

    An odd level gets a ``+0.0`` appended. Each partial sum covers an aligned block of positions, so
    appending zeros to the input changes only blocks made entirely of zeros, which add ``+0.0`` at the
    top levels; the final ``+ 0.0`` turns a ``-0.0`` into ``+0.0`` so that even that cannot show. Hence
    the sum of a row with values at ``[0, n)`` is the same bits for every padded length ``>= n``.
    """
    dim = dim % x.dim()
    while x.shape[dim] > 1:
        if x.shape[dim] % 2:
            pad_shape = list(x.shape)
            pad_shape[dim] = 1
            x = torch.cat((x, x.new_zeros(pad_shape)), dim)
        pairs = x.unflatten(dim, (x.shape[dim] // 2, 2))
        x = pairs.select(dim + 1, 0) + pairs.select(dim + 1, 1)
    return x.squeeze(dim) + 0.0


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
