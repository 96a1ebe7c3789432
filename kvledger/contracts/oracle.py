"""Differential checks: a result compared with a model or a reference, as a ContractViolation naming the ID.

The tests run these (the state machines against their models, the schedules against each request run
alone, the Triton kernels against their torch references), so a mismatch reads like every other
violation: the invariant, what differs, where. They hold no state and import no implementation;
``check_same_bits`` imports torch only when called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvledger.contracts.errors import ContractViolation


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def check_free_list_order(pool: str, free_list: Sequence[int], model: Sequence[int]) -> None:
    """I-REUSE-ORDER: the pool's free list, in order, equals the model's (fifo or lifo reuse)."""
    if list(free_list) == list(model):
        return
    i = _first_difference(free_list, model)
    raise ContractViolation(
        f"I-REUSE-ORDER: [{pool}] the free list differs from the model at position {i}:"
        f" pool {list(free_list)[i : i + 6]}, model {list(model)[i : i + 6]}"
        f" (lengths {len(free_list)} and {len(model)})"
    )


def check_output_oracle(who: object, output: Sequence[int], alone: Sequence[int]) -> None:
    """I-OUTPUT-ORACLE: a finished request's output equals the same request run alone with no cache."""
    if list(output) == list(alone):
        return
    i = _first_difference(output, alone)
    raise ContractViolation(
        f"I-OUTPUT-ORACLE: {who!r} produced {len(output)} token(s) that differ from the request run alone"
        f" from token {i}: got {list(output)[i : i + 6]}, alone {list(alone)[i : i + 6]}"
    )


def check_same_bits(what: str, got: Any, reference: Any) -> None:
    """I-KERNEL-REF: a kernel's output equals its torch reference bit for bit (NaN payloads, -0.0 included)."""
    import torch

    if got.shape != reference.shape or got.dtype != reference.dtype:
        raise ContractViolation(
            f"I-KERNEL-REF: {what}: got {got.dtype}{tuple(got.shape)},"
            f" the reference is {reference.dtype}{tuple(reference.shape)}"
        )
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    a = got.detach().contiguous().view(width).cpu()
    b = reference.detach().contiguous().view(width).cpu()
    if torch.equal(a, b):
        return
    differ = (a != b).nonzero()
    raise ContractViolation(
        f"I-KERNEL-REF: {what}: {differ.shape[0]} element(s) differ from the reference,"
        f" first at index {tuple(differ[0].tolist())}"
    )
