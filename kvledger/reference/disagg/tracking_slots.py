"""A PD decode instance's Mamba V2 tracking slots: a holdings manager of their own (issue 36 item 1).

A decode request holds ``k`` ping-pong tracking slots besides its working slot from pre-allocation (or
resumption) to release, though nothing captures into them on this side (its states arrive by transfer;
a decode radix cache caches a finished request's working slot). The scheduler's cache path has no
tracking rules here, so the decode instance registers this manager first in its coordinator's admission
order: pre-allocation takes the tracking slots, then the row, the working slot and the KV, all or none.
"""

from __future__ import annotations

from typing import cast

import torch

from kvledger.contracts.protocols import AnyPrefixCache, MambaStatePool, mamba_cache_of
from kvledger.reference.scheduler.counters import Counters
from kvledger.reference.scheduler.holdings import AllocationFailed, Undo
from kvledger.reference.scheduler.request import Req


class DecodeTrackingSlots:
    """Holdings manager of kind ``pd.tracking``: ``k`` tracking slots per admitted decode request.

    Invariant: a request's ``mamba_ping_pong_track_buffer`` names ``k`` slots it owns, or is None."""

    name = "pd.tracking"
    fields: tuple[str, ...] = ("mamba_ping_pong_track_buffer", "mamba_next_track_idx")

    def __init__(self, pool: MambaStatePool, k: int, counters: Counters, tree: AnyPrefixCache | None) -> None:
        self.pool = pool
        self.k = k
        self.counters = counters
        self.tree = tree

    def save(self, req: Req) -> object:
        return req.mamba_ping_pong_track_buffer

    def restore(self, req: Req, saved: object) -> None:
        req.mamba_ping_pong_track_buffer = cast("torch.Tensor | None", saved)

    def take(self, req: Req, undo: Undo) -> None:
        """Pre: ``req`` holds no tracking slots. Post: it holds ``k`` (recorded in ``undo``), or
        :class:`AllocationFailed` when the pool is short even after evicting the decode tree's unlocked states."""
        short = self.k - self.counters.mamba_available()
        mamba_tree = mamba_cache_of(self.tree)
        if short > 0 and mamba_tree is not None:
            mamba_tree.evict_mamba(short)  # unlocked states of the decode's tree
        track = self.pool.alloc(self.k, req.owner)
        if track is None:
            raise AllocationFailed("pd tracking")
        undo.append((self.pool.free, track, req))
        req.mamba_ping_pong_track_buffer = track
        req.mamba_next_track_idx = 0

    def release(self, req: Req, tree_len: int = 0) -> None:
        """Give back the tracking slots and clear their handle (#26941 left it set)."""
        if req.mamba_ping_pong_track_buffer is not None:
            self.pool.free(req.mamba_ping_pong_track_buffer, req.owner)
            req.mamba_ping_pong_track_buffer = None
