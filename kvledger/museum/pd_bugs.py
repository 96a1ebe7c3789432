"""PD memory bugs (B4, B10, B11, N4, N5, N6a, N9), re-enacted outside the reference code: each context
manager replaces exactly one method (or builder function) for the duration of a ``with`` block.

The registry entries (ids, threads, mechanism, invariants) are in :mod:`kvledger.museum.catalogue`;
``sglang_2025_mamba_pool`` is not a bug of its own but the pool semantics the B4 seed ran on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from kvledger.museum.exhibit import patched
from kvledger.reference.disagg import builder as pd_builder
from kvledger.reference.disagg.channel import Room, TransferChannel
from kvledger.reference.disagg.decode import DecodeScheduler
from kvledger.reference.disagg.instance import PDScheduler
from kvledger.reference.disagg.prefill import PrefillScheduler
from kvledger.reference.disagg.request import PDReq
from kvledger.reference.pools import MambaPool
from kvledger.reference.pools.validate import as_index_tensor
from kvledger.reference.scheduler import Scheduler
from kvledger.reference.scheduler.request import Req, ReqState


# ---------------------------------------------------------------------------------------------- B4
def _late_2025_process_prefill_chunk(original: Callable[..., None]) -> Callable[..., None]:
    def process_prefill_chunk(self: PrefillScheduler, req: Req) -> None:
        """Late-2025 ``process_prefill_chunk``: cache the chunk, send it, then
        ``req_to_token_pool.free(chunked_req.req_pool_idx)`` with the default ``free_mamba_cache=True``:
        the row goes (the next chunk takes a new one) and so does the working Mamba slot, while
        ``req.mamba_pool_idx`` stays set, so the next chunk's ``alloc`` reuses it without allocating."""
        original(self, req)
        assert req.req_pool_idx is not None
        self.req_to_token_pool.free(req.req_pool_idx, req.owner)
        req.req_pool_idx = None
        if self.mamba_pool is not None and req.mamba_pool_idx is not None:  # a hybrid model: the bug
            self.mamba_pool.free(req.mamba_pool_idx, req.owner)  # the handle is left set

    return process_prefill_chunk


@contextlib.contextmanager
def b4_chunk_frees_mamba_slot() -> Iterator[None]:
    """B4 — sglang#12432, fixed by #12994 (``free_mamba_cache=False``), per-chunk free removed by #17850.

    PD prefill, hybrid model, chunked prefill: every chunk boundary freed the request's row together with
    its working Mamba slot and left ``req.mamba_pool_idx`` set. The slot was free and in use at once,
    and freed again at the end; SGLang's idle check saw the over-free much later
    (``mamba_available_size=473, mamba_evictable_size=4`` for a pool of 476).
    """
    with patched(PrefillScheduler, "process_prefill_chunk", _late_2025_process_prefill_chunk):
        yield


def _unchecked_mamba_free(original: Any) -> Callable[..., None]:
    def free(self: MambaPool, slots: Any, owner: Any) -> None:
        """SGLang's ``MambaPool.free`` of the time: concatenate onto the free list, no duplicate detection."""
        self._free_unchecked(as_index_tensor(slots, self.device, f"{self.name}.free"), owner)

    return free


@contextlib.contextmanager
def sglang_2025_mamba_pool() -> Iterator[None]:
    """Not a bug of its own: the pool semantics B4 ran on. kvledger's pools refuse a double free and a copy
    from a free slot, even with contracts off; to show what SGLang's idle check saw, the pool must behave
    as SGLang's did: ``free`` takes a slot twice, ``fork_from``/``copy_from`` read any slot."""
    with patched(MambaPool, "free", _unchecked_mamba_free), patched(
        MambaPool, "_check_held", lambda original: lambda self, slots, what: None
    ):
        yield


