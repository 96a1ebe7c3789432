"""I-SIZING: the PD decode instance's pool sizes, SGLang's rules as pure arithmetic (CrossHair-proved).

A decode instance holds requests beyond its running limit: pre-allocated ones waiting for their KV
(the transfer queue) and transferred ones waiting to run. SGLang sizes for them
(``DecodeReqToTokenPool``, ``HybridMambaDecodeReqToTokenPool``):

* request rows: ``size + pre_alloc_size`` usable rows, plus row 0 reserved as padding;
* ``pre_alloc_size = 2 * max_num_reqs`` when ``max_num_reqs <= 32``, else 0 (the 2025 default);
* Mamba slots: ``max(requested, rows * slots_per_req)``: every row may hold a working slot (plus
  ping-pong slots with Mamba V2), so a smaller pool fails ``_pre_alloc`` (#19002: the decode pool
  ignored the requested size; #20858: the opposite mistake, pre_alloc added on top of an explicit size;
  #22462/#23267: ``rows x slots_per_req``). Catalogue B11.

Torch-free and side-effect-free: ``scripts/crosshair_gate.py`` proves the postconditions.
"""

from __future__ import annotations

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.seams import seam
from kvledger.contracts.switch import ensure, require

PRE_ALLOC_LIMIT = 32  # SGLang pre-allocates extra rows only for small running limits


@require(lambda max_num_reqs: max_num_reqs >= 1)
@ensure(lambda max_num_reqs, result: result >= 0)
@ensure(lambda max_num_reqs, result: result == 0 or result == 2 * max_num_reqs)
@ensure(lambda max_num_reqs, result: (result > 0) == (max_num_reqs <= PRE_ALLOC_LIMIT))
def default_pre_alloc_size(max_num_reqs: int) -> int:
    """Extra decode rows for requests in the transfer and prebuilt queues (SGLang's default)."""
    return 2 * max_num_reqs if max_num_reqs <= PRE_ALLOC_LIMIT else 0


@require(lambda size: size >= 1)
@require(lambda pre_alloc_size: pre_alloc_size >= 0)
@ensure(lambda size, pre_alloc_size, result: result == size + pre_alloc_size)
@ensure(lambda size, result: result >= size)
def decode_rows(size: int, pre_alloc_size: int) -> int:
    """Usable decode rows (row 0, reserved, comes on top)."""
    return size + pre_alloc_size


@seam  # B11 replaces it where the PD builder calls it (kvledger.reference.disagg.builder)
@require(lambda requested: requested >= 0)
@require(lambda rows: rows >= 1)
@require(lambda slots_per_req: slots_per_req >= 1)
@ensure(lambda rows, slots_per_req, result: result >= rows * slots_per_req, "every row can hold its slots")
@ensure(lambda requested, result: result >= requested, "never below what was asked for")
@ensure(
    lambda requested, rows, slots_per_req, result: result == max(requested, rows * slots_per_req),
    "and no more (#20858: pre_alloc must not be added on top of an explicit size)",
)
def decode_mamba_slots(requested: int, rows: int, slots_per_req: int) -> int:
    """Mamba slots of a decode instance: the requested size, raised to ``rows * slots_per_req``."""
    need = rows * slots_per_req
    return requested if requested >= need else need


def check_decode_sizing(*, rows: int, mamba_slots: int | None, slots_per_req: int, metadata_slots: int) -> None:
    """I-SIZING for a built decode instance; ContractViolation naming the numbers otherwise.

    ``mamba_slots`` is None for an attention-only model. Metadata slots need only be positive: a
    shortage throttles pre-allocation, it never breaks an invariant.
    """
    if mamba_slots is not None and mamba_slots < rows * slots_per_req:
        raise ContractViolation(
            f"I-SIZING: the decode Mamba pool has {mamba_slots} slots for {rows} rows x {slots_per_req}"
            f" slot(s) per request = {rows * slots_per_req} (B11, #19002): a pre-allocated request would"
            " find no working slot"
        )
    if metadata_slots < 1:
        raise ContractViolation(f"I-SIZING: the decode instance has {metadata_slots} metadata slots")
