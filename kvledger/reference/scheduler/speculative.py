"""Speculative decoding (EAGLE/MTP) in the scheduler: over-allocation, verify, acceptance, the rejected tail.

A decode step under speculative decoding is a *verify* batch (spec/speculative.md):

1. **Over-allocation** (:meth:`SpecDecoding.prepare_verify`): before the verify, every request's KV is
   extended to ``ceil_page(kv_committed_len + reserve)`` (one step's ``alloc_len_per_decode``, two with the
   overlap scheduler), all requests or none; ``kv_allocated_len`` runs ahead of ``kv_committed_len``. The
   row must be wide enough (I-SPEC-ROW), checked before any write.
2. **Verify** (at launch, by the runner's data plane): ``num_draft_tokens`` positions from the request's
   data-plane length (its committed length plus the tokens of a batch still in flight); the drafter is
   right for a drawn number of drafts (``0 .. max_accept``, :class:`AcceptanceDraw`), the target accepts
   exactly those and adds its own next token: ``accepted + 1`` new tokens, the same tokens a
   one-token-a-step decode produces (I-OUTPUT-ORACLE holds unchanged).
3. **Results** (:meth:`SpecDecoding.process_results`): the kept tokens are appended (up to the finish),
   ``kv_committed_len`` grows by as many, Mamba V2 records a capture only at an accepted position
   (:meth:`SpecDecoding.track_seqlen`), and the **rejected tail** (the pages above what a batch still in
   flight may write) goes back to the free list in the same step (I-SPEC-TAIL).

Retraction and abort with drafts outstanding free ``[cache_protected_len, kv_allocated_len)``, the tail
included, through the ordinary release paths (``ReqMemory``); finish frees it after the insert.

This module calls the pools' and the memory's public methods only; the scheduler delegates its decode
allocation, its decode-fit estimate, the launch and the results of a verify batch here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvledger.contracts.arith import ceil_to_page
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.seams import seam
from kvledger.reference.scheduler.batch import ScheduleBatch
from kvledger.reference.scheduler.request import Req, ReqState
from kvledger.reference.scheduler.runner import hash_next_token
from kvledger.reference.scheduler.spec_config import RowTooNarrow, SpeculativeConfig

_EMPTY = torch.empty(0, dtype=torch.int64)


class AcceptanceDraw:
    """How many drafts the target accepts, per request and verify: each draft is accepted with probability
    ``accept_rate`` if every earlier one was (a geometric count truncated at ``max_accept``), from a
    generator seeded by the configuration, so a run is reproducible. ``scripted`` replaces the draws by a
    fixed cycle (the machines and the tests)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.rate = config.accept_rate
        self.max_accept = config.max_accept
        self.rng = random.Random(config.seed)
        self.script: list[int] | None = None
        self._next = 0

    def scripted(self, counts: Sequence[int]) -> None:
        """Accept ``counts[0]``, ``counts[1]``, ... drafts in turn (cycled; each clipped to ``max_accept``)."""
        self.script = [max(0, int(c)) for c in counts] or None
        self._next = 0

    def __call__(self, req: Req) -> int:
        if self.script is not None:
            n = self.script[self._next % len(self.script)]
            self._next += 1
            return min(n, self.max_accept)
        n = 0
        while n < self.max_accept and self.rng.random() < self.rate:
            n += 1
        return n


@dataclass
class VerifyPlan:
    """What a verify batch carries besides a decode batch's fields: per request the data-plane start, the
    drafts the drafter got right, and (after the launch) the tokens verification kept."""

    num_positions: int
    starts: list[int]
    drawn: list[int]
    eos: int | None = None  # verification stops at the end-of-sequence token, as a finish does
    tokens: list[list[int]] = field(default_factory=list)


@dataclass
class SpecStats:
    verify_batches: int = 0
    request_steps: int = 0  # (request, verify) pairs whose result was applied
    tokens_kept: int = 0  # tokens appended by verifies (accepted drafts + bonus, up to the finish)
    drafts_accepted: int = 0
    captures: int = 0  # Mamba V2: verifies that captured a state (at an accepted position)
    tail_freed_tokens: int = 0  # KV tokens of rejected tails returned to the free list
    over_allocation_peak: int = 0  # max over verifies of sum(kv_allocated_len - kv_committed_len), tokens
    accept_histogram: dict[int, int] = field(default_factory=dict)

    @property
    def tokens_per_step(self) -> float:
        """Accepted tokens (drafts + bonus) per request and verify step."""
        return self.tokens_kept / self.request_steps if self.request_steps else 0.0


