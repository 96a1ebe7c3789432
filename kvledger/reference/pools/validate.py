"""Input validation shared by the pools: bad input becomes a typed error before anything changes.

I-TYPED-INPUT: a ``KVLedgerError`` subclass, never a bare torch error; I-NO-PARTIAL: raised before any
mutation, so a rejected call leaves the pool and its ledger exactly as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

import numpy as np
import torch

from kvledger.contracts.errors import DuplicateIds, InvalidArgument, SizeOutOfRange, SlotOutOfRange
from kvledger.contracts.owners import Owner
from kvledger.reference.config_fields import MAX_SIZE
from kvledger.reference.pools.id_free_list import FreeListSnapshot

INDEX_DTYPES = (torch.int32, torch.int64)
INT32_MAX = 2**31 - 1
INT64 = torch.int64

CPU = torch.device("cpu")
"""The device every CPU pool gets from :func:`resolve_device`: one object, so that the hot path asks
``device is CPU`` (a pointer comparison) instead of ``device.type`` (a fifth of a microsecond)."""


def resolve_device(device: str | torch.device) -> torch.device:
    """A concrete device (``cuda`` becomes ``cuda:0``); asking for CUDA without one is an error."""
    if not isinstance(device, (str, torch.device)):
        raise InvalidArgument(f"device must be a str or torch.device, got {type(device).__name__} {device!r}")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:  # an unparsable device string
        raise InvalidArgument(f"unknown device {device!r}: {exc}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidArgument(f"device {device!r} requested but CUDA is not available")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise InvalidArgument(f"unsupported device {device!r}: use 'cpu' or 'cuda'")
    return CPU if dev == CPU else dev


def check_count(n: object, what: str = "n") -> int:
    """A non-negative Python int of at most ``MAX_SIZE`` (bools and floats are rejected, not coerced).

    Every count the pools, caches and scheduler take (ids, tokens, positions, requests) is bounded by a
    pool or a row, and no pool is larger than ``MAX_SIZE``: a larger count (``evict_mamba(2**70)``,
    ``force_retract(2**70)``) is a mistake, refused as every size beyond its bound is."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise InvalidArgument(f"{what} must be an int, got {type(n).__name__} {n!r}")
    if n < 0:
        raise InvalidArgument(f"{what} must be >= 0, got {n}")
    if n > MAX_SIZE:
        raise SizeOutOfRange(f"{what} must be at most {MAX_SIZE} (MAX_SIZE), got {n}")
    return n


def check_positive(n: object, what: str) -> int:
    """A Python int >= 1 (pool sizes, page sizes, lengths)."""
    count = check_count(n, what)
    if count < 1:
        raise InvalidArgument(f"{what} must be >= 1, got {n}")
    return count


def check_int(n: object, what: str) -> int:
    """A Python int of any sign (bools and floats are rejected, not coerced)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise InvalidArgument(f"{what} must be an int, got {type(n).__name__} {n!r}")
    return n


def check_name(name: object, what: str = "name") -> str:
    """A non-empty str (a pool's or cache's name appears in every message and ledger report)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{what} must be a non-empty str, got {type(name).__name__} {name!r}")
    return name


def check_owner(owner: object, what: str = "owner") -> Owner:
    """An :class:`Owner`: whoever takes or gives back ids must be a handle the ledger can record."""
    if not isinstance(owner, Owner):
        raise InvalidArgument(f"{what} must be an Owner, got {type(owner).__name__} {owner!r}")
    return owner


def check_sequence(seq: object, what: str) -> Sequence[object]:
    """A list or tuple (sized, indexable, read twice without being consumed: no generator, no str)."""
    if not isinstance(seq, (list, tuple)):
        raise InvalidArgument(f"{what} must be a list or tuple, got {type(seq).__name__}")
    return seq


def _all_ints(items: Sequence[object]) -> TypeGuard[Sequence[int]]:
    return all(type(x) is int for x in items)


def _all_owners(items: Sequence[object]) -> TypeGuard[Sequence[Owner]]:
    return all(isinstance(x, Owner) for x in items)


def check_int_sequence(seq: object, what: str) -> Sequence[int]:
    """A list or tuple of Python ints (no bools, floats or tensors): one C-level pass over the types."""
    items = check_sequence(seq, what)
    if not _all_ints(items):
        bad = next(x for x in items if type(x) is not int)
        raise InvalidArgument(f"{what} must hold ints, got {type(bad).__name__} {bad!r}")
    return items


def check_owners(owners: object, what: str = "owners") -> Sequence[Owner]:
    """A list or tuple of :class:`Owner` handles."""
    items = check_sequence(owners, what)
    if not _all_owners(items):
        for owner in items:
            check_owner(owner, f"each of {what}")
    assert _all_owners(items)  # every item passed check_owner above
    return items


def as_index_tensor(ids: object, device: torch.device, what: str) -> torch.Tensor:
    """Ids as a 1-D int64 tensor on ``device``.

    Tensors must already be integer-typed and on the pool's device: a silent copy or cast would hide
    a caller that mixes up pools or devices. Python ints and sequences of ints are accepted for
    convenience and created on the pool's device.
    """
    if isinstance(ids, torch.Tensor):
        # The common case first: already a 1-D int64 tensor on the pool's device, returned as is.
        here = ids.is_cpu if device is CPU or device.type == "cpu" else ids.device == device
        if ids.dtype is INT64 and ids.dim() == 1 and here:
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


def check_decode_batch(seq_lens: object, last_loc: object, owners: object, pool: str) -> None:
    """The shape of a decode batch: equally long lists of ints and owners, every ``seq_len`` >= 1."""
    lens = check_int_sequence(seq_lens, f"[{pool}] alloc_decode: seq_lens")
    locs = check_int_sequence(last_loc, f"[{pool}] alloc_decode: last_loc")
    holders = check_owners(owners, f"[{pool}] alloc_decode: owners")
    if not (len(lens) == len(locs) == len(holders)):
        raise InvalidArgument(f"[{pool}] alloc_decode: argument lengths differ")
    if lens and min(lens) < 1:
        raise InvalidArgument(f"[{pool}] alloc_decode: seq_len must be >= 1, got {min(lens)}")


def ids_within(ids: torch.Tensor, low: int, high: int) -> bool:
    """Whether every id lies in ``[low, high]``: one unsigned reduction on the host, no tensor ops."""
    n = ids.numel()
    if n == 0:
        return True
    if n <= 16:  # a few ids: Python ints beat numpy calls
        lst: list[int] = ids.tolist()
        return low <= min(lst) and max(lst) <= high
    a: np.ndarray = ids.numpy() if ids.is_cpu else ids.cpu().numpy()
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


def check_snapshot(state: object, pool: str) -> FreeListSnapshot:
    """What ``backup_state`` returned (a :class:`FreeListSnapshot`); whose pool it is, ``restore`` checks."""
    if not isinstance(state, FreeListSnapshot):
        raise InvalidArgument(
            f"[{pool}] restore_state: expected the snapshot backup_state returned, got {type(state).__name__}"
        )
    return state
