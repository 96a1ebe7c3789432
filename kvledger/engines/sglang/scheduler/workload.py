"""A seeded generic workload over the real loop, and what to make of a failure (a budgeted mini-hunt).

Generic draws only (nothing aimed at one bug): arrivals whose prompts share a few prefixes, follow-up
turns (a finished request's prompt + output + a new tail), bursts, one loop step at a time, lengths
drawn per request. SGLang's own memory checks run strict (idle and busy: they raise), the fake worker
checks every tag it reads. The first failure ends the run and is classified (:func:`classify`).
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

from kvledger.engines.sglang.scheduler.loop import STRICT_IDLE_CHECK, arrive, step

STRICT_BUSY_CHECK = "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY"


@dataclass
class Finding:
    step: int
    kind: str  # "sglang-check-wrong", "leak", "tag-mismatch", "crash"
    message: str
    owners: dict[int, str] = field(default_factory=dict)  # Mamba slot -> who holds it


@dataclass
class RunReport:
    seed: int
    steps: int
    requests: int
    cpu_seconds: float
    finding: Finding | None
    ops: list[tuple[Any, ...]]


def classify(scheduler: Any, at: int, error: BaseException) -> Finding:
    """What the first failure is, by LEDGER owner (the scheduler runs under :func:`.ledgers.attach_scheduler`).

    SGLang's own memory check arrives as the attach's verdict (each slot it names classified by who holds
    it); a ledger violation (double free, leak, a slot handed out twice, a request naming a freed slot)
    names itself at the bad step; a tag mismatch is the fake worker reading someone else's state."""
    from kvledger.contracts.errors import ContractViolation
    from kvledger.engines.sglang.scheduler.ledgers import SchedulerLedgerViolation, SGLangCheckVerdict
    from kvledger.engines.sglang.scheduler.worker import TagMismatch

    text = str(error)
    if isinstance(error, TagMismatch):
        return Finding(at, "tag-mismatch", text)
    if isinstance(error, SGLangCheckVerdict):
        return Finding(at, error.kind, text, dict(error.owners))
    if isinstance(error, SchedulerLedgerViolation):
        return Finding(at, "ledger-identity", text)
    if isinstance(error, ContractViolation):
        return Finding(at, _violation_kind(text), text)
    return Finding(at, "crash", f"{type(error).__name__}: {text[:400]}")


def _violation_kind(text: str) -> str:
    """A watch violation by the invariant it names (a double free is I-NODUP-FREE)."""
    match = re.search(r"\((I-[A-Z-]+)\)", text)
    return "double-free" if match and match.group(1) == "I-NODUP-FREE" else "ledger"


def _prompt(rng: random.Random, prefixes: list[list[int]], limit: int) -> list[int]:
    base = rng.choice(prefixes) if rng.random() < 0.7 else []
    tail = [rng.randrange(1, 1000) for _ in range(rng.randint(1, 24))]
    return (base + tail)[: max(1, limit)]


def _abort(scheduler: Any, req: Any, live: list[Any], ops: list[tuple[Any, ...]]) -> list[Any]:
    """SGLang's own abort of ``req`` (as the tokenizer manager sends it); the live list without it once
    SGLang has taken it out of every queue (a running request is marked and released at the next step)."""
    from sglang.srt.managers.io_struct import AbortReq

    from kvledger.engines.sglang.scheduler.ledgers import left_every_queue

    ops.append(("abort", req.rid))
    scheduler.abort_request(AbortReq(rid=req.rid))
    return [r for r in live if r is not req] if left_every_queue(scheduler, req) else live


def run(scheduler: Any, seed: int, n_ops: int, aborts: float = 0.0) -> RunReport:
    """Draw ``n_ops`` operations from ``seed`` and run them; stops at the first failure.

    ``aborts``: the chance that a non-arrival operation is SGLang's own ``abort_request`` for a live
    request (waiting, chunked or running) instead of a loop step. 0 (the default) draws nothing for it, so
    the seeded runs and their saved repros stay as they were; above 0 the rids end in "." (SGLang's abort
    matches rids by prefix, and "r1" would also name "r10")."""
    os.environ.setdefault(STRICT_IDLE_CHECK, "1")
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 1000) for _ in range(rng.randint(4, 20))] for _ in range(3)]
    limit = scheduler.max_req_input_len
    finished: list[Any] = []
    live: list[Any] = []
    ops: list[tuple[Any, ...]] = []
    start = time.process_time()
    for i in range(n_ops):
        try:
            if rng.random() < 0.35:
                if finished and rng.random() < 0.4:
                    prev = rng.choice(finished)
                    tail = [rng.randrange(1, 1000) for _ in range(rng.randint(1, 6))]
                    tokens = (list(prev.origin_input_ids) + list(prev.output_ids) + tail)[:limit]
                else:
                    tokens = _prompt(rng, prefixes, limit)
                rid = f"r{i}." if aborts else f"r{i}"
                op: tuple[Any, ...] = ("arrive", rid, tokens, rng.randint(1, 12))
                ops.append(op)
                live.append(arrive(scheduler, rid, tokens, op[3]))
            elif aborts and live and rng.random() < aborts:
                live = _abort(scheduler, rng.choice(live), live, ops)
            else:
                ops.append(("step",))
                step(scheduler)
                finished += [r for r in live if r.finished()]
                live = [r for r in live if not r.finished()]
        except Exception as error:
            found = classify(scheduler, i, error)
            return RunReport(
                seed, i + 1, sum(o[0] == "arrive" for o in ops), time.process_time() - start, found, ops
            )
    return RunReport(seed, n_ops, sum(o[0] == "arrive" for o in ops), time.process_time() - start, None, ops)
