"""``Scheduler``: admission, chunked prefill, decode, retraction, finish and abort, step by step.

One ``step()`` is one iteration of SGLang's event loop: build the next batch (prefill first, else
decode), launch it (the runner computes the next tokens and the data plane), and process results.
Without overlap a batch's results are processed in the same step; with ``overlap=True`` they are
processed one step later, after the next batch was scheduled (SGLang's overlap scheduler, where bugs
B1, B2 and B8 lived).

After every step the busy identity holds for the KV, Mamba and row pools with every holder term
(:mod:`kvledger.reference.scheduler.accounting`); at quiescence the strong idle identity and full audits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvledger.contracts.arith import ceil_to_page
from kvledger.contracts.errors import BatchNotInFlight, ContractViolation, InvalidArgument, InvalidState
from kvledger.contracts.handles import HandleClaim, check_handles_owned
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.owners import BATCH_INFLIGHT, REQ_CHUNKED, REQ_WAITING, Account
from kvledger.contracts.pool_kinds import MAMBA, POOL_KINDS, PoolKind
from kvledger.contracts.protocols import AnyPrefixCache, KVAllocator, MambaStatePool, ReqRowPool, caches_kind
from kvledger.contracts.seams import seam
from kvledger.contracts.switch import ensure, invariant
from kvledger.reference.pools.validate import check_positive
from kvledger.reference.scheduler.accounting import Accounting
from kvledger.reference.scheduler.adder import AddReqResult, PrefillAdder
from kvledger.reference.scheduler.batch import ScheduleBatch
from kvledger.reference.scheduler.cache_paths.base import unlock
from kvledger.reference.scheduler.config import SchedulerConfig
from kvledger.reference.scheduler.ended import EndedRequests
from kvledger.reference.scheduler.faults import FAULT_KINDS as FAULT_KINDS
from kvledger.reference.scheduler.faults import FaultInjector as FaultInjector
from kvledger.reference.scheduler.memory import ReqMemory
from kvledger.reference.scheduler.queues import WaitingQueue
from kvledger.reference.scheduler.request import Req, ReqState
from kvledger.reference.scheduler.runner import HashTokenRunner, ModelRunner
from kvledger.reference.scheduler.speculative import SpecDecoding
from kvledger.reference.scheduler.stats import SchedulerStats as SchedulerStats
from kvledger.reference.scheduler.tracking import MambaTracking
from kvledger.reference.scheduler.validate import (
    UnknownRequest,
    check_collaborators,
    check_max_new_tokens,
    check_prompt,
    check_rid,
)


def _ladders_hold(self: Scheduler) -> bool:
    """I-REQ-LADDER; the accounting re-verifies only the requests whose ladder fields changed."""
    return self.accounting.ladders_hold()


def _tracks_hold(self: Scheduler) -> bool:
    """I-TRACK-POINT (Mamba V2); like the ladder, re-verified only where the tracked fields changed."""
    return self.memory.tracking is None or self.accounting.tracks_hold()


@invariant(lambda self: _ladders_hold(self), "I-REQ-LADDER for every live request")
@invariant(
    lambda self: _tracks_hold(self),
    "I-TRACK-POINT: every tracked length is a page boundary in (cache_protected_len, kv_committed_len]",
)
@invariant(
    lambda self: self.chunked_req is None or self.chunked_req.state is ReqState.CHUNKED,
    "the chunked request is in state CHUNKED",
)
class Scheduler:
    """Drives requests through the pools and the (optional) radix cache.

    Subclasses (the PD prefill and decode instances, ``kvledger.reference.disagg``) extend it through the
    small hooks ``new_request``, ``enqueue_arrival``, ``before_schedule``, ``after_results``,
    ``process_prefill_chunk`` and ``parked_accounts``, never by copying its logic.
    """

    pool_kinds: tuple[PoolKind, ...] = POOL_KINDS
    """The pool kinds its identity covers (kvledger.contracts.pool_kinds); a subclass with another pool adds
    its description here and the pool as the attribute the description names."""

    parked_accounts: frozenset[Account] = frozenset({BATCH_INFLIGHT})
    """Accounts in which a request that has ended may still hold ids (released later, on an event)."""

    def __init__(
        self,
        config: SchedulerConfig,
        *,
        kv_allocator: KVAllocator,
        req_to_token_pool: ReqRowPool,
        mamba_pool: MambaStatePool | None = None,
        tree: AnyPrefixCache | None = None,
        runner: ModelRunner | None = None,
        on_step: Callable[[Scheduler], None] | None = None,
    ) -> None:
        check_collaborators(config, kv_allocator, req_to_token_pool, mamba_pool, tree, runner, on_step)
        if kv_allocator.page_size != config.page_size:
            raise InvalidArgument(
                f"allocator page_size {kv_allocator.page_size} != config {config.page_size}"
            )
        if tree is not None and getattr(tree, "page_size", config.page_size) != config.page_size:
            raise InvalidArgument("tree page_size differs from the scheduler's")
        mamba_tree = caches_kind(tree, MAMBA.name)
        if mamba_tree and not config.extra_buffer and config.page_size != 1:
            raise InvalidArgument(
                "the Mamba radix cache with mamba_scheduler_strategy 'no_buffer' (V1) caches states at token"
                " granularity: page_size must be 1 (use 'extra_buffer' for page_size > 1)"
            )
        tracking = self._tracking(config, mamba_pool, tree) if mamba_tree and config.extra_buffer else None
        self.config = config
        self.kv_allocator = kv_allocator
        self.req_to_token_pool = req_to_token_pool
        self.mamba_pool = mamba_pool
        self.tree = tree
        self.runner: ModelRunner = runner if runner is not None else HashTokenRunner()
        self.faults = FaultInjector()
        self.memory = ReqMemory(
            kv_allocator=kv_allocator,
            req_to_token_pool=req_to_token_pool,
            mamba_pool=mamba_pool,
            tree=tree,
            page_size=config.page_size,
            fault_injector=self.faults,
            tracking=tracking,
        )
        self.accounting = Accounting(self)
        self.speculative = SpecDecoding(self, config.speculative) if config.speculative is not None else None
        self.on_step = on_step
        self.waiting: list[Req] = WaitingQueue[Req]()  # O(1) ``req in self.waiting`` (_leave_queues)
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.last_prefill: ScheduleBatch | None = None
        self.inflight: deque[ScheduleBatch] = deque()
        # Every request the scheduler still knows: the live ones and the last ``finished_window`` that
        # ended (older ones are dropped, so a long run's memory stays flat; their results are in stats).
        self.requests: dict[int, Req] = {}
        self.done: deque[Req] = deque()  # ended requests still in ``requests``, oldest first
        self._live: dict[int, Req] = {}  # queued and not yet released (what the identity and ladder read)
        self.ended_requests = EndedRequests()  # ended since the last I-OWNER-RELEASE check, or parked then
        self.new_token_ratio = config.init_new_token_ratio
        self.stats = SchedulerStats()
        self.step_no = 0
        self._next_batch_id = 0
        # Ledgers date their moves by this scheduler's step, so a violation's history reads in steps.
        pools = self.accounting.pools_by_name().values()
        self._dated_ledgers = [p.ledger for p in pools if isinstance(p.ledger, Ledger)]
        for ledger in self._dated_ledgers:
            ledger.clock, ledger.epoch = "scheduler step", 0
        self._stepping = False  # inside step(): the only place batches are built (I-CALL-STATE)

    @staticmethod
    def _tracking(config: SchedulerConfig, mamba_pool: Any, tree: Any) -> MambaTracking:
        """Mamba V2: the tree's branching grid must be the scheduler's capture grid, and the pool must hold
        at least one request's working and tracking slots (SGLang's per-request ratio)."""
        chunk = config.mamba_cache_chunk_size
        if getattr(tree, "mamba_cache_chunk_size", None) != chunk:
            raise InvalidArgument(
                f"extra_buffer: the Mamba radix cache must be built with mamba_cache_chunk_size={chunk}"
                f" (it has {getattr(tree, 'mamba_cache_chunk_size', None)})"
            )
        k = config.mamba_ping_pong_size
        if mamba_pool is None or mamba_pool.size < 1 + k:
            raise InvalidArgument(
                f"extra_buffer: a request holds a working slot and {k} tracking slot(s), but the Mamba pool"
                f" has {None if mamba_pool is None else mamba_pool.size}"
            )
        return MambaTracking(
            mamba_pool=mamba_pool, tree=tree, k=k, chunk=chunk, interval=config.mamba_track_interval
        )

    # ------------------------------------------------------------------ requests in
    @ensure(
        lambda self, result: (
            result.state is ReqState.REJECTED
            or (self._live.get(result.rid) is result and not result.state.is_done)
        )
    )
    def add_request(self, rid: int, prompt: Sequence[int], max_new_tokens: int) -> Req:
        """Queue a request; one that can never fit is rejected with a reason instead of blocking the queue
        (I-LIVENESS). Bad input (a used or non-int id, a prompt that is not a non-empty list of token ids in
        the runner's vocabulary, ``max_new_tokens < 1``) is refused before anything is queued."""
        tokens = self.validate_arrival(rid, prompt, max_new_tokens)
        req = self.new_request(rid, tokens, max_new_tokens)
        self.requests[rid] = req
        reason = self._never_fits(req)
        if reason is not None:
            self._finish_state(req, ReqState.REJECTED, reason)
            self.stats.rejections += 1
            self.stats.reject_reasons[reason] = self.stats.reject_reasons.get(reason, 0) + 1
            return req
        self._live[rid] = req
        self.accounting.track(req)
        self.enqueue_arrival(req)
        return req

    def validate_arrival(self, rid: int, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        """Bad input is a typed error (InvalidArgument) before anything changes; returns the prompt's tokens."""
        check_rid(rid)
        if rid in self.requests or rid in self._live:
            raise InvalidArgument(f"request id {rid!r} is already in use")
        tokens = check_prompt(rid, prompt, getattr(self.runner, "vocab_size", None))
        check_max_new_tokens(rid, max_new_tokens)
        return tokens

    def new_request(self, rid: int, prompt: list[int], max_new_tokens: int) -> Req:
        """Hook: the request object for an arrival (PD instances use a subclass with PD handles)."""
        return Req(rid, prompt, max_new_tokens, arrival_step=self.step_no)

    def enqueue_arrival(self, req: Req) -> None:
        """Hook: where an accepted arrival waits (PD: the bootstrap or pre-allocation queue)."""
        self.waiting.append(req)

    @seam
    def _never_fits(self, req: Req) -> str | None:
        total = len(req.origin_input_ids) + req.max_new_tokens
        if total > self.config.max_context_len:
            return "prompt + max_new_tokens exceeds max_context_len"
        # Alone, with everything else evicted, the request must fit with one spare page.
        if ceil_to_page(total, self.config.page_size) + self.config.page_size > self.kv_allocator.size:
            return "prompt + max_new_tokens exceeds the KV pool"
        if total > self.req_to_token_pool.max_context_len:
            return "prompt + max_new_tokens exceeds the req_to_token row length"
        return None if self.speculative is None else self.speculative.never_fits(req)

    # ------------------------------------------------------------------ queries
    def live_requests(self) -> list[Req]:
        """Requests that may hold something: queued and not yet released, not ended unless parked in one of
        ``parked_accounts`` (a launched batch, a PD lease). O(live), not O(all ever)."""
        return [
            r for r in self._live.values() if not r.state.is_done or r.owner.account in self.parked_accounts
        ]

    def _live_among(self, reqs: Iterable[Req]) -> list[Req]:
        """The requests of ``reqs`` that :meth:`live_requests` lists."""
        live, parked = self._live, self.parked_accounts
        return [
            r for r in reqs if live.get(r.rid) is r and (not r.state.is_done or r.owner.account in parked)
        ]

    def queued_requests(self) -> Iterable[Req]:
        """Every request queued and not yet released, unfiltered (a view: the count identities' fast path).

        A superset of :meth:`live_requests` only inside a step, between a request's end and its release.
        """
        return self._live.values()

    def queued_request(self, rid: int) -> Req | None:
        """The request queued under ``rid`` and not yet released, or None (what a queue check compares
        its entries against). A rid that is not a non-negative int is refused (InvalidArgument)."""
        return self._live.get(check_rid(rid))

    @property
    def batches_launched(self) -> int:
        """How many batches this scheduler has built so far (the last batch id handed out)."""
        return self._next_batch_id

    def ended_count(self) -> int:
        """Requests that finished, were aborted or were rejected so far."""
        st = self.stats
        return st.finished + st.aborts + st.rejections

    def is_quiescent(self) -> bool:
        """I-QUIESCENT: no batch in flight and no live request (waiting, chunked, running, just prefilled
        and not yet merged into the running batch, or parked on a batch)."""
        if self.waiting or self.running or self.chunked_req is not None or self.inflight:
            return False
        return not any(not r.state.is_done for r in self._live.values())

    def has_work(self) -> bool:
        return not self.is_quiescent()

    # ------------------------------------------------------------------ the loop
    def step(self) -> ScheduleBatch | None:
        """One event-loop iteration; returns the batch launched (None: nothing could run)."""
        self.step_no += 1
        self.stats.steps += 1
        for ledger in self._dated_ledgers:
            ledger.epoch = self.step_no
        self.before_schedule()
        self._stepping = True
        try:
            batch = self.get_next_batch_to_run()
        finally:
            self._stepping = False
        if batch is not None:
            self._launch(batch)
        # Without overlap a batch's results are processed in the step that launched it; with overlap
        # only the batch just launched stays in flight, its predecessor is processed now.
        keep = 1 if (self.config.overlap and batch is not None) else 0
        while len(self.inflight) > keep:
            self.process_batch_result(self.inflight[0])
        if batch is None:
            self.stats.idle_steps += 1
            self._update_ratio_on_idle()
        self.after_results()
        self._check_step()
        if self.on_step is not None:
            self.on_step(self)
        return batch

    def before_schedule(self) -> None:
        """Hook, at the start of a step: PD instances move their transfer queues here."""

    def after_results(self) -> None:
        """Hook, after this step's results were processed: PD instances poll their in-flight transfers."""

    # ------------------------------------------------------------------ per-step checks
    def _check_step(self) -> None:
        """The checks after every step: handles first (their message names the slot and the holder), then
        that ended requests released what they held, then the busy identity and the ledger cross-check."""
        if self.accounting.enabled:
            unverified = self.accounting.take_unverified_handles()  # O(changed handles): see there
            self.check_handles_owned(None if unverified is None else self._live_among(unverified))
            full = self.accounting.recount_every_step or self.is_quiescent()
            self.check_ended_requests_released(every_queued=full)
            if self.speculative is not None:
                self.speculative.check_requests()
        self.accounting.after_step()

    def check_handles_owned(self, reqs: Sequence[Req] | None = None) -> int:
        """I-HANDLE-OWNED: every id a handle of ``reqs`` (default: every live request) names is owned by
        that request. O(requests checked), never O(pool); returns the number of ids checked."""
        ledgers = {name: pool.ledger for name, pool in self.accounting.pools_by_name().items()}
        # The common case (every handle owned) answered by the ledgers' Python fast path; a claim that
        # fails it goes to check_handles_owned, which raises with the evidence (issue 24: this runs twice
        # per step over the running requests, so no claim objects are made for the handles that hold).
        checked, suspect = 0, []
        for r in self.live_requests() if reqs is None else reqs:
            owner = r.owner
            for field_name, pool, ids in r.handles():
                ledger = ledgers.get(pool)
                if not isinstance(ledger, Ledger):  # the release level's NullLedger knows no owner
                    continue
                checked += len(ids)
                if not ledger.holds(ids, owner):
                    suspect.append(HandleClaim(owner, field_name, pool, ids))
        check_handles_owned(suspect, ledgers)
        return checked

    def check_ended_requests_released(self, *, every_queued: bool = True) -> None:
        """I-OWNER-RELEASE at the step boundary: a request that has ended was released, or is parked in one
        of ``parked_accounts`` (a launched batch, a PD lease) that releases it later. The step's check passes
        ``every_queued=False`` (the requests ended since the last check: reference/scheduler/ended.py)."""
        self.ended_requests.check(self, every_queued=every_queued)

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Step until quiescent; returns the steps taken. Raises if it does not drain (liveness)."""
        check_positive(max_steps, "max_steps")
        taken = 0
        while self.has_work():
            if taken >= max_steps:
                raise ContractViolation(
                    f"I-LIVENESS: not drained after {max_steps} steps: {self.describe_queues()}"
                )
            self.step()
            taken += 1
        return taken

    def describe_queues(self) -> str:
        return (
            f"waiting={[r.rid for r in self.waiting]} running={[r.rid for r in self.running]} "
            f"chunked={self.chunked_req.rid if self.chunked_req else None} inflight={list(self.inflight)}"
        )

    def _check_stepping(self, what: str) -> None:
        """Batches are built only by step(), which launches them: one built elsewhere would hold its
        requests' memory with nothing to run it (I-CALL-STATE)."""
        if not self._stepping:
            raise InvalidState(f"{what}() is a part of step(): call step()")

    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        self._check_stepping("get_next_batch_to_run")
        self._merge_last_prefill()
        if (
            self.chunked_req is not None
            and self.chunked_req.kv_committed_len > self.chunked_req.cache_protected_len
        ):
            self.process_prefill_chunk(self.chunked_req)
        batch = self.get_new_batch_prefill()
        if batch is not None:
            return batch
        return self.update_running_batch()

    @seam
    def process_prefill_chunk(self, req: Req) -> None:
        """Between chunks: the tree adopts the finished chunk and the lock moves to it. The request keeps its
        row and working slot (2026 SGLang, PR #17850; the late-2025 PD path freed both: bug B4, #12432).
        A PD prefill instance also sends the chunk's whole pages here."""
        self.memory.cache_unfinished(req)

    def _merge_last_prefill(self) -> None:
        """Requests of the last prefill batch whose prompt is complete join the running batch."""
        last, self.last_prefill = self.last_prefill, None
        if last is None:
            return
        for req in last.reqs:
            if (
                req is last.chunked_req
                or req.state is not ReqState.RUNNING
                or req.abort_requested
                or req in self.running
            ):
                continue
            self.running.append(req)

    # ------------------------------------------------------------------ prefill
    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        self._check_stepping("get_new_batch_prefill")
        if not self.waiting and self.chunked_req is None:
            return None
        if self.chunked_req is not None and self.chunked_req.abort_requested:
            return None  # its abort is processed with the in-flight batch; one chunked request at a time
        running_bs = len(self.running)
        if running_bs >= self.config.max_running_requests and self.chunked_req is None:
            return None
        adder = PrefillAdder(
            self.config,
            tree=self.tree,
            kv_allocator=self.kv_allocator,
            req_to_token_pool=self.req_to_token_pool,
            mamba_pool=self.mamba_pool,
            running=self.running,
            new_token_ratio=self.new_token_ratio,
            counters=self.memory.counters,
        )
        if self.chunked_req is not None:
            chunked = self.chunked_req
            chunked.fill_ids = chunked.all_ids()
            chunked.extend_input_len = len(chunked.fill_ids) - chunked.kv_committed_len
            adder.new_chunked_req = adder.add_chunked_req(chunked)
        stopper: Req | None = None
        stop_result = AddReqResult.CONTINUE
        scanned = 0  # the head of the queue looked at: O(scanned) per step, not O(queue) (issue 38)
        for req in self.waiting:  # the loop leaves the queue as it is: no copy of it
            scanned += 1
            if running_bs + len(adder.can_run_list) >= self.config.max_running_requests:
                break
            cow = self.mamba_pool is not None and self.memory.is_mamba_tree
            if not adder.room_to_match(req, cow=cow):
                break  # before the match: its copy-on-write slot would eat into what is promised
            self.memory.init_next_round_input(req, cow=cow)
            result = adder.add_one_req(req)
            if result is not AddReqResult.CONTINUE:
                stopper, stop_result = req, result
                break
        if stopper is not None:
            self._cleanup_stopper(stopper, appended=adder.last_appended, result=stop_result)
        if not adder.can_run_list:
            return None
        admitted = set(map(id, adder.can_run_list))
        self.waiting[:scanned] = [r for r in self.waiting[:scanned] if id(r) not in admitted]
        new_chunked = adder.new_chunked_req
        out_cache_loc = self.memory.prepare_extend(adder.can_run_list, new_chunked)
        if out_cache_loc is None:
            self._rollback_admission(adder.can_run_list)
            return None
        for req in adder.can_run_list:
            if not req.prompt_counted:
                # Each prompt counts once, whole, at its first admission: later chunks are computed, not
                # served from the cache, and a retracted request's re-prefill is not a new prompt.
                req.prompt_counted = True
                self.stats.prompt_tokens += len(req.origin_input_ids)
                self.stats.cached_prompt_tokens += req.cache_protected_len
                req.prefix_hit_tokens = req.cache_protected_len
            req.state = ReqState.CHUNKED if req is new_chunked else ReqState.RUNNING
        self.chunked_req = new_chunked
        return self.new_batch(
            adder.can_run_list, is_decode=False, out_cache_loc=out_cache_loc, chunked_req=new_chunked
        )

    @seam
    def _cleanup_stopper(self, req: Req, *, appended: bool, result: AddReqResult) -> None:
        """The request that stopped the round: what happens to its copy-on-write slot."""
        policy = self.config.cow_release_policy
        if req.mamba_pool_idx is None or policy == "keep":
            return
        if policy == "if_not_appended" and appended:
            return
        # "if_not_appended" and the request was not appended (PR #21404).
        self.memory.release_cow_slot(req)

    def _rollback_admission(self, reqs: list[Req]) -> None:
        """prepare_extend failed (an injected fault): every admitted request is as if never admitted."""
        self.stats.rollbacks += 1
        previous_chunked = self.chunked_req
        requeue: list[Req] = []
        for req in reqs:
            if req is previous_chunked:
                req.owner.set_account(REQ_CHUNKED, op="rollback")
                continue
            if self.tree is not None:
                unlock(self.tree, req)
            req.owner.set_account(REQ_WAITING, op="rollback")
            if self.config.cow_release_policy != "keep":
                self.memory.release_cow_slot(req)
            requeue.append(req)
        self.waiting = WaitingQueue(requeue + self.waiting)

    # ------------------------------------------------------------------ decode
    def update_running_batch(self) -> ScheduleBatch | None:
        self._check_stepping("update_running_batch")
        self.running = [r for r in self.running if r.state is ReqState.RUNNING]
        if not self.running:
            return None
        retracted = self._retract_until_decode_fits()
        if not self.running:
            return None
        if retracted:
            self._reset_ratio_after_retract()
        else:
            self.new_token_ratio = max(
                self.new_token_ratio - self.config.new_token_ratio_decay, self.config.min_new_token_ratio
            )
        decode_reqs = [r for r in self.running if not r.abort_requested]
        if not decode_reqs:
            return None
        if self.speculative is not None:  # a verify batch: over-allocate the drafts' KV first
            verify_loc = self.speculative.prepare_verify(decode_reqs)
            return None if verify_loc is None else self.speculative.new_batch(decode_reqs, verify_loc)
        out = self.memory.prepare_decode(decode_reqs)
        if out is None:
            return None
        return self.new_batch(decode_reqs, is_decode=True, out_cache_loc=out)

    def _decode_fits(self) -> bool:
        counters = self.memory.counters
        spec = self.speculative
        demand = (self.memory if spec is None else spec).decode_demand_tokens(self.running)
        return demand <= counters.kv_available() + counters.kv_evictable()

    def _retract_until_decode_fits(self) -> list[Req]:
        retracted: list[Req] = []
        while not self._decode_fits():
            if self._drain_before_retract():
                continue
            if len(self.running) == 1 and self.chunked_req is None:
                victim = self.running.pop()
                self._abort_now(victim, "out of memory: the last running request cannot decode")
                continue
            victim = self._pick_victim()
            self.retract(victim)
            retracted.append(victim)
            if not self.running:
                break
        return retracted

    @seam
    def _drain_before_retract(self) -> bool:
        """Process the oldest batch in flight, so that no launched batch references a request about to be
        retracted: its result is applied and its KV length is final before the release
        (I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT; before #12224 SGLang retracted with the previous batch
        unprocessed, bug B2). Returns False when nothing is in flight."""
        if not self.inflight:
            return False
        self.process_batch_result(self.inflight[0])
        self.running = [r for r in self.running if r.state is ReqState.RUNNING]
        return True

    def _pick_victim(self) -> Req:
        """SGLang's order: most output tokens first; ties, the shortest input."""
        return max(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))

    def retract(self, req: Req) -> None:
        """Release without insert and requeue (``release_req`` + ``reset_for_retract``).

        Only a running request of this scheduler that no launched batch still references may be
        retracted (I-CALL-STATE): anything else is refused before anything changes."""
        self._check_retractable(req)
        self.running.remove(req)
        self.memory.release_without_insert(req)
        req.state = ReqState.WAITING
        req.is_retracted = True
        req.retract_count += 1
        req.owner.set_account(REQ_WAITING, op="retract")
        self.waiting.append(req)
        self.stats.retractions += 1

    @seam
    def _check_retractable(self, req: Req) -> None:
        """retract's refusals: another scheduler's request, one not running, one a launched batch references."""
        self._check_own_request(req, "retract")
        if req.state is not ReqState.RUNNING or req not in self.running:
            raise InvalidState(f"retract: {req!r} is {req.state.value}, not running")
        if any(req in b.reqs for b in self.inflight):
            raise InvalidState(
                f"retract: a launched batch still references {req.owner!r} (I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT)"
            )

    def force_retract(self, count: int = 1) -> int:
        """Test hook (SGLang's TEST_RETRACT): retract up to ``count`` running requests now."""
        check_positive(count, "count")
        while self.inflight:
            self.process_batch_result(self.inflight[0])
        self.running = [r for r in self.running if r.state is ReqState.RUNNING]
        n = 0
        while self.running and n < count:
            self.retract(self._pick_victim())
            n += 1
        if n:
            self._reset_ratio_after_retract()
        self._check_step()
        return n

    def _reset_ratio_after_retract(self) -> None:
        reqs = self.running
        total_max_new = sum(r.max_new_tokens for r in reqs)
        if not reqs or total_max_new == 0:
            self.new_token_ratio = self.config.init_new_token_ratio
            return
        decoded = sum(len(r.output_ids) for r in reqs)
        estimate = (decoded + self.config.retract_decode_steps * len(reqs)) / total_max_new
        self.new_token_ratio = min(1.0, max(estimate, self.config.min_new_token_ratio))

    def _update_ratio_on_idle(self) -> None:
        if self.is_quiescent():
            self.new_token_ratio = self.config.init_new_token_ratio

    # ------------------------------------------------------------------ launch and results
    def new_batch(
        self, reqs: list[Req], *, is_decode: bool, out_cache_loc: Any, chunked_req: Req | None = None
    ) -> ScheduleBatch:
        """The next numbered batch of ``reqs``, not yet in flight; their ids checked owned (I-HANDLE-OWNED)."""
        self._next_batch_id += 1
        extend_lens = [1] * len(reqs) if is_decode else [r.extend_input_len for r in reqs]
        batch = ScheduleBatch(self._next_batch_id, list(reqs), is_decode, extend_lens, out_cache_loc, chunked_req)
        self.accounting.check_not_in_flight(batch)
        if self.accounting.enabled:  # a forward never runs on an id its request does not own
            unverified = self.accounting.take_unverified_handles(batch.reqs)
            self.check_handles_owned(batch.reqs if unverified is None else unverified)
        return batch

    def _launch(self, batch: ScheduleBatch) -> None:
        """Run the forward now (stream order); only the bookkeeping of its results may lag."""
        batch.freeze_references()
        if batch.spec is not None:
            self.speculative.verify(batch)  # type: ignore[union-attr]  # only a speculative scheduler builds one
        else:
            batch.next_token_ids = self.runner.forward(
                batch.reqs, batch.extend_lens, batch.out_cache_loc, batch.is_decode
            )
            for req, tok in zip(batch.reqs, batch.next_token_ids, strict=True):
                if req is not batch.chunked_req:
                    req.pending_output_ids.append(tok)
        for req in batch.reqs:
            req.mamba_track = None  # the forward carried out this round's capture (Mamba V2)
        if batch.is_decode:
            self.stats.decode_batches += 1
        else:
            self.stats.prefill_batches += 1
            self.last_prefill = batch
        self.inflight.append(batch)

    @seam
    def process_batch_result(self, batch: ScheduleBatch) -> None:
        """Process the results of ``batch``, the oldest batch in flight, once (I-RESULTS-ONCE): it leaves
        the in-flight queue here. Another batch (already processed, not yet due, another scheduler's) is
        refused before anything changes."""
        if not isinstance(batch, ScheduleBatch):
            raise InvalidArgument(f"process_batch_result: expected a ScheduleBatch, got {type(batch).__name__}")
        if not self.inflight or self.inflight[0] is not batch:
            why = (
                "is not in flight (already processed, or launched by another scheduler)"
                if all(b is not batch for b in self.inflight)
                else "is not the oldest batch in flight (results are processed in launch order)"
            )
            raise BatchNotInFlight(f"process_batch_result: {batch!r} {why}")
        self.inflight.popleft()
        self._process_results(batch)

    def _process_results(self, batch: ScheduleBatch) -> None:
        assert batch.next_token_ids is not None
        if batch.spec is not None:
            self.speculative.process_results(batch)  # type: ignore[union-attr]
            return
        for req, tok in zip(batch.reqs, batch.next_token_ids, strict=True):
            if req is batch.chunked_req:
                continue  # its chunk's KV is cached when the next batch is built
            req.pending_output_ids.pop(0)
            if self._discards_result(req):
                self.stats.discarded_tokens += 1
                continue
            req.output_ids.append(tok)
            if batch.is_decode:
                self.memory.after_decode_result(req)
            self.stats.generated_tokens += 1
            if req.first_token_step is None:
                req.first_token_step = self.step_no
            if self.finishes(req, tok):
                self.finish(req)
            elif not batch.is_decode:
                self.memory.cache_unfinished(req)
        self.settle_batch(batch)

    def settle_batch(self, batch: ScheduleBatch) -> None:
        """After a batch's results: abort what the client asked to abort, release what ended while it ran."""
        for req in batch.reqs:
            if req.abort_requested and not req.state.is_done:
                self._abort_now(req, "aborted by client")
        for req in batch.deferred_release:
            self._release_finished_or_aborted(req)
        batch.deferred_release.clear()

    def discards_result(self, req: Req) -> bool:
        """Whether ``req`` gets no output from a batch that launched before it ended (the museum's seam)."""
        return self._discards_result(req)

    @seam
    def _discards_result(self, req: Req) -> bool:
        """A request that ended, or is to be aborted, after the batch launched gets no output from it."""
        return req.state.is_done or req.abort_requested

    def finishes(self, req: Req, tok: int) -> bool:
        """Whether ``tok``, just appended, ends ``req`` (its ``finish_reason`` set: length or stop)."""
        if len(req.output_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return True
        if self.config.eos_token_id is not None and tok == self.config.eos_token_id:
            req.finish_reason = "stop"
            return True
        return False

    def finish(self, req: Req) -> None:
        """``req`` ended normally: out of the queues, FINISHED, released (or deferred behind a batch)."""
        self.stats.finished += 1
        self._leave_queues(req)
        self._finish_state(req, ReqState.FINISHED, req.finish_reason or "length")
        self._release_or_defer(req)

    def _leave_queues(self, req: Req) -> None:
        # O(1) for the waiting list (a WaitingQueue counts its entries); the running batch is bounded
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if self.chunked_req is req:
            self.chunked_req = None

    @seam
    def _release_or_defer(self, req: Req) -> None:
        """Release now, or park the request on the in-flight batch that still references it."""
        holder = next((b for b in self.inflight if req in b.reqs), None)
        if holder is None:
            self._release_finished_or_aborted(req)
            return
        req.owner.set_account(BATCH_INFLIGHT, op=f"defer to batch#{holder.batch_id}")
        holder.deferred_release.append(req)

    def _release_finished_or_aborted(self, req: Req) -> None:
        if req.state is ReqState.FINISHED:
            self.memory.cache_finished(req)
        else:
            self.memory.release_without_insert(req)
        req.released = True
        req.pending_output_ids.clear()
        self._live.pop(req.rid, None)
        self.accounting.released(req)

    def _finish_state(self, req: Req, state: ReqState, reason: str) -> None:
        req.state = state
        if self.accounting.enabled:  # the per-step check runs (and empties it): else the set would only grow
            self.ended_requests.ended(req)
        req.finish_reason = reason
        req.finish_step = self.step_no
        self.done.append(req)
        while len(self.done) > self.config.finished_window:
            old = self.done.popleft()
            if self.requests.get(old.rid) is old:
                del self.requests[old.rid]

    # ------------------------------------------------------------------ abort
    @seam
    def abort(self, rid: int) -> bool:
        """Abort a request in any state. Returns False if it had already ended (idempotent)."""
        check_rid(rid)
        req = self.requests.get(rid)
        if req is None:
            raise UnknownRequest(f"no request {rid!r}")
        if req.state.is_done:
            return False
        if any(req in b.reqs for b in self.inflight):
            req.abort_requested = True  # released when that batch's results are processed
            return True
        self._abort_now(req, "aborted by client")
        self._check_step()
        return True

    def _check_own_request(self, req: Any, op: str) -> None:
        if not isinstance(req, Req):
            raise InvalidArgument(f"{op}: expected a Req, got {type(req).__name__}")
        if self._live.get(req.rid) is not req and self.requests.get(req.rid) is not req:
            raise UnknownRequest(f"{op}: {req!r} is not a request of this scheduler")

    @seam
    def _abort_now(self, req: Req, reason: str) -> None:
        self._leave_queues(req)
        self._finish_state(req, ReqState.ABORTED, reason)
        self.stats.aborts += 1
        self._release_or_defer(req)
