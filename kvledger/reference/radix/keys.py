"""Radix keys: normalisation and validation, the child key, and page-granular common-prefix length."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence

import numpy as np
import torch

from kvledger.contracts.errors import InvalidKey


def as_key(key: object) -> tuple[int, ...]:
    """A key as a tuple of ints (tuples hash and compare slices in C, which the walk relies on).

    A key is a list or tuple of ints ``>= 0``, or a 1-D integer tensor or array. Anything else (a nested
    sequence, a float, a string, None, a negative id, a generator) is :class:`InvalidKey` before the tree
    is touched.
    Tokens are opaque to the cache beyond that (their range is the model's vocabulary, checked where
    requests enter the scheduler); a bool is an int here, as in Python.
    """
    if type(key) is tuple:
        k = key
    elif type(key) is list:
        k = tuple(key)
    elif isinstance(key, (torch.Tensor, np.ndarray)):
        return _array_key(key)
    elif isinstance(key, Sequence) and not isinstance(key, (str, bytes, bytearray)):
        k = tuple(key)
    else:
        raise InvalidKey(f"a key must be a sequence of token ids, got {type(key).__name__}")
    check_tokens(k)
    return k


def check_tokens(k: tuple[object, ...]) -> None:
    """Every token an int in ``[0, 2**64)``: one C-level pass (``struct`` packs each through
    ``__index__``, so a float, a string, None or a nested sequence fails, and so does a negative id)."""
    try:
        _packer(len(k))(*k)
    except struct.error:
        bad = next((t for t in k if not isinstance(t, int) or not 0 <= t < 2**64), None)
        raise InvalidKey(f"a key's tokens must be ints >= 0, got {type(bad).__name__} {bad!r}") from None


@functools.lru_cache(maxsize=256)
def _packer(n: int) -> Callable[..., bytes]:
    return struct.Struct(f"{n}Q").pack


def _array_key(key: torch.Tensor | np.ndarray) -> tuple[int, ...]:
    integer = (
        not key.dtype.is_floating_point and not key.dtype.is_complex and key.dtype != torch.bool
        if isinstance(key, torch.Tensor)
        else key.dtype.kind in "iu"
    )
    if not integer or key.ndim != 1:
        raise InvalidKey(f"a key tensor must be 1-D with an integer dtype, got {key.dtype} {tuple(key.shape)}")
    return tuple(key.tolist())


def common_prefix_len(key: tuple[int, ...], start: int, node_key: tuple[int, ...], page_size: int) -> int:
    """Length of the common prefix of ``key[start:]`` and ``node_key``, in whole pages.

    One whole-slice comparison first (the common case: the node matches completely). Otherwise a
    bisection that compares only the unresolved range ``[lo, mid)`` each step, so about ``2n`` elements
    are copied and compared in C in total, instead of a Python loop over tokens.
    """
    n = min(len(key) - start, len(node_key))
    n -= n % page_size
    if key[start : start + n] == node_key[:n]:
        return n
    lo, hi = 0, n // page_size  # in pages: [0, lo) is equal, [0, hi) is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        a, b = lo * page_size, mid * page_size
        if key[start + a : start + b] == node_key[a:b]:
            lo = mid
        else:
            hi = mid
    return lo * page_size
