"""The tiny hybrid model's verify forward (speculative decoding), and the state it must leave behind.

:class:`SpeculativeTinyRunner` adds ``verify_drafts`` to :class:`~kvledger.reference.model.runner.TinyHybridRunner`:
the target model runs over the verify's ``num_draft_tokens`` positions (the last token, then the drafts),
one position at a time for the whole batch through the pools, exactly as decode steps would: K/V stored at
the over-allocated slots the scheduler planned, attention through each request's row, the Mamba layer
advancing the working slot. After each position the working state is kept aside (SGLang's
``intermediate_ssm`` buffers: outside the slot accounting, never allocated per slot).

The drafter is the target itself, wrong on purpose after a drawn number of drafts (the plan's ``drawn``):
draft ``j + 1`` is the target's token after position ``j`` while ``j < drawn``, another token after that.
Verification is real: the accepted count is the longest prefix of drafts equal to the target's tokens
(so it equals ``drawn``, fewer at an end-of-sequence token), and the kept tokens are the accepted drafts
plus the target's bonus token, the tokens decoding one at a time gives.

Then the recurrent state is put back to the accepted prefix: the state kept aside after the last kept
token is written into the working slot (a rejected draft's update cannot be undone by the scheduler; the
runner must restore it, N3's lesson). Mamba V2: the capture the scheduler will record
(``SpecDecoding.track_seqlen``, an accepted position) is written into the request's next tracking half
from the same kept-aside states. I-SPEC-STATE: after a verify, the working state is the state of exactly
the committed prefix (:func:`check_state_at_committed`, the data oracle run by the tests after every step).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvledger.contracts.errors import ContractViolation
from kvledger.reference.model.runner import TinyHybridRunner
from kvledger.reference.model.state_oracle import prefix_state
from kvledger.reference.model.tiny_hybrid import TinyHybridWeights, compute_mode
from kvledger.reference.pools.mamba_pool import MambaPool
from kvledger.reference.scheduler.request import Req
from kvledger.reference.scheduler.spec_config import kept_tokens
from kvledger.reference.scheduler.speculative import SpecDecoding, VerifyPlan

_LAYER = 0


class SpeculativeTinyRunner(TinyHybridRunner):
    """The tiny hybrid model with a verify forward for speculative decoding."""

    def verify_drafts(
        self, reqs: Sequence[Req], plan: VerifyPlan, out_cache_loc: torch.Tensor, spec: SpecDecoding
    ) -> list[list[int]]:
        n = plan.num_positions
        vocab = self.vocab_size
        starts: list[int] = list(plan.starts)
        drafts: list[list[int]] = [[] for _ in reqs]
        targets: list[list[int]] = [[] for _ in reqs]
        snaps: list[tuple[torch.Tensor, torch.Tensor]] = []
        mslots = torch.cat([self._mamba_slot(r) for r in reqs])
        slots = out_cache_loc.reshape(len(reqs), n)
        try:
            for j in range(n):
                # The drafts so far sit in the data plane's context (pending) while the target reads them.
                ends = [s + j + 1 for s in starts]
                with compute_mode():
                    toks = self._extend(reqs, [s + j for s in starts], ends, slots[:, j].contiguous())
                snaps.append(self._state_of(mslots))
                for i, tok in enumerate(toks):
                    targets[i].append(tok)
                    if j + 1 < n:
                        draft = tok if j < plan.drawn[i] else (tok + 1) % vocab
                        drafts[i].append(draft)
                        reqs[i].pending_output_ids.append(draft)
        finally:
            for i, req in enumerate(reqs):
                if drafts[i]:
                    del req.pending_output_ids[-len(drafts[i]) :]
        kept = [kept_tokens(targets[i], drafts[i], plan.eos) for i in range(len(reqs))]
        self._restore(reqs, mslots, snaps, [len(k) for k in kept])
        self._capture_accepted(reqs, starts, snaps, [len(k) for k in kept], n, spec)
        return kept

    def _state_of(self, mslots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pool = self.mamba_pool
        return pool.conv_state[_LAYER, mslots].clone(), pool.temporal_state[_LAYER, mslots].clone()

    def _restore(
        self,
        reqs: Sequence[Req],
        mslots: torch.Tensor,
        snaps: list[tuple[torch.Tensor, torch.Tensor]],
        kept: list[int],
    ) -> None:
        """Write the state after the last kept token into each working slot (I-SPEC-STATE)."""
        conv, ssm = self.mamba_pool.conv_state, self.mamba_pool.temporal_state
        for i in range(len(reqs)):
            c, s = snaps[kept[i] - 1]
            conv[_LAYER, mslots[i]] = c[i]
            ssm[_LAYER, mslots[i]] = s[i]

    def _capture_accepted(
        self,
        reqs: Sequence[Req],
        starts: list[int],
        snaps: list[tuple[torch.Tensor, torch.Tensor]],
        kept: list[int],
        n: int,
        spec: SpecDecoding,
    ) -> None:
        """Mamba V2: the capture at the length the scheduler records, from the states kept aside."""
        tracking = spec.s.memory.tracking
        if tracking is None:
            return
        conv, ssm = self.mamba_pool.conv_state, self.mamba_pool.temporal_state
        for i, req in enumerate(reqs):
            pp = req.mamba_ping_pong_track_buffer
            if pp is None:
                continue
            at = spec.track_seqlen(starts[i], starts[i] + kept[i], starts[i] + n, tracking.interval)
            if at is None or not 0 < at - starts[i] <= n:
                continue
            c, s = snaps[at - starts[i] - 1]
            slot = int(pp[req.mamba_next_track_idx])
            conv[_LAYER, slot] = c[i]
            ssm[_LAYER, slot] = s[i]


def check_state_at_committed(
    req: Req, mamba_pool: MambaPool, weights: TinyHybridWeights, length: int | None = None) -> None:
    """I-SPEC-STATE (the data oracle, test time: O(sequence) model work): the working state of a running
    request is the state of exactly its committed prefix (``length`` tokens: by default
    ``kv_committed_len``; with a batch in flight, the data plane's length), computed alone."""
    if req.mamba_pool_idx is None:
        return
    n = req.kv_committed_len if length is None else length
    slot = int(req.mamba_pool_idx[0])
    conv, ssm = prefix_state(weights, req.context_ids()[:n])
    same = torch.equal(mamba_pool.conv_state[_LAYER, slot], conv) and torch.equal(
        mamba_pool.temporal_state[_LAYER, slot], ssm
    )
    if not same:
        raise ContractViolation(
            f"I-SPEC-STATE: {req.owner!r}'s working state (slot {slot}) is not the state of its first {n}"
            f" tokens, the accepted prefix (a rejected draft's update kept?): {req!r}"
        )
