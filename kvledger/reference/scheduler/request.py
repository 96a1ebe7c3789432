"""``Req``: one request with SGLang's memory bookkeeping, and the ladder that ties it together.

The fields that decide what a request owns (``sglang-memory-model.md`` §1.9, §5.4):

* ``req_pool_idx``: its row in ``req_to_token`` (None while waiting).
* ``cache_protected_len``: tokens ``[0, cache_protected_len)`` are tree-owned and locked by ``lock``;
  page-aligned.
* ``kv_committed_len``: positions whose KV has been computed; ``kv_allocated_len``: positions with a slot.
  The request owns the KV of ``[cache_protected_len, ceil_page(kv_allocated_len))``.
* ``mamba_pool_idx``: its Mamba slot: the copy-on-write slot while waiting, the working slot once admitted.
* Mamba V2 (``extra_buffer``): ``mamba_ping_pong_track_buffer``, the ``k`` tracking slots an admitted
  request holds (2 with overlap, 1 without), ``mamba_next_track_idx`` (the half the next capture writes),
  ``mamba_last_track_seqlen`` (the length whose state the other half holds) and
  ``mamba_branching_seqlen`` (the branching point a match reported). spec/mamba-v2.md.

I-REQ-LADDER: ``0 <= cache_protected_len <= kv_committed_len <= kv_allocated_len <= max_context_len``
and ``cache_protected_len % page_size == 0``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from kvledger.contracts.owners import REQ_WAITING, Owner
from kvledger.contracts.pool_kinds import MAMBA, REQ
from kvledger.contracts.protocols import LockLike, NodeLike


@dataclass(frozen=True)
class TrackPoint:
    """A capture planned for the next forward (Mamba V2): the state after ``seqlen`` tokens goes into
    ``slot``, one of the request's tracking slots. The model runner carries it out; the scheduler clears
    it once the forward has run."""

    seqlen: int
    slot: torch.Tensor


class ReqState(enum.Enum):
    WAITING = "waiting"
    CHUNKED = "chunked"  # admitted, prompt only partly prefilled
    RUNNING = "running"  # prompt prefilled, decoding
    FINISHED = "finished"
    ABORTED = "aborted"
    REJECTED = "rejected"  # can never fit: refused with a reason instead of blocking the queue
    # Prefill/decode disaggregation (kvledger.reference.disagg, spec/pd.md): the queues around the scheduler.
    BOOTSTRAP = "bootstrap"  # prefill: handshake with the decode side pending
    INFLIGHT = "inflight"  # prefill: prompt done, its KV and state being sent
    PREALLOC = "prealloc"  # decode: handshake or memory pending
    TRANSFER = "transfer"  # decode: pre-allocated, receiving its KV and state
    PREBUILT = "prebuilt"  # decode: transferred, waiting to join the running batch (no forward)
    RETRACTED = "retracted"  # decode: retracted, its KV and state kept in a host copy

    is_done: bool
    """Finished, aborted or rejected: the request ends here. A plain attribute of each member (set below),
    not a property: it is read for every queued request after every step."""


for _state in ReqState:
    _state.is_done = _state in (ReqState.FINISHED, ReqState.ABORTED, ReqState.REJECTED)
del _state


@dataclass(eq=False)
class Req:
    """A request. ``origin_input_ids`` is the prompt; ``output_ids`` the tokens processed so far."""

    rid: int
    origin_input_ids: list[int]
    max_new_tokens: int
    arrival_step: int = 0
    output_ids: list[int] = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    owner: Owner = field(init=False)

    # --- memory bookkeeping (SGLang names) ---
    req_pool_idx: int | None = None
    mamba_pool_idx: torch.Tensor | None = None
    prefix_indices: torch.Tensor | None = None  # tree-owned KV slots of the cached prefix
    last_node: NodeLike | None = None
    lock: LockLike | None = None  # the LockRef taken on last_node (None: no lock held)
    cache_protected_len: int = 0
    kv_committed_len: int = 0
    kv_allocated_len: int = 0

    # --- Mamba V2 (extra_buffer) tracking, SGLang's names ---
    mamba_ping_pong_track_buffer: torch.Tensor | None = None  # the k tracking slots (None: holds none)
    mamba_next_track_idx: int = 0
    mamba_last_track_seqlen: int | None = None
    mamba_branching_seqlen: int | None = None
    mamba_track: TrackPoint | None = None  # this forward's capture, if any

    # --- this round's extend ---
    fill_ids: list[int] = field(default_factory=list)  # the tokens to have KV for after this round
    extend_input_len: int = 0
    # Tokens sampled by forwards whose results are not processed yet (overlap mode): the data plane
    # has them, the bookkeeping does not.
    pending_output_ids: list[int] = field(default_factory=list)

    # --- lifecycle ---
    is_retracted: bool = False
    retract_count: int = 0
    finish_reason: str | None = None
    abort_requested: bool = False
    released: bool = False  # one release per lifetime (I-OWNER-RELEASE, idempotency guard)
    first_token_step: int | None = None
    finish_step: int | None = None
    prefix_hit_tokens: int = 0  # tokens served from the cache at admission (for the hit-rate report)
    prompt_counted: bool = False  # its prompt is in the statistics (once, at the first admission)
    # The scheduler's accounting, told about every write of a field the identity or the ladder reads
    # (``write_marks``): what makes the after-step identity O(changed). See ``MEMORY_FIELDS``.
    watch: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.owner = Owner("req", self.rid, REQ_WAITING)

    @property
    def seqlen(self) -> int:
        """Tokens the request's sequence has, counting only processed output."""
        return len(self.origin_input_ids) + len(self.output_ids)

    def all_ids(self) -> list[int]:
        """Prompt and processed output."""
        return self.origin_input_ids + self.output_ids

    def context_ids(self) -> list[int]:
        """What the data plane has seen: prompt, processed output and not-yet-processed samples."""
        return self.origin_input_ids + self.output_ids + self.pending_output_ids

    def holds_kv(self) -> bool:
        return self.kv_allocated_len > self.cache_protected_len

    def handles(self) -> list[tuple[str, str, list[int]]]:
        """``(field, pool, ids)`` for every pool id a field of this request names (I-HANDLE-OWNED).

        Each must be owned by this request in its pool's ledger whenever the field is set: a released id
        left in a handle is reused later without being allocated (#12432, #26941). Subclasses with more
        handles (PD metadata slots, Mamba V2 ping-pong slots) extend the list.
        """
        out: list[tuple[str, str, list[int]]] = []
        if self.req_pool_idx is not None:
            out.append(("req_pool_idx", REQ.name, [self.req_pool_idx]))
        if self.mamba_pool_idx is not None:
            out.append(("mamba_pool_idx", MAMBA.name, self.mamba_pool_idx.tolist()))
        if self.mamba_ping_pong_track_buffer is not None:  # Mamba V2: the tracking slots (#26941)
            out.append(("mamba_ping_pong_track_buffer", MAMBA.name, self.mamba_ping_pong_track_buffer.tolist()))
        return out

    def mamba_slots(self) -> list[int]:
        """Every Mamba slot a handle of this request names: the working (or COW) slot, then the tracking
        slots."""
        # ``tolist`` is one call into torch; ``int(t[0])`` is an indexing op and a conversion, several
        # times slower, and this runs for every changed request after every step (the identity's terms).
        out: list[int] = [] if self.mamba_pool_idx is None else self.mamba_pool_idx.tolist()[:1]
        if self.mamba_ping_pong_track_buffer is not None:
            out += self.mamba_ping_pong_track_buffer.tolist()
        return out

    def __repr__(self) -> str:
        return (
            f"Req(rid={self.rid}, {self.state.value}, prompt={len(self.origin_input_ids)},"
            f" out={len(self.output_ids)}/{self.max_new_tokens}, row={self.req_pool_idx},"
            f" protected={self.cache_protected_len}, committed={self.kv_committed_len},"
            f" allocated={self.kv_allocated_len})"
        )


MEMORY_FIELDS = frozenset(
    {
        "req_pool_idx",
        "mamba_pool_idx",
        "cache_protected_len",
        "kv_committed_len",
        "kv_allocated_len",
        "mamba_ping_pong_track_buffer",
        "mamba_last_track_seqlen",
    }
)
"""The fields that decide what a request holds (the identity's terms), its ladder and (Mamba V2) its
tracked length: written by the holdings managers only (``holdings``), each write marked for the next
count by the accounting (``write_marks``). A pool kind whose terms read other fields names them in its
``fields``; the accounting marks those too."""


def ladder_holds(req: Req, page_size: int, max_context_len: int) -> bool:
    """I-REQ-LADDER for one request."""
    return (
        0 <= req.cache_protected_len <= req.kv_committed_len <= req.kv_allocated_len <= max_context_len
        and req.cache_protected_len % page_size == 0
    )


def track_point_holds(req: Req, page_size: int) -> bool:
    """I-TRACK-POINT for one request: a tracked length is a page boundary above what the request has
    already cached and not beyond what it has computed."""
    t = req.mamba_last_track_seqlen
    return t is None or (req.cache_protected_len < t <= req.kv_committed_len and t % page_size == 0)
