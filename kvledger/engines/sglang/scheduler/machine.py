"""A Hypothesis state machine over SGLang's real scheduler loop, attached (generic rules only).

Rules: arrivals whose prompts may start with one of a few shared prefixes, follow-up turns (a finished
request's prompt + output + a new tail), one loop step, aborts of a live request from whatever queue it
is in (SGLang's own ``abort_request``), chunk sizes drawn per example. On a PD side whose transfer
backend can fail (0.5.23, ``--pd prefill|decode``): a live request's transfer fails, and time passes
(the fake sender's waiting deadline), both through :mod:`.pd_faults`. Pools are the default small shape
(64 KV tokens, 8 rows, 24 Mamba slots), so admissions fail for lack of room and decodes retract. Nothing
here is written for one bug: a failure is whatever the attach (:mod:`.ledgers`), SGLang's own strict
checks or the fake worker's tags raise, classified by :func:`.workload.classify`.

One SGLang release per process: :func:`machine_for` binds the release; :func:`hunt_machine` runs it.
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvledger.engines.sglang.scheduler.loop import STRICT_IDLE_CHECK, arrive, is_pd_prefill, step

TOKENS = st.integers(1, 999)


class SchedulerMachine(RuleBasedStateMachine):
    """Generic rules over SGLang's real scheduler loop, attached (a subclass per release: :func:`machine_for`)."""

    release: ClassVar[str] = ""
    examples = 0
    operations = 0
    transfer_failures = 0  # PD transfers the machine failed (pd_faults), and clock moves it made
    clock_moves = 0
    # the operations of the latest example, as repro ops (Hypothesis runs the shrunk failing example
    # last, so after a failure these are its operations) and the shape it was built with
    last_ops: ClassVar[list[tuple[Any, ...]]] = []
    last_shape: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.scheduler: Any = None
        self.prefixes: list[list[int]] = []
        self.live: list[Any] = []
        self.finished: list[Any] = []
        self.n = 0
        self.ops: list[tuple[Any, ...]] = []
        self.pd_failures = False
        type(self).examples += 1
        type(self).last_ops = self.ops

    @initialize(
        prefixes=st.lists(st.lists(TOKENS, min_size=4, max_size=20), min_size=1, max_size=3),
        chunk=st.sampled_from([8, 16, 32]),
    )
    def build(self, prefixes: list[list[int]], chunk: int) -> None:
        from kvledger.engines.sglang.scheduler.build import SchedulerShape, build_attached

        self.prefixes = prefixes
        type(self).last_shape = {"chunked_prefill_size": chunk}
        self.scheduler = build_attached(type(self).release, SchedulerShape(chunked_prefill_size=chunk))
        from kvledger.engines.sglang.scheduler.pd_faults import can_fail

        self.pd_failures = can_fail(self.scheduler)  # the PD sides of a release whose backend can fail

    def _arrive(self, tokens: list[int], max_new: int) -> None:
        type(self).operations += 1
        self.n += 1
        limit = self.scheduler.max_req_input_len
        # rids end in "." so SGLang's prefix match in abort_request (``startswith``) names one request
        rid, tokens = f"r{self.n}.", tokens[: max(1, limit)]
        self.ops.append(("arrive", rid, list(tokens), max_new))
        self.live.append(arrive(self.scheduler, rid, tokens, max_new))

    @rule(
        prefix=st.integers(0, 2),
        shared=st.booleans(),
        tail=st.lists(TOKENS, min_size=1, max_size=24),
        max_new=st.integers(1, 12),
    )
    def new_request(self, prefix: int, shared: bool, tail: list[int], max_new: int) -> None:
        base = self.prefixes[prefix % len(self.prefixes)] if shared else []
        self._arrive(base + tail, max_new)

    @precondition(lambda self: bool(self.finished))
    @rule(
        pick=st.integers(0, 1 << 16),
        tail=st.lists(TOKENS, min_size=1, max_size=6),
        max_new=st.integers(1, 12),
    )
    def follow_up(self, pick: int, tail: list[int], max_new: int) -> None:
        prev = self.finished[pick % len(self.finished)]
        self._arrive(list(prev.origin_input_ids) + list(prev.output_ids) + tail, max_new)

    @rule()
    def loop_step(self) -> None:
        type(self).operations += 1
        self.ops.append(("step",))
        step(self.scheduler)
        self.finished += [r for r in self.live if r.finished()]
        self.live = [r for r in self.live if not r.finished()]

    @precondition(lambda self: bool(self.live))
    @rule(pick=st.integers(0, 1 << 16))
    def abort(self, pick: int) -> None:
        from sglang.srt.managers.io_struct import AbortReq

        type(self).operations += 1
        req = self.live[pick % len(self.live)]
        self.ops.append(("abort", req.rid))
        self.scheduler.abort_request(AbortReq(rid=req.rid))
        if _gone(self.scheduler, req):  # popped from the waiting queue: gone for good
            self.live = [r for r in self.live if r is not req]

    def teardown(self) -> None:
        if self.scheduler is not None:
            self.scheduler.kvledger_watch.detach()


