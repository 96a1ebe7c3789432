"""What produces the next token: a protocol, and the deterministic stand-in used until a model runs.

The scheduler calls the runner once per launched batch with the requests, the KV slots allocated for
this forward (``out_cache_loc``) and how many tokens each request extends by. A runner that computes
attention reads KV through the request's ``req_to_token`` row and writes the new positions' KV at
``out_cache_loc``; the tiny hybrid model does exactly that. The hash runner writes nothing: its next
token depends only on the tokens, which is what makes outputs independent of caching and scheduling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from kvledger.reference.scheduler.request import Req


class ModelRunner(Protocol):
    def forward(
        self, reqs: Sequence[Req], extend_lens: Sequence[int], out_cache_loc: torch.Tensor, is_decode: bool
    ) -> list[int]:
        """One forward over ``reqs``; returns the next token of each request."""
        ...


def hash_next_token(context: Sequence[int], vocab_size: int) -> int:
    """A deterministic next token from the last few tokens of the context (FNV-1a over 8 tokens).

    Depends on the context only, so a request's output is the same whatever else is scheduled with
    it and whatever was served from the cache.
    """
    h = 0xCBF29CE484222325
    for tok in context[-8:]:
        h ^= tok & 0xFFFFFFFF
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    h ^= len(context)
    return int(h % vocab_size)


class HashTokenRunner:
    """The deterministic stand-in: next token = :func:`hash_next_token` of the request's context."""

    def __init__(self, vocab_size: int = 32000) -> None:
        self.vocab_size = vocab_size

    def forward(
        self, reqs: Sequence[Req], extend_lens: Sequence[int], out_cache_loc: torch.Tensor, is_decode: bool
    ) -> list[int]:
        # After this forward the request has KV for kv_committed_len positions; the next token follows them.
        return [hash_next_token(req.context_ids()[: req.kv_committed_len], self.vocab_size) for req in reqs]
