"""``DecodeScheduler``: the decode instance (SGLang ``disaggregation/decode.py``, 2026 behaviour).

Queues: prealloc → transfer → waiting (prebuilt, no forward) → running, plus retracted:

| state | account | holds |
|---|---|---|
| ``PREALLOC`` | ``pd.decode.prealloc`` | nothing (a receiver) |
| ``TRANSFER`` | ``pd.decode.transfer`` | row, KV for the whole prompt, working slot, metadata slot; being written |
| ``PREBUILT`` | ``pd.decode.waiting`` | row, KV, working slot (the metadata slot went back at commit) |
| ``RUNNING`` | ``req.running`` | as any decoding request |
| ``RETRACTED`` | ``pd.decode.retracted`` | no pool id: KV and state in a host copy |
| ended, writes may land | ``pd.decode.lease`` | all of the above until the sender acknowledged the drain |

No radix cache by default (SGLang's ``ChunkCache``). With ``PDSpec.decode_radix_cache`` pre-allocation
matches the prompt's KV in the decode's tree (for a hybrid on KV only: the state arrives by transfer, no
copy-on-write), locks the matched node for the request's life and allocates only the rest, which is
all the sender transmits (``DstInfo.prefix_len``); a finished request inserts what it committed (with
its working slot, for a hybrid). The shared prefix is the tree's (``cache.protected`` while locked) in
every queue; the lock goes with the rest of the request's holdings, a lease included (I-PD-PREFIX-LOCK,
spec/pd.md). Rows are ``max_running + pre_alloc`` with row 0
reserved and the Mamba pool sized to cover every row (I-SIZING). One step is SGLang's
``process_decode_queue`` then the decode batch: release drained leases, resume retracted requests (while
any remains, nothing new is pre-allocated), pop pre-allocated requests (FIFO; each needs a row, a
metadata slot, a Mamba slot and KV within the token budget), poll the transfer queue (commit only when
every component landed: I-TRANSFER-ATOMIC; the metadata must name the request's room), move prebuilt
requests into the running batch, decode.
"""

from __future__ import annotations

from typing import Any

import torch

from kvledger.contracts.arith import ceil_to_page, remaining_new_tokens_clipped
from kvledger.contracts.errors import ContractViolation, InvalidState
from kvledger.contracts.owners import (
    PD_DECODE_LEASE,
    PD_DECODE_RETRACTED,
    PD_DECODE_TRANSFER,
    PD_DECODE_WAITING,
    REQ_RUNNING,
    Account,
)
from kvledger.contracts.protocols import MambaStateTensors, mamba_cache_of
from kvledger.contracts.seams import seam
from kvledger.contracts.sizing import check_decode_sizing
from kvledger.reference.disagg import landing
from kvledger.reference.disagg.channel import DstInfo, Poll
from kvledger.reference.disagg.decode_cache import check_decode_prefixes
from kvledger.reference.disagg.instance import PDScheduler
from kvledger.reference.disagg.messages import NoteKVWritten
from kvledger.reference.disagg.request import DECODE, HostCopy, PDReq
from kvledger.reference.disagg.tracking_slots import DecodeTrackingSlots
from kvledger.reference.scheduler.cache_paths.base import lock, unlock
from kvledger.reference.scheduler.request import Req, ReqState

# The decode states after ``commit_transfer``: the request no longer depends on its room.
_COMMITTED = frozenset({ReqState.PREBUILT, ReqState.RUNNING, ReqState.RETRACTED, ReqState.FINISHED})


