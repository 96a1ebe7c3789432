"""A tiny hybrid model: one attention layer reading KV through ``req_to_token``, one Mamba-like layer.

Deterministic weights from a seed, sizes a CPU runs in microseconds per token, greedy decoding. It
exists to be an *end-to-end oracle*: if the pools, the caches or the scheduler put the wrong bytes in
a slot, point a row at the wrong slot, skip a copy-on-write copy or read a freed slot, the tokens it
generates differ from the same request run alone with no cache (:func:`generate_alone`).

Every token is computed on its own with the same shapes whatever the batch, chunking or cache hit
(per-token vector ops, attention over exactly the positions before it), so the pooled run and the
reference run are bit-identical when the memory system is right. The layer maths:

* attention: ``q, k, v = x Wq, x Wk, x Wv``; K/V of the token stored at its KV slot; the output
  attends over the K/V of positions ``0..p`` read back through the request's row.
* Mamba-like: a causal depthwise conv over the last ``conv_kernel`` inputs (conv state = the previous
  ``conv_kernel - 1`` inputs) followed by a diagonal linear recurrence ``s = a * s + u B`` (temporal
  state), both living in the request's Mamba slot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


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
        self.unembed = w(d, config.vocab_size, scale=d**-0.5)


def token_qkv(
    weights: TinyHybridWeights, token: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Embedding and q, k, v (``[H, Dh]`` each) of one token."""
    c = weights.config
    x = weights.embed[token]
    shape = (c.num_heads, c.head_dim)
    return x, (x @ weights.wq).view(shape), (x @ weights.wk).view(shape), (x @ weights.wv).view(shape)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``q [H, Dh]`` over ``keys/values [P, H, Dh]``: the attention output ``[H * Dh]``."""
    scores = (keys * q).sum(-1) / math.sqrt(q.shape[-1])  # [P, H]
    probs = torch.softmax(scores, dim=0)
    return (probs.unsqueeze(-1) * values).sum(0).reshape(-1)


def mamba_step(
    weights: TinyHybridWeights, h: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token through the Mamba-like layer: returns (output, new conv state, new temporal state)."""
    window = torch.cat((conv_state, h.unsqueeze(0)), dim=0)  # [K, d], oldest first
    u = torch.nn.functional.silu((window * weights.conv).sum(0))
    new_ssm = weights.decay * ssm_state + u @ weights.w_in
    return new_ssm @ weights.w_state_out, window[1:], new_ssm


def head(
    weights: TinyHybridWeights,
    x: torch.Tensor,
    attn_out: torch.Tensor,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Residual stream after both layers, greedy next token, and the new Mamba states."""
    h1 = x + attn_out @ weights.wo
    y, conv_state, ssm_state = mamba_step(weights, h1, conv_state, ssm_state)
    logits = (h1 + y) @ weights.unembed
    return int(torch.argmax(logits)), conv_state, ssm_state


def generate_alone(
    weights: TinyHybridWeights, prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | None = None
) -> list[int]:
    """The oracle: the request run by itself, no pools, no cache, one token at a time."""
    c = weights.config
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    conv_state = torch.zeros(c.conv_state_shape, dtype=torch.float32, device=weights.embed.device)
    ssm_state = torch.zeros(c.temporal_state_shape, dtype=torch.float32, device=weights.embed.device)
    ctx = list(prompt)
    out: list[int] = []
    pos = 0
    nxt = -1
    while len(out) < max_new_tokens:
        while pos < len(ctx):
            x, q, k, v = token_qkv(weights, ctx[pos])
            keys.append(k)
            values.append(v)
            attn = attend(q, torch.stack(keys), torch.stack(values))
            nxt, conv_state, ssm_state = head(weights, x, attn, conv_state, ssm_state)
            pos += 1
        out.append(nxt)
        ctx.append(nxt)
        if eos_token_id is not None and nxt == eos_token_id:
            break
    return out
