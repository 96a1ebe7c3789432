"""A tiny hybrid model: one attention layer reading KV through ``req_to_token``, one Mamba-like layer.

Deterministic weights from a seed, greedy decoding. It exists to be an *end-to-end oracle*: if the
pools, the caches or the scheduler put the wrong bytes in a slot, point a row at the wrong slot, skip a
copy-on-write copy or read a freed slot, the tokens it generates differ from the same request run
alone with no cache (:func:`generate_alone`).

A forward is batched: all the new tokens of all the batch's requests go through each step at once.
It stays bit-exact whatever the batch, the chunking or the cache hit because every value a token
depends on is computed by :mod:`~kvledger.reference.model.batch_invariant` arithmetic (correctly
rounded elementwise operations, small reductions in a fixed order, long reductions in exact integer
arithmetic, where masked or padded terms add exact zeros), and because the pooled runner and
:func:`generate_alone` call the very same two functions, :func:`project` and
:func:`extend_after_store`. The layer maths:

* attention: ``q, k, v = x Wq, x Wk, x Wv`` (per-vocabulary tables, computed once, quantised to an
  integer grid: a quantised KV cache); the K/V of the token stored at its KV slot; the output attends
  over the K/V of positions ``0..p`` read back through the request's row (``slot_table``), softmax
  weights quantised to a 20-bit grid.
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

from kvledger.contracts.errors import InvalidArgument
from kvledger.reference.model import batch_invariant as bi

# Integer grids of the exact reductions (batch_invariant): q, k, v, the head's input and the unembedding
# hold integers in [-GRID, GRID]; attention weights integers in [0, PROB_GRID], summed in float64.
GRID = 1023
PROB_GRID = 2**20
# Score elements ``[requests, heads, queries, positions]`` of one attention block: bounds the memory
# whatever the batch (blocks are independent, so the split changes no result).
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


def _grid_scale(x: torch.Tensor) -> float:
    """The factor that maps ``x``'s largest magnitude to ``GRID``."""
    return GRID / float(x.abs().max().clamp_min(1e-30))


class TinyHybridWeights:
    """Seeded random weights; every tensor float32 on ``device``.

    q, k, v depend on the token alone, so they are tables with one row per vocabulary entry, computed
    once and shared by every caller, and quantised to integers on the ``GRID`` (a quantised KV cache):
    scores ``q . k`` and the weighted sums of values are then exact (see ``batch_invariant``). The
    scales that bring them back to real units are folded into ``score_scale`` and ``wo``.
    """

    def __init__(self, config: TinyHybridConfig, device: torch.device | str = "cpu") -> None:
        if not bi.exact_bound_ok(config.head_dim, GRID, GRID, torch.float32) or not bi.exact_bound_ok(
            config.d_model, GRID, GRID, torch.float32
        ):
            raise InvalidArgument(
                f"{config}: head_dim/d_model too large for exact float32 dot products on the grid"
            )
        g = torch.Generator().manual_seed(config.seed)
        d, hd = config.d_model, config.num_heads * config.head_dim

        def w(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * scale).to(dtype=torch.float32)

        self.config = config
        embed = w(config.vocab_size, d)
        wq, wk, wv = (w(d, hd, scale=d**-0.5) for _ in range(3))
        wo = w(hd, d, scale=hd**-0.5)
        conv = w(config.conv_kernel, d, scale=0.5)
        decay = torch.sigmoid(w(config.d_state))  # in (0, 1): a stable recurrence
        w_in = w(d, config.d_state, scale=d**-0.5)
        w_state_out = w(config.d_state, d, scale=config.d_state**-0.5)
        unembed = w(d, config.vocab_size, scale=d**-0.5)

        heads = (config.vocab_size, config.num_heads, config.head_dim)
        q, k, v = embed @ wq, embed @ wk, embed @ wv
        sq, sk, sv = _grid_scale(q), _grid_scale(k), _grid_scale(v)

        def put(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device).contiguous()

        self.embed = put(embed)
        self.q_table = put((bi.to_grid(q, sq, GRID) + 0.0).reshape(heads))
        self.k_table = put((bi.to_grid(k, sk, GRID) + 0.0).reshape(heads))
        self.v_table = put((bi.to_grid(v, sv, GRID) + 0.0).reshape(heads))
        self.score_scale = 1.0 / (sq * sk * math.sqrt(config.head_dim))
        self.wo = put(wo / sv)  # attention outputs come in v-grid units
        self.conv = put(conv)
        self.decay = put(decay)
        self.w_in = put(w_in)
        self.w_state_out = put(w_state_out)
        self.unembed = put(bi.to_grid(unembed, _grid_scale(unembed), GRID) + 0.0)


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

    Request ``b`` (``0..B-1``) extends positions ``[starts[b], starts[b] + extend_lens[b])``
    (``extend_lens[b] == 0`` allowed: no token, no state change). New token ``t`` belongs to request
    ``seq[t]``, sits at ``positions[t]`` and is that request's ``local[t]``-th new token.
    """

    starts: list[int]
    extend_lens: list[int]
    seq: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    local: torch.Tensor  # [T] int64

    @staticmethod
    def build(
        starts: Sequence[int], extend_lens: Sequence[int], device: torch.device | str = "cpu"
    ) -> Extend:
        lens = torch.tensor(list(extend_lens), dtype=torch.int64, device=device)
        seq = torch.repeat_interleave(torch.arange(len(lens), device=device), lens)
        first = torch.cumsum(lens, 0) - lens  # index in T of each request's first new token
        local = torch.arange(len(seq), device=device) - first[seq]
        start = torch.tensor(list(starts), dtype=torch.int64, device=device)
        return Extend(list(starts), list(extend_lens), seq, start[seq] + local, local)

    @property
    def ends(self) -> list[int]:
        return [s + n for s, n in zip(self.starts, self.extend_lens, strict=True)]


def project(weights: TinyHybridWeights, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Embedding ``x [T, d]`` and ``q, k, v [T, H, Dh]`` of the new tokens (table lookups)."""
    return weights.embed[tokens], weights.q_table[tokens], weights.k_table[tokens], weights.v_table[tokens]


