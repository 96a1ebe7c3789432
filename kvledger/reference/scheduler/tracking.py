"""Mamba V2 (``extra_buffer``) on the request side: ping-pong tracking slots, captures, donation.

A request admitted under V2 holds, besides its working slot, ``k`` tracking slots
(``mamba_ping_pong_track_buffer``: 2 with the overlap scheduler, 1 without). A forward *captures* the
request's state into one of them (the half ``mamba_next_track_idx`` names):

* an extend of at least one chunk captures once, at the branching point ``match_prefix`` reported if it
  lies inside the extend on the chunk grid, else at the extend's last grid point; the index flips when
  the extend is planned (SGLang's ``_mamba_radix_cache_v2_req_prepare_for_extend``);
* a decode step captures when the sequence reaches a multiple of ``mamba_track_interval``; the index
  flips when that step's result is processed (``_mamba_prefix_cache_update``).

``mamba_last_track_seqlen`` is then the length whose state the *other* half holds (the *keep* half).
``cache_unfinished_req`` donates the keep half to the tree and puts a freshly allocated slot in its place
(2026 SGLang: no copy that could race the forward stream); ``cache_finished_req`` inserts the keep half;
every release frees the tracking slots and clears the handle (SGLang #26941 left it set: a readmitted
request reused freed slots). Pure bookkeeping: the bytes move in the model runner, through the pool.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.ledger_by_level import AnyLedger
from kvledger.contracts.mamba_track import extend_track_seqlen, other_track_idx
from kvledger.contracts.protocols import MambaPrefixCache, MambaStatePool
from kvledger.contracts.seams import seam
from kvledger.contracts.switch import ensure
from kvledger.reference.scheduler.request import Req, TrackPoint


def _holds_k_distinct(tracking: MambaTracking, req: Req) -> bool:
    pp = req.mamba_ping_pong_track_buffer
    return (
        pp is not None and pp.numel() == tracking.k and len(set(req.mamba_slots())) == len(req.mamba_slots())
    )


class MambaTracking:
    """The V2 rules for one scheduler: ``k`` tracking slots, the capture grid and the decode interval."""

    def __init__(
        self, *, mamba_pool: MambaStatePool, tree: MambaPrefixCache, k: int, chunk: int, interval: int
    ) -> None:
        self.mamba_pool = mamba_pool
        self.tree = tree
        self.k = k
        self.chunk = chunk
        self.interval = interval
        # What happened, for reports and for the tests to show the paths were taken.
        self.stats = {"captures": 0, "branching_captures": 0, "donations": 0, "donations_skipped": 0}

    # ------------------------------------------------------------------ allocation (admission)
    def needs_slots(self, req: Req) -> bool:
        return req.mamba_ping_pong_track_buffer is None

    def alloc(self, req: Req) -> torch.Tensor | None:
        """The request's ``k`` tracking slots (zeroed), or None when the pool is short even after evicting
        the shortfall of cached states. The caller undoes it if the admission fails later."""
        short = self.k - self.mamba_pool.available_size()
        if short > 0:
            self.tree.evict_mamba(short)
        slots = self.mamba_pool.alloc(self.k, req.owner)
        if slots is None:
            return None
        req.mamba_ping_pong_track_buffer = slots
        req.mamba_next_track_idx = 0
        return slots

    def keep_idx(self, req: Req) -> int:
        """The half that holds the last captured state (``mamba_last_track_seqlen``'s)."""
        return other_track_idx(req.mamba_next_track_idx, self.k)

    # ------------------------------------------------------------------ captures
    def plan_extend(self, req: Req, start: int, end: int) -> None:
        """An extend of ``[start, end)`` is about to run: plan its capture, flip the index, record the length."""
        pp = req.mamba_ping_pong_track_buffer
        if pp is None:
            raise ContractViolation(
                f"I-REQ-MAMBA: {req.owner!r} extends under extra_buffer without tracking slots"
            )
        seqlen = extend_track_seqlen(start, end - start, self.chunk, req.mamba_branching_seqlen)
        if seqlen is None:
            return
        self.stats["captures"] += 1
        self.stats["branching_captures"] += seqlen == req.mamba_branching_seqlen
        req.mamba_track = TrackPoint(seqlen, pp[req.mamba_next_track_idx : req.mamba_next_track_idx + 1])
        req.mamba_next_track_idx = other_track_idx(req.mamba_next_track_idx, self.k)
        req.mamba_last_track_seqlen = seqlen

    def plan_decode(self, req: Req) -> None:
        """A decode step to ``kv_allocated_len`` tokens is about to run: capture on the interval grid."""
        pp = req.mamba_ping_pong_track_buffer
        if pp is not None and req.kv_allocated_len % self.interval == 0:
            self.stats["captures"] += 1
            i = req.mamba_next_track_idx
            req.mamba_track = TrackPoint(req.kv_allocated_len, pp[i : i + 1])

    def after_decode_result(self, req: Req) -> None:
        """The decode result was appended: if that step captured, the captured half becomes the keep half."""
        if req.mamba_ping_pong_track_buffer is None:
            return
        seq_len = len(req.origin_input_ids) + len(req.output_ids) - 1  # the tokens the step computed
        if seq_len % self.interval == 0:
            req.mamba_next_track_idx = other_track_idx(req.mamba_next_track_idx, self.k)
            req.mamba_last_track_seqlen = seq_len

    def captured(self, req: Req, seqlen: int) -> None:
        """A verify captured the state at ``seqlen`` (an accepted position) into the next half: it becomes
        the keep half."""
        req.mamba_next_track_idx = other_track_idx(req.mamba_next_track_idx, self.k)
        req.mamba_last_track_seqlen = seqlen

    @staticmethod
    def cached(req: Req) -> None:
        """The tree adopted the tracked state: nothing is tracked beyond the protected prefix any more."""
        req.mamba_last_track_seqlen = None

    # ------------------------------------------------------------------ donation and release
    @ensure(
        lambda self, req, result: result is None or _holds_k_distinct(self, req),
        "I-DONATION: after a donation the request still holds k distinct tracking slots (the replacement)",
    )
    @ensure(
        lambda self, req, result: (
            result is None
            or not self.mamba_pool.ledger.enabled
            or self.mamba_pool.ledger.owner_of(int(result)) is req.owner
        ),
        "I-DONATION: the donated slot is still the request's until the tree takes it",
    )
    def donate(self, req: Req) -> torch.Tensor | None:
        """Take the keep half out of the request's tracking slots for the tree, putting a fresh slot in its
        place; None (nothing changed) when no slot can be had even after evicting one cached state. The
        caller inserts the returned slot (ledger op ``donate``) or frees it if the tree has a state there."""
        pp = req.mamba_ping_pong_track_buffer
        assert pp is not None
        replacement = self.mamba_pool.alloc(1, req.owner)
        if replacement is None:
            self.tree.evict_mamba(1)
            replacement = self.mamba_pool.alloc(1, req.owner)
            if replacement is None:
                self.stats["donations_skipped"] += 1
                return None  # every cached state is locked: skip this donation (never assert, #36770)
        keep = self.keep_idx(req)
        donated = pp[keep : keep + 1].clone()
        req.mamba_ping_pong_track_buffer = self._refilled(pp, keep, replacement)
        self.stats["donations"] += 1
        return donated

    @staticmethod
    def _refilled(pp: torch.Tensor, keep: int, replacement: torch.Tensor) -> torch.Tensor:
        """The tracking slots with the donated half replaced (a new tensor: the handle changes, so the
        accounting sees it)."""
        refilled = pp.clone()
        refilled[keep] = replacement[0]
        return refilled

    def forget_kept(self, req: Req) -> None:
        """The tree adopted the keep half at finish: it is no longer the request's to free."""
        pp = req.mamba_ping_pong_track_buffer
        assert pp is not None
        keep = self.keep_idx(req)
        req.mamba_ping_pong_track_buffer = torch.cat((pp[:keep], pp[keep + 1 :]))

    @seam
    def release(self, req: Req) -> None:
        """Free the request's tracking slots and clear every tracking handle (the #26941 fix)."""
        pp = req.mamba_ping_pong_track_buffer
        if pp is not None and pp.numel():
            self.mamba_pool.free(pp, req.owner)
        self.clear(req)

    @staticmethod
    def clear(req: Req) -> None:
        req.mamba_ping_pong_track_buffer = None
        req.mamba_next_track_idx = 0
        req.mamba_last_track_seqlen = None
        req.mamba_track = None

    # ------------------------------------------------------------------ per-step checks
    def check_requests(self, reqs: Iterable[Req]) -> int:
        """I-REQ-MAMBA and I-STATE-BOUND over live requests; returns the requests checked."""
        ledger = self.mamba_pool.ledger
        bound = 1 + self.k
        n = 0
        for req in reqs:
            n += 1
            check_req_mamba(req, self.k, ledger)
            if ledger.enabled:
                held = ledger.held_count(req.owner)
                if held > bound:
                    extra = sorted(set(ledger.holdings(req.owner)) - set(req.mamba_slots()))
                    raise ContractViolation(
                        ledger.describe(
                            extra[:4],
                            f"I-STATE-BOUND: {req.owner!r} holds {held} Mamba slots, more than 1 + k = {bound};"
                            f" its handles name {req.mamba_slots()}, the ledger also gives it {extra[:8]}",
                        )
                    )
        return n


def check_req_mamba(req: Req, k: int, ledger: AnyLedger | None = None) -> None:
    """I-REQ-MAMBA for one request: a request without a row holds at most its copy-on-write slot and no
    tracking slots; an admitted one its working slot and (V2) exactly ``k`` tracking slots, all distinct.
    With a ledger, a violation names the slots' owners and last moves."""
    pp = req.mamba_ping_pong_track_buffer
    if req.req_pool_idx is None:
        if pp is not None:
            headline = (
                f"I-REQ-MAMBA: {req.owner!r} has no row, but its handle mamba_ping_pong_track_buffer still"
                f" names tracking slots {pp.tolist()} (a release that left the handle set: SGLang #26941): {req!r}"
            )
            raise ContractViolation(
                ledger.describe(pp.tolist(), headline) if ledger is not None and ledger.enabled else headline
            )
        return
    if k == 0:
        if pp is not None:
            raise ContractViolation(
                f"I-REQ-MAMBA: {req.owner!r} holds tracking slots {pp.tolist()} under no_buffer"
            )
        return
    if req.owner.account.name in ("req.chunked", "req.running") and (pp is None or pp.numel() != k):
        raise ContractViolation(
            f"I-REQ-MAMBA: admitted {req.owner!r} must hold k = {k} tracking slots, its handle names"
            f" {None if pp is None else pp.tolist()}: {req!r}"
        )
    slots = req.mamba_slots()
    if len(set(slots)) != len(slots):
        raise ContractViolation(f"I-REQ-MAMBA: {req.owner!r} names a Mamba slot twice: {slots}")
