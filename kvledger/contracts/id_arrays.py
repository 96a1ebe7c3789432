"""Ids as a ledger reads them: a host int64 array or a short list of Python ints, from whatever a pool hands in.

A pool passes ids as a numpy array, a torch tensor (any device), a sequence of ints or one int; the
ledgers (:mod:`kvledger.contracts.ledger`, :mod:`kvledger.contracts.owner_table`) convert once, here.
The thresholds below choose between a ledger's Python path for a few ids and its numpy path for many.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

SMALL_MOVE = 16
"""Moves of at most this many ids take the owner table's Python path (:class:`OwnerTable`)."""

BYTE_TESTS = 512
"""Up to this many ids, a move's sign test reads each id's high byte (a bytes slice), not a reduction."""

HIGH_BYTES = slice(7, None, 8) if sys.byteorder == "little" else slice(0, None, 8)
"""The most significant byte of each int64 in a ``tobytes()`` copy (zero for ids in ``[0, 2**56)``)."""


def as_id_list(ids: Any) -> list[int]:
    """Ids as a list of Python ints, from a tensor, an array, a sequence or a single int."""
    if isinstance(ids, int):
        return [ids]
    tolist = getattr(ids, "tolist", None)
    if tolist is not None:
        out = tolist()
        return [out] if isinstance(out, int) else list(out)
    return [int(i) for i in ids]


def as_id_array(ids: Any) -> np.ndarray:
    """Ids as a 1-D int64 numpy array on the host (zero-copy for CPU tensors and int64 arrays)."""
    if isinstance(ids, np.ndarray):
        a = ids
    elif isinstance(ids, int):
        return np.array((ids,), dtype=np.int64)
    elif hasattr(ids, "is_cpu"):  # a torch tensor: host it first (a no-op on CPU)
        a = ids.numpy() if ids.is_cpu else ids.cpu().numpy()
    else:
        try:
            a = np.asarray(ids, dtype=np.int64)
        except OverflowError:  # an int beyond int64 is certainly not an id: keep it visible, as objects
            return np.asarray(list(ids), dtype=object)
    if a.dtype != np.int64:
        a = a.astype(np.int64)
    return a.reshape(-1)


def message_ids(ids: Any) -> list[int]:
    """Ids for a message: Python ints (works for object arrays holding huge ints too)."""
    return [int(i) for i in as_id_list(ids)]