def attention(
    weights: TinyHybridWeights,
    q: torch.Tensor,
    ext: Extend,
    slot_table: torch.Tensor,
    k_store: torch.Tensor,
    v_store: torch.Tensor,
) -> torch.Tensor:
    """Causal attention of each new token over its request's positions ``0..p``: ``[T, H * Dh]``.

    ``slot_table[b, j]`` names the row of ``k_store``/``v_store`` (``[S, H, Dh]``) holding request
    ``b``'s position ``j``. Entries past the request's end are never read into a result; between a
    query's position and the end they get weight exactly 0 (so they must be finite, as the request's
    own fresh K/V are). Requests are processed in blocks, each request's queries against its own
    positions only.
    """
    t_total, heads, head_dim = q.shape
    out = q.new_zeros((t_total, heads * head_dim))
    ends = ext.ends
    if not bi.exact_bound_ok(max(ends, default=0), PROB_GRID, GRID, torch.float64):
        raise InvalidArgument(f"attention over {max(ends)} positions: weighted sums would not be exact")
    first = 0
    for lo, hi in _request_blocks(ext.extend_lens, ends, heads):
        count = sum(ext.extend_lens[lo:hi])
        if count:
            rows = slice(first, first + count)
            out[rows] = _attention_block(
                weights,
                q[rows],
                ext.seq[rows] - lo,
                ext.local[rows],
                ext.positions[rows],
                slot_table[lo:hi],
                ends[lo:hi],
                k_store,
                v_store,
            )
        first += count
    return out


def _request_blocks(lens: Sequence[int], ends: Sequence[int], heads: int) -> Iterator[tuple[int, int]]:
    """Consecutive request ranges whose padded score tensor stays within the block budget."""
    lo, queries, positions = 0, 0, 0
    for b, (n, end) in enumerate(zip(lens, ends, strict=True)):
        grown_q, grown_p = max(queries, n), max(positions, end)
        if b > lo and (b - lo + 1) * heads * grown_q * grown_p > _ATTENTION_BLOCK_ELEMENTS:
            yield lo, b
            lo, grown_q, grown_p = b, n, end
        queries, positions = grown_q, grown_p
    if lo < len(lens):
        yield lo, len(lens)


