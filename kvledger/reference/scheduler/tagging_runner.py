"""The hash runner with data tags: the same tokens, and every state and KV slot it fills carries its prefix.

:class:`TaggingHashRunner` generates exactly what :class:`~kvledger.reference.scheduler.runner.HashTokenRunner`
does (so the output oracle is unchanged), and on every forward it also moves data, through
``kvledger.kernels``, as a model would (the tags: ``kvledger.contracts.data_tags``):

* it reads each request's working Mamba slot and checks that it holds the tag of the request's tokens up
  to where this forward starts (I-DATA-STATE): whatever put the state there (a fresh zeroed slot, a
  copy-on-write from the tree, a PD landing, a restore from a host copy) must have brought that prefix's
  state; then it writes the tag of the prefix up to where the forward ends;
* it carries out Mamba V2 captures: the tracking slot a capture names gets the tag of the prefix up to
  the capture's length (what the real runner's copy from the working state at that length holds);
* with a KV buffer, it reads the K/V its requests attend to, through their ``req_to_token`` rows, and
  checks that position ``p`` holds the tag of the prefix up to ``p`` (I-DATA-KV), then writes the tags of
  the new positions at ``out_cache_loc``.
* under speculative decoding it is also the verify forward (:meth:`TaggingHashRunner.verify_drafts`,
  what ``SpecDecoding.verify`` calls): the same reads and checks at the verify's data-plane start, the
  KV of every verified position written with the tag of the *drafted* prefix (the last token, then the
  drafts, the rejected ones included: their positions hold a rejected draft's tag, which no later read
  may trust), the working state put back to the tag of the accepted prefix (a real runner restores the
  state kept aside after the last kept token), and the Mamba V2 capture the scheduler will record written
  from the drafted prefix at the length ``SpecDecoding.track_seqlen`` names (so a capture at a rejected
  position holds a rejected draft's tag, and the machine's check of the keep half sees it).

The machines check the rest after every rule (every cached state, tracking slot and host copy:
``kvledger.museum.machines.data_oracle``). The cost is a few tensor operations per forward and a fold of
each request's new tokens; it is a checking runner (the hunt's), not the default one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from kvledger import kernels
from kvledger.contracts.data_tags import HALF_BITS, HALF_MASK, PrefixTags, decode
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.reference.pools.kv_buffer import KVBufferPool
from kvledger.reference.pools.mamba_pool import MambaPool
from kvledger.reference.pools.req_to_token import ReqToTokenPool
from kvledger.reference.scheduler.request import Req
from kvledger.reference.scheduler.runner import HashTokenRunner, hash_next_token
from kvledger.reference.scheduler.spec_config import kept_tokens

if TYPE_CHECKING:  # pragma: no cover  (the speculative step hands itself to the verify)
    from kvledger.reference.scheduler.speculative import SpecDecoding, VerifyPlan


def _component(leads: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """``[n, width]`` float32: each row ``lead`` then ``length`` repeated (one component of a tagged slot)."""
    out = np.repeat(lengths.astype(np.float32)[:, None], width, axis=1)
    out[:, 0] = leads
    return out


def state_rows(
    tags: Sequence[int], lengths: Sequence[int], widths: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """The conv and temporal rows (``[n, F]``, flattened per slot) of states holding ``tags`` after
    ``lengths`` tokens (``data_tags.encode``, vectorised)."""
    t = np.asarray(tags, dtype=np.int64)
    n = np.asarray(lengths, dtype=np.int64)
    return _component(t & HALF_MASK, n, widths[0]), _component((t >> HALF_BITS) & HALF_MASK, n, widths[1])


def flat_states(pool: MambaPool) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool's conv and temporal state as ``[L, S, 1, F]`` views (every scheduled write applied): the
    layout ``kernels.store_kv`` writes, one slot-indexed pair of buffers, as the PD landing does."""
    conv, temporal = pool.states
    return (
        conv.reshape(conv.shape[0], conv.shape[1], 1, -1),
        temporal.reshape(temporal.shape[0], temporal.shape[1], 1, -1),
    )


def write_states(pool: MambaPool, slots: Sequence[int], tags: Sequence[int], lengths: Sequence[int]) -> None:
    """Write the tagged states of ``tags``/``lengths`` into ``slots`` (distinct), every layer, via the kernels."""
    if not slots:
        return
    conv, temporal = flat_states(pool)
    rows_c, rows_t = state_rows(tags, lengths, (conv.shape[3], temporal.shape[3]))
    device = conv.device
    idx = torch.tensor(list(slots), dtype=torch.int64, device=device)
    c = torch.from_numpy(rows_c).to(dtype=conv.dtype, device=device).unsqueeze(1)
    t = torch.from_numpy(rows_t).to(dtype=temporal.dtype, device=device).unsqueeze(1)
    for layer in range(conv.shape[0]):
        kernels.store_kv(conv, temporal, layer, idx, c, t)


