"""``PrefillScheduler``: the prefill instance (SGLang ``disaggregation/prefill.py``, 2026 behaviour).

Queues: bootstrap → waiting → (chunked →) running → inflight, each an account in the ledger:

| state | account | holds |
|---|---|---|
| ``BOOTSTRAP`` | ``pd.prefill.bootstrap`` | nothing (a sender) |
| ``WAITING`` | ``req.waiting`` | its metadata slot; a copy-on-write Mamba slot after a match |
| ``CHUNKED`` / ``RUNNING`` | ``req.chunked`` / ``req.running`` | row, working slot, KV tail, lock, metadata slot |
| ``INFLIGHT`` | ``pd.prefill.inflight`` | row, working slot, uncached tail, lock, metadata slot (being read) |
| ended, sends in flight | ``pd.prefill.lease`` | all of the above until every dispatched message resolved |

One step is SGLang's event loop: poll the senders of waiting and chunked requests (a decode-side abort
or a failed room aborts them: the #28236 fix), pop bootstrapped requests into the waiting queue (a
metadata slot each; FIFO, stops when none is free), build and run a prefill batch (chunk boundaries
send the finished whole pages), then poll the inflight queue (success releases with insert; failure
aborts) and the leases. A prefill instance never decodes: ``max_new_tokens`` is forced to 1 (the first
token rides with the metadata) and a request whose prompt is complete goes to the inflight queue.
"""

from __future__ import annotations

from typing import Any

from kvledger.contracts.arith import floor_to_page
from kvledger.contracts.owners import PD_PREFILL_INFLIGHT, PD_PREFILL_LEASE, REQ_WAITING
from kvledger.contracts.seams import seam
from kvledger.reference.disagg.channel import Poll, Send
from kvledger.reference.disagg.instance import PDScheduler
from kvledger.reference.disagg.request import PREFILL, PDReq
from kvledger.reference.scheduler.request import Req, ReqState


