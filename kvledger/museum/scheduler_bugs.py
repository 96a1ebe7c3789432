"""Scheduler and cache bugs, re-enacted outside the reference code: each ``wrap`` below takes the reference
method and returns the historical one that replaces it for the duration of an exhibit's ``with`` block
(:func:`kvledger.museum.exhibit.patched`). The registry entries are in :mod:`kvledger.museum.catalogue`.

Each replacement is the historical behaviour written against kvledger's names, no more: the checks that
catch it are the reference's own, run by the generic machines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from kvledger.contracts.errors import InvalidState
from kvledger.reference.radix import MambaRadixCache
from kvledger.reference.scheduler import ReqState, Scheduler
from kvledger.reference.scheduler.cache_paths import MambaV2Path
from kvledger.reference.scheduler.cache_paths.base import row_of
from kvledger.reference.scheduler.memory import ReqMemory
from kvledger.reference.scheduler.request import Req
from kvledger.reference.scheduler.tracking import MambaTracking
from kvledger.reference.scheduler.validate import UnknownRequest

Wrap = Callable[[Any], Any]


# --------------------------------------------------------------------------------------------- B1
def b1_result_path_frees_the_extra_token(original: Any) -> Any:
    def process_batch_result(self: Scheduler, batch: Any) -> None:
        """Before #12224's single release path: with overlap, a request that finished in batch N had
        already been launched in batch N+1; when N+1's result came back the result path freed the KV of
        that discarded extra token itself, although the request's release covers it."""
        extra = [
            (req, batch.out_cache_loc[i : i + 1])
            for i, req in enumerate(batch.reqs)
            if batch.is_decode and req.state.is_done
        ]
        original(self, batch)
        for req, loc in extra:
            self.kv_allocator.free(loc, req.owner)

    return process_batch_result


# --------------------------------------------------------------------------------------------- B2
# Before #12224, with the overlap scheduler, SGLang retracted in ``get_next_batch_to_run`` while the
# previous decode batch's results were still unprocessed; that batch had allocated one more KV token for
# each of its requests than their output showed. Three places together made the leak: the retraction did
# not wait for the batch, the result path skipped the retracted request, and the release freed a length
# inferred from the token lists. Each wrap below replaces one of them.
def b2_retraction_does_not_drain(original: Any) -> Any:
    def _drain_before_retract(self: Scheduler) -> bool:
        """Before #12224: the retraction ran with the previous batch in flight, its results unprocessed."""
        return False

    return _drain_before_retract


def b2_retraction_accepts_a_launched_request(original: Any) -> Any:
    def _check_retractable(self: Scheduler, req: Req) -> None:
        """``retract_decode`` picked any request of the running batch, launched in the batch in flight or
        not (the batch's result was to skip it)."""
        self._check_own_request(req, "retract")
        if req.state is not ReqState.RUNNING or req not in self.running:
            raise InvalidState(f"retract: {req!r} is {req.state.value}, not running")

    return _check_retractable


def b2_result_path_skips_the_retracted(original: Any) -> Any:
    def _discards_result(self: Scheduler, req: Req) -> bool:
        """``if req.is_retracted: continue``: a request retracted after the batch launched (back in the
        waiting queue) gets nothing from that batch's result, its last allocated KV token included."""
        return bool(original(self, req)) or req.state is ReqState.WAITING

    return _discards_result


def b2_retraction_frees_an_inferred_length(original: Any) -> Any:
    def release_without_insert(self: ReqMemory, req: Req) -> None:
        """Before #11981/#12224: retraction (the request is still RUNNING when it is released) freed the
        KV of ``len(input) + max(len(output) - 1, 0)`` tokens, a length inferred from the token lists,
        instead of what the request had allocated; with a decode batch in flight the request had
        allocated one token more."""
        if req.state is ReqState.RUNNING and req.req_pool_idx is not None:
            inferred = len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)
            req.kv_allocated_len = max(req.cache_protected_len, min(inferred, req.kv_allocated_len))
        original(self, req)

    return release_without_insert


# --------------------------------------------------------------------------------------------- B5
def b5_release_skips_the_lone_cow_slot(original: Any) -> Any:
    def release_without_insert(self: ReqMemory, req: Req) -> None:
        """Before #12693: the abort path released only requests holding a row; a waiting request whose
        ``match_prefix`` had taken a copy-on-write slot kept it for good."""
        if req.req_pool_idx is None:
            self._guard_release(req)
            return
        original(self, req)

    return release_without_insert


# --------------------------------------------------------------------------------------------- B6
def b6_16067_frees_the_stopper_slot_on_failure(original: Any) -> Any:
    def _cleanup_stopper(self: Scheduler, req: Req, *, appended: bool, result: Any) -> None:
        """#16067 (reverted by #18910): free the copy-on-write slot of the request that stopped the round
        whenever ``add_one_req`` did not return CONTINUE, even when the request had been appended (the
        budget ran out after it), so an admitted request loses its working slot."""
        if req.mamba_pool_idx is not None:
            self.memory.release_cow_slot(req)

    return _cleanup_stopper