def _host(t: torch.Tensor) -> np.ndarray:
    return t.numpy() if t.is_cpu else t.cpu().numpy()


def pair_mismatches(
    a: torch.Tensor, b: torch.Tensor, slots: Sequence[int], want_a: np.ndarray, want_b: np.ndarray
) -> list[int]:
    """Indices ``i`` where slot ``slots[i]`` of the ``[L, S, 1, F]`` buffers ``a`` and ``b`` (conv and
    temporal state, or K and V) differs from row ``i`` of ``want_a``/``want_b`` in any layer (numpy on the
    host: a check touches a few elements per slot)."""
    idx = np.asarray(slots, dtype=np.int64)
    ok = (_host(a)[:, idx, 0] == want_a).all(axis=(0, 2)) & (_host(b)[:, idx, 0] == want_b).all(axis=(0, 2))
    return [] if ok.all() else np.flatnonzero(~ok).tolist()


def state_mismatches(
    pool: MambaPool, slots: Sequence[int], tags: Sequence[int], lengths: Sequence[int]
) -> list[int]:
    """Indices ``i`` whose slot ``slots[i]`` does not hold the state of ``tags[i]`` after ``lengths[i]``
    tokens, in every layer and both components (empty: all hold theirs)."""
    if not slots:
        return []
    conv, temporal = flat_states(pool)
    rows_c, rows_t = state_rows(tags, lengths, (conv.shape[3], temporal.shape[3]))
    return pair_mismatches(conv, temporal, slots, rows_c, rows_t)


def kv_mismatches(
    kv_buffer: KVBufferPool, slots: Sequence[int], tags: Sequence[int], positions: Sequence[int]
) -> list[int]:
    """Indices ``i`` whose KV slot ``slots[i]`` does not hold the tag of the prefix up to ``positions[i]``."""
    if not slots:
        return []
    want_k, want_v = state_rows(tags, [p + 1 for p in positions], (2, 2))
    return pair_mismatches(kv_buffer.k_buffer, kv_buffer.v_buffer, slots, want_k, want_v)


def describe_state(pool: MambaPool, slot: int, tags: Sequence[int]) -> str:
    """What a slot holds, in the tags' terms: the length its elements claim and whether that length's tag
    of the owner's prefix (``tags``, as :meth:`PrefixTags.tags` returns) is what it carries."""
    conv, temporal = flat_states(pool)
    c = conv[:, slot, 0].tolist()
    t = temporal[:, slot, 0].tolist()
    lead_c, lead_t = c[0][0], t[0][0]
    claimed = c[0][1] if len(c[0]) > 1 else t[0][1] if len(t[0]) > 1 else None
    found = decode(lead_c, lead_t) if lead_c == lead_c and lead_t == lead_t else None  # NaN: poison
    where = [n for n, tag in enumerate(tags) if tag == found]
    return (
        f"slot {slot} holds conv {c} and temporal {t} (layer-major): tag {found}, length {claimed};"
        f" that tag is the owner's prefix state at {where or 'no length of its tokens'}"
    )


