"""Host-memory pools (SGLang's ``mem_cache/pool_host``): the host tier's slots, one owner each.

A :class:`HostPool` is one :class:`~kvledger.reference.pools.base.IdPool` (the one pool base): host slots
``1..size`` (slot 0 padding, as every kvledger pool), each id one token of KV (``host_kv``) or one Mamba
state (``host_mamba``), its ledger recording who holds each, and its contents, a ``[L, size + 1, *F]``
tensor on the CPU shaped like the device buffer it backs up. SGLang sizes a host pool as a ratio of the
device pool (``hicache_ratio``) and builds it on CPU with ``pin_memory=False`` where no CUDA is present;
here the size is given. Contents move only through :func:`kvledger.kernels.transfer_slots`.
"""

from __future__ import annotations

import torch

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import Owner
from kvledger.reference.config_fields import check_size
from kvledger.reference.pools.base import IdPool


class HostPool(IdPool):
    """Host slots of one kind with their contents.

    Invariant: every slot is free or held by exactly one owner (the ledger's, I-EXCLUSIVE / I-NODUP-FREE
    cover a host pool as any other); ``buffer.shape[1] == size + 1``."""

    def __init__(
        self,
        size: int,
        like: torch.Tensor,
        *,
        name: str = "host_kv",
        checks: CheckLevel | None = None,
    ) -> None:
        """``like``: the device buffer (``[L, S, *F]``) this pool backs up; the host copy takes its layers,
        features and dtype. Pre: ``size >= 1`` (typed error otherwise)."""
        check_size(size, f"HostPool {name!r}: size")
        if not isinstance(like, torch.Tensor) or like.dim() < 2:
            raise InvalidArgument(f"HostPool {name!r}: like must be a [L, S, *F] tensor")
        self.size = size
        self._init_pool(name, "cpu", 1, size, reuse="fifo", checks=checks)
        shape = (like.shape[0], size + 1, *like.shape[2:])
        self.buffer = torch.zeros(shape, dtype=like.dtype, device="cpu")

    def alloc(self, n: int, owner: Owner, op: str = "alloc") -> torch.Tensor | None:
        """``n`` host slots for ``owner`` (int64, CPU), or None when fewer are free (nothing changes)."""
        return self.free_list.alloc(n, owner, op)

    def free(self, ids: torch.Tensor, owner: Owner, op: str = "free") -> None:
        """Give ``owner``'s slots back (a slot it does not hold, or a repeat, is a typed error, I-NODUP-FREE)."""
        self.free_list.free_checked(ids, owner, op, "host slot")
