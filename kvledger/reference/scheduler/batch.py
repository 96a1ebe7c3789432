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
    (I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT); under Mamba V2 also the tracking slot its forward captures into,
    as long as the request still holds it (:meth:`mamba_still_held`). ``ref_kv`` records the KV slots it
    writes for diagnostics: a KV slot's later writers are ordered after this batch on the device
    stream, and so are a Mamba slot's (zeroing and copies run in a later forward). Requests that finish or are
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

    def mamba_still_held(self) -> frozenset[int]:
        """The Mamba slots this forward advances or captures into that its requests still name.

        A capture target the request has given away since the launch (V2's ``cache_unfinished`` at a chunk
        boundary donates the keep half, and frees it when the tree already has that state) is no longer the
        batch's: whoever takes it next zeroes or copies into it only in a later forward (SGLang 0.5.23 runs
        both in the forward, ``clear_slots`` "must run on forward stream"; the reference's
        ``MambaPool`` write schedule), ordered after this one on the device stream, as a freed KV slot's
        next writer is. A slot a request still names is its own until the results are processed."""
        named = {slot for r in self.reqs for slot in r.mamba_slots()}
        return self.ref_mamba.intersection(named)

    def __repr__(self) -> str:
        kind = "decode" if self.is_decode else "extend"
        return f"ScheduleBatch#{self.batch_id}({kind}, reqs={[r.rid for r in self.reqs]})"