# --------------------------------------------------------------------------------------------- B7
def b7_waiting_abort_bypasses_the_release(original: Any) -> Any:
    def _abort_now(self: Scheduler, req: Req, reason: str) -> None:
        """#20010/#20069 (fix #20182): the queue-length and waiting-timeout aborts took a waiting request
        out of the queue and ended it without the release helper the client abort used."""
        if req.state is not ReqState.WAITING:
            original(self, req, reason)
            return
        self._leave_queues(req)
        self._finish_state(req, ReqState.ABORTED, reason)
        self.stats.aborts += 1
        req.released = True
        self._live.pop(req.rid, None)
        self.accounting.released(req)

    return _abort_now


# --------------------------------------------------------------------------------------------- B8
def b8_release_without_deferral(original: Any) -> Any:
    def _release_or_defer(self: Scheduler, req: Req) -> None:
        """Before #17850: a request that finished (or a chunk that ended) gave back its row at once, while
        the launched batch still read it; the next admission wrote its prefix into that row."""
        self._release_finished_or_aborted(req)

    return _release_or_defer


# --------------------------------------------------------------------------------------------- B9
def b9_abort_releases_an_ended_request(original: Any) -> Any:
    def abort(self: Scheduler, rid: int) -> bool:
        """Before #18694: the preemption path released the request it picked without asking whether it
        had already finished and been released."""
        req = self.requests.get(rid)
        if req is None:
            raise UnknownRequest(f"no request {rid!r}")
        if any(req in b.reqs for b in self.inflight):
            req.abort_requested = True
            return True
        self._abort_now(req, "aborted by client")
        self._check_step()
        return True

    return abort


# --------------------------------------------------------------------------------------------- B14
def b14_dec_rederives_the_mamba_lock(original: Any) -> Any:
    def _mamba_component_to_release(self: MambaRadixCache, lock: Any) -> bool:
        """Before #27147: ``dec_lock_ref`` re-read ``node.mamba_value`` instead of what ``inc_lock_ref``
        recorded; a tombstone revived in between got a Mamba unlock it never had."""
        return lock.node.mamba_value is not None

    return _mamba_component_to_release


# --------------------------------------------------------------------------------------------- B16
def b16_finish_inserts_an_empty_key(original: Any) -> Any:
    def cache_finished(self: MambaV2Path, req: Req) -> int:
        """Before #35821: V2's ``cache_finished_req`` with nothing tracked beyond the protected prefix
        (cache_len 0 or None) still inserted, creating a node with an empty key under the root."""
        tracked = req.mamba_last_track_seqlen
        if tracked is None or tracked <= req.cache_protected_len:
            empty = self.rows.read(row_of(req), 0, 0)
            tree = cast(MambaRadixCache, self.tree)  # the reference tree: the planted leaf bypasses insert
            tree._new_leaf(tree.root, (), empty, req.owner)
            return req.cache_protected_len
        result: int = original(self, req)
        return result

    return cache_finished


# --------------------------------------------------------------------------------------------- B17
def b17_rollback_forgets_the_side_allocations(original: Any) -> Any:
    def _extend_one(self: ReqMemory, req: Req, undo: list[Any]) -> Any:
        """Before #39787: ``alloc`` took the row and the Mamba slot, then failed on the next allocation;
        nothing recorded what to undo, so the partial allocation stayed."""
        return original(self, req, [])

    return _extend_one


# --------------------------------------------------------------------------------------------- B21
def b21_chunk_without_insert_drops_the_prefix(original: Any) -> Any:
    def process_prefill_chunk(self: Scheduler, req: Req) -> None:
        """#33996: with no radix tree (ChunkCache), skipping the insert between chunks also skipped the
        prefix bookkeeping; the next chunk restarted at prefix 0 and allocated the sequence again."""
        if self.tree is None:
            req.kv_committed_len = req.kv_allocated_len = 0
            return
        original(self, req)

    return process_prefill_chunk


# --------------------------------------------------------------------------------------------- N1
def n1_release_keeps_the_tracking_handle(original: Any) -> Any:
    def release(self: MambaTracking, req: Req) -> None:
        """Before #26941: ``free_mamba_cache`` freed the ping-pong tracking slots and left
        ``mamba_ping_pong_track_buffer`` set; ``alloc`` skips the allocation when it is set, so a
        retracted request came back with slots it no longer owned."""
        pp = req.mamba_ping_pong_track_buffer
        if pp is not None and pp.numel():
            self.mamba_pool.free(pp, req.owner)
        req.mamba_track = None

    return release


# --------------------------------------------------------------------------------------------- vLLM
def vllm_prediction_counts_tokens_not_pages(original: Any) -> Any:
    def decode_demand_tokens(self: ReqMemory, reqs: Any) -> int:
        """vLLM's "prediction == commitment" family (nano-vllm #207, TRT-LLM #12404): the can-allocate
        estimate of a decode step counts one token per request, while the allocation takes a whole page
        for every request whose token opens one."""
        return len(reqs)

    return decode_demand_tokens


def vllm_oversize_request_waits(original: Any) -> Any:
    def _never_fits(self: Scheduler, req: Req) -> str | None:
        """vLLM #39734: a request within ``max_model_len`` but larger than the KV pool passed the arrival
        check and waited at the head of the queue forever."""
        return None

    return _never_fits

