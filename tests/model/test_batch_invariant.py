"""The arithmetic the tiny model is built from gives a value's bits from its own inputs alone.

Each test computes the same values inside tensors of different shapes, at different offsets (SIMD
lanes, vector tails), in different batch sizes, and asserts identical bits (``torch.equal`` on the
raw bit patterns, so ``-0.0``/``+0.0`` and NaN payloads count too).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvledger.reference.model import batch_invariant as bi


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32 if x.dtype == torch.float32 else torch.int64)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


floats32 = st.floats(-100.0, 100.0, width=32, allow_nan=False)


@given(value=floats32, length=st.integers(1, 70))
def test_exp_of_a_value_has_the_same_bits_at_every_offset(value: float, length: int) -> None:
    alone = bi.exp(torch.tensor([value], dtype=torch.float32))
    spread = bi.exp(torch.full((length,), value, dtype=torch.float32))
    assert same_bits(spread, alone.expand(length))
    noisy = torch.linspace(-50, 50, length, dtype=torch.float32)
    for offset in range(length):  # the value among others, in every lane and in the tail
        mixed = noisy.clone()
        mixed[offset] = value
        assert same_bits(bi.exp(mixed)[offset : offset + 1], alone)


def test_exp_is_close_to_the_library_exp_and_keeps_nan() -> None:
    x = torch.linspace(-87, 88, 100_003, dtype=torch.float32)
    assert torch.allclose(bi.exp(x), torch.exp(x), rtol=2e-6, atol=0)
    assert bool(torch.isnan(bi.exp(torch.tensor([float("nan")]))).all())
    assert float(bi.exp(torch.tensor([-1e30]))[0]) > 0  # clamped, never 0: a weight stays positive


@given(rows=st.integers(1, 40), n=st.integers(1, 16), m=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_linear_row_is_the_same_whatever_the_batch(rows: int, n: int, m: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g)
    w = torch.randn(n, m, generator=g)
    batched = bi.linear(x, w)
    for i in range(rows):
        assert same_bits(batched[i : i + 1], bi.linear(x[i : i + 1], w))
    assert torch.allclose(batched, x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_products_on_the_grid_are_exact_in_any_shape(dtype: torch.dtype) -> None:
    """At the bound, a BLAS matmul equals the integer result: no partial sum ever rounds."""
    g = torch.Generator().manual_seed(7)
    terms, bound_a = (16, 1023) if dtype == torch.float32 else (4096, 2**20)
    bound_b = 1023
    assert bi.exact_bound_ok(terms, bound_a, bound_b, dtype)
    if dtype == torch.float32:
        assert not bi.exact_bound_ok(terms + 1, bound_a, bound_b, dtype)  # 17 * 1023**2 > 2**24
    a = torch.randint(-bound_a, bound_a + 1, (37, terms), generator=g)
    b = torch.randint(-bound_b, bound_b + 1, (terms, 300), generator=g)
    a[0], b[:, 0] = bound_a, bound_b  # the worst case: every partial sum grows to the bound
    exact = a @ b  # int64
    got = a.to(dtype) @ b.to(dtype)
    assert torch.equal(got.to(torch.int64), exact)
    for i in (0, 1, 36):  # a row alone, through a different kernel (gemv), the same bits
        assert same_bits(a[i : i + 1].to(dtype) @ b.to(dtype), got[i : i + 1])


def test_to_grid_rounds_and_clamps() -> None:
    x = torch.tensor([0.4, 0.6, -0.6, 5000.0, -5000.0])
    assert to_list(bi.to_grid(x, 1.0, 1023)) == [0.0, 1.0, -1.0, 1023.0, -1023.0]


def to_list(x: torch.Tensor) -> list[float]:
    return [float(v) for v in x]
