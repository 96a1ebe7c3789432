"""Pure page and budget arithmetic: the functional core that CrossHair proves in CI.

Torch-free and side-effect-free on purpose: ``crosshair check --analysis_kind=icontract`` explores
every path of these functions and proves the postconditions (tooling-notes §5). Pools, caches and the
scheduler call these instead of re-deriving the arithmetic inline, so the proof covers them.
Preconditions bound the domain (CrossHair treats them as assumptions); the pools validate input
before calling here. Every postcondition here is proved over all paths within its preconditions (the
CI gate fails otherwise); ``kvledger/contracts/invariants/proofs.py`` lists the targets.
"""

from __future__ import annotations

from kvledger.contracts.switch import ensure, require

MAX_TERMS = 32
"""The most terms an identity may have (8 standard accounts plus declared ones). CrossHair exhausts a loop
over a symbolic list only when its length is bounded, so this bound is what makes the sums provable."""

MAX_PROVED_KEY = 8
"""Key length up to which ``matched_prefix_len`` is proved over all paths."""


@require(lambda num_tokens: num_tokens >= 0)
@require(lambda page_size: page_size >= 1)
@ensure(lambda num_tokens, page_size, result: result * page_size >= num_tokens)
@ensure(lambda num_tokens, page_size, result: (result - 1) * page_size < num_tokens or result == 0)
def pages_needed(num_tokens: int, page_size: int) -> int:
    """The number of whole pages that hold ``num_tokens`` tokens (ceil division)."""
    return (num_tokens + page_size - 1) // page_size


@require(lambda n: n >= 0)
@require(lambda page_size: page_size >= 1)
@ensure(lambda n, page_size, result: result % page_size == 0 and result <= n < result + page_size)
def floor_to_page(n: int, page_size: int) -> int:
    """The largest page-aligned length not above ``n`` (what a radix tree may own of a sequence)."""
    return n - n % page_size


@require(lambda n: n >= 0)
@require(lambda page_size: page_size >= 1)
@ensure(lambda n, page_size, result: result % page_size == 0 and result - page_size < n <= result)
def ceil_to_page(n: int, page_size: int) -> int:
    """The smallest page-aligned length not below ``n`` (what a request's pages span)."""
    return pages_needed(n, page_size) * page_size


@require(lambda prefix_len, seq_len: 0 <= prefix_len <= seq_len)
@require(lambda page_size: page_size >= 1)
@ensure(lambda prefix_len, seq_len, page_size, result: result[0] >= 0 and result[1] >= 0)
@ensure(lambda prefix_len, seq_len, page_size, result: result[0] < page_size)
@ensure(
    lambda prefix_len, seq_len, page_size, result: result[0] + result[1] * page_size >= seq_len - prefix_len,
    "fill plus new pages cover the extend",
)
@ensure(
    lambda prefix_len, seq_len, page_size, result: (
        ceil_to_page(prefix_len, page_size) + result[1] * page_size == ceil_to_page(seq_len, page_size)
    ),
    "after the extend the request spans exactly ceil(seq_len) tokens of pages",
)
def extend_page_plan(prefix_len: int, seq_len: int, page_size: int) -> tuple[int, int]:
    """Paged extend from ``prefix_len`` to ``seq_len``: (tokens filled into the partial last page, new pages).

    The first part reuses the free tail of the page that already holds token ``prefix_len - 1``; only
    the pages after it come off the free list.
    """
    spare_in_last_page = ceil_to_page(prefix_len, page_size) - prefix_len
    fill = min(spare_in_last_page, seq_len - prefix_len)
    new_pages = pages_needed(seq_len - prefix_len - fill, page_size)
    return fill, new_pages


@require(lambda seq_len: seq_len >= 1)
@require(lambda page_size: page_size >= 1)
@ensure(
    lambda seq_len, page_size, result: (
        result == (pages_needed(seq_len, page_size) > pages_needed(seq_len - 1, page_size))
    )
)
def decode_needs_new_page(seq_len: int, page_size: int) -> bool:
    """Whether growing a sequence to ``seq_len`` tokens (the new token included) opens a new page."""
    return (seq_len - 1) % page_size == 0


@require(lambda parts: len(parts) <= MAX_TERMS)
@require(lambda size: size >= 0)
@ensure(lambda parts, size, result: result == (sum(parts) == size))
def accounts_sum_to_size(parts: list[int], size: int) -> bool:
    """The cheap identity: free + evictable + protected + held-by-... == size (I-COUNT).

    Terms are counts (never negative: I-CAP checks that apart); the sum needs no such assumption.
    """
    total = 0
    for p in parts:
        total += p
    return total == size


@require(lambda a, b: len(a) <= MAX_PROVED_KEY and len(b) <= MAX_PROVED_KEY)
@require(lambda page_size: page_size >= 1)
@ensure(lambda a, b, page_size, result: result % page_size == 0)
@ensure(lambda a, b, page_size, result: result <= min(len(a), len(b)))
@ensure(lambda a, b, page_size, result: all(a[i] == b[i] for i in range(result)))
@ensure(
    lambda a, b, page_size, result: (
        result + page_size > min(len(a), len(b))
        or any(a[i] != b[i] for i in range(result, result + page_size))
    ),
    "maximal: the next whole page differs or does not exist",
)
def matched_prefix_len(a: list[int], b: list[int], page_size: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, rounded down to whole pages.

    A radix tree keyed by pages can only share whole pages, so a match ending mid-page stops at the
    page boundary below it. The length bound is the domain of the proof: CrossHair confirms every
    postcondition over all paths for keys of up to ``MAX_PROVED_KEY`` tokens and any page size (with 32
    it no longer exhausts the paths within the CI budget).
    """
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i - i % page_size


@require(lambda max_new_tokens, output_len: 0 <= output_len <= max_new_tokens)
@require(lambda clip: clip >= 1)
@ensure(lambda max_new_tokens, output_len, clip, result: 0 <= result <= clip)
@ensure(lambda max_new_tokens, output_len, clip, result: result <= max_new_tokens - output_len)
def remaining_new_tokens_clipped(max_new_tokens: int, output_len: int, clip: int) -> int:
    """Decode tokens a request may still produce, clipped (SGLang's CLIP_MAX_NEW_TOKENS estimate)."""
    return min(max_new_tokens - output_len, clip)
