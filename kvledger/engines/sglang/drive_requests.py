"""The Mamba machine with SGLang's own request objects: ``cache_unfinished_req`` and ``cache_finished_req``.

:class:`SGLangRequestMachine` keeps every rule of the Mamba machine (:mod:`.drive_mamba`: tree-level
admissions, locks, tombstone locks, revivals, evictions, matches) and adds the life cycle SGLang's
scheduler gives a request, played with real ``sglang.srt.managers.schedule_batch.Req`` objects on the
loaded release's ``UnifiedRadixCache`` (FULL + MAMBA, Python core) and ``HybridReqToTokenPool``, with
or without the Mamba extra buffer (``extra_buffer``: the ping-pong tracking slots of the V2 strategy):

* admit: ``Req.init_next_round_input(tree)`` (SGLang's own match, with copy-on-write), the lock the
  prefill adder takes on ``req.last_node``, ``alloc([req])`` (row, working slot, ping-pong slots), KV
  for the first chunk, the row written, ``kv_committed_len`` / ``kv_allocated_len`` set;
* a chunk boundary: ``cache_unfinished_req(req, chunked=True)``; the next chunk: ``init_next_round_input()``
  without a tree (what the scheduler does for its chunked request), KV for the chunk;
* decode: one KV slot per token, the row written, the sampled token appended to ``output_ids``;
* the forward's tracking step (extra buffer): ``mamba_last_track_seqlen`` and ``mamba_next_track_idx``;
* finish: ``cache_finished_req(req)`` then ``free(req)`` (SGLang's ``release_kv_cache``);
* retract: ``cache_finished_req(req, is_insert=False)``, ``free(req)``, ``Req.reset_for_retract()``; the
  request waits and may be admitted again (the same object);
* abort while waiting.

The oracle is the attach (:func:`.attach.watch` with ``audit_each``) plus its request check: every
request object is tracked (:meth:`.attach.Watch.track`), so after every scheduler-level call the ids its
handles name (``req_pool_idx``, ``mamba_pool_idx``, ``mamba_ping_pong_track_buffer``) must be held by it
(I-HANDLE-OWNED), as kvledger's own requests are every step. Which fields the machine sets, and why, is
in spec/sglang-attach.md ("Requests").

Releases: the per-request row pool (``alloc(reqs)`` / ``free(req)``, before ``alloc_rows``) with the
request's Mamba fields on the ``Req`` itself: 0.5.11, 0.5.12, 0.5.13.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import watch
from kvledger.engines.sglang.drive_mamba import SGLangUnifiedMambaMachine
from kvledger.engines.sglang.loader import load
from kvledger.museum.machines.cache_base import KeyDraw, key_draws, picks

REQUEST_RELEASES = ("0.5.11", "0.5.12", "0.5.13")
"""Releases whose ``Req`` and row pool this machine drives (see the module docstring)."""

TOKENS = st.integers(0, 2)
CHUNKS = st.integers(1, 4)  # prompts are 2 to 5 tokens (the cache machine's keys at page 1)


def request_classes() -> tuple[Any, Any]:
    """SGLang's ``Req`` and ``SamplingParams`` (imported on first use: the scheduler's module is heavy)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req, SamplingParams


def new_request(rid: str, tokens: tuple[int, ...]) -> Any:
    """A real SGLang ``Req`` with the minimal constructor arguments: id, empty text, prompt ids,
    sampling parameters. The prompt is an ``array('q')`` from 0.5.13 on (its constructor's type; the
    output ids are one too) and a list before (``origin_input_ids + output_ids`` must concatenate)."""
    Req, SamplingParams = request_classes()
    ids: Any = array("q", tokens) if hasattr(Req, "get_fill_ids") else list(tokens)
    return Req(
        rid=rid,
        origin_input_text="",
        origin_input_ids=ids,
        sampling_params=SamplingParams(max_new_tokens=64),
    )


