"""A tiny hybrid model: one attention layer reading KV through ``req_to_token``, one Mamba-like layer.

Deterministic weights from a seed, greedy decoding. It exists to be an *end-to-end oracle*: if the
pools, the caches or the scheduler put the wrong bytes in a slot, point a row at the wrong slot, skip a
copy-on-write copy or read a freed slot, the tokens it generates differ from the same request run
alone with no cache (:func:`generate_alone`).

A forward is batched: all the new tokens of all the batch's requests go through each step at once.
It stays bit-exact whatever the batch, the chunking or the cache hit because every value a token
depends on is computed by :mod:`~kvledger.reference.model.batch_invariant` arithmetic (elementwise
IEEE operations, reductions in a fixed order, sums over positions that ignore masked padding), and
because the pooled runner and :func:`generate_alone` call the very same two functions,
:func:`project` and :func:`extend_after_store`. The layer maths:

* attention: ``q, k, v = x Wq, x Wk, x Wv`` (per-vocabulary tables, computed once); the K/V of the
  token stored at its KV slot; the output attends over the K/V of positions ``0..p`` read back
  through the request's row (``slot_table``).
* Mamba-like: a causal depthwise conv over the last ``conv_kernel`` inputs (conv state = the previous
  ``conv_kernel - 1`` inputs) followed by a diagonal linear recurrence ``s = a * s + u B`` (temporal
  state), both living in the request's Mamba slot.
* head: logits of the last new token of each request only (the others' are never sampled); argmax.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from kvledger.reference.model import batch_invariant as bi

# Masked key positions are padded up to a multiple of this: the first levels of the positional
# tree sum then never need an odd-length pad (the padding does not change any result, see tree_sum).
_POSITION_ALIGN = 64
# Elements of one query block's ``[queries, positions, heads, head_dim]`` product: bounds the memory
# of the attention whatever the batch (blocks are independent, so the split changes no result).
_ATTENTION_BLOCK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class TinyHybridConfig:
    vocab_size: int = 128
    d_model: int = 16
    num_heads: int = 2
    head_dim: int = 8
    conv_kernel: int = 3
    d_state: int = 8
    seed: int = 1234

    @property
    def conv_state_shape(self) -> tuple[int, ...]:
        return (self.conv_kernel - 1, self.d_model)

    @property
    def temporal_state_shape(self) -> tuple[int, ...]:
        return (self.d_state,)


class TinyHybridWeights:
    """Seeded random weights; every tensor float32 on ``device``."""

    def __init__(self, config: TinyHybridConfig, device: torch.device | str = "cpu") -> None:
        g = torch.Generator().manual_seed(config.seed)
        d, hd = config.d_model, config.num_heads * config.head_dim

        def w(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=torch.float32)

        self.config = config
        self.embed = w(config.vocab_size, d)
        self.wq = w(d, hd, scale=d**-0.5)
        self.wk = w(d, hd, scale=d**-0.5)
        self.wv = w(d, hd, scale=d**-0.5)
        self.wo = w(hd, d, scale=hd**-0.5)
        self.conv = w(config.conv_kernel, d, scale=0.5)
        self.decay = torch.sigmoid(w(config.d_state)).contiguous()  # in (0, 1): a stable recurrence
        self.w_in = w(d, config.d_state, scale=d**-0.5)
        self.w_state_out = w(config.d_state, d, scale=config.d_state**-0.5)
        self.unembed = w(d, config.vocab_size, scale=d**-0.5).contiguous()
        # q, k, v depend on the token alone: one table row per vocabulary entry, shared by every caller,
        # so no projection is ever recomputed (and none can round differently). q carries 1/sqrt(Dh).
        heads = (config.vocab_size, config.num_heads, config.head_dim)
        self.q_table = (self.embed @ self.wq / math.sqrt(config.head_dim)).reshape(heads).contiguous()
        self.k_table = (self.embed @ self.wk).reshape(heads).contiguous()
        self.v_table = (self.embed @ self.wv).reshape(heads).contiguous()


@contextlib.contextmanager
def compute_mode() -> Iterator[None]:
    """Inference mode on one intra-op thread: the model's tensors are small, and on a shared 2-core
    machine OpenMP workers spinning against other processes make each op tens of times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class Extend:
    """Where one forward's new tokens sit: request-major, positions increasing within a request.

    ``seq[t]``/``positions[t]``: the request (``0..B-1``) and position of new token ``t``;
    ``extend_lens[b]``: how many new tokens request ``b`` has (0 allowed: no token, no state change).
    """

    seq: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    extend_lens: torch.Tensor  # [B] int64

    @staticmethod
    def build(
        starts: Sequence[int], extend_lens: Sequence[int], device: torch.device | str = "cpu"
    ) -> Extend:
        lens = torch.tensor(list(extend_lens), dtype=torch.int64, device=device)
        seq = torch.repeat_interleave(torch.arange(len(lens), device=device), lens)
        first_index = torch.cumsum(lens, 0) - lens  # index in T of each request's first new token
        start = torch.tensor(list(starts), dtype=torch.int64, device=device)
        positions = start[seq] + torch.arange(len(seq), device=device) - first_index[seq]
        return Extend(seq=seq, positions=positions, extend_lens=lens)