class PrefillScheduler(PDScheduler):
    side = PREFILL
    lease_account = PD_PREFILL_LEASE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.bootstrap_queue: list[PDReq] = []
        self.inflight_queue: list[PDReq] = []
        super().__init__(*args, **kwargs)

    def pd_queues(self) -> dict[str, list[PDReq]]:
        return {"bootstrap": self.bootstrap_queue, "inflight": self.inflight_queue, **super().pd_queues()}

    # ------------------------------------------------------------------ arrivals
    def new_request(self, rid: int, prompt: list[int], max_new_tokens: int) -> Req:
        # SGLang's _process_req: the prefill produces exactly one token, so the adder's estimate is exact.
        return super().new_request(rid, prompt, 1)

    def enqueue_arrival(self, req: Req) -> None:
        assert isinstance(req, PDReq)
        self.bootstrap_queue.append(req)

    # ------------------------------------------------------------------ the event loop's PD steps
    def before_schedule(self) -> None:
        self.poll_waiting_failures()
        self.poll_running_failures()
        self.pop_bootstrapped()

    def after_results(self) -> None:
        self.process_inflight_queue()
        self.process_leases()

    @seam
    def poll_waiting_failures(self) -> None:
        """Abort waiting requests whose room failed (a decode-side abort): they hold a metadata slot and,
        unpolled, keep it until they are scheduled (#28236)."""
        for req in list(self.waiting):
            assert isinstance(req, PDReq)
            if self.channel.sender_status(req.bootstrap_room) is Poll.FAILED:
                self.abort_for(req, self.channel.failure_reason(req.bootstrap_room, PREFILL))

    def poll_running_failures(self) -> None:
        """A chunked (or, with overlap, launched) request whose room failed stops at its next batch."""
        for req in self.live_requests():
            assert isinstance(req, PDReq)
            if (
                req.state in (ReqState.CHUNKED, ReqState.RUNNING)
                and not req.abort_requested
                and self.channel.sender_status(req.bootstrap_room) is Poll.FAILED
            ):
                self.abort_for(req, self.channel.failure_reason(req.bootstrap_room, PREFILL))

    def pop_bootstrapped(self) -> None:
        """Bootstrapped requests take a metadata slot and join the waiting queue (FIFO; failed entries
        are removed first, all of them, so none waits behind an entry short of a slot: I-DRAIN)."""
        for req in list(self.bootstrap_queue):
            if self.channel.sender_status(req.bootstrap_room) is Poll.FAILED:
                self.abort_for(req, self.channel.failure_reason(req.bootstrap_room, PREFILL))
        for req in list(self.bootstrap_queue):
            if self.channel.sender_status(req.bootstrap_room) is Poll.BOOTSTRAPPING:
                continue
            idx = self.metadata_pool.alloc(req.owner)
            if idx is None:
                self.pd_stats.retries += 1
                break
            req.metadata_idx = idx
            self.bootstrap_queue.remove(req)
            self._enter(req, ReqState.WAITING, REQ_WAITING, "bootstrapped")
            self.waiting.append(req)

    # ------------------------------------------------------------------ prefill
    def _merge_last_prefill(self) -> None:
        """A prefill instance never decodes: nothing joins a running batch."""
        self.last_prefill = None

    @seam
    def process_prefill_chunk(self, req: Req) -> None:
        """Cache the finished chunk (the request keeps its row and working slot), then send its whole pages."""
        super().process_prefill_chunk(req)
        assert isinstance(req, PDReq)
        self.send_kv_chunk(req, last=False)

    def finish(self, req: Req) -> None:
        """The prompt is complete: cache it, hand the last chunk (with state and metadata) to the engine
        and wait in the inflight queue (SGLang ``process_batch_result_disagg_prefill``)."""
        assert isinstance(req, PDReq)
        self._leave_queues(req)
        self.memory.cache_unfinished(req)
        self._enter(req, ReqState.INFLIGHT, PD_PREFILL_INFLIGHT, "prefill done")
        self.inflight_queue.append(req)
        self.send_kv_chunk(req, last=True)

    def send_kv_chunk(self, req: PDReq, *, last: bool) -> None:
        """Hand positions ``[start_send_idx, end)`` to the engine (SGLang ``send_kv_chunk``).

        A non-last chunk sends only whole pages whose ids are final: with a radix cache, those the tree
        adopted (locked by the request), since a later insert may still swap a request-owned slot for a
        cached duplicate; without one, everything up to the last whole page. The last chunk sends the rest
        and carries the Mamba working slot and the metadata slot.
        """
        if last:
            end = req.kv_committed_len
        elif self.tree is not None:
            end = req.cache_protected_len
        else:
            end = floor_to_page(req.kv_committed_len, self.config.page_size)
        start = req.start_send_idx
        if not last and end <= start:
            return
        assert req.req_pool_idx is not None
        send = Send(
            start,
            end,
            self.req_to_token_pool.read(req.req_pool_idx, start, end).tolist(),
            req.origin_input_ids[start:end],
        )
        if last:
            assert req.metadata_idx is not None
            self.metadata_pool.set_buf(req.metadata_idx, req.bootstrap_room, req.output_ids[0])
            send.meta_src = req.metadata_idx
            if req.mamba_pool_idx is not None:
                send.state_src = int(req.mamba_pool_idx[0])
        if self.channel.send_chunk(req.bootstrap_room, send, last=last):
            if start == 0:
                self.pd_stats.transfers_started += 1
            req.start_send_idx = end

    # ------------------------------------------------------------------ inflight queue
    def process_inflight_queue(self) -> None:
        """Success: release with insert; failure: abort (released now, or leased while sends may read)."""
        for req in list(self.inflight_queue):
            status = self.channel.sender_status(req.bootstrap_room)
            if status is Poll.SUCCESS:
                self.inflight_queue.remove(req)
                self.pd_stats.transfers_succeeded += 1
                self._finish_state(req, ReqState.FINISHED, "transferred")
                self._release_finished_or_aborted(req)
            elif status is Poll.FAILED:
                self.abort_for(req, self.channel.failure_reason(req.bootstrap_room, PREFILL))

    # ------------------------------------------------------------------ reader lease
    @seam
    def transfer_may_touch(self, req: PDReq) -> bool:
        return not self.channel.reads_drained(req.bootstrap_room)

    def lease_drained(self, req: PDReq) -> bool:
        return self.channel.reads_drained(req.bootstrap_room)