def set_fill_len(req: Any, n: int) -> None:
    """Cut this round at ``n`` tokens, as the prefill adder does for a chunk (``fill_ids`` truncated
    before 0.5.13; ``fill_len`` after) and set ``extend_input_len`` with SGLang's own setter."""
    if hasattr(req, "fill_len"):
        req.fill_len = n
    else:
        req.fill_ids = req.fill_ids[:n]
    req.set_extend_input_len(n - len(req.prefix_indices))


def mark_chunked(req: Any, delta: int) -> None:
    """The chunk counter ``alloc(reqs)`` checks (``is_chunked`` before 0.5.13, ``inflight_middle_chunks``)."""
    name = "inflight_middle_chunks" if hasattr(req, "inflight_middle_chunks") else "is_chunked"
    setattr(req, name, max(0, getattr(req, name) + delta))


@dataclass(eq=False)  # one per request object: compared by identity
class Live:
    rid: str
    req: Any
    chunked: bool = False  # between chunks of its prompt
    waiting: bool = False  # retracted, or not admitted yet


class SGLangRequestMachine(SGLangUnifiedMambaMachine):
    """The Mamba machine's rules plus the scheduler-level calls on real ``Req`` objects."""

    TREE = "unified"

    @initialize(pool_pages=st.integers(8, 16), slots=st.integers(4, 9), extra_buffer=st.booleans())
    def setup(self, pool_pages: int, slots: int, extra_buffer: bool = False) -> None:
        self.sgl = load()
        self.ps = 1
        self.extra_buffer = extra_buffer
        self.alloc = build.token_allocator(pool_pages)
        self.rows = build.hybrid_req_pool(4, slots, extra_buffer=extra_buffer)
        self.slots = getattr(self.rows, "mamba_allocator", None) or self.rows.mamba_pool
        self.tree = build.unified_radix_cache(
            self.alloc, self.rows, mamba=True, core="python", extra_buffer=extra_buffer
        )
        self.w = watch(
            allocator=self.alloc, req_pool=self.rows, mamba_pool=self.rows, tree=self.tree, audit_each=True
        )
        self.reqs = []
        self.extra = []
        self.seen = []
        self.n = 0
        self.live: list[Live] = []

    # ------------------------------------------------------------------ helpers
    def state_demand(self, req: Any) -> int:
        """State slots ``alloc([req])`` takes: a working slot unless the match gave one, two ping-pong
        slots with the extra buffer unless the request still has them."""
        need = 1 if req.mamba_pool_idx is None else 0
        if self.extra_buffer and req.mamba_ping_pong_track_buffer is None:
            need += self.rows.mamba_ping_pong_track_buffer_size
        return need

    def budget_states(self, need: int) -> bool:
        """SGLang's scheduler evicts states for a request's demand before it matches (PR #38151)."""
        short = need - self.slots.available_size()
        if short > 0:
            self.tree.evict(self.sgl.EvictParams(num_tokens=0, mamba_num=short))
        return self.slots.available_size() >= need

    def kv_for(self, n: int) -> torch.Tensor | None:
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        if self.alloc.available_size() < n:
            self.tree.evict(self.sgl.EvictParams(num_tokens=n - self.alloc.available_size()))
        return self.alloc.alloc(n)

    def forward(self, lv: Live, start: int, kv: torch.Tensor, track: bool) -> None:
        """What a forward over positions ``start ..`` leaves: the KV ids written into the request's row,
        the committed and allocated lengths, and (extra buffer, ``track``) the tracking step: the state
        written into the ping-pong slot ``mamba_next_track_idx``, its length recorded and the index
        flipped (the scheduler's tracking after a forward)."""
        req = lv.req
        end = start + kv.numel()
        if kv.numel():
            self.rows.write((req.req_pool_idx, slice(start, end)), kv.to(torch.int32))
        req.kv_committed_len = end
        req.kv_allocated_len = end
        if self.extra_buffer and track and end > 0 and req.mamba_ping_pong_track_buffer is not None:
            req.mamba_last_track_seqlen = end - end % self.ps
            req.mamba_next_track_idx = self.rows.get_mamba_ping_pong_other_idx(req.mamba_next_track_idx)

    def release(self, lv: Live, *, insert: bool) -> None:
        """SGLang's ``release_kv_cache``: ``cache_finished_req`` then the row back."""
        self.tree.cache_finished_req(lv.req, is_insert=insert)
        self.rows.free(lv.req)

    def wait(self, lv: Live) -> None:
        """The request goes (back) to the waiting queue, still tracked."""
        lv.waiting, lv.chunked = True, False
        if lv not in self.live:
            self.live.append(lv)

    # ------------------------------------------------------------------ request rules
    @rule(draw=key_draws, chunk=CHUNKS, track=st.booleans())
    def admit_request(self, draw: KeyDraw, chunk: int, track: bool) -> None:
        key = self.key(draw, min_pages=2)
        self.seen.append(key)
        rid = self.rid("R")
        lv = Live(rid, new_request(rid, key))
        self.w.track(lv.req, rid)
        self.run_prefill(lv, chunk, track, first=True)

    def run_prefill(self, lv: Live, chunk: int, track: bool, *, first: bool) -> None:
        req = lv.req
        with self.w.holder(lv.rid):
            if first:
                if self.rows.available_size() == 0 or not self.budget_states(self.state_demand(req)):
                    self.wait(lv)
                    return
                req.init_next_round_input(self.tree)  # SGLang's match, copy-on-write included
                src = getattr(req, "mamba_cow_src_index", None)
                if src is not None and req.mamba_pool_idx is not None:  # deferred copy: the forward's
                    self.rows.mamba_pool.copy_from(src.reshape(-1), req.mamba_pool_idx.reshape(-1))
                self.tree.inc_lock_ref(req.last_node)  # the prefill adder's lock
                if not self.budget_states(self.state_demand(req)):
                    self.tree.dec_lock_ref(req.last_node)
                    if req.mamba_pool_idx is not None:  # the match's copy-on-write slot (PR #21404)
                        self.slots.free(req.mamba_pool_idx.reshape(-1))
                        req.mamba_pool_idx = None
                    req.reset_for_retract()
                    self.wait(lv)
                    return
                self.rows.alloc([req])
                self.rows.write(
                    (req.req_pool_idx, slice(0, len(req.prefix_indices))), req.prefix_indices.to(torch.int32)
                )
                if lv not in self.live:
                    self.live.append(lv)
            else:
                req.init_next_round_input()  # the chunked request's next round: no match
            start = len(req.prefix_indices)
            total = len(req.origin_input_ids) + len(req.output_ids)  # what init_next_round_input fills
            end = min(total, start + chunk)
            set_fill_len(req, end)
            kv = self.kv_for(end - start)
            if kv is None:  # no KV for the chunk: retracted
                self.retract_one(lv)
                return
            self.forward(lv, start, kv, track)
            if end < total:
                # cache_unfinished_req donates a state slot (a copy without the extra buffer, a tracked
                # ping-pong slot with it) and asserts "Can not alloc mamba cache" when none can be had
                # (#36770, #40128, #37619: catalogued). The scheduler budgets state slots before it
                # runs a batch (D5); a chunk that cannot have its slot is retracted instead.
                tracked = req.mamba_last_track_seqlen is not None
                if (tracked or not self.extra_buffer) and not self.budget_states(1):
                    self.retract_one(lv)
                    return
                lv.chunked = True
                mark_chunked(req, +1)
                self.tree.cache_unfinished_req(req, chunked=True)
            else:
                if lv.chunked:
                    mark_chunked(req, -1)
                lv.chunked = False
                req.output_ids.append(0)  # the first sampled token

    @precondition(lambda self: any(lv.chunked for lv in getattr(self, "live", ())))
    @rule(pick=picks, chunk=CHUNKS, track=st.booleans())
    def next_chunk(self, pick: int, chunk: int, track: bool) -> None:
        chunked = [lv for lv in self.live if lv.chunked]
        self.run_prefill(chunked[pick % len(chunked)], chunk, track, first=False)

    def running(self) -> list[Live]:
        return [lv for lv in getattr(self, "live", ()) if not lv.chunked and not lv.waiting]

    @precondition(lambda self: bool(self.running()))
    @rule(pick=picks, token=TOKENS, track=st.booleans())
    def decode(self, pick: int, token: int, track: bool) -> None:
        lv = self.running()[pick % len(self.running())]
        with self.w.holder(lv.rid):
            kv = self.kv_for(1)
            if kv is None:
                self.retract_one(lv)
                return
            self.forward(lv, lv.req.kv_committed_len, kv, track)
            lv.req.output_ids.append(token)

    @precondition(lambda self: bool(self.running()))
    @rule(pick=picks)
    def finish_request(self, pick: int) -> None:
        lv = self.running()[pick % len(self.running())]
        # A finished request leaves the engine: its object is dropped, so its handles are no longer
        # checked (kvledger checks live requests only; a finish donates the working slot to the tree
        # and SGLang leaves mamba_pool_idx naming it). Its ids are still attributed to it.
        self.w.untrack(lv.req)
        with self.w.holder(lv.rid):
            self.release(lv, insert=True)
        self.live.remove(lv)
        self.w.retire(lv.rid)  # it left the engine: it holds nothing (I-OWNER-RELEASE)

    def retract_one(self, lv: Live) -> None:
        with self.w.holder(lv.rid):
            self.release(lv, insert=False)
        lv.req.reset_for_retract()
        self.wait(lv)

    @precondition(lambda self: any(not lv.waiting for lv in getattr(self, "live", ())))
    @rule(pick=picks)
    def retract(self, pick: int) -> None:
        active = [lv for lv in self.live if not lv.waiting]
        self.retract_one(active[pick % len(active)])

    @precondition(lambda self: any(lv.waiting for lv in getattr(self, "live", ())))
    @rule(pick=picks, chunk=CHUNKS, track=st.booleans())
    def readmit(self, pick: int, chunk: int, track: bool) -> None:
        waiting = [lv for lv in self.live if lv.waiting]
        lv = waiting[pick % len(waiting)]
        lv.waiting = False
        self.run_prefill(lv, chunk, track, first=True)

    def release_everything(self) -> None:
        """End of a run: every live request leaves (a running one released as a retract releases it),
        then the Mamba machine's requests and locks."""
        for lv in list(self.live):
            self.w.untrack(lv.req)
            if not lv.waiting:
                with self.w.holder(lv.rid):
                    self.release(lv, insert=False)
            self.live.remove(lv)
            self.w.retire(lv.rid)
        super().release_everything()

    @precondition(lambda self: any(lv.waiting for lv in getattr(self, "live", ())))
    @rule(pick=picks)
    def abort_waiting(self, pick: int) -> None:
        waiting = [lv for lv in self.live if lv.waiting]
        lv = waiting[pick % len(waiting)]
        self.live.remove(lv)
        self.w.untrack(lv.req)
        self.w.retire(lv.rid)


def requests_supported() -> bool:
    return load().version in REQUEST_RELEASES


FOUND_0512: tuple[str, ...] = (
    "state.setup(pool_pages=8, slots=4, extra_buffer=True)",
    "state.admit_request(chunk=1, draw=([], None, 0), track=False)",
    "state.retract(pick=0)",
)
"""What ``hunt(300, 30, "requests")`` found on 0.5.12 (shrunk; spec/sglang-attach.md, "Historical
bugs", N1): with the extra buffer a request is admitted (row, working slot, two ping-pong slots) and
retracted; ``cache_finished_req(req, is_insert=False)`` frees the ping-pong slots through
``free_mamba_cache`` and leaves ``req.mamba_ping_pong_track_buffer`` naming them: I-HANDLE-OWNED when
the release returns. 0.5.13's ``free_mamba_cache`` clears the handle (PR #26941) and runs the same budget
clean."""
