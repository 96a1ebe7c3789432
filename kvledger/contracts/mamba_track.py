"""Mamba V2 (``extra_buffer``) tracking arithmetic: where a request's state is captured, and how many slots.

Torch-free and side-effect-free, so CrossHair proves the postconditions in CI (``proofs.py``). The
scheduler, the Mamba radix cache and the model runner call these instead of re-deriving the rules
(SGLang PR #14792, ``schedule_batch._mamba_radix_cache_v2_req_prepare_for_extend``,
``mamba_radix_cache._match_post_processor``, ``HybridReqToTokenPool``):

* a request holds ``k`` ping-pong tracking slots besides its working slot: 2 with the overlap scheduler
  (a launched forward may write one while the other is handed to the tree), 1 without;
* an extend of at least ``chunk`` tokens captures exactly one state: at the branching point that
  ``match_prefix`` reported when it lies inside the extend on the chunk grid counted from the extend's
  start, else at the last grid point of the extend;
* a decode step captures the state when the sequence reaches a multiple of ``mamba_track_interval``;
* the branching point of a match is the matched KV length rounded down to the chunk, reported only when
  the match went past the deepest node with a state.
"""

from __future__ import annotations

from kvledger.contracts.switch import ensure, require

FLA_CHUNK_SIZE = 64
"""SGLang's linear-attention kernel chunk: the grid on which a prefill can expose an intermediate state."""


@require(lambda page_size: page_size >= 1)
@require(lambda chunk: chunk is None or chunk >= 1)
@require(
    lambda chunk, page_size: (
        (chunk is None and (page_size % FLA_CHUNK_SIZE == 0 or FLA_CHUNK_SIZE % page_size == 0))
        or (chunk is not None and (page_size % chunk == 0 or chunk % page_size == 0))
    ),
    "one of the chunk and the page divides the other (SGLang's configuration check)",
)
@ensure(lambda page_size, result: result >= page_size and result % page_size == 0)
@ensure(lambda chunk, page_size, result: result == max(FLA_CHUNK_SIZE if chunk is None else chunk, page_size))
def mamba_cache_chunk_size(chunk: int | None, page_size: int) -> int:
    """SGLang's ``mamba_cache_chunk_size``: the kernel chunk or the page, whichever is larger.

    ``chunk`` None means the FLA kernel's 64. The configuration check requires one of chunk and page to
    divide the other, which makes the larger a multiple of the page.
    """
    base = FLA_CHUNK_SIZE if chunk is None else chunk
    return max(base, page_size)


@ensure(lambda extra_buffer, result: extra_buffer or result == 0)
@ensure(lambda extra_buffer, overlap, result: not extra_buffer or result == (2 if overlap else 1))
def ping_pong_size(extra_buffer: bool, overlap: bool) -> int:
    """Tracking slots per request: none in V1 (``no_buffer``), 2 with overlap and 1 without in V2."""
    if not extra_buffer:
        return 0
    return 2 if overlap else 1


@require(lambda size: size in (1, 2))
@require(lambda size, next_idx: 0 <= next_idx < size)
@ensure(lambda size, result: 0 <= result < size)
@ensure(lambda size, next_idx, result: size == 1 or result != next_idx)
def other_track_idx(next_idx: int, size: int) -> int:
    """``get_mamba_ping_pong_other_idx``: the half that holds the last captured state (the one kept or
    donated), given the half the next capture writes. With one slot it is that same slot."""
    return 1 - next_idx if size == 2 else next_idx


@require(lambda prefix_len, extend_len: prefix_len >= 0 and extend_len >= 0)
@require(lambda chunk: chunk >= 1)
@require(lambda branching: branching is None or branching >= 0)
@ensure(lambda extend_len, chunk, result: (result is None) == (extend_len < chunk), "tracks iff >= one chunk")
@ensure(
    lambda prefix_len, extend_len, result: result is None or prefix_len < result <= prefix_len + extend_len,
    "the state is captured inside this extend",
)
@ensure(
    lambda prefix_len, extend_len, chunk, branching, result: (
        result is None
        or result == prefix_len + extend_len // chunk * chunk
        or (result == branching and (branching - prefix_len) % chunk == 0)
    ),
    "on the chunk grid counted from the extend's start: its last point, or the branching point",
)
@ensure(
    lambda prefix_len, extend_len, chunk, branching, result: (
        extend_len < chunk
        or branching is None
        or not (prefix_len < branching < prefix_len + extend_len and (branching - prefix_len) % chunk == 0)
        or result == branching
    ),
    "a branching point inside the extend and on its grid wins",
)
def extend_track_seqlen(prefix_len: int, extend_len: int, chunk: int, branching: int | None) -> int | None:
    """The sequence length whose state an extend of ``[prefix_len, prefix_len + extend_len)`` captures
    (``mamba_last_track_seqlen``), or None when the extend is shorter than one chunk."""
    if extend_len < chunk:
        return None
    end = prefix_len + extend_len
    if branching is not None and prefix_len < branching < end and (branching - prefix_len) % chunk == 0:
        return branching
    return prefix_len + extend_len // chunk * chunk


@require(lambda matched_len, state_len: 0 <= state_len <= matched_len)
@require(lambda chunk: chunk >= 1)
@ensure(
    lambda matched_len, state_len, result: result is None or matched_len > state_len,
    "only a match that went past its deepest state reports a branching point",
)
@ensure(lambda chunk, result: result is None or (result > 0 and result % chunk == 0))
@ensure(lambda matched_len, result: result is None or result <= matched_len)
@ensure(
    lambda matched_len, state_len, chunk, result: (
        (result is None) == (matched_len == state_len or matched_len < chunk)
    )
)
def branching_seqlen(matched_len: int, state_len: int, chunk: int) -> int | None:
    """``mamba_branching_seqlen``: where a request can leave a state for the KV it matched past the
    deepest state (``matched_len`` tokens matched, ``state_len`` of them up to that state)."""
    if matched_len == state_len:
        return None
    aligned = matched_len // chunk * chunk
    return aligned if aligned > 0 else None


@require(lambda k: 0 <= k <= 2)
@ensure(
    lambda needs_working, needs_ping_pong, k, result: (
        result == int(needs_working) + (k if needs_ping_pong else 0)
    )
)
@ensure(lambda k, result: 0 <= result <= 1 + k, "I-STATE-BOUND: never more than 1 + k at once")
def mamba_slot_demand(needs_working: bool, needs_ping_pong: bool, k: int) -> int:
    """Slots an admission takes from the Mamba pool: a working slot unless the copy-on-write slot becomes
    it, and the ``k`` tracking slots unless the request still has them (I-ATOMIC-ADMISSION, B17)."""
    return (1 if needs_working else 0) + (k if needs_ping_pong else 0)
