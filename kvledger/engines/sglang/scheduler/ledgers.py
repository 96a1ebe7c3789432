"""``attach_scheduler``: a live SGLang ``Scheduler``'s pools, tree and requests under kvledger's ledgers.

Built on :func:`kvledger.engines.sglang.attach.watch` (its wrappers mirror every alloc / free / insert /
evict into a ledger per pool before SGLang's code runs: a double free or a free of the tree's ids
outside the tree raises at the bad call). This module adds what a scheduler needs on top:

* owners from the request, with no ``with w.holder(rid)`` by hand. During a step the scheduler acts for
  its requests (SGLang allocates for a whole batch in one call: ``alloc_for_extend``/``alloc_for_decode``),
  so the ids it hands out are held by the ``scheduler`` owner; when the step ends each id a live request
  names (its row, its Mamba slot, the KV locations of its row) is handed to that request's owner, whose
  account is the queue the request sits in (``sched.waiting``, ``sched.running``, ``sched.chunked``,
  ``sched.prefill_batch``, the PD queues where present). When the next step starts the requests' ids go
  back to the scheduler, which frees them on their behalf.
* the identity after every step, per pool: free + tree (evictable + protected) + held by each queue
  == size, with nothing left to the scheduler itself (an id no live request names is a leak), no id
  named by two live requests and none a live request names that is free (handed out twice / used after
  free). A violation raises :class:`SchedulerLedgerViolation` naming slot, owner and history.
* SGLang's own memory check (``self_check_during_idle`` / ``check_memory``) classified by LEDGER owner:
  every slot it names that a live request holds -> "SGLang's check is wrong: slot N is held by waiting
  request R"; held by no one but SGLang's books -> a real leak (:class:`SGLangCheckVerdict`).
* a batch about to run (the step's batch choice returned it): none of its requests names a free row or
  Mamba slot, none is named by two of them (:meth:`SchedulerWatch.check_batch`, before the forward).
* id domains per release: request rows are numbered from 0 before 0.5.11 (the watch's ledger starts at 1);
  0.5.5.x's row API and old tree insert go through :mod:`.watch05`; its PD prefill loop's step is
  ``get_next_disagg_prefill_batch_to_run`` ... ``process_disagg_prefill_inflight_queue``.

Not checked here: which request a free acts for (the scheduler frees for all of them), KV locations a
request names beyond its row's committed length, and contents (the fake worker's data tags check those).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.ledger import Ledger, as_id_array
from kvledger.contracts.owners import FREE_LIST, Account, Owner
from kvledger.engines.sglang.attach import Watch, watch
from kvledger.engines.sglang.scheduler.watch05 import uses_row_api, watch_row_api

QUEUES = (
    # (scheduler attribute, account name): where a live request can sit between two steps
    ("chunked_req", "chunked"),
    ("running_batch", "running"),
    ("cur_batch", "batch"),  # the batch this step ran (the loop sets last_batch after process_batch_result)
    # 0.5.23's own loops keep the batch being run here until last_batch is set (a launched server's
    # event_loop_normal sets no cur_batch: without this its prefill batch's rows read as leaked)
    ("cur_batch_for_debug", "batch"),
    ("last_batch", "batch"),
    ("waiting_queue", "waiting"),
    ("disagg_prefill_bootstrap_queue", "pd_bootstrap"),
    ("disagg_prefill_inflight_queue", "pd_inflight"),
    ("disagg_decode_prealloc_queue", "pd_prealloc"),
    ("disagg_decode_transfer_queue", "pd_transfer"),
)


MAMBA_SLOTS_PER_ROW = 3
"""SGLang's ``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`` (0.5.9, 0.5.10; radix cache on, no extra buffer)."""


class SchedulerLedgerViolation(ContractViolation):
    """The scheduler's books disagree with the ledgers at a step boundary (leak, double hand-out, stale)."""


class SGLangCheckVerdict(ContractViolation):
    """SGLang's own memory check fired; ``kind`` says what the ledger makes of it, ``owners`` who holds what."""

    def __init__(self, kind: str, message: str, owners: dict[int, str], original: BaseException) -> None:
        super().__init__(message)
        self.kind = kind
        self.owners = owners
        self.original = original


@dataclass
class LiveRequest:
    req: Any
    queue: str

    @property
    def rid(self) -> str:
        return str(self.req.rid)


