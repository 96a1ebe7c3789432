"""``TinyHybridRunner``: the tiny hybrid model run against the pools, with data-integrity contracts.

The scheduler hands it each launched batch. For every request it computes the extend positions
``[kv_committed_len - extend_len, kv_committed_len)``, all requests and tokens of the batch at once:
K/V of the new tokens stored at their slots (``KVBufferPool.set_kv_buffer``, one call per batch),
attention over the K/V of positions ``0..p`` read back through each request's ``req_to_token`` row,
the Mamba-like layer advancing each request's working slot. The arithmetic is the very same as
:func:`~kvledger.reference.model.tiny_hybrid.generate_alone`'s (:func:`project` and
:func:`extend_after_store`), so a correct memory system yields the same tokens bit for bit.

Debug builds (``check_integrity``, on when the pools keep a ledger) also check what the reads see,
vectorised over the batch (:mod:`~kvledger.reference.model.read_checks`):

* I-NO-POISON-READ: no KV slot or Mamba slot read for a live request holds the poison the pools write
  on free;
* I-KV-ROW-CONTENT: the slot a row names for position ``q`` was last written for that request's token
  at position ``q`` (a shadow map of what was written where), so a row pointing at another path's KV
  is caught at the read, not just in the output.

Mamba V2 captures (``req.mamba_track``, planned by the scheduler): the state after ``seqlen`` tokens is
copied from the working slot into the tracking slot through the pool (``MambaPool.copy_from``, the
kernels), as SGLang's backend copies the final or an intermediate chunk state into the track slot. A
capture inside an extend splits the forward in two at that length: the first part advances the working
state to the capture point, the copy is scheduled, the second part continues from it. The arithmetic is
chunk-invariant, so the split changes no token and no state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvledger.contracts.errors import ContractViolation
from kvledger.reference.model.read_checks import KVWriteShadow, check_no_poison_read, check_row_content
from kvledger.reference.model.tiny_hybrid import (
    Extend,
    TinyHybridWeights,
    compute_mode,
    extend_after_store,
    project,
)
from kvledger.reference.pools.kv_buffer import KVBufferPool
from kvledger.reference.pools.mamba_pool import MambaPool
from kvledger.reference.pools.req_to_token import ReqToTokenPool
from kvledger.reference.scheduler.request import Req, TrackPoint

_LAYER = 0  # the model has one attention layer and one Mamba layer


class TinyHybridRunner:
    """A :class:`~kvledger.reference.scheduler.runner.ModelRunner` backed by the tiny hybrid model."""

    def __init__(
        self,
        weights: TinyHybridWeights,
        *,
        kv_buffer: KVBufferPool,
        req_to_token_pool: ReqToTokenPool,
        mamba_pool: MambaPool,
        check_integrity: bool = True,
    ) -> None:
        self.weights = weights
        self.kv_buffer = kv_buffer
        self.req_to_token_pool = req_to_token_pool
        self.mamba_pool = mamba_pool
        self.check_integrity = check_integrity
        self.written = KVWriteShadow(kv_buffer.num_slots, kv_buffer.device)
        self.tokens_computed = 0

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary: the scheduler refuses a prompt token outside it (I-TYPED-INPUT)."""
        return int(self.weights.config.vocab_size)

    def forward(
        self, reqs: Sequence[Req], extend_lens: Sequence[int], out_cache_loc: torch.Tensor, is_decode: bool
    ) -> list[int]:
        if not reqs:
            return []
        ends = [req.kv_committed_len for req in reqs]
        starts = [end - n for end, n in zip(ends, extend_lens, strict=True)]
        tracks = [self._track_of(req, s, e) for req, s, e in zip(reqs, starts, ends, strict=True)]
        cuts = [e if t is None or t.seqlen == e else t.seqlen for t, e in zip(tracks, ends, strict=True)]
        with compute_mode():
            if cuts == ends:
                out = self._extend(reqs, starts, ends, out_cache_loc)
            else:
                out = self._extend_in_two(reqs, starts, cuts, ends, out_cache_loc, tracks)
        self._capture(reqs, tracks, ends)
        return out

    def _extend_in_two(
        self,
        reqs: Sequence[Req],
        starts: list[int],
        cuts: list[int],
        ends: list[int],
        new_slots: torch.Tensor,
        tracks: list[TrackPoint | None],
    ) -> list[int]:
        """Every request up to its capture point (or its end), the captures there, then the rest."""
        offsets = [0]
        for s, e in zip(starts, ends, strict=True):
            offsets.append(offsets[-1] + e - s)
        first = torch.cat([new_slots[o : o + c - s] for o, s, c in zip(offsets[:-1], starts, cuts, strict=True)])
        out = self._extend(reqs, starts, cuts, first)
        self._capture(reqs, tracks, cuts)
        later = [i for i, (c, e) in enumerate(zip(cuts, ends, strict=True)) if c < e]
        rest = torch.cat([new_slots[offsets[i] + cuts[i] - starts[i] : offsets[i + 1]] for i in later])
        tail = self._extend([reqs[i] for i in later], [cuts[i] for i in later], [ends[i] for i in later], rest)
        for i, tok in zip(later, tail, strict=True):
            out[i] = tok
        return out

    def _track_of(self, req: Req, start: int, end: int) -> TrackPoint | None:
        """The request's capture for this forward, checked: inside the extend, into one of its tracking slots."""
        track = req.mamba_track
        if track is None:
            return None
        pp = req.mamba_ping_pong_track_buffer
        if not start < track.seqlen <= end or pp is None or int(track.slot[0]) not in pp.tolist():
            raise ContractViolation(
                f"I-TRACK-POINT: {req.owner!r} plans a capture at {track.seqlen} into slot"
                f" {track.slot.tolist()} for a forward over [{start}, {end}) with tracking slots"
                f" {None if pp is None else pp.tolist()}"
            )
        return track

    def _capture(self, reqs: Sequence[Req], tracks: Sequence[TrackPoint | None], at: Sequence[int]) -> None:
        """Copy the working state into the tracking slot of every request whose capture point is ``at``."""
        src = [self._mamba_slot(r) for r, t, a in zip(reqs, tracks, at, strict=True) if t and t.seqlen == a]
        if src:
            dst = [t.slot for t, a in zip(tracks, at, strict=True) if t and t.seqlen == a]
            self.mamba_pool.copy_from(torch.cat(src), torch.cat(dst))

    def _extend(
        self, reqs: Sequence[Req], starts: Sequence[int], ends: Sequence[int], new_slots: torch.Tensor
    ) -> list[int]:
        device = self.kv_buffer.device
        extend_lens = [e - s for s, e in zip(starts, ends, strict=True)]
        contexts = [req.context_ids() for req in reqs]
        ext = Extend.build(starts, extend_lens, device)
        tokens = torch.tensor(
            [t for ctx, s, e in zip(contexts, starts, ends, strict=True) for t in ctx[s:e]],
            dtype=torch.int64,
            device=device,
        )
        slot_table = self._slot_table(reqs, ends)
        if not torch.equal(
            slot_table[ext.seq, ext.positions], new_slots.to(device=device, dtype=torch.int64)
        ):
            raise ContractViolation(self._which_row_disagrees(reqs, ext, slot_table, new_slots, ends))
        mslots = torch.cat([self._mamba_slot(req) for req in reqs])

        x, q, k, v = project(self.weights, tokens)
        self.kv_buffer.set_kv_buffer(_LAYER, new_slots, k, v)
        self.written.record(new_slots.to(device), tokens, ext.positions)
        if self.check_integrity:
            self._check_reads(reqs, slot_table, ends, contexts, mslots)

        # Taken right before the write, never across a copy or an alloc (the #32995 hazard, spec §4).
        conv_state, ssm_state = self.mamba_pool.conv_state, self.mamba_pool.temporal_state
        out, new_conv, new_ssm = extend_after_store(
            self.weights,
            x,
            q,
            ext,
            slot_table,
            self.kv_buffer.k_buffer[_LAYER],
            self.kv_buffer.v_buffer[_LAYER],
            conv_state[_LAYER, mslots],
            ssm_state[_LAYER, mslots],
        )
        conv_state[_LAYER, mslots] = new_conv
        ssm_state[_LAYER, mslots] = new_ssm
        self.tokens_computed += len(tokens)
        return out

    def _slot_table(self, reqs: Sequence[Req], ends: Sequence[int]) -> torch.Tensor:
        """``[B, max end]`` int64: each request's row, positions at or past its end set to padding slot 0."""
        rows = torch.tensor([self._row(req) for req in reqs], dtype=torch.int64)
        width = max(ends)
        table = self.req_to_token_pool.req_to_token[rows.to(self.req_to_token_pool.device), :width]
        table = table.to(device=self.kv_buffer.device, dtype=torch.int64)
        live = torch.arange(width, device=table.device) < torch.tensor(ends, device=table.device)[:, None]
        return torch.where(live, table, 0)

    def note_external_writes(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> None:
        """K/V stored by something other than this runner's forward (a PD transfer landing, a host copy
        restored): record which token at which position now sits in each slot, so I-KV-ROW-CONTENT keeps
        checking the reads of those slots."""
        device = self.kv_buffer.device
        self.written.record(
            torch.tensor(list(slots), dtype=torch.int64, device=device),
            torch.tensor(list(tokens), dtype=torch.int64, device=device),
            torch.tensor(list(positions), dtype=torch.int64, device=device),
        )

    def _check_reads(
        self,
        reqs: Sequence[Req],
        slot_table: torch.Tensor,
        ends: Sequence[int],
        contexts: Sequence[list[int]],
        mslots: torch.Tensor,
    ) -> None:
        """I-NO-POISON-READ (Mamba and KV slots) and I-KV-ROW-CONTENT over every slot the batch reads."""
        owners = [req.owner for req in reqs]
        every = torch.arange(len(reqs), device=mslots.device)
        check_no_poison_read(owners, "Mamba", self.mamba_pool.poisoned(mslots), mslots, every)
        live = (
            torch.arange(slot_table.shape[1], device=slot_table.device)
            < torch.tensor(ends, device=slot_table.device)[:, None]
        )
        read_by, positions = torch.nonzero(live, as_tuple=True)  # request-major, positions increasing
        slots = slot_table[live]
        check_no_poison_read(owners, "KV", self.kv_buffer.poisoned(slots), slots, read_by)
        tokens = torch.tensor(
            [t for ctx, e in zip(contexts, ends, strict=True) for t in ctx[:e]],
            dtype=torch.int64,
            device=slots.device,
        )
        check_row_content(owners, self.written, slots, tokens, positions, read_by)

    @staticmethod
    def _row(req: Req) -> int:
        if req.req_pool_idx is None:
            raise ContractViolation(f"{req.owner!r} is in a forward batch without a req_to_token row")
        return req.req_pool_idx

    @staticmethod
    def _mamba_slot(req: Req) -> torch.Tensor:
        if req.mamba_pool_idx is None:
            raise ContractViolation(f"{req.owner!r} is in a forward batch without a Mamba slot")
        return req.mamba_pool_idx.reshape(1)

    @staticmethod
    def _which_row_disagrees(
        reqs: Sequence[Req], ext: Extend, slot_table: torch.Tensor, new_slots: torch.Tensor, ends: Sequence[int]
    ) -> str:
        wrong = slot_table[ext.seq, ext.positions] != new_slots.to(slot_table.device)
        b = int(ext.seq[torch.nonzero(wrong)[0, 0]])
        n = int(ext.extend_lens[b])
        end = ends[b]
        return f"{reqs[b].owner!r}: row {reqs[b].req_pool_idx} [{end - n}, {end}) does not hold the batch's new slots"