def project(weights: TinyHybridWeights, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Embedding ``x [T, d]`` and ``q, k, v [T, H, Dh]`` of the new tokens (table lookups)."""
    return weights.embed[tokens], weights.q_table[tokens], weights.k_table[tokens], weights.v_table[tokens]


def attention(
    q: torch.Tensor,
    ext: Extend,
    slot_table: torch.Tensor,
    k_store: torch.Tensor,
    v_store: torch.Tensor,
) -> torch.Tensor:
    """Causal attention of each new token over its request's positions ``0..p``: ``[T, H * Dh]``.

    ``slot_table[b, j]`` names the row of ``k_store``/``v_store`` (``[S, H, Dh]``) holding request
    ``b``'s position ``j``; entries past a query's own position are masked (their contents, stale or
    poisoned, never reach a result). Queries are processed in blocks; each query's positions are padded
    to the block's length, which the positional :func:`~batch_invariant.tree_sum` ignores.
    """
    t_total, heads, head_dim = q.shape
    out = q.new_empty((t_total, heads * head_dim))
    if t_total == 0:
        return out
    span = int(ext.positions.max()) + 1
    span = -(-span // _POSITION_ALIGN) * _POSITION_ALIGN
    if slot_table.shape[1] < span:
        slot_table = torch.nn.functional.pad(slot_table, (0, span - slot_table.shape[1]))
    block = max(1, _ATTENTION_BLOCK_ELEMENTS // (span * heads * head_dim))
    for lo in range(0, t_total, block):
        hi = min(t_total, lo + block)
        out[lo:hi] = _attention_block(
            q[lo:hi], ext.seq[lo:hi], ext.positions[lo:hi], slot_table, k_store, v_store
        )
    return out


def _attention_block(
    q: torch.Tensor,
    seq: torch.Tensor,
    positions: torch.Tensor,
    slot_table: torch.Tensor,
    k_store: torch.Tensor,
    v_store: torch.Tensor,
) -> torch.Tensor:
    span = int(positions.max()) + 1
    span = -(-span // _POSITION_ALIGN) * _POSITION_ALIGN
    visible = torch.arange(span, device=q.device) <= positions[:, None]  # [Tq, P]
    slots = slot_table[seq, :span]  # [Tq, P]
    keys = k_store[slots]  # [Tq, P, H, Dh]
    scores = bi.tree_sum(keys * q[:, None], dim=-1)  # [Tq, P, H]; q is pre-scaled by 1/sqrt(Dh)
    scores = torch.where(visible[..., None], scores, -math.inf)
    top = scores.amax(dim=1, keepdim=True)  # a max is exact in any order
    weights = torch.where(visible[..., None], bi.exp(scores - top), 0.0)
    probs = weights / bi.tree_sum(weights, dim=1)[:, None]
    values = torch.where(visible[..., None, None], v_store[slots], 0.0)  # masked rows may hold NaN
    return bi.tree_sum(probs[..., None] * values, dim=1).flatten(1)  # [Tq, H * Dh]


def mamba_and_head(
    weights: TinyHybridWeights,
    x: torch.Tensor,
    attn: torch.Tensor,
    extend_lens: torch.Tensor,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Residual stream after both layers, greedy next token of each request, and the new states.

    ``conv_state [B, K-1, d]`` / ``ssm_state [B, d_state]`` are each request's states before its
    first new token; a request with no new token gets ``-1`` and its states back unchanged.
    """
    h1 = x + bi.linear(attn, weights.wo)  # [T, d]
    batch, history, d = conv_state.shape
    lens = extend_lens
    t_total = h1.shape[0]
    # Each request's conv inputs laid out as [its conv state rows, its new tokens' h1 rows].
    seg_len = lens + history
    seg_end = torch.cumsum(seg_len, 0)
    seg_start = seg_end - seg_len
    seq = torch.repeat_interleave(torch.arange(batch, device=x.device), lens)
    local = torch.arange(t_total, device=x.device) - (torch.cumsum(lens, 0) - lens)[seq]
    inputs = h1.new_empty((int(seg_end[-1]) if batch else 0, d))
    back = torch.arange(history, device=x.device)
    inputs[(seg_start[:, None] + back).flatten()] = conv_state.reshape(-1, d)
    rows = seg_start[seq] + history + local
    inputs[rows] = h1
    mixed = inputs[rows - history] * weights.conv[0]  # window oldest first, accumulated in order
    for j in range(1, history + 1):
        mixed = mixed + inputs[rows - history + j] * weights.conv[j]
    drive = bi.linear(bi.silu(mixed), weights.w_in)  # [T, d_state]
    new_conv = inputs[seg_end[:, None] - history + back]  # [B, K-1, d]
    # The recurrence runs token by token (a scan would round differently by chunk); all requests at once.
    longest = int(lens.max()) if batch else 0
    padded = drive.new_zeros((batch, longest, drive.shape[1]))
    padded[seq, local] = drive
    state = ssm_state
    for i in range(longest):
        stepped = weights.decay * state + padded[:, i]
        state = stepped if bool((lens > i).all()) else torch.where((lens > i)[:, None], stepped, state)
    has_tokens = lens > 0
    last = (torch.cumsum(lens, 0) - 1)[has_tokens]
    h_last = h1[last] + bi.linear(state[has_tokens], weights.w_state_out)
    picked = torch.argmax(bi.linear(h_last, weights.unembed), dim=1)  # first maximum on ties
    out = torch.full((batch,), -1, dtype=torch.int64)
    out[has_tokens.cpu()] = picked.cpu()
    return out.tolist(), new_conv, state


def extend_after_store(
    weights: TinyHybridWeights,
    x: torch.Tensor,
    q: torch.Tensor,
    ext: Extend,
    slot_table: torch.Tensor,
    k_store: torch.Tensor,
    v_store: torch.Tensor,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """The rest of a forward once the new tokens' K/V are stored: next tokens and new Mamba states."""
    attn = attention(q, ext, slot_table, k_store, v_store)
    return mamba_and_head(weights, x, attn, ext.extend_lens, conv_state, ssm_state)


def generate_alone(
    weights: TinyHybridWeights,
    prompt: Sequence[int],
    max_new_tokens: int,
    eos_token_id: int | None = None,
    *,
    prefill_chunk: int | None = None,
) -> list[int]:
    """The oracle: the request run by itself, no pools, no cache, greedy.

    The prompt is prefilled in chunks of ``prefill_chunk`` tokens (all at once by default), then one
    token per step; K/V live in a buffer preallocated for the whole sequence, position ``p`` in row
    ``p``. The result does not depend on ``prefill_chunk`` (the tests check it does not).
    """
    c = weights.config
    device = weights.embed.device
    with compute_mode():
        total = len(prompt) + max_new_tokens
        k_store = torch.zeros((max(total, 1), c.num_heads, c.head_dim), dtype=torch.float32, device=device)
        v_store = torch.zeros_like(k_store)
        slot_table = torch.arange(k_store.shape[0], device=device)[None]
        conv_state = torch.zeros((1, *c.conv_state_shape), dtype=torch.float32, device=device)
        ssm_state = torch.zeros((1, *c.temporal_state_shape), dtype=torch.float32, device=device)
        ctx = list(prompt)
        out: list[int] = []
        pos = 0
        nxt = -1
        while len(out) < max_new_tokens:
            while pos < len(ctx):
                n = len(ctx) - pos if prefill_chunk is None else min(prefill_chunk, len(ctx) - pos)
                tokens = torch.tensor(ctx[pos : pos + n], dtype=torch.int64, device=device)
                x, q, k, v = project(weights, tokens)
                k_store[pos : pos + n] = k
                v_store[pos : pos + n] = v
                ext = Extend.build([pos], [n], device)
                (nxt,), conv_state, ssm_state = extend_after_store(
                    weights, x, q, ext, slot_table, k_store, v_store, conv_state, ssm_state
                )
                pos += n
            out.append(nxt)
            ctx.append(nxt)
            if eos_token_id is not None and nxt == eos_token_id:
                break
        return out
