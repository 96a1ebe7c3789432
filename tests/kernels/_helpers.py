"""Shared helpers for the kernel tests: random raw-bit states and bit-level comparison."""

from __future__ import annotations

import torch

BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_bits(x: torch.Tensor) -> torch.Tensor:
    """``x`` reinterpreted as same-width integers, so comparisons see NaN payloads and -0.0."""
    return x.view(BITS[x.element_size()])


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(as_bits(a).cpu(), as_bits(b).cpu())


def random_bits(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A tensor of uniformly random raw bits (NaNs with random payloads, -0.0, infs included)."""
    gen = torch.Generator().manual_seed(seed)
    size = torch.empty((), dtype=dtype).element_size()
    bits_dtype = BITS[size]
    info = torch.iinfo(bits_dtype)
    raw = torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(bits_dtype)
    return raw.view(dtype)


def random_values(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Ordinary finite values (small integers for integer dtypes)."""
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    info = torch.iinfo(dtype)  # stay clear of iinfo.min: that is the integer poison value
    return torch.randint(max(-1000, info.min + 1), min(1000, info.max), shape, generator=gen).to(dtype)
