"""The generic scheduler state machine (``kvledger.museum.machines.scheduler``) under the loaded profile,
plus bad calls from whatever state the scheduler is in.

The machine lives in the package so ``kvledger hunt`` can run it against the museum's exhibits; here it
runs against the reference code: any failure is a bug of the reference (or of the machine). The test
subclass adds the bad-call rule: each bad call must raise a typed error and leave the full snapshot of
the scheduler, its pools and tree unchanged (``tests/sweep/snapshot.py``, test-only, hence not in the
package machine).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from kvledger.contracts.errors import (
    BatchNotInFlight,
    InvalidArgument,
    InvalidState,
    KVLedgerError,
)
from kvledger.museum.machines.scheduler import FAMILIES, SchedulerMachine, setups, v2_machine
from kvledger.reference.scheduler import ReqState, UnknownRequest
from tests.scheduler.harness import long_fuzz_settings
from tests.sweep import snapshot

__all__ = ["FAMILIES", "SchedulerMachine", "SchedulerMachineWithBadCalls", "setups"]

BadCall = tuple[str, type[KVLedgerError], Callable[[], object]]


def bad_calls(machine: SchedulerMachine) -> list[BadCall]:
    """The bad calls the current state allows: (what, typed error, call)."""
    sched = machine.sched
    nxt = machine.next_rid
    used = sorted(sched.requests)
    calls: list[BadCall] = [
        ("a generator prompt", InvalidArgument, lambda: sched.add_request(nxt, iter([1, 2]), 2)),
        ("an empty prompt", InvalidArgument, lambda: sched.add_request(nxt, [], 2)),
        ("a float token", InvalidArgument, lambda: sched.add_request(nxt, [1, 2.0], 2)),
        ("a token outside the vocabulary", InvalidArgument, lambda: sched.add_request(nxt, [1, 32000], 2)),
        ("a negative token", InvalidArgument, lambda: sched.add_request(nxt, [-1], 2)),
        ("max_new_tokens 0", InvalidArgument, lambda: sched.add_request(nxt, [1], 0)),
        ("abort of an unknown rid", UnknownRequest, lambda: sched.abort(nxt + 1000)),
        ("abort of a str rid", InvalidArgument, lambda: sched.abort("0")),
        ("a batch built outside step", InvalidState, sched.get_next_batch_to_run),
        ("a prefill built outside step", InvalidState, sched.get_new_batch_prefill),
        ("a decode built outside step", InvalidState, sched.update_running_batch),
        ("force_retract(0)", InvalidArgument, lambda: sched.force_retract(0)),
        ("run_until_idle(0)", InvalidArgument, lambda: sched.run_until_idle(0)),
        ("an unknown fault kind", InvalidArgument, lambda: sched.faults.fail_next("disk")),
        ("retract of None", InvalidArgument, lambda: sched.retract(None)),  # type: ignore[arg-type]
    ]
    if used:
        rid = used[-1]
        calls.append(("a used rid", InvalidArgument, lambda: sched.add_request(rid, [1], 2)))
    in_flight = {id(r) for b in sched.inflight for r in b.reqs}
    for req in list(sched.requests.values()):
        if req not in sched.running or req.state is not ReqState.RUNNING or id(req) in in_flight:
            calls.append((f"retract of a {req.state.value} request", InvalidState, lambda r=req: sched.retract(r)))
    for batch in machine.launched:
        if not sched.inflight or sched.inflight[0] is not batch:
            calls.append(("re-processing a batch", BatchNotInFlight, lambda b=batch: sched.process_batch_result(b)))
    return calls


class SchedulerMachineWithBadCalls(SchedulerMachine):
    @rule(data=st.data())
    def bad_call(self, data: st.DataObject) -> None:
        what, error, call = data.draw(st.sampled_from(bad_calls(self)), label="bad call")
        before = snapshot.take(self.sched)
        try:
            call()
        except KVLedgerError as exc:
            assert isinstance(exc, error), f"{what}: expected {error.__name__}, got {type(exc).__name__}: {exc}"
        else:
            raise AssertionError(f"{what}: accepted although bad")
        changed = snapshot.differences(before, snapshot.take(self.sched))
        assert not changed, f"{what}: refused but changed {changed}"
        event(f"bad call: {what.split(' request')[0]}")


TestSchedulerMachine = SchedulerMachineWithBadCalls.TestCase

V2_BUDGET = settings(settings(), max_examples=25)  # each page size on its own: V2 at 1, 4 and 16 in CI
TestSchedulerMachineV2Page1 = v2_machine(1).TestCase
TestSchedulerMachineV2Page4 = v2_machine(4).TestCase
TestSchedulerMachineV2Page16 = v2_machine(16).TestCase
for _case in (TestSchedulerMachineV2Page1, TestSchedulerMachineV2Page4, TestSchedulerMachineV2Page16):
    _case.settings = V2_BUDGET
del _case


@pytest.mark.deep
@pytest.mark.timeout(3600)  # its own budget, not the suite's 600 s default
def test_scheduler_machine_long_fuzz() -> None:
    """Nightly-style fuzzing: ``pytest -m deep`` (excluded from the default run)."""
    run_state_machine_as_test(SchedulerMachineWithBadCalls, settings=long_fuzz_settings(3000, 120))
