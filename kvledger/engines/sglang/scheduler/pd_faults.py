"""PD transfer failures for the machine: a transfer that fails, and time that passes (SGLang 0.5.23's fake backend).

Both reach SGLang's failure handling through the transfer backend's public surface, as a real backend's
failure would:

* a failed transfer: the request's ``FakeKVSender`` (prefill) or ``FakeKVReceiver`` (decode) is told to
  ``abort()``, the backend interface's call that concludes it ``KVPoll.Failed``; the scheduler sees the
  failure at its next poll of that request (the bootstrap, inflight, prealloc or transfer queue) and
  runs its own failure path (``handle_bootstrap_failure``, ``prepare_abort``, the release of the
  request's KV, row and Mamba slot), with ``failure_exception()`` naming the cause. The request itself
  is not aborted by a client: only its transfer fails.
* time passing: 0.5.23's ``FakeKVSender`` fails a sender that was initialised and polled but never sent
  within ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` seconds (monotonic clock). A stepped loop runs far
  faster than the wall clock, so the fake backend's module reads a clock the machine can move forward
  (:class:`TransferClock`: the real monotonic clock plus an offset that only grows); nothing else reads it.

Releases before 0.5.23 (0.5.5.x-0.5.10): their fake sender and receiver have no ``abort()`` and no
deadline, and nothing else public makes them report ``Failed``: these rules are not drawn there.
"""

from __future__ import annotations

import time
from typing import Any

from kvledger.contracts.errors import InvalidArgument
from kvledger.engines.sglang.scheduler.ledgers import requests_in
from kvledger.engines.sglang.scheduler.loop import is_pd_decode, is_pd_prefill

FAKE_CONN = "sglang.srt.disaggregation.fake.conn"
PREFILL_QUEUES = ("disagg_prefill_bootstrap_queue", "waiting_queue", "chunked_req", "running_batch")
PREFILL_QUEUES_AFTER = ("disagg_prefill_inflight_queue",)
DECODE_QUEUES = ("disagg_decode_prealloc_queue", "disagg_decode_transfer_queue")


def can_fail(scheduler: Any) -> bool:
    """The scheduler is a PD side whose fake backend can conclude a transfer ``Failed`` (0.5.23)."""
    if not (is_pd_prefill(scheduler) or is_pd_decode(scheduler)):
        return False
    module = __import__(FAKE_CONN, fromlist=["FakeKVSender"])
    return hasattr(module.FakeKVSender, "abort") and hasattr(module.FakeKVReceiver, "abort")


def open_transfers(scheduler: Any) -> dict[str, Any]:
    """rid -> the sender (prefill) or receiver (decode) of each live request whose transfer has not
    concluded, in queue order."""
    out: dict[str, Any] = {}
    if is_pd_decode(scheduler):
        for attr in DECODE_QUEUES:
            queue = getattr(scheduler, attr, None)
            for item in getattr(queue, "queue", None) or []:
                receiver = getattr(item, "kv_receiver", None)
                if receiver is not None and receiver.conclude_state is None:
                    out.setdefault(str(item.req.rid), receiver)
        return out
    for attr in (*PREFILL_QUEUES, *PREFILL_QUEUES_AFTER):
        for req in requests_in(getattr(scheduler, attr, None)):
            sender = getattr(req, "disagg_kv_sender", None)
            if sender is not None and sender.conclude_state is None and not req.finished():
                out.setdefault(str(req.rid), sender)
    return out


def fail_transfer(scheduler: Any, rid: str) -> bool:
    """Conclude ``rid``'s transfer ``Failed`` through its endpoint's ``abort()``; False when ``rid`` has
    no open transfer (already concluded, or gone). The scheduler notices at its next poll."""
    endpoint = open_transfers(scheduler).get(rid)
    if endpoint is None:
        return False
    endpoint.abort()
    return True


class TransferClock:
    """The monotonic clock the fake backend's module reads: the real one plus :attr:`offset`, which only
    grows (a monotonic clock never goes back). Other ``time`` functions are the real ones."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise InvalidArgument(f"TransferClock.advance: {seconds!r} is not a duration >= 0")
        self.offset += float(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def transfer_clock() -> TransferClock:
    """The process's :class:`TransferClock`, put in the fake backend's module the first time (it stays:
    this process runs one release, and an offset of 0 is the real clock)."""
    module = __import__(FAKE_CONN, fromlist=["FakeKVSender"])
    clock = getattr(module, "time", None)
    if not isinstance(clock, TransferClock):
        clock = TransferClock()
        setattr(module, "time", clock)  # noqa: B010 (the module's own name for its clock)
    return clock


def waiting_timeout() -> float:
    """SGLang's ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` (seconds) as the fake sender reads it."""
    from sglang.srt.environ import envs

    return float(envs.SGLANG_DISAGGREGATION_WAITING_TIMEOUT.get())
