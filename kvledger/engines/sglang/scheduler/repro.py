"""Replaying and shrinking an operation list (from :func:`.workload.run`) against a fresh scheduler."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from kvledger.engines.sglang.scheduler.loop import STRICT_IDLE_CHECK, arrive, step
from kvledger.engines.sglang.scheduler.workload import Finding, classify

Op = tuple[Any, ...]


def replay(scheduler: Any, ops: list[Op]) -> Finding | None:
    """Run ``ops`` (``("arrive", rid, tokens, max_new)`` / ``("step",)`` / ``("abort", rid)`` / ``("fail",
    rid)`` / ``("clock", seconds)``); the first failure, classified."""
    os.environ.setdefault(STRICT_IDLE_CHECK, "1")
    for i, op in enumerate(ops):
        try:
            if op[0] == "arrive":
                arrive(scheduler, op[1], list(op[2]), op[3])
            elif op[0] == "abort":  # SGLang's own abort, as the machine sends it
                from sglang.srt.managers.io_struct import AbortReq

                scheduler.abort_request(AbortReq(rid=op[1]))
            elif op[0] == "fail":  # a PD transfer failure (pd_faults), as the machine draws it
                from kvledger.engines.sglang.scheduler.pd_faults import fail_transfer

                fail_transfer(scheduler, op[1])
            elif op[0] == "clock":  # time passing for the PD transfer backend (pd_faults)
                from kvledger.engines.sglang.scheduler.pd_faults import transfer_clock

                transfer_clock().advance(op[1])
            else:
                step(scheduler)
        except Exception as error:
            return classify(scheduler, i, error)
    return None


def shrink(make: Callable[[], Any], ops: list[Op], kind: str) -> list[Op]:
    """Greedy one-op deletion until no single removal keeps a finding of ``kind`` (each try: fresh build)."""
    current = list(ops)
    changed = True
    while changed:
        changed = False
        for i in range(len(current) - 1, -1, -1):
            trial = current[:i] + current[i + 1 :]
            found = replay(make(), trial)
            if found is not None and found.kind == kind:
                current = trial[: found.step + 1]
                changed = True
    return current