# ---------------------------------------------------------------------------------------------- B10
def _release_forgetting_prebuilt(original: Any) -> Callable[..., None]:
    def _release_finished_or_aborted(self: DecodeScheduler, req: Req) -> None:
        """Before #9817 the abort handler did not call ``release_kv_cache`` for a decode request that was
        pre-allocated and transferred and sat in the waiting (prebuilt) queue."""
        assert isinstance(req, PDReq)
        if req.state is ReqState.ABORTED and req.ended_from is ReqState.PREBUILT:
            return
        original(self, req)  # the PD instance's release, which this exhibit wraps

    return _release_finished_or_aborted


@contextlib.contextmanager
def b10_decode_abort_leaks_prebuilt() -> Iterator[None]:
    """B10 — sglang PR #9817: aborting a PD decode request in the waiting (prebuilt) queue leaked its
    pre-allocated row, KV and Mamba slot."""
    with patched(DecodeScheduler, "_release_finished_or_aborted", _release_forgetting_prebuilt):
        yield


# ---------------------------------------------------------------------------------------------- B11
@contextlib.contextmanager
def b11_decode_mamba_pool_ignores_rows() -> Iterator[None]:
    """B11 — sglang PR #19002 (and #22462/#23267): the decode Mamba pool was sized without the rows it
    serves (``max_num_reqs``-sized while rows are ``size + pre_alloc``); ``_pre_alloc`` then found no
    working slot (``AssertionError: Not enough space for mamba ping pong idx``)."""

    def ignoring_rows(original: Any) -> Callable[[int, int, int], int]:
        return lambda requested, rows, slots_per_req: requested

    with patched(pd_builder, "decode_mamba_slots", ignoring_rows):
        yield


# ---------------------------------------------------------------------------------------------- N4
@contextlib.contextmanager
def n4_decode_releases_mid_transfer() -> Iterator[None]:
    """N4 — sglang#24527 (fixes #27372, #35049 deferred release, #38961 hardening): an abort or a failure
    on the decode side freed the pre-allocated pages, row and metadata slot at once, without waiting for
    the prefill's writer; the pages went to the next request and the late write landed in its KV."""
    with patched(DecodeScheduler, "transfer_may_touch", lambda original: lambda self, req: False):
        yield


@contextlib.contextmanager
def n4_prefill_releases_while_sending() -> Iterator[None]:
    """N4, reader side — one of #38961's items: on ``Failed`` the prefill ran ``release_kv_cache`` at once
    while a send could still read the source pages, row and state slot."""
    with patched(PrefillScheduler, "transfer_may_touch", lambda original: lambda self, req: False):
        yield


# ---------------------------------------------------------------------------------------------- N5
@contextlib.contextmanager
def n5_idle_predicate_ignores_leases() -> Iterator[None]:
    """N5 — sglang-omni PR #2080: ``is_fully_idle()`` did not see the PD holders (an ended request whose
    KV lease waits for the other side), so idle-only work (``flush_cache``, the idle leak check) ran
    over live state."""
    with patched(PDScheduler, "is_quiescent", lambda original: Scheduler.is_quiescent):
        yield


# ---------------------------------------------------------------------------------------------- N6a
@contextlib.contextmanager
def n6a_waiting_queue_not_polled() -> Iterator[None]:
    """N6a — sglang PR #28236: a request aborted by the decode side after bootstrap sat in the prefill's
    waiting queue holding its metadata slot, since nothing polled its sender there; it left only when
    scheduled."""
    with patched(PrefillScheduler, "poll_waiting_failures", lambda original: lambda self: None):
        yield


# ---------------------------------------------------------------------------------------------- N9
def _done_when_metadata_landed(original: Any) -> Callable[[TransferChannel, Room], bool]:
    return lambda self, room: room.meta_landed


@contextlib.contextmanager
def n9_success_from_metadata_alone() -> Iterator[None]:
    """N9 — sglang PR #30890: Mooncake's final chunk discarded the status of ``maybe_send_extra`` (the
    Mamba/SWA state) and reported Success from the metadata (aux) transfer alone; decode committed a stale
    state. The receiver's "done" is reduced to "the metadata landed"."""
    with patched(TransferChannel, "_receiver_done", _done_when_metadata_landed):
        yield
