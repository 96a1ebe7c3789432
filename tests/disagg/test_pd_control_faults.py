"""Faults on control messages (issue 27 item 3): the decode's pre-allocation info (INIT), abort notices
from either side (ABORT) and the sender's drain acknowledgement (ACK) lost, delayed (so reordered) or
duplicated. Nothing is lost: every request ends with a reason (I-LIVENESS), every lease is released, the
pair drains to quiescence, and aborts drain within the bound (I-DRAIN, checked after every step)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.museum.exhibit import patched
from kvledger.reference.disagg import DECODE, PREFILL, Component, Fault, PDSystem
from kvledger.reference.disagg.channel import TransferChannel
from kvledger.reference.scheduler import ReqState
from tests.disagg.harness import build, expected, pd_spec, with_channel

PREFIX = list(range(10, 26))
CONTROL_FAULTS = [Fault.DROP, Fault.DELAY, Fault.DUPLICATE]


def _system() -> PDSystem:
    return build(with_channel(pd_spec(), control_retry=3, delay_steps=2))


def _step_until(system: PDSystem, cond: Callable[[], bool], limit: int = 100) -> None:
    for _ in range(limit):
        if cond():
            return
        system.step()
    raise AssertionError(f"not reached in {limit} steps: {system.describe()}")


def _drain(system: PDSystem) -> None:
    system.run_until_idle(1000)
    system.check_quiescent()  # leases released, rooms closed, I-DRAIN satisfied
    for p, d in system.pairs.values():
        assert p.state.is_done and p.finish_reason and d.state.is_done and d.finish_reason, (p, d)
        if d.state is ReqState.FINISHED:
            assert d.output_ids == expected(system, d.origin_input_ids, d.max_new_tokens)
    assert all(inst.lease_queue == [] for inst in system.instances())
    c = system.channel.config
    assert system.longest_drain <= c.drain_bound + 2 * max(c.control_retry, c.delay_steps)
    assert system.channel.drain_slack == {}  # forgotten once each aborted request drained


@pytest.mark.parametrize("fault", CONTROL_FAULTS)
def test_a_faulty_preallocation_message_still_transfers_every_request(fault: Fault) -> None:
    system = _system()
    system.channel.inject(Component.INIT, fault)
    for rid in range(3):
        system.add_request(rid, [*PREFIX, rid], 4)
    _drain(system)
    assert all(d.state is ReqState.FINISHED for _, d in system.pairs.values())
    assert system.channel.stats.faults[("init", fault.value)] == 1
    assert system.channel.stats.retransmissions == (1 if fault is Fault.DROP else 0)


@pytest.mark.parametrize("fault", CONTROL_FAULTS)
@pytest.mark.parametrize("component", [Component.ABORT, Component.ACK])
def test_a_faulty_decode_abort_or_acknowledgement_still_releases_the_lease(
    component: Component, fault: Fault
) -> None:
    """Deferred release (#35049): the decode aborts mid-transfer and leases its ids until the sender
    acknowledges; a lost abort or acknowledgement is sent again, a duplicate changes nothing."""
    system = _system()
    system.channel.inject(Component.KV, Fault.TIMEOUT)  # keeps a message in flight
    system.add_request(0, PREFIX, 3)
    system.add_request(1, [*PREFIX, 1], 3)
    _step_until(system, lambda: any(True for _ in system.channel.in_flight()))
    system.channel.inject(component, fault)
    system.abort(0, DECODE)
    d = system.pairs[0][1]
    assert d.owner.account.name == "pd.decode.lease"
    _drain(system)
    assert d.released and system.channel.stats.acks == 1
    assert system.pairs[1][1].state is ReqState.FINISHED
    assert system.channel.stats.faults[(component.value, fault.value)] == 1


@pytest.mark.parametrize("fault", CONTROL_FAULTS)
def test_a_faulty_prefill_abort_still_ends_the_decode_copy(fault: Fault) -> None:
    system = _system()
    system.add_request(0, PREFIX, 3)
    _step_until(system, lambda: system.pairs[0][1].state is ReqState.TRANSFER)
    system.channel.inject(Component.ABORT, fault)
    system.abort(0, PREFILL)
    _drain(system)
    p, d = system.pairs[0]
    assert p.state is ReqState.ABORTED and d.state.is_done


def test_random_control_faults_drain_with_every_request_ended() -> None:
    system = build(with_channel(pd_spec(decode_running=2), fault_rate=0.3, seed=7, control_retry=3))
    for rid in range(10):
        system.add_request(rid, [*PREFIX[: 6 + rid], rid], 3)
    for rid in (2, 5):
        system.step()
        system.abort(rid, DECODE if rid == 2 else PREFILL)
    _drain(system)
    faults = system.channel.stats.faults
    assert any(c in ("init", "abort", "ack") for c, _ in faults), faults


@pytest.mark.parametrize(
    ("component", "fault"),
    [(Component.ABORT, Fault.FAIL), (Component.ACK, Fault.TIMEOUT), (Component.KV, Fault.DUPLICATE)],
)
def test_a_fault_a_component_cannot_suffer_is_refused_and_nothing_is_queued(
    component: Component, fault: Fault
) -> None:
    system = _system()
    with pytest.raises(InvalidArgument, match="cannot suffer"):
        system.channel.inject(component, fault)
    assert system.channel._injected == []


@pytest.mark.fires("I-DRAIN")
def test_without_retransmission_a_lost_decode_abort_leaves_the_lease_undrained() -> None:
    """A planted bug: the retransmission timer does nothing. The decode's abort is lost, the sender
    never acknowledges, and the decode's lease holds its ids past the drain bound."""
    system = _system()
    system.add_request(0, PREFIX, 3)
    _step_until(system, lambda: system.pairs[0][1].state is ReqState.TRANSFER)
    system.channel.inject(Component.ABORT, Fault.DROP)
    with patched(TransferChannel, "_on_retry", lambda original: lambda self, room, sent: None):
        system.abort(0, DECODE)
        with pytest.raises(ContractViolation, match="I-DRAIN"):
            system.run_until_idle(200)