def _attention_block(
    weights: TinyHybridWeights,
    q: torch.Tensor,
    seq: torch.Tensor,
    local: torch.Tensor,
    positions: torch.Tensor,
    slot_table: torch.Tensor,
    ends: Sequence[int],
    k_store: torch.Tensor,
    v_store: torch.Tensor,
) -> torch.Tensor:
    """``q [Tq, H, Dh]`` of requests ``seq`` (``0..nb-1``): queries laid out ``[nb, H, Nmax, Dh]``."""
    device = q.device
    heads, head_dim = q.shape[1:]
    nb, span = len(ends), max(ends)
    longest = int(local.max()) + 1
    queries = q.new_zeros((nb, longest, heads, head_dim))
    queries[seq, local] = q
    query_pos = torch.zeros((nb, longest), dtype=torch.int64, device=device)  # padding rows: position 0
    query_pos[seq, local] = positions
    slots = slot_table[:, :span]
    if slots.shape[1] < span:
        slots = torch.nn.functional.pad(slots, (0, span - slots.shape[1]))
    live = torch.arange(span, device=device) < torch.tensor(list(ends), device=device)[:, None]  # [nb, P]
    keys = k_store[slots].permute(0, 2, 3, 1)  # [nb, H, Dh, P]
    values = torch.where(live[..., None, None], v_store[slots], 0.0).permute(0, 2, 1, 3)  # [nb, H, P, Dh]
    # Exact: integers on the grid, |sum| < 2**24 (checked when the weights were built).
    scores = torch.matmul(queries.permute(0, 2, 1, 3), keys) + 0.0  # [nb, H, Nmax, P]
    visible = (torch.arange(span, device=device) <= query_pos[..., None])[:, None]  # [nb, 1, Nmax, P]
    scores = torch.where(visible, scores * weights.score_scale, -math.inf)
    top = scores.amax(dim=-1, keepdim=True)  # a max is exact in any order
    probs = torch.where(visible, torch.round(bi.exp(scores - top) * PROB_GRID), 0.0).to(torch.float64)
    # Exact in float64: integer weights <= 2**20 times integer values <= GRID, summed over P positions.
    num = torch.matmul(probs, values.to(torch.float64)) + 0.0  # [nb, H, Nmax, Dh]
    mixed = (num / probs.sum(dim=-1, keepdim=True)).to(q.dtype)
    return mixed.permute(0, 2, 1, 3)[seq, local].flatten(1)  # [Tq, H * Dh]


def mamba_and_head(
    weights: TinyHybridWeights,
    x: torch.Tensor,
    attn: torch.Tensor,
    extend_lens: Sequence[int],
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Residual stream after both layers, greedy next token of each request, and the new states.

    ``conv_state [B, K-1, d]`` / ``ssm_state [B, d_state]`` are each request's states before its
    first new token; a request with no new token gets ``-1`` and its states back unchanged.
    """
    device = x.device
    h1 = x + bi.linear(attn, weights.wo)  # [T, d]
    batch, history, d = conv_state.shape
    lens = torch.tensor(list(extend_lens), dtype=torch.int64, device=device)
    t_total = h1.shape[0]
    # Each request's conv inputs laid out as [its conv state rows, its new tokens' h1 rows].
    seg_len = lens + history
    seg_end = torch.cumsum(seg_len, 0)
    seg_start = seg_end - seg_len
    seq = torch.repeat_interleave(torch.arange(batch, device=device), lens)
    local = torch.arange(t_total, device=device) - (torch.cumsum(lens, 0) - lens)[seq]
    inputs = h1.new_empty((int(seg_end[-1]), d))
    back = torch.arange(history, device=device)
    inputs[(seg_start[:, None] + back).flatten()] = conv_state.reshape(-1, d)
    rows = seg_start[seq] + history + local
    inputs[rows] = h1
    mixed = inputs[rows - history] * weights.conv[0]  # window oldest first, accumulated in order
    for j in range(1, history + 1):
        mixed = mixed + inputs[rows - history + j] * weights.conv[j]
    drive = bi.linear(bi.silu(mixed), weights.w_in)  # [T, d_state]
    new_conv = inputs[seg_end[:, None] - history + back]  # [B, K-1, d]
    # The recurrence runs token by token (a scan would round differently by chunk); all requests at once.
    longest = max(extend_lens)
    padded = drive.new_zeros((batch, longest, drive.shape[1]))
    padded[seq, local] = drive
    state = ssm_state
    for i in range(longest):
        stepped = weights.decay * state + padded[:, i]
        state = stepped if min(extend_lens) > i else torch.where((lens > i)[:, None], stepped, state)
    has_tokens = lens > 0
    last = (torch.cumsum(lens, 0) - 1)[has_tokens]
    h_last = h1[last] + bi.linear(state[has_tokens], weights.w_state_out)
    # The head on the grid, each row scaled to its own largest magnitude (argmax ignores a positive
    # scale): exact integer logits, so the BLAS matmul's order cannot matter.
    scale = GRID / h_last.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    logits = torch.mm(bi.to_grid(h_last, scale, GRID), weights.unembed) + 0.0
    picked = torch.argmax(logits, dim=1)  # first maximum on ties
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
    attn = attention(weights, q, ext, slot_table, k_store, v_store)
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
