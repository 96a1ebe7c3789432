"""``TinyHybridRunner``: the tiny hybrid model run against the pools, with data-integrity contracts.

The scheduler hands it each launched batch. For every request it computes the extend positions
``[kv_committed_len - extend_len, kv_committed_len)`` one token at a time: K/V stored at the token's
slot (``KVBufferPool.set_kv_buffer``), attention over the K/V of positions ``0..p`` read back through
the request's ``req_to_token`` row, the Mamba-like layer advancing the request's working slot.

Debug builds (a ledger on the KV pool) also check what the reads see:

* I-NO-POISON-READ: no KV slot or Mamba slot read for a live request holds the poison the pools write
  on free;
* I-KV-ROW-CONTENT: the slot a row names for position ``q`` was last written for that request's token
  at position ``q`` (a shadow map of what was written where), so a row pointing at another path's KV
  is caught at the read, not just in the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvledger.contracts.errors import ContractViolation
from kvledger.reference.model.tiny_hybrid import TinyHybridWeights, attend, head, token_qkv
from kvledger.reference.scheduler.request import Req

_LAYER = 0  # the model has one attention layer and one Mamba layer


class TinyHybridRunner:
    """A :class:`~kvledger.reference.scheduler.runner.ModelRunner` backed by the tiny hybrid model."""

    def __init__(
        self,
        weights: TinyHybridWeights,
        *,
        kv_buffer: Any,
        req_to_token_pool: Any,
        mamba_pool: Any,
        check_integrity: bool = True,
    ) -> None:
        self.weights = weights
        self.kv_buffer = kv_buffer
        self.req_to_token_pool = req_to_token_pool
        self.mamba_pool = mamba_pool
        self.check_integrity = check_integrity
        self.written: dict[int, tuple[int, int]] = {}  # KV slot -> (token, position) last stored there
        self.tokens_computed = 0

    def forward(
        self, reqs: Sequence[Req], extend_lens: Sequence[int], out_cache_loc: torch.Tensor, is_decode: bool
    ) -> list[int]:
        out: list[int] = []
        offset = 0
        for req, n in zip(reqs, extend_lens, strict=True):
            out.append(self._extend(req, n, out_cache_loc[offset : offset + n]))
            offset += n
        return out

    def _extend(self, req: Req, n: int, new_slots: torch.Tensor) -> int:
        end = req.kv_committed_len
        start = end - n
        row = req.req_pool_idx
        assert row is not None and req.mamba_pool_idx is not None
        ctx = req.context_ids()
        slots = self.req_to_token_pool.read(row, 0, end)
        if not torch.equal(slots[start:end], new_slots):
            raise ContractViolation(
                f"{req.owner!r}: row {row} [{start}, {end}) does not hold the batch's new slots"
            )
        mslot = req.mamba_pool_idx
        if self.check_integrity and bool(self.mamba_pool.poisoned(mslot).any()):
            raise ContractViolation(
                f"I-NO-POISON-READ: {req.owner!r} reads poisoned Mamba slot {int(mslot[0])}"
            )
        conv_state = self.mamba_pool.conv_state[_LAYER, int(mslot[0])].clone()
        ssm_state = self.mamba_pool.temporal_state[_LAYER, int(mslot[0])].clone()
        # Store the new positions' K/V first: each position attends to itself and everything before it.
        embeds, queries, keys, values = [], [], [], []
        for p in range(start, end):
            x, q, k, v = token_qkv(self.weights, ctx[p])
            embeds.append(x)
            queries.append(q)
            keys.append(k)
            values.append(v)
        if n:
            self.kv_buffer.set_kv_buffer(_LAYER, new_slots, torch.stack(keys), torch.stack(values))
            for p, s in zip(range(start, end), new_slots.tolist(), strict=True):
                self.written[s] = (ctx[p], p)
        if self.check_integrity:
            self._check_reads(req, slots, ctx)
        k_all = self.kv_buffer.k_buffer[_LAYER, slots]
        v_all = self.kv_buffer.v_buffer[_LAYER, slots]
        nxt = -1
        for i, p in enumerate(range(start, end)):
            attn = attend(queries[i], k_all[: p + 1], v_all[: p + 1])
            nxt, conv_state, ssm_state = head(self.weights, embeds[i], attn, conv_state, ssm_state)
        self.mamba_pool.conv_state[_LAYER, int(mslot[0])] = conv_state
        self.mamba_pool.temporal_state[_LAYER, int(mslot[0])] = ssm_state
        self.tokens_computed += n
        return nxt

    def _check_reads(self, req: Req, slots: torch.Tensor, ctx: list[int]) -> None:
        poisoned = self.kv_buffer.poisoned(slots)
        if bool(poisoned.any()):
            bad = slots[poisoned].tolist()[:8]
            raise ContractViolation(
                f"I-NO-POISON-READ: {req.owner!r} reads poisoned (freed) KV slot(s) {bad}"
            )
        for q, s in enumerate(slots.tolist()):
            if self.written.get(s) != (ctx[q], q):
                raise ContractViolation(
                    f"I-KV-ROW-CONTENT: {req.owner!r} position {q} (token {ctx[q]}) reads slot {s}, "
                    f"which holds {self.written.get(s)} (token, position)"
                )
