"""A fake model worker for SGLang's real scheduler: SGLang's own pools, deterministic tokens, data tags.

No model runs, but every forward leaves what a model would leave, so aliased or stale state is seen,
not only wrong counts:

* KV: each token position's cell holds, in the K buffer, a chained tag ``H(tag of the previous
  position, token)`` and, in the V buffer, the token itself. Before a forward, every cached cell the
  request reads (its matched prefix, or its earlier tokens in decode) must satisfy the chain; a cell
  another request overwrote (a slot handed out twice) or a freed-and-reused cell breaks it.
* Mamba: the request's slot holds the tag of the last token it has consumed. Before a forward that
  continues from cached state (a matched prefix or a decode) the slot must hold the tag of the
  request's last cached cell; two requests sharing a slot, or a slot copied from the wrong node, fail.

A broken tag raises :class:`TagMismatch` naming the row, the slot or cell and the values. Next tokens
are a function of the tag (deterministic, vocabulary 1000), so runs replay exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from kvledger.contracts.errors import ContractViolation

_P = 1_000_003  # tags stay below 2**24: exact in float32


def chain(previous: int, token: int) -> int:
    """The tag of a position from the tag before it and its token (1-based, never 0: 0 is 'unwritten')."""
    return (previous * 131 + token + 7) % _P + 1


class TagMismatch(ContractViolation):
    """Data read by a forward is not what that request's earlier forwards wrote (aliased or stale)."""

    invariant = "I-EXCLUSIVE"


@dataclass(frozen=True)
class WorkerShape:
    kv_tokens: int
    rows: int
    mamba_slots: int
    context_len: int
    max_new_tokens: int
    seed: int


class FakeWorker:
    """What SGLang's scheduler asks of ``TpModelWorker`` (0.5.9 / 0.5.10), backed by real pools."""

    is_hybrid_swa = False
    sliding_window_size = None

    def __init__(self, shape: WorkerShape) -> None:
        from kvledger.engines.sglang.scheduler.pools import build_pools

        self.shape = shape
        self.req_to_token_pool, self.allocator = build_pools(shape)
        self.kv = self.allocator.get_kvcache()
        self.model_runner = SimpleNamespace(
            hybrid_gdn_config=None,
            mamba2_config=SimpleNamespace(),  # non-None: the scheduler builds its Mamba tree
            mambaish_config=SimpleNamespace(),
            lora_manager=None,
            weight_load_mem_usage=0.0,
            graph_mem_usage=0.0,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator,
        )
        self.model_config: Any = None  # the scheduler's model config (0.5.10 reads the worker's copy)
        self.forwards = 0
        self.checked_cells = 0

    # ------------------------------------------------------------------ what __init__ asks
    def get_worker_info(self) -> tuple[Any, ...]:
        s = self.shape
        # the request limits TpModelWorker derives: a request never exceeds the context or the pool
        max_req_len = min(s.context_len - 1, s.kv_tokens - 1)
        limits = (s.kv_tokens, s.kv_tokens, s.rows, None, max_req_len, max_req_len - 5, s.seed, "cpu")
        return (*limits, None, None, None, None)

    def get_memory_pool(self) -> tuple[Any, Any]:
        return self.req_to_token_pool, self.allocator

    def get_pad_input_ids_func(self) -> None:
        return None

    # ------------------------------------------------------------------ the forward
    def _tag(self, loc: int) -> int:
        return int(self.kv.k_buffer[0][loc, 0, 0].item())

    def _slot(self, row: int) -> int:
        return int(self.req_to_token_pool.req_index_to_mamba_index_mapping[row].item())

    def _state(self, slot: int) -> int:
        return int(self.req_to_token_pool.mamba_pool.mamba_cache.temporal[0, slot].flatten()[0].item())

    def _check_cached(self, row: int, cached: int) -> int:
        """Verify the chain over the ``cached`` cells of ``row``; returns the last tag (0 if none)."""
        locs = self.req_to_token_pool.req_to_token[row, :cached].tolist()
        previous = 0
        for pos, loc in enumerate(locs):
            token = int(self.kv.v_buffer[0][loc, 0, 0].item())
            tag = self._tag(loc)
            if tag != chain(previous, token):
                raise TagMismatch(
                    f"row {row}: KV cell {loc} (position {pos}) holds tag {tag}, but its request's chain "
                    f"expects {chain(previous, token)}: the cell was overwritten by another request"
                )
            previous = tag
        self.checked_cells += cached
        return previous

    def _forward_row(self, row: int, cached: int, tokens: list[int], locs: list[int]) -> int:
        previous = self._check_cached(row, cached)
        slot = self._slot(row)
        if cached:
            state = self._state(slot)
            if state != previous:
                raise TagMismatch(
                    f"row {row}: Mamba slot {slot} holds state tag {state}, but the request's cached "
                    f"tokens end in tag {previous}: the slot is shared with, or was copied from, another"
                )
        for token, loc in zip(tokens, locs, strict=True):
            previous = chain(previous, token)
            self.kv.k_buffer[0][loc, 0, 0] = float(previous)
            self.kv.v_buffer[0][loc, 0, 0] = float(token)
        self.req_to_token_pool.mamba_pool.mamba_cache.temporal[0, slot] = float(previous)
        return previous % 1000

    def forward_batch_generation(self, batch: Any, **_: Any) -> Any:
        from sglang.srt.managers.utils import GenerationBatchResult

        self.forwards += 1
        rows = batch.req_pool_indices.tolist()
        seq_lens = batch.seq_lens.tolist()
        out = batch.out_cache_loc.tolist()
        ids = batch.input_ids.tolist()
        nexts = []
        if batch.forward_mode.is_decode():
            for i, row in enumerate(rows):
                nexts.append(self._forward_row(row, seq_lens[i] - 1, [ids[i]], [out[i]]))
        else:
            # the extend lengths: extend_seq_lens / extend_prefix_lens until 0.5.2x, extend_lens /
            # prefix_lens in 0.5.23
            lens = getattr(batch, "extend_seq_lens", None) or batch.extend_lens
            prefixes = getattr(batch, "extend_prefix_lens", None) or batch.prefix_lens
            start = 0
            for i, row in enumerate(rows):
                n = lens[i]
                cached = prefixes[i]
                nexts.append(self._forward_row(row, cached, ids[start : start + n], out[start : start + n]))
                start += n
        return GenerationBatchResult(
            logits_output=None,
            next_token_ids=torch.tensor(nexts, dtype=torch.int64),
            can_run_cuda_graph=False,
        )