class PDFaultMachine(SchedulerMachine):
    """The machine on a PD side (``--pd prefill|decode``) with the two failure rules. A subclass, not two
    more rules on every machine: Hypothesis picks a rule by its index in the class's rule list, so rules
    that exist but never run would still change every other release's derandomized search (the 0.5.9
    budget that finds #16067 found nothing with them)."""

    @precondition(lambda self: self.pd_failures and bool(self.live))
    @rule(pick=st.integers(0, 1 << 16))
    def transfer_fails(self, pick: int) -> None:
        """A live request's KV transfer fails (PD sides of 0.5.23: :mod:`.pd_faults`); SGLang's failure
        path takes it from there at its next poll."""
        from kvledger.engines.sglang.scheduler.pd_faults import fail_transfer, open_transfers

        rids = list(open_transfers(self.scheduler))
        if not rids:
            return
        type(self).operations += 1
        rid = rids[pick % len(rids)]
        self.ops.append(("fail", rid))
        type(self).transfer_failures += fail_transfer(self.scheduler, rid)

    @precondition(lambda self: self.pd_failures and is_pd_prefill(self.scheduler))
    @rule(fraction=st.sampled_from([0.25, 0.5, 1.0, 2.0]))
    def time_passes(self, fraction: float) -> None:
        """The wall clock moves on by a fraction of SGLang's transfer waiting timeout (the fake sender's
        deadline, the prefill side's only: the fake receiver has none; a stepped loop is otherwise far
        faster than the clock)."""
        from kvledger.engines.sglang.scheduler.pd_faults import transfer_clock, waiting_timeout

        type(self).operations += 1
        seconds = fraction * waiting_timeout()
        self.ops.append(("clock", seconds))
        transfer_clock().advance(seconds)
        type(self).clock_moves += 1


def machine_for(release: str) -> type[RuleBasedStateMachine]:
    """The machine class over ``release`` (its examples counted in ``examples``): its own subclass, so
    its counters and its latest example's operations are its own."""
    from kvledger.engines.sglang.scheduler.build23 import PD_ENV

    base = PDFaultMachine if os.environ.get(PD_ENV) else SchedulerMachine
    name = f"{base.__name__}_{release.replace('.', '_')}"
    attrs = {
        "release": release,
        "examples": 0,
        "operations": 0,
        "transfer_failures": 0,
        "clock_moves": 0,
        "last_ops": [],
        "last_shape": {},
    }
    return type(name, (base,), attrs)


def _gone(scheduler: Any, req: Any) -> bool:
    from kvledger.engines.sglang.scheduler.ledgers import left_every_queue

    return left_every_queue(scheduler, req)


def hunt_machine(release: str, examples: int, steps: int) -> dict[str, Any]:
    """Run the machine (derandomized: the same budget draws the same examples in every release)."""
    from kvledger.engines.sglang.scheduler.workload import classify

    os.environ.setdefault(STRICT_IDLE_CHECK, "1")
    cls: Any = machine_for(release)
    config = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    cpu = time.process_time()
    finding = None
    try:
        run_state_machine_as_test(cls, settings=config)
    except Exception as error:  # the shrunk failure, re-raised by Hypothesis
        found = classify(None, -1, error)
        finding = {"kind": found.kind, "message": found.message[:600], "owners": found.owners}
    out: dict[str, Any] = {
        "release": release,
        "examples": cls.examples,
        "operations": cls.operations,
        "transfer_failures": cls.transfer_failures,
        "clock_moves": cls.clock_moves,
        "cpu_s": round(time.process_time() - cpu, 2),
        "finding": finding,
    }
    if finding is not None:
        out.update(_shrunk_repro(release, list(cls.last_ops), dict(cls.last_shape)))
    return out


def _shrunk_repro(release: str, ops: list[tuple[Any, ...]], shape: dict[str, Any]) -> dict[str, Any]:
    """The shrunk example's operations, replayed on a fresh scheduler (they must fail the same way)."""
    from dataclasses import asdict

    from kvledger.engines.sglang.scheduler.build import SchedulerShape, build_attached
    from kvledger.engines.sglang.scheduler.repro import replay

    again = replay(build_attached(release, SchedulerShape(**shape)), ops)
    return {
        "repro_ops": len(ops),
        "repro_shape": shape,
        "repro_finding": None if again is None else asdict(again),
        "repro": ops,
    }
