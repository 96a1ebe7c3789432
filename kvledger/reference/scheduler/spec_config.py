"""Speculative decoding's knobs (SGLang's names) and the KV footprint they imply.

A speculative decode step (EAGLE/MTP, SGLang's ``speculative_*`` server arguments) drafts tokens, then runs
one *verify* forward of the target model over ``num_draft_tokens`` positions (the last sampled token
and the drafts; with ``topk > 1`` a flattened tree). Verification accepts the longest prefix of drafts the
target agrees with (``0 .. max_accept``) and adds the target's own next token (the bonus): ``accepted + 1``
new tokens per request and step.

The KV of the step is allocated *before* the verify, so ``kv_allocated_len`` runs ahead of
``kv_committed_len`` (SGLang's ``alloc_len_per_decode``, ``allocation_sizing.py``):

* ``alloc_len_per_decode = max(num_steps * topk, num_draft_tokens)`` at page 1 or topk 1;
* at page > 1 with topk > 1 every topk branch may need its own partly filled page:
  ``max(ceil((page - 1 + num_steps + page - 1) / page) * page * topk, num_draft_tokens)``.

The reserve a request keeps ahead of its committed length is one step's allocation without the overlap
scheduler, two with it (the next batch is launched before this one's acceptance is known). The
request-to-token row must hold that reserve beyond the context length: SGLang's row headroom
``4 + num_draft_tokens``, widened at page > 1 to ``reserve + page - 1`` (PR #26972: the narrow row
clamped the release slice and leaked the over-allocated pages, catalogue N18). :meth:`row_headroom` is
that width; the scheduler refuses a row pool narrower than it (:class:`RowTooNarrow`, I-SPEC-ROW).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvledger.contracts import spec_footprint as footprint
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.seams import seam
from kvledger.reference.config_fields import Size, check_fields, check_size


class RowTooNarrow(InvalidArgument):
    """The request-to-token rows cannot hold the speculative over-allocation (I-SPEC-ROW)."""


def _check_layout(page_size: object, overlap: object = False) -> tuple[int, bool]:
    """The engine layout a footprint question is asked for: a page size in ``[1, MAX_SIZE]`` and a bool."""
    size = check_size(page_size, "speculative footprint: page_size")
    if not isinstance(overlap, bool):
        raise InvalidArgument(f"speculative footprint: overlap must be a bool, got {type(overlap).__name__}")
    return size, overlap


@dataclass(frozen=True)
class SpeculativeConfig:
    """``speculative_num_steps``, ``speculative_eagle_topk``, ``speculative_num_draft_tokens`` and the
    acceptance distribution of the drafts (each draft token is accepted with probability
    ``accept_rate`` if every earlier one was: a truncated geometric count, seeded by ``seed``)."""

    num_steps: Size = 3
    topk: Size = 1
    num_draft_tokens: Size = 4
    accept_rate: float = 0.7
    seed: int = 0

    def __post_init__(self) -> None:
        check_fields(self)
        if self.num_draft_tokens < 2:
            raise InvalidArgument(
                f"speculative num_draft_tokens {self.num_draft_tokens} must be >= 2 (the last token and a draft)"
            )
        if self.num_draft_tokens > self.num_steps * self.topk + 1:
            raise InvalidArgument(
                f"speculative num_draft_tokens {self.num_draft_tokens} exceeds num_steps * topk + 1 ="
                f" {self.num_steps * self.topk + 1}: the draft tree has no more tokens to verify"
            )
        if not 0.0 <= self.accept_rate <= 1.0:
            raise InvalidArgument(f"speculative accept_rate {self.accept_rate} must be within [0, 1]")

    @classmethod
    def mtp(cls, k: int, *, accept_rate: float = 0.7, seed: int = 0) -> SpeculativeConfig:
        """MTP/EAGLE with a chain of ``k`` drafts (topk 1): ``num_steps = k``, ``num_draft_tokens = k + 1``."""
        check_size(k, "SpeculativeConfig.mtp: k", low=1)
        return cls(num_steps=k, topk=1, num_draft_tokens=k + 1, accept_rate=accept_rate, seed=seed)

    @property
    def max_accept(self) -> int:
        """The most drafts one verify can accept: the tree's depth, and no more than it verifies."""
        return min(self.num_steps, self.num_draft_tokens - 1)

    def alloc_len_per_decode(self, page_size: int) -> int:
        """KV tokens one request may allocate in one speculative decode step (SGLang's formula)."""
        page_size, _ = _check_layout(page_size)
        return footprint.alloc_len_per_decode(self.num_steps, self.topk, self.num_draft_tokens, page_size)

    def reserve(self, page_size: int, overlap: bool) -> int:
        """KV tokens a request holds beyond its committed length before a verify: one step's allocation,
        two with the overlap scheduler (the committed length lags one step)."""
        page_size, overlap = _check_layout(page_size, overlap)
        return footprint.reserve(self.num_steps, self.topk, self.num_draft_tokens, page_size, overlap)

    @seam
    def row_headroom(self, page_size: int, overlap: bool) -> int:
        """Row positions needed beyond the context length: SGLang's ``4 + num_draft_tokens``, and at page > 1
        the reserve plus a partly filled page (PR #26972)."""
        page_size, overlap = _check_layout(page_size, overlap)
        return footprint.row_headroom(self.num_steps, self.topk, self.num_draft_tokens, page_size, overlap)


def kept_tokens(targets: list[int], drafts: list[int], eos: int | None) -> list[int]:
    """What one verify keeps: the drafts equal to the target's tokens, in order (the longest agreeing
    prefix), then the target's own next token (the bonus), cut at an end-of-sequence token. Shared by the
    verify forwards that compute the target's tokens (the tiny model's and the tagged hash runner's)."""
    out: list[int] = []
    for j, tok in enumerate(targets):
        out.append(tok)
        if tok == eos or j >= len(drafts) or drafts[j] != tok:
            break
    return out
