"""``PDReq``: a request on one side of a prefill/decode pair, with its PD handles.

Both instances see the same request id and ``bootstrap_room`` (the router sends a request to both), but
each has its own ``PDReq`` and ledger owner (``prefill.req#7``, ``decode.req#7``), as two processes would.
Extra fields (SGLang's names where they exist):

* ``metadata_idx``: the metadata slot (a handle: I-HANDLE-OWNED);
* ``start_send_idx``: prefill, the first position not yet handed to the channel;
* ``stage_since``: the step the request entered its current queue (I-DRAIN reports it);
* ``ended_from``: the state a request was in when it was aborted (aborts by stage);
* ``host_copy``: decode, the KV and state of a retracted request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvledger.contracts.owners import PD_DECODE_PREALLOC, PD_PREFILL_BOOTSTRAP, Owner
from kvledger.reference.scheduler.request import Req, ReqState

PREFILL, DECODE = "prefill", "decode"


@dataclass
class HostCopy:
    """What a retracted decode request keeps off the device (SGLang: a CPU tensor or the host pool).

    ``length`` positions of K/V per attention layer (None with the hash runner, which has no KV data)
    and the Mamba state of every layer.
    """

    length: int
    k: torch.Tensor | None
    v: torch.Tensor | None
    conv: torch.Tensor | None
    temporal: torch.Tensor | None


@dataclass(eq=False, repr=False)
class PDReq(Req):
    side: str = PREFILL
    bootstrap_room: int = 0
    metadata_idx: int | None = None
    start_send_idx: int = 0
    stage_since: int = 0
    ended_from: ReqState | None = None
    host_copy: HostCopy | None = None

    def __post_init__(self) -> None:
        first = PD_PREFILL_BOOTSTRAP if self.side == PREFILL else PD_DECODE_PREALLOC
        self.owner = Owner(f"{self.side}.req", self.rid, first)
        self.state = ReqState.BOOTSTRAP if self.side == PREFILL else ReqState.PREALLOC

    def handles(self) -> list[tuple[str, str, list[int]]]:
        out = super().handles()
        if self.metadata_idx is not None:
            out.append(("metadata_idx", "metadata", [self.metadata_idx]))
        return out

    def __repr__(self) -> str:
        return f"{self.side}.{super().__repr__()[:-1]}, room={self.bootstrap_room}, meta={self.metadata_idx})"
