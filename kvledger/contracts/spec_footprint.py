"""Speculative decoding's KV footprint per request and step, after SGLang's ``allocation_sizing.py``.

Pure integer arithmetic (no torch), shared by the scheduler's configuration
(``kvledger.reference.scheduler.spec_config``) and ``kvledger simulate``'s option checks, which must not
import the engine.
"""

from __future__ import annotations


def alloc_len_per_decode(num_steps: int, topk: int, num_draft_tokens: int, page_size: int) -> int:
    """KV tokens one request may allocate in one speculative decode step: ``max(num_steps * topk,
    num_draft_tokens)``; at page > 1 with topk > 1 every topk branch may need its own partly filled
    pages, ``ceil((page - 1 + num_steps + page - 1) / page)`` of them."""
    if page_size == 1 or topk == 1:
        return max(num_steps * topk, num_draft_tokens)
    pages_per_branch = (page_size - 1 + num_steps + page_size - 1) // page_size
    return max(pages_per_branch * page_size * topk, num_draft_tokens)


def reserve(num_steps: int, topk: int, num_draft_tokens: int, page_size: int, overlap: bool) -> int:
    """KV tokens held beyond the committed length before a verify: one step's allocation, two with the
    overlap scheduler (the committed length lags one step)."""
    return (2 if overlap else 1) * alloc_len_per_decode(num_steps, topk, num_draft_tokens, page_size)


def row_headroom(num_steps: int, topk: int, num_draft_tokens: int, page_size: int, overlap: bool) -> int:
    """Row positions needed beyond the context length: ``4 + num_draft_tokens``, at least the reserve, and
    at page > 1 the reserve plus a partly filled page (SGLang PR #26972)."""
    held = reserve(num_steps, topk, num_draft_tokens, page_size, overlap)
    extra = max(4 + num_draft_tokens, held)
    return max(extra, held + page_size - 1) if page_size > 1 else extra
