"""``ScheduleBatch``: one launched forward and what it references while it is in flight."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kvledger.reference.scheduler.request import Req


@dataclass(eq=False)
class ScheduleBatch:
    """A prefill (extend) or decode batch.

    While in flight (overlap mode: launched, results not processed) the batch references its requests'
    rows (read by its forward, written by the host) and their Mamba working slots (advanced by its
    forward); neither may be handed to another request until the results are processed
    (I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT); under Mamba V2 also the tracking slot its forward captures into.
    ``ref_kv`` records the KV slots it writes for diagnostics: a KV
    slot's later writers are ordered after this batch on the device stream. Requests that finish or are
    aborted meanwhile are parked in ``deferred_release`` (account ``batch.inflight``) and released
    when this batch's results are processed.
    """

    batch_id: int
    reqs: list[Req]
    is_decode: bool
    extend_lens: list[int]
    out_cache_loc: torch.Tensor
    chunked_req: Req | None = None  # the request whose prompt is still incomplete after this batch
    next_token_ids: list[int] | None = None
    deferred_release: list[Req] = field(default_factory=list)
    ref_rows: frozenset[int] = frozenset()
    ref_kv: frozenset[int] = frozenset()
    ref_mamba: frozenset[int] = frozenset()
    spec: Any = None  # a verify batch's plan (speculative decoding: scheduler/speculative.py), else None

    def freeze_references(self) -> None:
        """Record what the forward reads and writes, at launch."""
        self.ref_rows = frozenset(r.req_pool_idx for r in self.reqs if r.req_pool_idx is not None)
        self.ref_kv = frozenset(self.out_cache_loc.tolist())
        self.ref_mamba = frozenset(
            [int(r.mamba_pool_idx[0]) for r in self.reqs if r.mamba_pool_idx is not None]
            + [int(r.mamba_track.slot[0]) for r in self.reqs if r.mamba_track is not None]
        )

    def __repr__(self) -> str:
        kind = "decode" if self.is_decode else "extend"
        return f"ScheduleBatch#{self.batch_id}({kind}, reqs={[r.rid for r in self.reqs]})"