def kv_rows(tags: Sequence[int], positions: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V (``[T, 1, 2]`` float32) of positions ``p`` whose prefixes, up to and including ``p``, end
    with the tags ``tags``: ``encode(tag, p + 1)`` led by the tag's low and high half."""
    conv, temporal = state_rows(tags, [p + 1 for p in positions], (2, 2))
    return torch.from_numpy(conv).unsqueeze(1), torch.from_numpy(temporal).unsqueeze(1)


class TaggingHashRunner(HashTokenRunner):
    """The hash runner that also writes, and checks on read, the data tags of states and KV."""

    def __init__(
        self,
        vocab_size: int = 32000,
        *,
        mamba_pool: MambaPool | None = None,
        kv_buffer: KVBufferPool | None = None,
        req_to_token_pool: ReqToTokenPool | None = None,
    ) -> None:
        super().__init__(vocab_size)
        self.mamba_pool = mamba_pool
        self.kv_buffer = kv_buffer
        self.req_to_token_pool = req_to_token_pool
        self.prefix_tags = PrefixTags()
        if kv_buffer is not None and tuple(kv_buffer.k_buffer.shape[2:]) != (1, 2):
            raise InvalidArgument(
                f"TaggingHashRunner: the KV buffer must have 1 head of dim 2, got {tuple(kv_buffer.k_buffer.shape)}"
            )

    def forward(
        self, reqs: Sequence[Req], extend_lens: Sequence[int], out_cache_loc: torch.Tensor, is_decode: bool
    ) -> list[int]:
        out = super().forward(reqs, extend_lens, out_cache_loc, is_decode)
        if not reqs:
            return out
        ends = [req.kv_committed_len for req in reqs]
        starts = [end - n for end, n in zip(ends, extend_lens, strict=True)]
        tags = [self.prefix_tags.tags(req.context_ids()[:end]) for req, end in zip(reqs, ends, strict=True)]
        if self.kv_buffer is not None and self.req_to_token_pool is not None:
            self._check_kv_reads(reqs, starts, tags)
            self._write_kv(starts, ends, tags, out_cache_loc)
        if self.mamba_pool is not None:
            self._advance_states(reqs, starts, ends, tags)
        return out

    # The data paths below run only with their pool (``forward`` and the verify test for it first).
    def _state_pool(self) -> MambaPool:
        assert self.mamba_pool is not None, "a state path without a Mamba pool"
        return self.mamba_pool

    def _kv(self) -> KVBufferPool:
        assert self.kv_buffer is not None, "a KV path without a KV buffer"
        return self.kv_buffer

    def _row_table(self) -> torch.Tensor:
        assert self.req_to_token_pool is not None, "a KV path without a request-row pool"
        return self.req_to_token_pool.req_to_token

    # ------------------------------------------------------------------ the speculative verify
    def verify_drafts(
        self, reqs: Sequence[Req], plan: VerifyPlan, out_cache_loc: torch.Tensor, spec: SpecDecoding
    ) -> list[list[int]]:
        """The verify forward over ``plan.num_positions`` positions per request from ``plan.starts`` (the
        last token, then the drafts): returns the kept tokens (the accepted drafts and the bonus token, as
        ``SpecDecoding``'s hash verify), and moves the data a model's verify moves (module docstring)."""
        n = plan.num_positions
        kept: list[list[int]] = []
        tags: list[list[int]] = []
        for req, start, drawn in zip(reqs, plan.starts, plan.drawn, strict=True):
            drafted, targets = self._draft(req.context_ids(), start, n, drawn)
            kept.append(kept_tokens(targets, drafted[start + 1 :], plan.eos))
            tags.append(self.prefix_tags.extend(self.prefix_tags.tags(drafted[:start]), drafted[start:]))
        starts = list(plan.starts)
        if self.kv_buffer is not None and self.req_to_token_pool is not None:
            self._check_kv_reads(reqs, starts, tags)
            self._write_kv(starts, [s + n for s in starts], tags, out_cache_loc)
        if self.mamba_pool is not None:
            self._verify_states(reqs, starts, tags, [len(k) for k in kept], spec)
        return kept

    def _draft(self, context: list[int], start: int, n: int, drawn: int) -> tuple[list[int], list[int]]:
        """The drafted sequence (``context`` then ``n - 1`` drafts) and the target's token after each of
        the ``n`` verified positions: the drafter agrees with the target for ``drawn`` drafts, then
        proposes another token (as the tiny model's verify does)."""
        if len(context) != start + 1:
            raise ContractViolation(
                f"I-DATA-STATE: a verify planned from {start} tokens for a context of {len(context)}"
                " (the data plane's start is every token but the last)"
            )
        drafted = list(context)
        targets: list[int] = []
        for j in range(n):
            tok = hash_next_token(drafted, self.vocab_size)
            targets.append(tok)
            if j + 1 < n:
                drafted.append(tok if j < drawn else (tok + 1) % self.vocab_size)
        return drafted, targets

    def _verify_states(
        self, reqs: Sequence[Req], starts: list[int], tags: list[list[int]], kept: list[int], spec: SpecDecoding
    ) -> None:
        """Check the working states at the verify's start, then write each the accepted prefix's state
        (start + kept tokens) and carry out the V2 capture the scheduler will record."""
        having = self._check_working_states(reqs, starts, tags)
        tracking = spec.s.memory.tracking
        slots: list[int] = []
        write_tags: list[int] = []
        lengths: list[int] = []
        for i in having:
            req, start = reqs[i], starts[i]
            slots.append(int(req.mamba_pool_idx.reshape(-1)[0]))  # type: ignore[union-attr]
            write_tags.append(tags[i][start + kept[i]])
            lengths.append(start + kept[i])
            pp = req.mamba_ping_pong_track_buffer
            if tracking is None or pp is None:
                continue
            drafted_end = len(tags[i]) - 1
            at = spec.track_seqlen(start, start + kept[i], drafted_end, tracking.interval)
            if at is None or not start < at <= drafted_end:
                continue
            slots.append(int(pp[req.mamba_next_track_idx]))
            write_tags.append(tags[i][at])
            lengths.append(at)
        write_states(self._state_pool(), slots, write_tags, lengths)

    # ------------------------------------------------------------------ Mamba states
    def _check_working_states(self, reqs: Sequence[Req], starts: list[int], tags: list[list[int]]) -> list[int]:
        """I-DATA-STATE at a forward's start: each request's working state is its prefix's up to where the
        forward starts. Returns the indices of the requests that hold a working slot."""
        slots = [int(r.mamba_pool_idx.reshape(-1)[0]) for r in reqs if r.mamba_pool_idx is not None]
        having = [i for i, r in enumerate(reqs) if r.mamba_pool_idx is not None]
        begun = [starts[i] for i in having]
        bad = state_mismatches(self._state_pool(), slots, [tags[i][starts[i]] for i in having], begun)
        if bad:
            i = having[bad[0]]
            raise ContractViolation(
                f"I-DATA-STATE: {reqs[i].owner!r} starts a forward at {starts[i]} tokens, but its working"
                f" Mamba state is not the state of its first {starts[i]} tokens: "
                + describe_state(self._state_pool(), slots[bad[0]], tags[i])
            )
        return having

    def _advance_states(
        self, reqs: Sequence[Req], starts: list[int], ends: list[int], tags: list[list[int]]
    ) -> None:
        having = self._check_working_states(reqs, starts, tags)
        write_slots = [int(reqs[i].mamba_pool_idx.reshape(-1)[0]) for i in having]  # type: ignore[union-attr]
        write_tags = [tags[i][ends[i]] for i in having]
        write_lengths = [ends[i] for i in having]
        for i in having:
            track = reqs[i].mamba_track
            if track is None:
                continue
            pp = reqs[i].mamba_ping_pong_track_buffer
            slot = int(track.slot.reshape(-1)[0])
            if not starts[i] < track.seqlen <= ends[i] or pp is None or slot not in pp.tolist():
                raise ContractViolation(
                    f"I-TRACK-POINT: {reqs[i].owner!r} plans a capture at {track.seqlen} into slot {slot} for a"
                    f" forward over [{starts[i]}, {ends[i]}) with tracking slots {None if pp is None else pp.tolist()}"
                )
            write_slots.append(slot)
            write_tags.append(tags[i][track.seqlen])
            write_lengths.append(track.seqlen)
        write_states(self._state_pool(), write_slots, write_tags, write_lengths)

    # ------------------------------------------------------------------ KV
    def _check_kv_reads(self, reqs: Sequence[Req], starts: list[int], tags: list[list[int]]) -> None:
        """I-DATA-KV: every position a request attends to (before this forward's) holds its prefix's tag."""
        table = _host(self._row_table())
        slots: list[int] = []
        want_tags: list[int] = []
        positions: list[int] = []
        readers: list[int] = []
        for i, (req, start, t) in enumerate(zip(reqs, starts, tags, strict=True)):
            if start == 0 or req.req_pool_idx is None:
                continue
            slots.extend(table[req.req_pool_idx, :start].tolist())
            want_tags.extend(t[1 : start + 1])
            positions.extend(range(start))
            readers.extend([i] * start)
        bad = kv_mismatches(self._kv(), slots, want_tags, positions)
        if not bad:
            return
        j = bad[0]
        req, p, slot = reqs[readers[j]], positions[j], slots[j]
        kb, vb = self._kv().k_buffer[0], self._kv().v_buffer[0]
        raise ContractViolation(
            f"I-DATA-KV: {req.owner!r} reads position {p} from KV slot {slot} (row {req.req_pool_idx}), which"
            f" holds K {kb[slot].tolist()} V {vb[slot].tolist()}, not the tag of its first {p + 1} tokens"
        )

    def _write_kv(self, starts: list[int], ends: list[int], tags: list[list[int]], loc: torch.Tensor) -> None:
        want_tags: list[int] = []
        positions: list[int] = []
        for start, end, t in zip(starts, ends, tags, strict=True):
            want_tags.extend(t[start + 1 : end + 1])
            positions.extend(range(start, end))
        if not positions:
            return
        k, v = kv_rows(want_tags, positions)
        buf = self._kv()
        idx = loc.to(device=buf.device, dtype=torch.int64)
        kt = k.to(dtype=buf.k_buffer.dtype, device=buf.device)
        vt = v.to(dtype=buf.v_buffer.dtype, device=buf.device)
        for layer in range(buf.num_layers):
            kernels.store_kv(buf.k_buffer, buf.v_buffer, layer, idx, kt, vt)
