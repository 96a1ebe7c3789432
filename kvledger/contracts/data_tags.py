"""Data tags: what a state slot or a KV slot must hold, as a pure function of the tokens before it.

The hash runner computes no real state, so without tags every Mamba slot stays zero and a bug that moves
the right slot with the wrong contents (the wrong ping-pong half donated, a capture recorded at the wrong
length, a backup that misses a component, a copy in the wrong direction) leaves nothing to see. With tags,
the tagged hash runner (``kvledger.reference.scheduler.tagging_runner``) writes into every state it
advances, and into every KV slot it fills, a small fingerprint of the prefix it stands for, exactly as a
real recurrent state is a function of its prefix:

* the *prefix tag* after ``n`` tokens is a fold over them, ``tag(0) = 0`` and
  ``tag(n + 1) = mix(tag(n), token n, n)``: 48 bits, order- and position-sensitive;
* a state slot after ``n`` tokens holds :func:`encode` ``(tag(n), n)`` in every layer: the conv state's
  first element the tag's low 24 bits and every other element ``n``, the temporal state's first element
  the high 24 bits and every other element ``n``. Both components carry the length, so a restore that
  misses one shows; the empty prefix encodes as all zeros, which is what a freshly allocated slot holds;
* the KV slot of position ``p`` holds ``encode(tag(p + 1), p + 1)`` in K and V alike (the prefix up to
  and including ``p``).

Every value is an integer below ``2**24``: exact in float32, so copies, host round trips and landings
keep it bit for bit. :class:`PrefixTags` memoises the folds (a decode step extends its context by one
token, so a lookup usually extends a cached fold by one step).
"""

from __future__ import annotations

from collections.abc import Sequence

TAG_BITS = 48
HALF_BITS = 24
HALF_MASK = (1 << HALF_BITS) - 1
TAG_MASK = (1 << TAG_BITS) - 1
_M1 = 0xBF58476D1CE4E5B9  # splitmix64's multipliers
_M2 = 0x94D049BB133111EB
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def mix(tag: int, token: int, position: int) -> int:
    """One step of the fold: the tag of a prefix extended by ``token`` at ``position``."""
    x = (tag * _GOLDEN + (token & 0xFFFFFFFF) + (position << 32) + 1) & _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return (x ^ (x >> 31)) & TAG_MASK


def fold(tokens: Sequence[int], start: int = 0, tag: int = 0) -> list[int]:
    """The tags after each of ``tokens`` (which begin at ``start``), continuing from ``tag``: ``len(tokens)`` ints."""
    out: list[int] = []
    for i, token in enumerate(tokens):
        tag = mix(tag, token, start + i)
        out.append(tag)
    return out


def encode(tag: int, length: int) -> tuple[int, int]:
    """The two values a slot's components lead with: (conv's first element, temporal's first element);
    every other element of both holds ``length``."""
    return tag & HALF_MASK, (tag >> HALF_BITS) & HALF_MASK


def decode(first: float, second: float) -> int:
    """The tag two leading values stand for (the inverse of :func:`encode` on its range)."""
    return (int(second) << HALF_BITS) | int(first)


class PrefixTags:
    """Memoised prefix tags: ``tags(tokens)[n]`` is the tag after ``tokens[:n]`` (index 0: the empty prefix)."""

    LIMIT = 4096  # folds kept; cleared past this (a hunt example makes a few hundred)

    def __init__(self) -> None:
        self._memo: dict[tuple[int, ...], list[int]] = {(): [0]}

    def tags(self, tokens: Sequence[int]) -> list[int]:
        key = tuple(tokens)
        got = self._memo.get(key)
        if got is not None:
            return got
        shorter = self._memo.get(key[:-1])
        # the usual case: a decode step added one token to a context folded before
        got = [*shorter, mix(shorter[-1], key[-1], len(key) - 1)] if shorter is not None else [0, *fold(key)]
        if len(self._memo) >= self.LIMIT:
            self._memo = {(): [0]}
        self._memo[key] = got
        return got

    def extend(self, base: list[int], tokens: Sequence[int]) -> list[int]:
        """The tags of a prefix whose tags are ``base`` (as :meth:`tags` returns) extended by ``tokens``."""
        return base + fold(tokens, len(base) - 1, base[-1])