class SpecDecoding:
    """The speculative decode step of one scheduler."""

    # ``sched`` is the Scheduler that owns this object, typed loosely: importing its module here, even for
    # type checking, would close an import cycle (scheduler -> speculative -> scheduler; test_import_graph).
    def __init__(self, sched: Any, config: SpeculativeConfig) -> None:
        self.s = sched
        self.config = config
        ps, overlap = sched.config.page_size, sched.config.overlap
        self.page_size = ps
        self.reserve = config.reserve(ps, overlap)
        self.num_positions = config.num_draft_tokens
        self.draw = AcceptanceDraw(config)
        self.stats = SpecStats()
        self.check_row_width()

    # ------------------------------------------------------------------ configuration
    def check_row_width(self) -> None:
        """I-SPEC-ROW at construction: the rows hold the context plus the over-allocation's headroom."""
        width = self.s.req_to_token_pool.max_context_len
        need = self.s.config.max_allocated_len
        if width < need:
            raise RowTooNarrow(
                f"I-SPEC-ROW: req_to_token rows of {width} positions cannot hold max_context_len"
                f" {self.s.config.max_context_len} plus the speculative headroom {need - self.s.config.max_context_len}"
                f" (num_draft_tokens={self.config.num_draft_tokens}, topk={self.config.topk},"
                f" page_size={self.page_size}, overlap={self.s.config.overlap}): build the rows {need} wide"
            )

    def never_fits(self, req: Req) -> str | None:
        """Alone, the request's last verify must fit: its whole sequence plus the reserve, and a spare page."""
        total = len(req.origin_input_ids) + req.max_new_tokens
        if ceil_to_page(total + self.reserve, self.page_size) + self.page_size > self.s.kv_allocator.size:
            return "prompt + max_new_tokens + the speculative reserve exceeds the KV pool"
        return None

    # ------------------------------------------------------------------ allocation
    def _target_of(self, committed: int) -> int:
        return ceil_to_page(committed + self.reserve, self.page_size)

    def _target(self, req: Req) -> int:
        """Where the over-allocation before a verify ends: the committed length plus the reserve, page-ceiled."""
        return max(req.kv_allocated_len, self._target_of(req.kv_committed_len))

    def decode_demand_tokens(self, reqs: Sequence[Req]) -> int:
        """KV tokens the next verify takes off the free list (whole pages): prediction == commitment."""
        ps = self.page_size
        return sum(ceil_to_page(self._target(r), ps) - ceil_to_page(r.kv_allocated_len, ps) for r in reqs)

    def prepare_verify(self, reqs: Sequence[Req]) -> torch.Tensor | None:
        """Over-allocate every request's reserve, all or none; returns the verify positions' KV slots."""
        if not reqs:
            return _EMPTY.to(self.s.kv_allocator.device)
        if self.s.faults("kv"):
            return None
        self._evict_for(self.decode_demand_tokens(reqs))
        holdings = self.s.memory.holdings_of  # the KV manager grows each request; the reservation undoes
        reservation = holdings.reserve(reqs)
        for req in reqs:
            end = self._target(req)
            if end == req.kv_allocated_len:
                continue
            self.check_fits_row(req, end)
            if holdings.kv.grow(req, end, reservation.undo) is None:
                reservation.rollback()
                return None
        reservation.commit()
        over = sum(r.kv_allocated_len - r.kv_committed_len for r in self.s.running)
        self.stats.over_allocation_peak = max(self.stats.over_allocation_peak, over)
        rows: Any = self.s.req_to_token_pool  # every verified request holds a row
        starts = [self.data_start(r) for r in reqs]
        return torch.cat(
            [rows.read(r.req_pool_idx, c, c + self.num_positions) for r, c in zip(reqs, starts, strict=True)]
        )

    def _evict_for(self, tokens: int) -> None:
        short = tokens - self.s.memory.counters.kv_available()
        if short > 0 and self.s.tree is not None:
            self.s.tree.evict(short)

    def check_fits_row(self, req: Req, end: int) -> None:
        """I-SPEC-ROW before a write: the over-allocation ends within the row (PR #26972's fail-fast)."""
        width = self.s.req_to_token_pool.max_context_len
        if end > width:
            raise ContractViolation(
                f"I-SPEC-ROW: {req.owner!r} over-allocates to {end} positions for a verify of"
                f" {self.num_positions}, beyond its row of {width} (page_size={self.page_size},"
                f" topk={self.config.topk}, reserve={self.reserve}): {req!r}"
            )

    def data_start(self, req: Req) -> int:
        """Where the verify starts on the data plane: every token of the context but the last has its KV
        there (with overlap, also the tokens of a batch whose results are not processed yet)."""
        return len(req.origin_input_ids) + len(req.output_ids) + len(req.pending_output_ids) - 1

    # ------------------------------------------------------------------ the batch
    def new_batch(self, reqs: list[Req], out_cache_loc: torch.Tensor) -> ScheduleBatch:
        batch: ScheduleBatch = self.s.new_batch(reqs, is_decode=True, out_cache_loc=out_cache_loc)
        batch.extend_lens = [self.num_positions] * len(reqs)
        batch.spec = VerifyPlan(
            self.num_positions,
            [self.data_start(r) for r in reqs],
            [min(self.draw(r), self._room(r)) for r in reqs],
            eos=self.s.config.eos_token_id,
        )
        return batch

    @staticmethod
    def _room(req: Req) -> int:
        """Drafts worth accepting: a verify never keeps tokens past ``max_new_tokens`` (SGLang truncates the
        accepted length of a request that finishes inside the verify), so the state it leaves is the one at
        the last kept token."""
        return max(req.max_new_tokens - len(req.output_ids) - len(req.pending_output_ids) - 1, 0)

    def verify(self, batch: ScheduleBatch) -> None:
        """The verify forward (data plane): the tokens each request keeps, put where results will find them."""
        plan: VerifyPlan = batch.spec
        verifier = getattr(self.s.runner, "verify_drafts", None)
        if verifier is not None:
            plan.tokens = verifier(batch.reqs, plan, batch.out_cache_loc, self)
        else:
            plan.tokens = [
                self._hash_verify(r, n, plan.eos) for r, n in zip(batch.reqs, plan.drawn, strict=True)
            ]
        batch.next_token_ids = [toks[-1] for toks in plan.tokens]
        for req, toks in zip(batch.reqs, plan.tokens, strict=True):
            req.pending_output_ids.extend(toks)
        self.stats.verify_batches += 1

    def _hash_verify(self, req: Req, drawn: int, eos: int | None) -> list[int]:
        """The hash runner's verify: the target's token after each accepted position; the drafter agrees with
        the target for ``drawn`` drafts and then proposes another token, so exactly ``drawn`` are accepted
        (fewer at an end-of-sequence token)."""
        vocab = int(getattr(self.s.runner, "vocab_size", 32000))
        ctx = req.context_ids()
        out: list[int] = []
        for _ in range(drawn + 1):
            tok = hash_next_token(ctx, vocab)
            out.append(tok)
            if tok == eos:
                break
            ctx = [*ctx, tok]
        return out

    # ------------------------------------------------------------------ results
    def process_results(self, batch: ScheduleBatch) -> None:
        """Apply a verify batch's results: append the kept tokens, commit their KV, capture (V2) only at an
        accepted position, give the rejected tail back, finish and release as a decode result does."""
        s = self.s
        plan: VerifyPlan = batch.spec
        for req, toks, drawn in zip(batch.reqs, plan.tokens, plan.drawn, strict=True):
            del req.pending_output_ids[: len(toks)]
            if s.discards_result(req):
                s.stats.discarded_tokens += len(toks)
                continue
            committed = req.kv_committed_len
            kept, finished = 0, False
            for tok in toks:
                req.output_ids.append(tok)
                kept += 1
                s.stats.generated_tokens += 1
                if s.finishes(req, tok):
                    finished = True
                    break
            if req.first_token_step is None:
                req.first_token_step = s.step_no
            self.s.memory.holdings_of.kv.set_committed(req, committed + kept)
            self._count(kept, drawn)
            self._after_verify(req, committed, committed + self.num_positions)
            if finished:
                s.finish(req)
        s.settle_batch(batch)

    def _count(self, kept: int, drawn: int) -> None:
        st = self.stats
        st.request_steps += 1
        st.tokens_kept += kept
        st.drafts_accepted += min(drawn, max(kept - 1, 0))
        st.accept_histogram[drawn] = st.accept_histogram.get(drawn, 0) + 1

    def _after_verify(self, req: Req, start: int, drafted_end: int) -> None:
        tracking = self.s.memory.tracking
        if tracking is not None and req.mamba_ping_pong_track_buffer is not None:
            seqlen = self.track_seqlen(start, req.kv_committed_len, drafted_end, tracking.interval)
            if seqlen is not None:
                self.stats.captures += 1
                tracking.captured(req, seqlen)
        self.release_rejected_tail(req)

    @seam
    def track_seqlen(self, start: int, accepted_end: int, drafted_end: int, interval: int) -> int | None:
        """Mamba V2: the length a verify over ``[start, drafted_end)`` that kept ``[start, accepted_end)``
        captures at: the last multiple of ``interval`` in ``(start, accepted_end]``, never a drafted position
        beyond it (its state belongs to rejected tokens; SGLang PR #35821 clamps the step), None if none.
        The data plane (the runner) captures at the same length."""
        last = accepted_end - accepted_end % interval
        return last if last > start else None

    def keep_to(self, req: Req) -> int:
        """What the request must keep allocated now: its committed length, plus one verify's positions when a
        launched batch (overlap) still writes them."""
        in_flight = any(req in b.reqs for b in self.s.inflight)
        return req.kv_committed_len + (self.num_positions if in_flight else 0)

    def release_rejected_tail(self, req: Req) -> None:
        """Free the KV above :meth:`keep_to` (whole pages beyond its page) in the same step (I-SPEC-TAIL)."""
        keep = self.keep_to(req)
        if req.kv_allocated_len <= keep or req.req_pool_idx is None:
            return
        self.stats.tail_freed_tokens += self.s.memory.holdings_of.kv.shrink_to(req, keep)

    # ------------------------------------------------------------------ per-step check
    def check_requests(self, reqs: Callable[[], Sequence[Req]] | None = None) -> int:
        """I-SPEC-ROW and I-SPEC-TAIL over the live requests that hold a row, after every step: the allocated
        length within the row, and nothing held beyond what a launched batch may still write."""
        width = self.s.req_to_token_pool.max_context_len
        n = 0
        for req in self.s.live_requests() if reqs is None else reqs():
            if req.req_pool_idx is None or req.state.is_done or req.state is not ReqState.RUNNING:
                continue
            n += 1
            if not req.kv_committed_len <= req.kv_allocated_len <= width:
                raise ContractViolation(
                    f"I-SPEC-ROW: {req.owner!r} has committed {req.kv_committed_len}, allocated"
                    f" {req.kv_allocated_len}, row width {width}: {req!r}"
                )
            in_flight = any(req in b.reqs for b in self.s.inflight)
            # A launched verify (overlap) was over-allocated from the committed length before it: up to the
            # reserve. Otherwise the verify's result was processed this step and its tail freed with it.
            bound = self._target_of(req.kv_committed_len) if in_flight else req.kv_committed_len
            if req.kv_allocated_len > bound:
                raise ContractViolation(
                    f"I-SPEC-TAIL: {req.owner!r} still holds KV up to {req.kv_allocated_len} after its verify;"
                    f" committed {req.kv_committed_len}, a launched batch needs up to {bound}: the rejected"
                    f" tail [{bound}, {req.kv_allocated_len}) was not given back in the step: {req!r}"
                )
        return n


def over_allocated_tokens(reqs: Any) -> int:
    """Tokens allocated beyond the committed length, over ``reqs``."""
    return sum(r.kv_allocated_len - r.kv_committed_len for r in reqs)
