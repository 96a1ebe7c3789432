"""Input validation shared by the pools: bad input becomes a typed error before anything changes.

I-TYPED-INPUT: a ``KVLedgerError`` subclass, never a bare torch error; I-NO-PARTIAL: raised before any
mutation, so a rejected call leaves the pool and its ledger exactly as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kvledger.contracts.errors import DuplicateIds, InvalidArgument, SlotOutOfRange

INDEX_DTYPES = (torch.int32, torch.int64)
INT32_MAX = 2**31 - 1


def resolve_device(device: str | torch.device) -> torch.device:
    """A concrete device (``cuda`` becomes ``cuda:0``); asking for CUDA without one is an error."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidArgument(f"device {device!r} requested but CUDA is not available")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise InvalidArgument(f"unsupported device {device!r}: use 'cpu' or 'cuda'")
    return dev


def check_count(n: Any, what: str = "n") -> int:
    """A non-negative Python int (bools and floats are rejected, not coerced)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise InvalidArgument(f"{what} must be an int, got {type(n).__name__} {n!r}")
    if n < 0:
        raise InvalidArgument(f"{what} must be >= 0, got {n}")
    return n


def check_positive(n: Any, what: str) -> int:
    """A Python int >= 1 (pool sizes, page sizes, lengths)."""
    if check_count(n, what) < 1:
        raise InvalidArgument(f"{what} must be >= 1, got {n}")
    return n


def as_index_tensor(ids: Any, device: torch.device, what: str) -> torch.Tensor:
    """Ids as a 1-D int64 tensor on ``device``.

    Tensors must already be integer-typed and on the pool's device: a silent copy or cast would hide
    a caller that mixes up pools or devices. Python ints and sequences of ints are accepted for
    convenience and created on the pool's device.
    """
    if isinstance(ids, torch.Tensor):
        # The common case first: already a 1-D int64 tensor on the pool's device, returned as is.
        here = ids.is_cpu if device.type == "cpu" else ids.device == device
        if ids.dtype is torch.int64 and ids.dim() == 1 and here:
            return ids
        if ids.dtype not in INDEX_DTYPES:
            raise InvalidArgument(f"{what}: ids must be int32 or int64, got {ids.dtype}")
        if ids.device != device:
            raise InvalidArgument(f"{what}: ids are on {ids.device}, the pool is on {device}")
        if ids.dim() > 1:
            raise InvalidArgument(f"{what}: ids must be 1-D, got shape {tuple(ids.shape)}")
        return ids.reshape(-1).to(torch.int64)
    if isinstance(ids, bool):
        raise InvalidArgument(f"{what}: ids must be ints, got a bool")
    try:
        if isinstance(ids, int):
            return torch.tensor([ids], dtype=torch.int64, device=device)
        if isinstance(ids, Sequence) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return torch.tensor(list(ids), dtype=torch.int64, device=device)
    except (
        OverflowError,
        RuntimeError,
        ValueError,
    ) as exc:  # an int beyond int64: certainly not an id of any pool
        raise SlotOutOfRange(f"{what}: id does not fit in int64 ({exc})") from None
    raise InvalidArgument(
        f"{what}: expected a tensor, an int or a sequence of ints, got {type(ids).__name__}"
    )


def check_decode_batch(seq_lens: Sequence[Any], last_loc: Sequence[Any], owners: Sequence[Any], pool: str) -> None:
    """The shape of a decode batch: equally long lists, every ``seq_len`` an int >= 1."""
    if not (len(seq_lens) == len(last_loc) == len(owners)):
        raise InvalidArgument(f"[{pool}] alloc_decode: argument lengths differ")
    for s in seq_lens:
        if check_count(s, "seq_len") < 1:
            raise InvalidArgument(f"[{pool}] alloc_decode: seq_len must be >= 1")


def ids_within(ids: torch.Tensor, low: int, high: int) -> bool:
    """Whether every id lies in ``[low, high]``: one unsigned reduction on the host, no tensor ops."""
    n = ids.numel()
    if n == 0:
        return True
    if n <= 16:  # a few ids: Python ints beat numpy calls
        lst = ids.tolist()
        return low <= min(lst) and max(lst) <= high
    a = ids.numpy() if ids.is_cpu else ids.cpu().numpy()
    if a.dtype != np.int64:
        a = a.astype(np.int64)
    return int((a - low).view(np.uint64).max()) <= high - low


def check_in_range(ids: torch.Tensor, low: int, high: int, pool: str, unit: str = "id") -> None:
    """Every id in ``[low, high]``; anything else (the reserved id 0 included) is SlotOutOfRange."""
    if ids_within(ids, low, high):
        return
    bad = (ids < low) | (ids > high)
    if bool(bad.any()):
        offenders = ids[bad][:8].tolist()
        raise SlotOutOfRange(f"[{pool}] {unit}(s) {offenders} outside the usable range [{low}, {high}]")


def check_unique(ids: torch.Tensor, pool: str, unit: str = "id") -> None:
    if ids.numel() < 2:
        return
    uniq, counts = torch.unique(ids, return_counts=True)
    if uniq.numel() != ids.numel():
        raise DuplicateIds(f"[{pool}] {unit}(s) repeated in one call: {uniq[counts > 1][:8].tolist()}")