class DecodeScheduler(PDScheduler):
    side = DECODE
    lease_account = PD_DECODE_LEASE

    def __init__(
        self,
        *args: Any,
        reserved_decode_tokens: int = 4,
        mamba_slots_per_req: int = 1,
        tracking_slots: int = 0,
        note_kv_written: NoteKVWritten | None = None,
        **kwargs: Any,
    ) -> None:
        self.prealloc_queue: list[PDReq] = []
        self.transfer_queue: list[PDReq] = []
        self.prebuilt_queue: list[PDReq] = []
        self.retracted_queue: list[PDReq] = []
        super().__init__(*args, **kwargs)
        if self.tree is not None and self.memory.tracking is not None:
            raise ContractViolation("the decode radix cache tracks no state (its states arrive by transfer)")
        self.reserved_decode_tokens = reserved_decode_tokens
        self.mamba_slots_per_req = mamba_slots_per_req
        # Mamba V2: the ping-pong tracking slots a decode request holds besides its working slot, from
        # pre-allocation (or resumption) to release; nothing captures into them (the decode radix cache,
        # when there is one, caches a finished request's working slot, not a tracked state).
        self.tracking_slots = tracking_slots if self.mamba_pool is not None else 0
        self.pd_tracking: DecodeTrackingSlots | None = None
        if self.tracking_slots and self.mamba_pool is not None:
            self.pd_tracking = DecodeTrackingSlots(
                self.mamba_pool, self.tracking_slots, self.memory.counters, self.tree
            )
            # Taken first (a rollback gives them back last); released by ``_free_tracking``, before the
            # scheduler's release path (retraction, release_now), as before the coordinator.
            self.memory.holdings_of.add(self.pd_tracking, first=True, released_here=False)
        self.note_kv_written = note_kv_written
        check_decode_sizing(
            rows=self.req_to_token_pool.size,
            mamba_slots=None if self.mamba_pool is None else self.mamba_pool.size,
            slots_per_req=mamba_slots_per_req,
            metadata_slots=self.metadata_pool.size,
        )

    def pd_queues(self) -> dict[str, list[PDReq]]:
        return {
            "prealloc": self.prealloc_queue,
            "transfer": self.transfer_queue,
            "prebuilt": self.prebuilt_queue,
            "retracted": self.retracted_queue,
            **super().pd_queues(),
        }

    def enqueue_arrival(self, req: Req) -> None:
        assert isinstance(req, PDReq)
        self.prealloc_queue.append(req)

    def _never_fits(self, req: Req) -> str | None:
        """Besides the scheduler's limits: pre-allocation takes the whole prompt plus the decode
        reservation at once (``_fits``), so a prompt for which that exceeds the KV pool would wait in the
        pre-allocation queue forever, even with the pool empty (I-LIVENESS; found by the museum's PD
        machine: a 29-token prompt, 4 reserved tokens, a 32-token pool)."""
        reason = super()._never_fits(req)
        if reason is None and self._prealloc_need(len(req.origin_input_ids)) > self.kv_allocator.size:
            reason = "prompt + reserved decode tokens exceeds the KV pool"
        return reason

    def _prealloc_need(self, length: int, reserved: int | None = None, cached: int = 0) -> int:
        """KV for ``length`` positions in whole pages, less the ``cached`` ones (a matched prefix, whole
        pages), plus the decode reservation (``reserved``, by default ``reserved_decode_tokens``)."""
        reserve = self.reserved_decode_tokens if reserved is None else reserved
        return ceil_to_page(length, self.config.page_size) - cached + reserve

    # ------------------------------------------------------------------ process_decode_queue
    def before_schedule(self) -> None:
        self.process_leases()
        self.resume_retracted()
        self.pop_preallocated()
        self.pop_transferred()
        self.get_new_prebuilt_batch()

    def _allocatable_tokens(self) -> int:
        """SGLang's ``_allocatable_token_budgets``: free KV minus what running, transferring and prebuilt
        requests are promised (the largest running request must still be able to finish, since
        transfer-queue requests cannot be retracted)."""
        promised = self.reserved_decode_tokens * (
            len(self.running) + len(self.transfer_queue) + len(self.prebuilt_queue)
        )
        largest = max(
            (
                remaining_new_tokens_clipped(r.max_new_tokens, len(r.output_ids), self.config.clip_max_new_tokens)
                for r in self.running
            ),
            default=0,
        )
        # With a decode radix cache, what it could evict counts too (a full tree must not block
        # pre-allocation forever: nothing else evicts it while no request is admitted).
        free = self.kv_allocator.available_size() + self.memory.counters.kv_evictable()
        return free - max(promised, largest)

    def _fits(self, length: int, reserved: int | None = None, cached: int = 0) -> bool:
        """A row, a metadata slot, the Mamba slots and ``length`` positions of KV (``cached`` of them
        already in the decode's tree) for one more request."""
        if self.req_to_token_pool.available_size() < 1 or self.metadata_pool.available_size() < 1:
            return False
        if self.mamba_pool is not None and self._states_available() < self.mamba_slots_per_req:
            return False
        return self._prealloc_need(length, reserved, cached) <= self._allocatable_tokens()

    def _states_available(self) -> int:
        """Free Mamba slots, plus the unlocked states the decode's tree could evict for them."""
        return self.memory.counters.mamba_available() + self.memory.counters.mamba_evictable()

    def _allocate(self, req: PDReq, length: int, account: Account, cached: int = 0) -> torch.Tensor | None:
        """Row, working slot, V2 tracking slots and KV for positions ``[cached, length)`` (all or nothing;
        ``[0, cached)`` is the locked prefix the tree holds, ``req.prefix_indices``), via the scheduler's
        path's coordinator (the tracking slots first, given back last if the rest does not fit)."""
        assert cached == (0 if req.prefix_indices is None else int(req.prefix_indices.numel()))
        self.memory.holdings_of.kv.set_matched(req, req.prefix_indices, req.last_node)
        req.extend_input_len = length - cached
        return self.memory.prepare_extend([req], None, admit_account=account)

    def _free_tracking(self, req: PDReq) -> None:
        """Give back the V2 tracking slots and clear their handle (#26941 left it set)."""
        if self.pd_tracking is not None:
            self.pd_tracking.release(req)

    def release_now(self, req: PDReq) -> None:
        self._free_tracking(req)
        super().release_now(req)

    def pop_preallocated(self) -> None:
        """Pre-allocate bootstrapped requests, FIFO, stopping at the first that does not fit.

        Failed entries go first, all of them: the FIFO stop must not keep an aborted request queued
        behind one that waits for memory (I-DRAIN; SGLang removes aborted entries at the top too).
        """
        for req in list(self.prealloc_queue):
            if self.channel.receiver_status(req.bootstrap_room) is Poll.FAILED:
                self.abort_for(req, self.channel.failure_reason(req.bootstrap_room, DECODE))
        if self.retracted_queue:
            return  # while a retracted request waits, nothing new is pre-allocated
        for req in list(self.prealloc_queue):
            if self.channel.receiver_status(req.bootstrap_room) is Poll.BOOTSTRAPPING:
                continue
            if not self._pre_alloc(req):
                self.pd_stats.retries += 1
                break

    def _pre_alloc(self, req: PDReq) -> bool:
        """Match and lock the cached prefix (with a decode radix cache), then take a metadata slot, the
        row, the Mamba slots and KV for the rest; on any shortage give everything back, the lock too."""
        length = len(req.origin_input_ids)
        cached = self.match_and_lock(req)
        if not self._fits(length, cached=cached):
            self.unlock_prefix(req)
            return False
        idx = self.metadata_pool.alloc(req.owner)
        if idx is None:
            self.unlock_prefix(req)
            return False
        req.metadata_idx = idx
        out = self._allocate(req, length, PD_DECODE_TRANSFER, cached)
        if out is None:
            self.metadata_pool.free(idx, req.owner)
            req.metadata_idx = None
            self.unlock_prefix(req)
            return False
        self.prealloc_queue.remove(req)
        self._enter(req, ReqState.TRANSFER, PD_DECODE_TRANSFER, "pre-allocated")
        self.transfer_queue.append(req)
        assert req.req_pool_idx is not None
        self.channel.init_receiver(
            req.bootstrap_room,
            DstInfo(
                kv_slots=out.tolist(),
                mamba_slot=None if req.mamba_pool_idx is None else int(req.mamba_pool_idx[0]),
                meta_idx=idx,
                row=req.req_pool_idx,
                prefix_len=cached,
            ),
        )
        self.pd_stats.transfers_started += 1
        self.pd_stats.prefix_hits += bool(cached)
        self.pd_stats.prefix_tokens += cached
        return True

    # ------------------------------------------------------------------ the decode radix cache
    def match_and_lock(self, req: PDReq) -> int:
        """The prompt's longest cached prefix in the decode's tree, locked for the request's life; returns
        its length (0 without a tree or a match: then no lock is taken).

        KV only (#32732's ``skip_mamba_match``): the request's state arrives by transfer, so the match
        needs no state on its last node and copies none (no copy-on-write from the tree). The whole
        prompt may match (#19746 allows a full hit: then only the state and the metadata travel).
        """
        if self.tree is None:
            return 0
        key, tree = req.origin_input_ids, self.tree
        mamba_tree = mamba_cache_of(tree)
        res = tree.match_prefix(key) if mamba_tree is None else mamba_tree.match_prefix_kv(key)
        cached = int(res.device_indices.numel())
        if cached == 0:
            return 0
        self.memory.holdings_of.kv.set_matched(req, res.device_indices, res.last_node)
        lock(self.tree, req, res.last_node)
        return cached

    def unlock_prefix(self, req: PDReq) -> None:
        """Pre-allocation gave up: give back the lock ``match_and_lock`` took (the request stays queued)."""
        if req.lock is not None:
            assert self.tree is not None
            unlock(self.tree, req)
        self.memory.holdings_of.kv.set_matched(req, None, None)

    def pop_transferred(self) -> None:
        """Commit transferred requests; abort failed ones (released, or leased while writes may land)."""
        for req in list(self.transfer_queue):
            status = self.channel.receiver_status(req.bootstrap_room)
            if status is Poll.FAILED:
                self.abort_for(req, self.channel.failure_reason(req.bootstrap_room, DECODE))
            elif status is Poll.SUCCESS:
                self.commit_transfer(req)

    def commit_transfer(self, req: PDReq) -> None:
        """SGLang ``_commit_transfer_to_req``: the first token from the metadata; the request is prebuilt.

        I-TRANSFER-ATOMIC: only when every component (all KV positions, the state, the metadata) landed
        and nothing of the room is in flight; a "success" that is not (#30890) is a ContractViolation.
        """
        missing = self.channel.missing_components(req.bootstrap_room)
        if missing:
            raise ContractViolation(
                f"I-TRANSFER-ATOMIC: {req.owner!r} committed with components missing: {missing};"
                f" {self.channel.describe_room(req.bootstrap_room)}"
            )
        assert req.metadata_idx is not None
        room, first_token = self.metadata_pool.read(req.metadata_idx)
        if room != req.bootstrap_room:
            why = "no metadata landed" if room == 0 else f"metadata buffer index collision (room {room})"
            self.abort_for(req, why)
            return
        self.metadata_pool.free(req.metadata_idx, req.owner)
        req.metadata_idx = None
        self.channel.close(req.bootstrap_room, DECODE)
        self.transfer_queue.remove(req)
        req.output_ids.append(first_token)
        req.first_token_step = self.step_no
        self.stats.generated_tokens += 1
        self.pd_stats.transfers_succeeded += 1
        self._enter(req, ReqState.PREBUILT, PD_DECODE_WAITING, "transferred")
        self.prebuilt_queue.append(req)

    def serves_alone(self, req: PDReq) -> bool:
        """Committed: the decode stopped polling the room at ``commit_transfer`` (as SGLang's does), so a
        sender abort arriving later does not reach this copy; only an abort on the decode ends it."""
        return req.state in _COMMITTED

    def get_new_prebuilt_batch(self) -> None:
        """Prebuilt requests join the running batch without a forward (finished ones finish here)."""
        for req in list(self.prebuilt_queue):
            if len(self.running) >= self.config.max_running_requests:
                break
            self.prebuilt_queue.remove(req)
            if self.finishes(req, req.output_ids[-1]):
                self.finish(req)
                continue
            self._enter(req, ReqState.RUNNING, REQ_RUNNING, "prebuilt")
            self.running.append(req)

    # ------------------------------------------------------------------ retraction
    def retract(self, req: Req) -> None:
        """Keep a host copy, release as the scheduler does, park in the retracted queue."""
        assert isinstance(req, PDReq)
        req.host_copy = self._host_copy(req)
        self._free_tracking(req)
        super().retract(req)
        self.waiting.remove(req)
        self._enter(req, ReqState.RETRACTED, PD_DECODE_RETRACTED, "retract to host")
        self.retracted_queue.append(req)

    def _host_copy(self, req: PDReq) -> HostCopy:
        n = req.kv_committed_len
        assert req.req_pool_idx is not None
        slots = self.req_to_token_pool.read(req.req_pool_idx, 0, n)
        k = v = conv = temporal = None
        if self.kv_buffer is not None:
            k = self.kv_buffer.k_buffer[:, slots].clone().cpu()
            v = self.kv_buffer.v_buffer[:, slots].clone().cpu()
        if self.mamba_pool is not None and req.mamba_pool_idx is not None:
            states = self._state_tensors()
            conv = states.conv_state[:, req.mamba_pool_idx].clone().cpu()
            temporal = states.temporal_state[:, req.mamba_pool_idx].clone().cpu()
        return HostCopy(n, k, v, conv, temporal)

    def _state_tensors(self) -> MambaStateTensors:
        """The Mamba pool's state tensors, which a retraction copies out and back (a pool without them,
        an adapter exposing only ids, cannot be retracted to the host)."""
        if not isinstance(self.mamba_pool, MambaStateTensors):
            raise InvalidState(f"retract to host: the Mamba pool {self.mamba_pool!r} exposes no state tensors")
        return self.mamba_pool

    def resume_retracted(self) -> None:
        """Bring retracted requests back from their host copy (SGLang ``resume_retracted_reqs``), FIFO."""
        for req in list(self.retracted_queue):
            copy = req.host_copy
            assert copy is not None
            # Reserve only what the request can still generate: a request retracted near the end of a
            # prompt at the decode limit needs less than the full reservation, and with the full one it
            # could never come back (and, first in line, would block every pre-allocation: I-LIVENESS;
            # found by the PD machine's draws at the decode limit, issue 27).
            clip = self.config.clip_max_new_tokens
            left = remaining_new_tokens_clipped(req.max_new_tokens, len(req.output_ids), clip)
            if not self._fits(copy.length, min(self.reserved_decode_tokens, left)):
                self.pd_stats.retries += 1
                break
            out = self._allocate(req, copy.length, PD_DECODE_WAITING)
            if out is None:
                self.pd_stats.retries += 1
                break
            states = None if self.mamba_pool is None or copy.conv is None else self._state_tensors()
            landing.restore(self.kv_buffer, out, copy, states, req.mamba_pool_idx)
            if self.note_kv_written is not None:
                self.note_kv_written(out.tolist(), req.context_ids()[: copy.length], list(range(copy.length)))
            req.host_copy = None
            self.retracted_queue.remove(req)
            self._enter(req, ReqState.PREBUILT, PD_DECODE_WAITING, "resumed from host")
            self.prebuilt_queue.append(req)
            self.pd_stats.resumes += 1

    def _check_step(self) -> None:
        if self.accounting.enabled:
            check_decode_prefixes(self)  # I-PD-PREFIX-LOCK
        super()._check_step()

    # ------------------------------------------------------------------ writer lease
    @seam
    def transfer_may_touch(self, req: PDReq) -> bool:
        """Writes may land while the receiver was initialised and the sender has not acknowledged."""
        return self.channel.writes_may_land(req.bootstrap_room)

    def start_lease(self, req: PDReq) -> None:
        self.channel.request_drain(req.bootstrap_room)

    def lease_drained(self, req: PDReq) -> bool:
        return self.channel.writes_drained(req.bootstrap_room)
