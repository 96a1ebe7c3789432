"""Radix keys: normalisation, the child key, and page-granular common-prefix length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvledger.contracts.errors import InvalidKey


def as_key(key: Any) -> tuple[int, ...]:
    """A key as a tuple of ints (tuples hash and compare slices in C, which the walk relies on)."""
    if isinstance(key, tuple):
        return key
    if isinstance(key, list):
        return tuple(key)
    tolist = getattr(key, "tolist", None)
    if tolist is not None:
        out = tolist()
        if isinstance(out, list):
            return tuple(out)
    if isinstance(key, Sequence) and not isinstance(key, (str, bytes)):
        return tuple(key)
    raise InvalidKey(f"a key must be a sequence of token ids, got {type(key).__name__}")


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