@dataclass
class SchedulerWatch:
    """The attach of one scheduler. Build with :func:`attach_scheduler`; :meth:`detach` undoes it."""

    scheduler: Any
    watch: Watch
    steps: int = 0
    _owners: dict[tuple[str, str], Owner] = field(default_factory=dict)
    _handed: list[tuple[Ledger, np.ndarray, Owner]] = field(default_factory=list)
    wrapped_names: list[str] = field(default_factory=list)  # scheduler attributes the attach set
    # who hears of a violation (None: it raises in the scheduler's step). A live server's attach
    # (:mod:`.serve_plugin`) logs it with its evidence, then raises or detaches per its option
    on_violation: Callable[[ContractViolation, BaseException | None], None] | None = None

    # ------------------------------------------------------------------ the requests
    def live_requests(self, *, finishing: bool = False) -> list[LiveRequest]:
        """Every request the scheduler holds, once, in the first queue that has it: the unfinished ones,
        or (``finishing``) those marked finished and not yet taken out of their queue (an abort marks a
        running request; the next step releases it)."""
        seen: set[int] = set()
        out: list[LiveRequest] = []
        for attr, queue in QUEUES:
            for req in requests_in(getattr(self.scheduler, attr, None)):
                if id(req) in seen:
                    continue
                seen.add(id(req))
                if bool(req.finished()) == finishing:
                    out.append(LiveRequest(req, "finishing" if finishing else queue))
        return out

    def owner(self, live: LiveRequest) -> Owner:
        key = (live.rid, live.queue)
        if key not in self._owners:
            self._owners[key] = Owner("req", live.rid, Account(f"sched.{live.queue}"))
        return self._owners[key]

    def _named(self, live: LiveRequest) -> Iterator[tuple[Ledger, np.ndarray, str]]:
        req, w = req_memory(live.req), self.watch
        row = getattr(req, "req_pool_idx", None)
        if row is not None and w.rows is not None:
            yield w.rows, np.array([int(row)], dtype=np.int64), "req_pool_idx"
        slot = getattr(req, "mamba_pool_idx", None)
        if slot is not None and w.slots is not None:
            yield w.slots, as_id_array(slot).reshape(-1), "mamba_pool_idx"
        if row is not None and w.kv is not None:
            length = int(getattr(req, "kv_allocated_len", 0) or 0)
            locs = self.scheduler.req_to_token_pool.req_to_token[int(row), :length]
            pages = np.unique(as_id_array(locs) // w.page_size)
            held = pages[w.kv.held_mask(pages, w.caller)] if pages.size else pages
            if held.size:  # the prefix part is the tree's (locked), the rest the request's
                yield w.kv, held, "kv"

    # ------------------------------------------------------------------ step boundaries
    def hand_to_requests(self) -> None:
        """End of a step: each id a live request names goes from the scheduler to the request's owner."""
        for live in self.live_requests():
            owner = self.owner(live)
            for ledger, ids, handle in self._named(live):
                self._hand(ledger, ids, owner, live, handle)
        for live in self.live_requests(finishing=True):
            # a finished request may already have released some ids (they are free or someone else's
            # now); those it still names that the scheduler holds are still its own
            owner = self.owner(live)
            for ledger, ids, handle in self._named(live):
                mine = ids[ledger.held_mask(ids, self.watch.caller)]
                if mine.size:
                    self._hand(ledger, mine, owner, live, handle)

    def _hand(self, ledger: Ledger, ids: np.ndarray, owner: Owner, live: LiveRequest, handle: str) -> None:
        bad = [int(i) for i in ids.tolist() if ledger.owner_of(int(i)) is not self.watch.caller]
        if bad:
            holders = {i: _name(ledger.owner_of(i)) for i in bad}
            what = (
                "free (used after its free)"
                if all(h == "free" for h in holders.values())
                else "not the scheduler's"
            )
            raise SchedulerLedgerViolation(
                ledger.describe(
                    bad,
                    f"step {self.steps}: {live.queue} request {live.rid} names {ledger.pool} {bad} in its"
                    f" {handle}, which are {what}: held by {holders} (I-HANDLE-OWNED)",
                )
            )
        ledger.transfer(ids, self.watch.caller, owner, f"step {self.steps}: handed to {live.rid}")
        self._handed.append((ledger, ids, owner))

    def take_back(self) -> None:
        """Start of a step: the requests' ids go back to the scheduler, which frees them for them."""
        for ledger, ids, owner in reversed(self._handed):
            ledger.transfer(
                ids, owner, self.watch.caller, f"step {self.steps}: scheduler acts for {owner.key}"
            )
        self._handed.clear()

    def check_identity(self) -> None:
        """After the hand-out: nothing is left to the scheduler (an id no live request names is a leak)."""
        w = self.watch
        for ledger in (w.kv, w.rows, w.slots):
            if ledger is None:
                continue
            orphans = sorted(ledger.holdings(w.caller))
            if orphans:
                raise SchedulerLedgerViolation(
                    ledger.describe(
                        orphans[:8],
                        f"step {self.steps}: {ledger.pool} {orphans[:8]} were handed out and no live request"
                        f" names them: a leak (free + tree + queues != size; accounts {ledger.account_sizes()})",
                    )
                )

    def check_batch(self, batch: Any) -> None:
        """Before a chosen batch runs: no request in it names a free row or Mamba slot (used after its
        free), and no row or slot is named by two of its requests (handed out twice). The forward would
        read and write that state (I-HANDLE-OWNED)."""
        w = self.watch
        named: dict[tuple[str, int], str] = {}
        for req in requests_in(batch):
            live = LiveRequest(req, "batch")
            for ledger, ids, handle in self._named(live):
                if ledger is w.kv:
                    continue  # a request's KV pages are checked at the step's end (and by the tags)
                for i in ids.tolist():
                    key = (ledger.pool, int(i))
                    if key in named and named[key] != live.rid:
                        raise SchedulerLedgerViolation(
                            ledger.describe(
                                [int(i)],
                                f"step {self.steps}: requests {named[key]} and {live.rid} of the batch about to"
                                f" run both name {ledger.pool} {int(i)} ({handle}): handed out twice"
                                " (I-HANDLE-OWNED)",
                            )
                        )
                    named[key] = live.rid
                free = [int(i) for i in ids.tolist() if ledger.owner_of(int(i)) is FREE_LIST]
                if free:
                    raise SchedulerLedgerViolation(
                        ledger.describe(
                            free,
                            f"step {self.steps}: request {live.rid} of the batch about to run names"
                            f" {ledger.pool} {free} in its {handle}, which are free (used after its free)"
                            " (I-HANDLE-OWNED)",
                        )
                    )

    def accounts(self) -> dict[str, dict[str, int]]:
        """Per pool, the identity's terms now: free, tree, each queue (their sum is the pool's size)."""
        w = self.watch
        out: dict[str, dict[str, int]] = {}
        for ledger in (w.kv, w.rows, w.slots):
            if ledger is not None:
                out[ledger.pool] = {k: v for k, v in ledger.account_sizes().items() if v}
        return out

    def end_step(self) -> None:
        self.steps += 1
        self.hand_to_requests()
        self.check_identity()
        self.audit()

    def audit(self) -> None:
        """The watch's full audit (a free group's list SGLang leaves filled after ``free_group_end`` is
        not read as pending: the watch reads the lists only while it saw a group open)."""
        self.watch.audit()

    # ------------------------------------------------------------------ SGLang's own check
    def classify_check(self, error: BaseException) -> SGLangCheckVerdict | None:
        """SGLang's memory check named slots (``leaked_mamba_pages={...}``): who holds each, by ledger."""
        match = re.search(r"leaked_mamba_pages=\{([^}]*)\}", str(error))
        if match is None or self.watch.slots is None:
            return None
        named = [int(x) for x in match.group(1).split(",") if x.strip()]
        self.hand_to_requests()
        slots = self.watch.slots
        held = {n: who for n, who in self._request_held(slots).items() if n in named}
        note = ""
        if not held:
            # SGLang's list is off by one before 0.5.13 (``range(size)`` over slots 1..size): it always
            # names slot 0 and can never name slot ``size``; the ledger knows every live request's slot.
            held = self._request_held(slots)
            note = f" (SGLang's own list names {named}: off by one)" if held else ""
        if held:
            parts = [f"slot {n} is held by {who}" for n, who in sorted(held.items())]
            text = "SGLang's check is wrong: " + "; ".join(parts) + note
            return SGLangCheckVerdict("sglang-check-wrong", text, held, error)
        inside = [n for n in named if n in slots.domain]
        owners = {n: _name(slots.owner_of(n)) for n in inside}
        text = f"slots {named} have no live owner: a real leak (ledger owners {owners})"
        return SGLangCheckVerdict("leak", slots.describe(inside, text), {}, error)

    def classify_exhaustion(self, error: BaseException) -> SGLangCheckVerdict | None:
        """SGLang's own "Can not alloc mamba cache": who holds every slot, and whether the pool is sized
        as SGLang's runner sizes it (3 Mamba slots per request row with the radix cache on)."""
        if "Can not alloc mamba cache" not in str(error) or self.watch.slots is None:
            return None
        with contextlib.suppress(ContractViolation):
            self.hand_to_requests()
        slots, rows = self.watch.slots, self.watch.rows
        held = self._request_held(slots)
        tree = len(slots.holdings(self.watch.tree_state))
        protected = int(self.scheduler.tree_cache.mamba_protected_size())
        free = len(slots.holdings(FREE_LIST))
        n_rows = rows.size if rows is not None else 0
        kind = "pool-undersized" if n_rows * MAMBA_SLOTS_PER_ROW > slots.size else "mamba-exhausted"
        text = (
            f"SGLang's Mamba pool is exhausted: {len(held)} slot(s) held by requests {held}, {tree} by the tree"
            f" ({protected} locked), {free} free, of {slots.size}; SGLang's runner sizes {MAMBA_SLOTS_PER_ROW}"
            f" slots per request row, this pool has {n_rows} rows"
            + (" (undersized: a sizing SGLang never builds)" if kind == "pool-undersized" else "")
        )
        return SGLangCheckVerdict(kind, text, held, error)

    @staticmethod
    def _request_held(slots: Ledger) -> dict[int, str]:
        """Every slot a live request holds now (after :meth:`hand_to_requests`), named by its queue."""
        out: dict[int, str] = {}
        for owner in slots.owners():
            if owner.kind == "req":
                for n in slots.holdings(owner):
                    out[n] = f"{owner.account.name.removeprefix('sched.')} request {owner.key}"
        return out

    def detach(self) -> None:
        for name in self.wrapped_names:
            vars(self.scheduler).pop(name, None)
        self.wrapped_names.clear()
        self.watch.detach()


def req_memory(req: Any) -> Any:
    """Where a ``Req`` keeps its memory handles (row, Mamba slot, KV lengths): the request itself before
    0.5.14, its ``kv`` record after (0.5.23)."""
    return getattr(req, "kv", None) or req


def left_every_queue(scheduler: Any, req: Any) -> bool:
    """``req`` is in none of the scheduler's queues (an abort popped it, or it was released)."""
    return not any(req is r for attr, _ in QUEUES for r in requests_in(getattr(scheduler, attr, None)))


def requests_in(queue: Any) -> list[Any]:
    """The SGLang requests in one scheduler queue attribute: a request, a batch, a list, a PD queue."""
    if queue is None:
        return []
    if hasattr(queue, "rid"):
        return [queue]
    reqs = getattr(queue, "reqs", None)
    if reqs is not None:
        return list(reqs)
    inner = getattr(queue, "queue", queue)
    out = []
    for item in inner if isinstance(inner, (list, tuple)) else ():
        out.append(getattr(item, "req", item))
    return [r for r in out if hasattr(r, "rid")]


def _name(owner: Owner | None) -> str:
    if owner is None:
        return "nobody"
    if owner is FREE_LIST:
        return "free"
    return f"{owner.kind} {owner.key} ({owner.account.name})"


def _renumber_rows(w: Watch, req_pool: Any) -> None:
    """Rows are numbered from 0 before 0.5.11 (``free_slots = list(range(size))``)."""
    if w.rows is not None and 0 in list(req_pool.free_slots):
        w.rows = Ledger("req", range(0, int(req_pool.size)))


def attach_scheduler(scheduler: Any, *, audit_each: bool = False) -> SchedulerWatch:
    """Put a live SGLang ``Scheduler`` (pools, tree, requests, queues) under kvledger's ledgers.

    Pre: ``scheduler`` is an SGLang ``Scheduler`` whose pools and tree are not watched, before its first
    step. Post: every step (``get_next_batch_to_run`` ... ``process_batch_result`` or the idle check)
    ends with the identity checked (:class:`SchedulerLedgerViolation`), and SGLang's own memory check
    raises :class:`SGLangCheckVerdict` naming each slot's ledger owner. :meth:`SchedulerWatch.detach`
    restores the scheduler exactly."""
    needs = ("token_to_kv_pool_allocator", "req_to_token_pool", "tree_cache", "get_next_batch_to_run")
    missing = [n for n in needs if not hasattr(scheduler, n)]
    if missing:
        raise InvalidArgument(
            f"attach_scheduler: {type(scheduler).__name__} is not an SGLang Scheduler (no {missing})"
        )
    if "get_next_batch_to_run" in vars(scheduler):
        raise InvalidArgument("attach_scheduler: this scheduler is already attached; detach that first")
    req_pool = scheduler.req_to_token_pool
    hybrid = getattr(req_pool, "mamba_pool", None) is not None
    if hybrid and uses_row_api(req_pool):  # 0.5.5.x: rows by count, insert(key, value, mamba_value)
        w = watch_row_api(
            allocator=scheduler.token_to_kv_pool_allocator,
            req_pool=req_pool,
            tree=scheduler.tree_cache,
            audit_each=audit_each,
        )
    else:
        w = watch(
            allocator=scheduler.token_to_kv_pool_allocator,
            req_pool=req_pool,
            mamba_pool=req_pool if hybrid else None,
            tree=scheduler.tree_cache,
            audit_each=audit_each,
        )
        _renumber_rows(w, req_pool)
    sw = SchedulerWatch(scheduler, w)
    _wrap_steps(sw)
    return sw


class _StepWrappers:
    """The four shapes a wrapped scheduler method takes: the start of a step (the batch choice), an event
    between steps (an abort, a PD queue's poll), the end of a step, and SGLang's own memory check (its
    failure classified by ledger owner). The checks run after SGLang's own code."""

    def __init__(self, sw: SchedulerWatch) -> None:
        self.sw = sw

    def report(self, error: ContractViolation, cause: BaseException | None = None) -> None:
        # a listener that does not raise lets the step's result through; SGLang's own error (``cause``) is
        # re-raised by the caller either way
        if self.sw.on_violation is None:
            raise error from cause
        self.sw.on_violation(error, cause)

    def guarded(self, check: Callable[..., None], *args: Any) -> None:
        try:
            check(*args)
        except ContractViolation as error:
            self.report(error)

    def begin(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.guarded(self.sw.take_back)
            try:
                batch = original(*args, **kwargs)
            except AssertionError as error:
                verdict = self.sw.classify_exhaustion(error)
                if verdict is None:
                    raise
                self.report(verdict, error)
                raise
            # 0.5.23 returns a plan (the batch to run, the running batch after the choice)
            chosen = getattr(batch, "batch_to_run", batch)
            if chosen:
                self.guarded(self.sw.check_batch, chosen)
            return batch

        return call

    def between(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # a scheduler event between two steps (an abort): the scheduler acts for its requests, then the
        # identity is checked as after a step
        def call(*args: Any, **kwargs: Any) -> Any:
            self.guarded(self.sw.take_back)
            out = original(*args, **kwargs)
            self.guarded(self.sw.end_step)
            return out

        return call

    def end(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            self.guarded(self.sw.end_step)
            return out

        return call

    def checked(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                out = original(*args, **kwargs)
            except Exception as error:
                if isinstance(error, ContractViolation):
                    raise
                try:
                    verdict: ContractViolation | None = self.sw.classify_check(error)
                except ContractViolation as inner:  # the ledgers disagree with the books first
                    verdict = inner
                if verdict is None:
                    raise
                self.report(verdict, error)
                raise
            self.guarded(self.sw.end_step)
            return out

        return call


def _wrap_steps(sw: SchedulerWatch) -> None:
    s = sw.scheduler
    wrap = _StepWrappers(sw)

    def install(name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        if hasattr(s, name):
            setattr(s, name, make(getattr(s, name)))
            sw.wrapped_names.append(name)

    vars(s)["kvledger_watch"] = sw
    sw.wrapped_names.append("kvledger_watch")
    install("get_next_batch_to_run", wrap.begin)
    install("abort_request", wrap.between)
    install("process_batch_result", wrap.end)
    install("self_check_during_idle", wrap.checked)
    install("on_idle", wrap.checked)  # 0.5.23: the idle housekeeping holding the memory check
    if getattr(s, "disagg_decode_prealloc_queue", None) is not None:
        # PD decode's loop (0.5.23): the decode queues advance first (preallocation for new requests,
        # finished transfers move to waiting), then the batch choice
        install("process_decode_queue", wrap.between)
        install("get_next_disagg_decode_batch_to_run", wrap.begin)
    if getattr(s, "disagg_prefill_bootstrap_queue", None) is not None:
        # PD prefill's loop: the step begins with its own batch choice (process_prefill_chunk runs there)
        # and ends after the inflight queue is polled (finished transfers release their requests), both
        # on a busy and an idle iteration; process_batch_result_disagg_prefill sits inside the step
        install("get_next_disagg_prefill_batch_to_run", wrap.begin)
        install("process_disagg_prefill_inflight_queue", wrap.between)
