"""Recorded logs for the audit tests: small runs of the reference engine, and ways to plant a bug in one."""

from __future__ import annotations

import io
import json
from typing import Any

from kvledger.audit import Auditor, Recorder
from tests.scheduler.harness import Setup, build, ledgers

MAMBA = Setup(
    tree="mamba_radix", kv_tokens=256, rows=3, mamba_slots=6, chunk=8, mamba_strategy="no_buffer"
)  # V1
PAGED = Setup(tree="radix", hybrid=False, page_size=4, kv_tokens=256, rows=3, chunk=8, overlap=True)
PLAIN = Setup(tree="none", kv_tokens=160, rows=2, mamba_slots=3, chunk=None)
PROMPTS = {rid: [5, 5, 5, 5, 5, 5, 5, 5, rid % 3, rid, rid + 1] for rid in range(8)}


def record(
    spec: Setup, prompts: dict[int, list[int]] = PROMPTS, max_new: int = 5, abort: int | None = None
) -> list[str]:
    """The event log of ``prompts`` run to quiescence on ``spec`` (one line per event)."""
    sched = build(ledgers(spec))
    out = io.StringIO()
    with Recorder(sched, out, source="tests"):
        for rid, prompt in prompts.items():
            sched.add_request(rid, prompt, max_new)
        if abort is not None:
            sched.step()
            sched.abort(abort)
        sched.run_until_idle(2000)
    return out.getvalue().splitlines()


def events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


def first(lines: list[str], **match: Any) -> int:
    """The index (0-based) of the first line whose event has every ``match`` field."""
    for i, ev in enumerate(events(lines)):
        if all(ev.get(k) == v for k, v in match.items()):
            return i
    raise AssertionError(f"no event with {match}")


def lock_count_before(lines: list[str], index: int, node: int) -> int:
    """The lock count of ``node`` just before line ``index``, by replaying the log up to it."""
    auditor = Auditor()
    for i, line in enumerate(lines[:index], start=1):
        auditor.feed_line(line, i)
    return auditor.nodes[node].lock_ref
