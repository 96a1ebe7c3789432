"""The transfer channel's answers to calls about rooms it knows, has closed, or never opened; what a
landing copies; and quiescence asked for too early. (The refusals themselves, one per class of bad
input, are rows of the bad-input sweep, ``tests/sweep/cases_pd.py``.)"""

from __future__ import annotations

import pytest
import torch

from kvledger.contracts.errors import InvalidArgument, InvalidState, UnknownRoom
from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.kernels import poison_value
from kvledger.reference.config_fields import MAX_SIZE
from kvledger.reference.disagg import DECODE, PREFILL, Component, Fault, PDSystem, Poll
from kvledger.reference.disagg.landing import copy_metadata
from kvledger.reference.pools import MetadataBufferPool
from tests.disagg.harness import build, expected
from tests.levels import debug_level
from tests.sweep import snapshot


def _finished_system() -> PDSystem:
    system = build()
    system.add_request(0, [1, 2, 3], 2)
    system.run_until_idle(200)
    return system


def test_a_closed_room_is_known_answered_as_closed_and_never_reopened() -> None:
    system = _finished_system()
    ch = system.channel
    assert 1 not in ch.rooms  # request 0's room closed once both sides were done with it
    before = snapshot.take(system)
    assert ch.sender_status(1) is Poll.FAILED and ch.receiver_status(1) is Poll.FAILED
    assert ch.reads_drained(1) and ch.writes_drained(1) and not ch.writes_may_land(1)
    assert ch.failure_reason(1, PREFILL) == "room closed"
    ch.abort(1, DECODE, "a late abort")  # after the commit: nothing to tell anyone
    ch.close(1, PREFILL)
    assert not snapshot.differences(before, snapshot.take(system))
    with pytest.raises(InvalidArgument, match="used before"):
        ch.open(1, 3, expects_state=True)
    with pytest.raises(InvalidState, match="has closed"):
        ch.missing_components(1)
    with pytest.raises(UnknownRoom, match="never opened"):
        ch.sender_status(2)  # request 1 never arrived: room 2 was never opened
    assert not snapshot.differences(before, snapshot.take(system))


def test_an_injected_fault_is_counted_down_not_copied() -> None:
    """``times`` up to MAX_SIZE is one entry (no list of 2**31 copies); each message that draws it
    takes one."""
    system = build()
    system.channel.inject(Component.KV, Fault.DELAY, times=MAX_SIZE)
    assert len(system.channel._injected) == 1
    system.add_request(0, [1, 2, 3], 2)
    system.run_until_idle(200)
    system.check_quiescent()
    drawn = system.channel.stats.faults[("kv", "delay")]
    assert drawn >= 1
    assert system.channel._injected[0][3] == MAX_SIZE - drawn
    decode_req = system.pairs[0][1]
    assert decode_req.output_ids == expected(system, [1, 2, 3], 2)  # delayed, not lost


def test_check_quiescent_while_busy_is_the_callers_error() -> None:
    system = build()
    system.add_request(0, [1, 2, 3], 2)
    before = snapshot.take(system)
    with pytest.raises(InvalidState, match="I-QUIESCENT"):
        system.check_quiescent()
    assert not snapshot.differences(before, snapshot.take(system))
    system.run_until_idle(200)
    system.check_quiescent()  # at quiescence the checks run (and pass)


@pytest.mark.parametrize("source", ["never written", "freed"])
def test_a_landing_copies_the_raw_metadata(source: str) -> None:
    """The landing path is a raw copy through the kernels, not the checked ``store``: a room 0 (nothing
    written) or a poisoned slot (freed too early) lands as it is, for the decode's commit to refuse."""
    debug = debug_level(True)  # debug build: a freed slot is poisoned
    src, dst = MetadataBufferPool(2, name="p.meta", checks=debug), MetadataBufferPool(2, name="d.meta", checks=debug)
    owner = Owner("req", 1, REQ_RUNNING)
    slot = src.alloc(owner)
    assert slot is not None
    if source == "freed":
        src.set_buf(slot, 5, 9)
        src.free(slot, owner)
    target = dst.alloc(owner)
    assert target is not None
    copy_metadata(src, slot, dst, target)
    poison = int(poison_value(torch.int64))
    assert dst.read(target) == ((0, 0) if source == "never written" else (poison, poison))
