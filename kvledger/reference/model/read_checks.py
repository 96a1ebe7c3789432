"""What a forward's reads must see: the data-integrity checks of the tiny model's runner, vectorised.

* I-NO-POISON-READ: no KV slot or Mamba slot read for a live request holds the poison the pools
  write on free.
* I-KV-ROW-CONTENT: the slot a row names for position ``q`` was last written for that request's token
  at position ``q``. A shadow map (two tensors indexed by KV slot: the token and the position last
  stored there) is updated with every store, so a row pointing at another path's KV is caught at the
  read, not just in the output.

Each check is a handful of tensor operations over all the slots the batch reads; the evidence (which
request, position, token, slot, and what the slot holds) is resolved only when a check fails.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvledger.contracts.errors import ContractViolation

_NEVER = -1  # shadow entry of a slot no forward has stored into


class KVWriteShadow:
    """Per KV slot: the (token, position) last stored there by the model, ``-1`` if never."""

    def __init__(self, num_slots: int, device: torch.device | str = "cpu") -> None:
        self.token = torch.full((num_slots,), _NEVER, dtype=torch.int64, device=device)
        self.position = torch.full((num_slots,), _NEVER, dtype=torch.int64, device=device)

    def record(self, slots: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        self.token[slots] = tokens
        self.position[slots] = positions

    def holds(self, slot: int) -> tuple[int, int] | None:
        token, position = int(self.token[slot]), int(self.position[slot])
        return None if token == _NEVER else (token, position)


def check_no_poison_read(
    owners: Sequence[object], what: str, poisoned: torch.Tensor, slots: torch.Tensor, read_by: torch.Tensor
) -> None:
    """I-NO-POISON-READ over the slots a batch reads: ``poisoned[i]`` for ``slots[i]`` read by request
    ``read_by[i]`` (an index into ``owners``)."""
    if not bool(poisoned.any()):
        return
    first = int(torch.nonzero(poisoned)[0, 0])
    bad = slots[poisoned & (read_by == read_by[first])].tolist()[:8]
    raise ContractViolation(
        f"I-NO-POISON-READ: {owners[int(read_by[first])]!r} reads poisoned (freed) {what} slot(s) {bad}"
    )


def check_row_content(
    owners: Sequence[object],
    shadow: KVWriteShadow,
    slots: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    read_by: torch.Tensor,
) -> None:
    """I-KV-ROW-CONTENT: request ``read_by[i]`` reads ``slots[i]`` for its token ``tokens[i]`` at
    ``positions[i]``; the shadow map must say that slot was last written for exactly that."""
    wrong = (shadow.token[slots] != tokens) | (shadow.position[slots] != positions)
    if not bool(wrong.any()):
        return
    i = int(torch.nonzero(wrong)[0, 0])
    slot = int(slots[i])
    raise ContractViolation(
        f"I-KV-ROW-CONTENT: {owners[int(read_by[i])]!r} position {int(positions[i])} "
        f"(token {int(tokens[i])}) reads slot {slot}, which holds {shadow.holds(slot)} (token, position)"
    )
