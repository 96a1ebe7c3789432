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


def slot_holders(scheduler: Any) -> dict[int, str]:
    """Every Mamba slot a live request holds, named by the queue the request is in."""
    out: dict[int, str] = {}

    def add(req: Any, queue: str) -> None:
        idx = getattr(req, "mamba_pool_idx", None)
        if idx is not None:
            out[int(idx)] = f"{queue} request {req.rid}"

    for req in scheduler.waiting_queue:
        add(req, "waiting")
    if scheduler.running_batch is not None:
        for req in scheduler.running_batch.reqs:
            add(req, "running")
    if scheduler.chunked_req is not None:
        add(scheduler.chunked_req, "chunked")
    return out


def classify(scheduler: Any, at: int, error: BaseException) -> Finding:
    """SGLang's check named slots as leaked: held by a live request -> SGLang's check is wrong."""
    from kvledger.engines.sglang.scheduler.worker import TagMismatch

    text = str(error)
    if isinstance(error, TagMismatch):
        return Finding(at, "tag-mismatch", text)
    match = re.search(r"leaked_mamba_pages=\{([^}]*)\}", text)
    if match is None:
        return Finding(at, "crash", f"{type(error).__name__}: {text[:400]}")
    named = [int(x) for x in match.group(1).split(",") if x.strip()]
    holders = slot_holders(scheduler)
    owned = {n: holders[n] for n in named if n in holders}
    if owned:
        parts = [f"slot {n} is held by {who}" for n, who in owned.items()]
        return Finding(at, "sglang-check-wrong", "SGLang's check is wrong: " + "; ".join(parts), owned)
    return Finding(at, "leak", f"slots {named} have no live owner: a real leak ({text[:200]})")


def _prompt(rng: random.Random, prefixes: list[list[int]], limit: int) -> list[int]:
    base = rng.choice(prefixes) if rng.random() < 0.7 else []
    tail = [rng.randrange(1, 1000) for _ in range(rng.randint(1, 24))]
    return (base + tail)[: max(1, limit)]


def run(scheduler: Any, seed: int, n_ops: int) -> RunReport:
    """Draw ``n_ops`` operations from ``seed`` and run them; stops at the first failure."""
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
                rid = f"r{i}"
                op: tuple[Any, ...] = ("arrive", rid, tokens, rng.randint(1, 12))
                ops.append(op)
                live.append(arrive(scheduler, rid, tokens, op[3]))
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
