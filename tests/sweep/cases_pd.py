"""Bad calls on the PD parts: ``MetadataBufferPool``, ``PDSystem``, ``PDSpec``, ``ChannelConfig`` and
``build_pd`` (the system's entry points), plus the scheduler's arrival check the system calls on both
instances (``Scheduler.validate_arrival``).

Scenes (``tests/sweep/scenes.py``): ``metadata``, a pool with slots held by ``a`` (one written) and ``b``;
``pd``, a system with a finished request (rid 0), one between the instances (1) and one waiting (2).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kvledger.reference.config_fields import MAX_SIZE
from kvledger.reference.disagg import (
    DECODE,
    PREFILL,
    ChannelConfig,
    Component,
    DecodeScheduler,
    Fault,
    PDScheduler,
    PDSpec,
    PDSystem,
    PrefillScheduler,
    TransferChannel,
    build_pd,
)
from kvledger.reference.disagg.messages import DstInfo, Send
from kvledger.reference.engine import EngineSpec
from kvledger.reference.engine import build_parts as _build_parts
from kvledger.reference.pools import MetadataBufferPool
from tests.sweep.scenes import Scene
from tests.sweep.table import (
    DEGENERATE,
    DOUBLE,
    DUPLICATE,
    FOREIGN,
    NEGATIVE,
    OUT_OF_RANGE,
    WRONG_STATE,
    WRONG_TYPE,
    Case,
    Query,
    Row,
    method_cases,
)

Meta: Any = MetadataBufferPool  # typed as Any: the wrong-type arguments below are deliberate
System: Any = PDSystem
Spec: Any = PDSpec
Chan: Any = ChannelConfig
build: Any = build_pd
build_parts: Any = _build_parts


def _t(*ids: Any) -> torch.Tensor:
    return torch.tensor(list(ids), dtype=torch.int64)


def _col(*values: int) -> torch.Tensor:
    return torch.tensor([[v] for v in values], dtype=torch.int64)


# ---------------------------------------------------------------------- the metadata pool
META: dict[str, list[Row]] = {
    "__init__": [
        Row(DEGENERATE, "size 0", "InvalidArgument", lambda s: Meta(0)),
        Row(NEGATIVE, "a negative size", "InvalidArgument", lambda s: Meta(-2)),
        Row(WRONG_TYPE, "a float size", "InvalidArgument", lambda s: Meta(2.0)),
        Row(WRONG_TYPE, "a None name", "InvalidArgument", lambda s: Meta(2, name=None)),
        Row(WRONG_TYPE, "an unknown device", "InvalidArgument", lambda s: Meta(2, device="nowhere")),
        Row(OUT_OF_RANGE, "size 2**62 (beyond MAX_SIZE)", "SizeOutOfRange", lambda s: Meta(2**62)),
        Row(WRONG_TYPE, "a bool size", "InvalidArgument", lambda s: Meta(True)),
        Row(WRONG_TYPE, "a numpy int size", "InvalidArgument", lambda s: Meta(np.int64(4))),
    ],
    "alloc": [
        Row(WRONG_TYPE, "a None owner", "InvalidArgument", lambda s: s.pool.alloc(None)),
        Row(WRONG_TYPE, "a str owner", "InvalidArgument", lambda s: s.pool.alloc("req-1")),
    ],
    "free": [
        Row(NEGATIVE, "a negative slot", "KVLedgerError", lambda s: s.pool.free(-1, s.a)),
        Row(OUT_OF_RANGE, "a slot beyond the pool", "SlotOutOfRange", lambda s: s.pool.free(99, s.a)),
        Row(WRONG_TYPE, "a float slot", "InvalidArgument", lambda s: s.pool.free(1.0, s.a)),
        Row(WRONG_TYPE, "a None owner", "InvalidArgument", lambda s: s.pool.free(s.a_ids[0], None)),
        Row(DOUBLE, "a free slot", "DoubleFree", lambda s: s.pool.free(s.free_ids[0], s.a)),
        Row(FOREIGN, "another owner's slot", "ForeignSlot", lambda s: s.pool.free(s.b_ids[0], s.a), True),
    ],
    "set_buf": [
        Row(WRONG_STATE, "a free slot", "InvalidArgument", lambda s: s.pool.set_buf(s.free_ids[0], 5, 1)),
        Row(NEGATIVE, "a negative slot", "InvalidArgument", lambda s: s.pool.set_buf(-1, 5, 1)),
        Row(OUT_OF_RANGE, "a slot beyond the pool", "InvalidArgument", lambda s: s.pool.set_buf(99, 5, 1)),
        Row(
            DEGENERATE,
            "room 0 (the empty mark)",
            "InvalidArgument",
            lambda s: s.pool.set_buf(s.a_ids[1], 0, 1),
        ),
        Row(NEGATIVE, "a negative room", "InvalidArgument", lambda s: s.pool.set_buf(s.a_ids[1], -3, 1)),
        Row(
            NEGATIVE, "a negative output id", "InvalidArgument", lambda s: s.pool.set_buf(s.a_ids[1], 5, -1)
        ),
        Row(WRONG_TYPE, "a float room", "InvalidArgument", lambda s: s.pool.set_buf(s.a_ids[1], 5.0, 1)),
        Row(OUT_OF_RANGE, "a room beyond int64", "InvalidArgument", lambda s: s.pool.set_buf(s.a_ids[1], 2**70, 1)),
        Row(
            OUT_OF_RANGE,
            "an output id beyond int64",
            "InvalidArgument",
            lambda s: s.pool.set_buf(s.a_ids[1], 5, 2**70),
        ),
        Row(WRONG_TYPE, "a bool room", "InvalidArgument", lambda s: s.pool.set_buf(s.a_ids[1], True, 1)),
        Row(WRONG_TYPE, "a numpy int room", "InvalidArgument", lambda s: s.pool.set_buf(s.a_ids[1], np.int64(5), 1)),
        Row(WRONG_TYPE, "a numpy int slot", "InvalidArgument", lambda s: s.pool.set_buf(np.int64(s.a_ids[1]), 5, 1)),
    ],
    "store": [
        Row(
            WRONG_STATE,
            "a free slot",
            "InvalidArgument",
            lambda s: s.pool.store(_t(s.free_ids[0]), _col(5), _col(1)),
        ),
        Row(NEGATIVE, "a negative slot", "SlotOutOfRange", lambda s: s.pool.store(_t(-1), _col(5), _col(1))),
        Row(
            OUT_OF_RANGE,
            "a slot beyond the pool",
            "SlotOutOfRange",
            lambda s: s.pool.store(_t(99), _col(5), _col(1)),
        ),
        Row(
            DUPLICATE,
            "a slot twice",
            "DuplicateIds",
            lambda s: s.pool.store(_t(s.a_ids[1], s.a_ids[1]), _col(5, 6), _col(1, 2)),
        ),
        Row(
            DEGENERATE,
            "rooms of the wrong shape",
            "InvalidArgument",
            lambda s: s.pool.store(_t(s.a_ids[1]), _t(5), _col(1)),
        ),
        Row(
            WRONG_TYPE,
            "float output ids",
            "InvalidArgument",
            lambda s: s.pool.store(_t(s.a_ids[1]), _col(5), torch.ones(1, 1)),
        ),
        Row(
            WRONG_TYPE,
            "float slots",
            "InvalidArgument",
            lambda s: s.pool.store(torch.ones(1), _col(5), _col(1)),
        ),
        Row(
            WRONG_TYPE,
            "a list of rooms",
            "InvalidArgument",
            lambda s: s.pool.store(_t(s.a_ids[1]), [[5]], _col(1)),
        ),
        Row(NEGATIVE, "a negative room", "InvalidArgument", lambda s: s.pool.store(_t(s.a_ids[1]), _col(-5), _col(1))),
        Row(
            DEGENERATE,
            "room 0 (the empty mark)",
            "InvalidArgument",
            lambda s: s.pool.store(_t(s.a_ids[1]), _col(0), _col(1)),
        ),
        Row(
            NEGATIVE,
            "a negative output id",
            "InvalidArgument",
            lambda s: s.pool.store(_t(s.a_ids[1]), _col(5), _col(-1)),
        ),
        Row(
            WRONG_TYPE,
            "rooms on another device",
            "InvalidArgument",
            lambda s: s.pool.store(_t(s.a_ids[1]), torch.ones(1, 1, dtype=torch.int64, device="meta"), _col(1)),
        ),
        Row(
            WRONG_TYPE,
            "bool rooms",
            "InvalidArgument",
            lambda s: s.pool.store(_t(s.a_ids[1]), torch.ones(1, 1, dtype=torch.bool), _col(1)),
        ),
    ],
    "gather": [
        Row(NEGATIVE, "a negative slot", "SlotOutOfRange", lambda s: s.pool.gather(_t(-1))),
        Row(OUT_OF_RANGE, "a slot beyond the pool", "SlotOutOfRange", lambda s: s.pool.gather(_t(99))),
        Row(WRONG_TYPE, "float slots", "InvalidArgument", lambda s: s.pool.gather(torch.zeros(1))),
    ],
    "read": [
        Row(NEGATIVE, "a negative slot (would wrap)", "KVLedgerError", lambda s: s.pool.read(-1)),
        Row(OUT_OF_RANGE, "a slot beyond the pool", "SlotOutOfRange", lambda s: s.pool.read(99)),
        Row(WRONG_TYPE, "a float slot", "InvalidArgument", lambda s: s.pool.read(0.5)),
        Row(WRONG_TYPE, "a None slot", "InvalidArgument", lambda s: s.pool.read(None)),
    ],
    "poisoned": [
        Row(NEGATIVE, "a negative slot (would wrap)", "KVLedgerError", lambda s: s.pool.poisoned(-1)),
        Row(OUT_OF_RANGE, "a slot beyond the pool", "SlotOutOfRange", lambda s: s.pool.poisoned(99)),
        Row(WRONG_TYPE, "a str slot", "InvalidArgument", lambda s: s.pool.poisoned("0")),
    ],
}


# ---------------------------------------------------------------------- the system and its builder
def _system_with(**kw: Any) -> object:
    s = build(PDSpec())
    args = {"prefill": s.prefill, "decode": s.decode, "channel": s.channel, **kw}
    return System(args["prefill"], args["decode"], args["channel"])


SYSTEM_INIT: list[Row] = [
    Row(WRONG_TYPE, "a None prefill", "InvalidArgument", lambda s: _system_with(prefill=None)),
    Row(
        WRONG_TYPE,
        "the decode as the prefill",
        "InvalidArgument",
        lambda s: _system_with(prefill=build(PDSpec()).decode),
    ),
    Row(WRONG_TYPE, "a dict channel", "InvalidArgument", lambda s: _system_with(channel={})),
    Row(
        FOREIGN,
        "another system's channel",
        "InvalidArgument",
        lambda s: _system_with(channel=TransferChannel()),
    ),
]

ADD: list[Row] = [
    Row(WRONG_TYPE, "a str rid", "InvalidArgument", lambda s: s.system.add_request("9", [1, 2], 2)),
    Row(NEGATIVE, "a negative rid", "InvalidArgument", lambda s: s.system.add_request(-1, [1, 2], 2)),
    Row(OUT_OF_RANGE, "a rid beyond int64", "InvalidArgument", lambda s: s.system.add_request(2**70, [1, 2], 2)),
    Row(
        OUT_OF_RANGE,
        "a rid whose room would not fit int64",
        "InvalidArgument",
        lambda s: s.system.add_request(2**63 - 1, [1, 2], 2),
    ),
    Row(WRONG_TYPE, "a numpy int rid", "InvalidArgument", lambda s: s.system.add_request(np.int64(9), [1, 2], 2)),
    Row(WRONG_TYPE, "a bool rid", "InvalidArgument", lambda s: s.system.add_request(True, [1, 2], 2)),
    Row(DUPLICATE, "a rid in use", "InvalidArgument", lambda s: s.system.add_request(1, [1, 2], 2)),
    Row(
        DUPLICATE,
        "the rid of a finished request",
        "InvalidArgument",
        lambda s: s.system.add_request(0, [1, 2], 2),
    ),
    Row(
        WRONG_TYPE,
        "a generator prompt",
        "InvalidArgument",
        lambda s: s.system.add_request(9, iter([1, 2]), 2),
    ),
    Row(DEGENERATE, "an empty prompt", "InvalidArgument", lambda s: s.system.add_request(9, [], 2)),
    Row(
        OUT_OF_RANGE,
        "a token outside the vocabulary",
        "InvalidArgument",
        lambda s: s.system.add_request(9, [1, 10**6], 2),
    ),
    Row(NEGATIVE, "a negative token", "InvalidArgument", lambda s: s.system.add_request(9, [-1], 2)),
    Row(DEGENERATE, "max_new_tokens 0", "InvalidArgument", lambda s: s.system.add_request(9, [1], 0)),
    Row(
        WRONG_TYPE, "a float max_new_tokens", "InvalidArgument", lambda s: s.system.add_request(9, [1], 2.0)
    ),
]

ABORT: list[Row] = [
    Row(WRONG_TYPE, "a str rid", "InvalidArgument", lambda s: s.system.abort("1")),
    Row(FOREIGN, "an unknown rid", "UnknownRequest", lambda s: s.system.abort(77)),
    Row(WRONG_TYPE, "an unknown side", "InvalidArgument", lambda s: s.system.abort(1, "router")),
    Row(WRONG_TYPE, "a None side", "InvalidArgument", lambda s: s.system.abort(1, None)),
    Row(NEGATIVE, "a negative rid", "InvalidArgument", lambda s: s.system.abort(-1)),
    Row(OUT_OF_RANGE, "a rid beyond int64", "InvalidArgument", lambda s: s.system.abort(2**70)),
]

CHECK_QUIESCENT: list[Row] = [
    Row(WRONG_STATE, "while the system is busy", "InvalidState", lambda s: s.system.check_quiescent()),
]

RUN: list[Row] = [
    Row(DEGENERATE, "max_steps 0", "InvalidArgument", lambda s: s.system.run_until_idle(0)),
    Row(WRONG_TYPE, "a float max_steps", "InvalidArgument", lambda s: s.system.run_until_idle(2.5)),
]

VALIDATE: list[Row] = [
    Row(DUPLICATE, "a rid in use", "InvalidArgument", lambda s: s.sched.validate_arrival(1, [1], 2)),
    Row(WRONG_TYPE, "a bool rid", "InvalidArgument", lambda s: s.sched.validate_arrival(True, [1], 2)),
    Row(
        WRONG_TYPE,
        "a generator prompt",
        "InvalidArgument",
        lambda s: s.sched.validate_arrival(9, iter([1]), 2),
    ),
    Row(
        OUT_OF_RANGE,
        "a token outside the vocabulary",
        "InvalidArgument",
        lambda s: s.sched.validate_arrival(9, [10**6], 2),
    ),
    Row(DEGENERATE, "max_new_tokens 0", "InvalidArgument", lambda s: s.sched.validate_arrival(9, [1], 0)),
]

SPEC: list[Row] = [
    Row(WRONG_TYPE, "a None prefill spec", "InvalidArgument", lambda s: Spec(prefill=None)),
    Row(WRONG_TYPE, "a dict channel", "InvalidArgument", lambda s: Spec(channel={"latency": 1})),
    Row(WRONG_TYPE, "a float pre_alloc_size", "InvalidArgument", lambda s: Spec(pre_alloc_size=2.0)),
    Row(NEGATIVE, "a negative pre_alloc_size", "InvalidArgument", lambda s: Spec(pre_alloc_size=-1)),
    Row(DEGENERATE, "zero metadata slots", "InvalidArgument", lambda s: Spec(decode_metadata_slots=0)),
    Row(NEGATIVE, "negative reserved tokens", "InvalidArgument", lambda s: Spec(reserved_decode_tokens=-1)),
    *(
        Row(OUT_OF_RANGE, f"{name} 2**70", "SizeOutOfRange", lambda s, n=name: Spec(**{n: 2**70}))
        for name in ("pre_alloc_size", "prefill_metadata_slots", "decode_metadata_slots", "reserved_decode_tokens")
    ),
    Row(
        OUT_OF_RANGE,
        "decode rows (max_running + pre_alloc_size) beyond MAX_SIZE",
        "SizeOutOfRange",
        lambda s: Spec(pre_alloc_size=MAX_SIZE),
    ),
    Row(WRONG_TYPE, "a bool pre_alloc_size", "InvalidArgument", lambda s: Spec(pre_alloc_size=True)),
    Row(
        WRONG_STATE,
        "a decode with a radix cache",
        "InvalidArgument",
        lambda s: Spec(decode=EngineSpec(tree="radix")),
    ),
    Row(
        FOREIGN,
        "instances that disagree on the page size",
        "InvalidArgument",
        lambda s: Spec(
            prefill=EngineSpec(tree="radix", page_size=2, kv_tokens=64), decode=EngineSpec(tree="none")
        ),
    ),
]

CHANNEL: list[Row] = [
    Row(DEGENERATE, "latency 0", "InvalidArgument", lambda s: Chan(latency=0)),
    Row(WRONG_TYPE, "a float latency", "InvalidArgument", lambda s: Chan(latency=1.5)),
    Row(WRONG_TYPE, "a bool seed", "InvalidArgument", lambda s: Chan(seed=True)),
    Row(NEGATIVE, "a negative delay", "InvalidArgument", lambda s: Chan(delay_steps=-1)),
    Row(OUT_OF_RANGE, "a fault rate above 1", "InvalidArgument", lambda s: Chan(fault_rate=1.5)),
    Row(WRONG_TYPE, "a NaN fault rate", "InvalidArgument", lambda s: Chan(fault_rate=float("nan"))),
    *(
        Row(OUT_OF_RANGE, f"{name} 2**70", "SizeOutOfRange", lambda s, n=name: Chan(**{n: 2**70}))
        for name in ("latency", "delay_steps", "bootstrap_timeout", "transfer_timeout", "message_timeout")
    ),
    Row(WRONG_TYPE, "a numpy int latency", "InvalidArgument", lambda s: Chan(latency=np.int64(1))),
]

CHANNEL_INIT: list[Row] = [
    Row(WRONG_TYPE, "a dict config", "InvalidArgument", lambda s: TransferChannel({"latency": 1})),
    Row(
        WRONG_TYPE, "an EngineSpec as the config", "InvalidArgument", lambda s: TransferChannel(EngineSpec())
    ),
]

# ---------------------------------------------------------------------- the transfer channel (scene "pd":
# room 1 closed (request 0 finished), room 2 initialised with messages in flight, room 3 open, not
# initialised; room 77 never opened)
def _ch(s: Scene) -> Any:
    return s.system.channel


def _dst(n: int, **kw: Any) -> DstInfo:
    fields: dict[str, Any] = {"kv_slots": list(range(1, n + 1)), "mamba_slot": 1, "meta_idx": 0, "row": 1, **kw}
    return DstInfo(**fields)


def _send(start: int, end: int, **kw: Any) -> Send:
    n = end - start
    fields: dict[str, Any] = {"src_slots": list(range(1, n + 1)), "tokens": [1] * n, **kw}
    return Send(start, end, **fields)


UNKNOWN_ROOM = 77
CLOSED_ROOM = 1

CHANNEL_ROWS: dict[str, list[Row]] = {
    "inject": [
        Row(WRONG_TYPE, "an unknown component", "InvalidArgument", lambda s: _ch(s).inject("disk", Fault.DROP)),
        Row(WRONG_TYPE, "an unknown fault", "InvalidArgument", lambda s: _ch(s).inject(Component.KV, "explode")),
        Row(WRONG_TYPE, "a None component", "InvalidArgument", lambda s: _ch(s).inject(None, Fault.DROP)),
        Row(WRONG_TYPE, "a fault as the component", "InvalidArgument", lambda s: _ch(s).inject(Fault.DROP, Fault.DROP)),
        Row(
            OUT_OF_RANGE,
            "times 2**40",
            "SizeOutOfRange",
            lambda s: _ch(s).inject(Component.KV, Fault.DROP, times=2**40),
        ),
        Row(WRONG_TYPE, "times 1.5", "InvalidArgument", lambda s: _ch(s).inject(Component.KV, Fault.DROP, times=1.5)),
        Row(DEGENERATE, "times 0", "InvalidArgument", lambda s: _ch(s).inject(Component.KV, Fault.DROP, times=0)),
        Row(NEGATIVE, "times -1", "InvalidArgument", lambda s: _ch(s).inject(Component.KV, Fault.DROP, times=-1)),
        Row(WRONG_TYPE, "times True", "InvalidArgument", lambda s: _ch(s).inject(Component.KV, Fault.DROP, times=True)),
        Row(
            WRONG_TYPE,
            "a numpy int times",
            "InvalidArgument",
            lambda s: _ch(s).inject(Component.KV, Fault.DROP, times=np.int64(2)),
        ),
        Row(
            FOREIGN,
            "a room never opened (a fault that could never fire)",
            "UnknownRoom",
            lambda s: _ch(s).inject(Component.KV, Fault.DROP, room=UNKNOWN_ROOM),
        ),
        Row(
            WRONG_STATE,
            "a closed room",
            "InvalidState",
            lambda s: _ch(s).inject(Component.KV, Fault.DROP, room=CLOSED_ROOM),
        ),
        Row(DEGENERATE, "room 0", "InvalidArgument", lambda s: _ch(s).inject(Component.KV, Fault.DROP, room=0)),
        Row(WRONG_TYPE, "a str room", "InvalidArgument", lambda s: _ch(s).inject(Component.KV, Fault.DROP, room="2")),
    ],
    "open": [
        Row(DUPLICATE, "an open room", "InvalidArgument", lambda s: _ch(s).open(2, 3, expects_state=True)),
        Row(DOUBLE, "a closed room", "InvalidArgument", lambda s: _ch(s).open(CLOSED_ROOM, 3, expects_state=True)),
        Row(DEGENERATE, "room 0", "InvalidArgument", lambda s: _ch(s).open(0, 3, expects_state=True)),
        Row(
            OUT_OF_RANGE, "a room beyond int64", "InvalidArgument", lambda s: _ch(s).open(2**70, 3, expects_state=True)
        ),
        Row(DEGENERATE, "plan_len 0", "InvalidArgument", lambda s: _ch(s).open(9, 0, expects_state=True)),
        Row(OUT_OF_RANGE, "plan_len 2**40", "SizeOutOfRange", lambda s: _ch(s).open(9, 2**40, expects_state=True)),
        Row(WRONG_TYPE, "an int expects_state", "InvalidArgument", lambda s: _ch(s).open(9, 3, expects_state=1)),
    ],
    "close": [
        Row(FOREIGN, "a room never opened", "UnknownRoom", lambda s: _ch(s).close(UNKNOWN_ROOM, DECODE)),
        Row(WRONG_TYPE, "an unknown side", "InvalidArgument", lambda s: _ch(s).close(2, "router")),
        Row(WRONG_TYPE, "a None side", "InvalidArgument", lambda s: _ch(s).close(2, None)),
        Row(NEGATIVE, "a negative room", "InvalidArgument", lambda s: _ch(s).close(-2, DECODE)),
    ],
    "abort": [
        Row(WRONG_TYPE, "an unknown side", "InvalidArgument", lambda s: _ch(s).abort(3, "x", "bad side")),
        Row(FOREIGN, "a room never opened", "UnknownRoom", lambda s: _ch(s).abort(UNKNOWN_ROOM, DECODE, "r")),
        Row(WRONG_TYPE, "a None reason", "InvalidArgument", lambda s: _ch(s).abort(3, PREFILL, None)),
        Row(WRONG_TYPE, "a bool room", "InvalidArgument", lambda s: _ch(s).abort(True, PREFILL, "r")),
    ],
    "sender_status": [
        Row(FOREIGN, "a room never opened", "UnknownRoom", lambda s: _ch(s).sender_status(UNKNOWN_ROOM)),
        Row(DEGENERATE, "room 0", "InvalidArgument", lambda s: _ch(s).sender_status(0)),
        Row(WRONG_TYPE, "a str room", "InvalidArgument", lambda s: _ch(s).sender_status("2")),
    ],
    "receiver_status": [
        Row(FOREIGN, "a room never opened", "UnknownRoom", lambda s: _ch(s).receiver_status(UNKNOWN_ROOM)),
        Row(NEGATIVE, "a negative room", "InvalidArgument", lambda s: _ch(s).receiver_status(-1)),
        Row(WRONG_TYPE, "a numpy int room", "InvalidArgument", lambda s: _ch(s).receiver_status(np.int64(2))),
    ],
    "failure_reason": [
        Row(WRONG_TYPE, "an unknown side", "InvalidArgument", lambda s: _ch(s).failure_reason(2, "x")),
        Row(FOREIGN, "a room never opened", "UnknownRoom", lambda s: _ch(s).failure_reason(UNKNOWN_ROOM, DECODE)),
    ],
    "missing_components": [
        Row(FOREIGN, "a room never opened", "UnknownRoom", lambda s: _ch(s).missing_components(UNKNOWN_ROOM)),
        Row(WRONG_STATE, "a closed room", "InvalidState", lambda s: _ch(s).missing_components(CLOSED_ROOM)),
        Row(WRONG_TYPE, "a float room", "InvalidArgument", lambda s: _ch(s).missing_components(2.0)),
    ],
    "init_receiver": [
        Row(FOREIGN, "a room never opened", "UnknownRoom", lambda s: _ch(s).init_receiver(999, _dst(3))),
        Row(WRONG_STATE, "a closed room", "InvalidState", lambda s: _ch(s).init_receiver(CLOSED_ROOM, _dst(3))),
        Row(WRONG_TYPE, "a None dst", "InvalidArgument", lambda s: _ch(s).init_receiver(3, None)),
        Row(DOUBLE, "a room already initialised", "InvalidState", lambda s: _ch(s).init_receiver(2, _dst(19))),
        Row(DEGENERATE, "slots for another plan length", "InvalidArgument", lambda s: _ch(s).init_receiver(3, _dst(4))),
        Row(
            NEGATIVE,
            "a negative KV slot",
            "InvalidArgument",
            lambda s: _ch(s).init_receiver(3, _dst(3, kv_slots=[1, -2, 3])),
        ),
        Row(
            OUT_OF_RANGE,
            "a metadata slot beyond the decode's pool",
            "InvalidArgument",
            lambda s: _ch(s).init_receiver(3, _dst(3, meta_idx=10**6)),
        ),
        Row(
            OUT_OF_RANGE,
            "a Mamba slot beyond the decode's pool",
            "InvalidArgument",
            lambda s: _ch(s).init_receiver(3, _dst(3, mamba_slot=10**6)),
        ),
        Row(WRONG_TYPE, "a float row", "InvalidArgument", lambda s: _ch(s).init_receiver(3, _dst(3, row=1.0))),
        Row(
            WRONG_TYPE,
            "an int for the KV slots",
            "InvalidArgument",
            lambda s: _ch(s).init_receiver(3, _dst(3, kv_slots=3)),
        ),
        Row(
            WRONG_TYPE,
            "a list metadata slot",
            "InvalidArgument",
            lambda s: _ch(s).init_receiver(3, _dst(3, meta_idx=[0])),
        ),
    ],
    "send_chunk": [
        Row(
            FOREIGN,
            "a room never opened",
            "UnknownRoom",
            lambda s: _ch(s).send_chunk(UNKNOWN_ROOM, _send(0, 1), last=False),
        ),
        Row(WRONG_TYPE, "a None send", "InvalidArgument", lambda s: _ch(s).send_chunk(3, None, last=False)),
        Row(WRONG_TYPE, "a str last", "InvalidArgument", lambda s: _ch(s).send_chunk(3, _send(0, 1), last="yes")),
        Row(
            DEGENERATE,
            "a chunk that does not continue the positions sent",
            "InvalidArgument",
            lambda s: _ch(s).send_chunk(3, _send(1, 2), last=False),
        ),
        Row(
            OUT_OF_RANGE,
            "a chunk beyond the plan",
            "InvalidArgument",
            lambda s: _ch(s).send_chunk(3, _send(0, 5), last=False),
        ),
        Row(
            DEGENERATE,
            "fewer source slots than positions",
            "InvalidArgument",
            lambda s: _ch(s).send_chunk(3, _send(0, 2, src_slots=[1]), last=False),
        ),
        Row(
            WRONG_TYPE,
            "an int for the source slots",
            "InvalidArgument",
            lambda s: _ch(s).send_chunk(3, _send(0, 1, src_slots=1), last=False),
        ),
        Row(
            NEGATIVE,
            "a negative source slot",
            "InvalidArgument",
            lambda s: _ch(s).send_chunk(3, _send(0, 2, src_slots=[1, -1]), last=False),
        ),
        Row(
            DEGENERATE,
            "a chunk that runs backwards",
            "InvalidArgument",
            lambda s: _ch(s).send_chunk(3, Send(2, 1, [], []), last=False),
        ),
    ],
    **{
        name: [
            Row(FOREIGN, "a room never opened", "UnknownRoom", lambda s, n=name: getattr(_ch(s), n)(UNKNOWN_ROOM)),
            Row(WRONG_TYPE, "a bool room", "InvalidArgument", lambda s, n=name: getattr(_ch(s), n)(True)),
        ]
        for name in ("request_drain", "writes_may_land", "writes_drained", "reads_drained", "describe_room")
    },
    "advance": [
        Row(NEGATIVE, "a time before now", "InvalidArgument", lambda s: _ch(s).advance(_ch(s).now - 1)),
        Row(WRONG_TYPE, "a float time", "InvalidArgument", lambda s: _ch(s).advance(9.5)),
        Row(WRONG_TYPE, "a None time", "InvalidArgument", lambda s: _ch(s).advance(None)),
    ],
    "attach": [
        Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: _ch(s).attach(None, None)),
        Row(
            WRONG_TYPE,
            "a pool instead of the instance data",
            "InvalidArgument",
            lambda s: _ch(s).attach(s.system.prefill.metadata_pool, s.system.decode.metadata_pool),
        ),
    ],
}


# ---------------------------------------------------------------------- a PD instance's own arrival
INSTANCE_ADD: list[Row] = [
    Row(
        DEGENERATE,
        "no room (the prefill side)",
        "InvalidArgument",
        lambda s: s.system.prefill.add_request(9, [1, 2], 2),
    ),
    Row(
        DEGENERATE,
        "no room (the decode side)",
        "InvalidArgument",
        lambda s: s.system.decode.add_request(9, [1, 2], 2),
    ),
    Row(
        FOREIGN,
        "a room not open on the channel",
        "UnknownRoom",
        lambda s: s.system.decode.add_request(9, [1, 2], 2, bootstrap_room=UNKNOWN_ROOM),
    ),
    Row(
        DEGENERATE,
        "room 0",
        "InvalidArgument",
        lambda s: s.system.decode.add_request(9, [1, 2], 2, bootstrap_room=0),
    ),
    Row(
        WRONG_TYPE,
        "a bool room",
        "InvalidArgument",
        lambda s: s.system.decode.add_request(9, [1, 2], 2, bootstrap_room=True),
    ),
    Row(
        DUPLICATE,
        "a room in use on the instance",
        "InvalidArgument",
        lambda s: s.system.decode.add_request(9, [1, 2], 2, bootstrap_room=3),
    ),
    Row(
        NEGATIVE,
        "a negative rid",
        "InvalidArgument",
        lambda s: s.system.decode.add_request(-1, [1, 2], 2, bootstrap_room=3),
    ),
]


BUILD: list[Row] = [
    Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: build(None)),
    Row(WRONG_TYPE, "an EngineSpec", "InvalidArgument", lambda s: build(EngineSpec())),
]


BUILD_PARTS: list[Row] = [
    Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: build_parts(None)),
    Row(WRONG_TYPE, "a PDSpec", "InvalidArgument", lambda s: build_parts(PDSpec())),
]


def _cases(member: str, scene: str, rows: list[Row]) -> list[Case]:
    return [row.case(member, scene) for row in rows]


CASES: list[Case] = [
    *(
        c
        for method, rows in META.items()
        for c in _cases(f"MetadataBufferPool.{method}", "metadata" if method != "__init__" else "empty", rows)
    ),
    *_cases("PDSystem.__init__", "empty", SYSTEM_INIT),
    *_cases(
        "TransferChannel.drain_bound",
        "pd",
        [
            Row(WRONG_TYPE, "a str room id", "InvalidArgument", lambda s: s.system.channel.drain_bound("0")),
            Row(WRONG_TYPE, "a None room id", "InvalidArgument", lambda s: s.system.channel.drain_bound(None)),
        ],
    ),
    *_cases("PDSystem.add_request", "pd", ADD),
    *_cases("PDSystem.abort", "pd", ABORT),
    *_cases("PDSystem.run_until_idle", "pd", RUN),
    *_cases("PDSystem.check_quiescent", "pd", CHECK_QUIESCENT),
    *method_cases("TransferChannel", "pd", CHANNEL_ROWS),
    *_cases("PDScheduler.add_request", "pd", INSTANCE_ADD),
    *_cases("Scheduler.validate_arrival", "sched", VALIDATE),
    *_cases("PDSpec.__init__", "empty", SPEC),
    *_cases("ChannelConfig.__init__", "empty", CHANNEL),
    *_cases("build_pd", "empty", BUILD),
    *_cases("build_parts", "empty", BUILD_PARTS),
    *_cases("TransferChannel.__init__", "empty", CHANNEL_INIT),
]

# members each class defines itself (an inherited one is swept under the class that defines it)
_OWN = {f"{cls.__name__}.{n}" for cls in (PDScheduler, PrefillScheduler, DecodeScheduler) for n in vars(cls)}

QUERIES: list[Query] = [
    *(
        Query(f"MetadataBufferPool.{name}", "metadata", lambda s, n=name: getattr(s.pool, n)())
        for name in ("audit", "available_size", "pending_free_size", "free_ids", "pending_ids")
    ),
    *(
        Query(f"PDSystem.{name}", "pd", lambda s, n=name: getattr(s.system, n)())
        for name in ("describe", "has_work", "instances", "is_quiescent", "check_leases", "check_drain")
    ),
    Query("PDSystem.checking", "pd", lambda s: s.system.checking),
    *(
        Query(f"{cls}.{name}", "pd", lambda s, side=side, n=name: getattr(getattr(s.system, side), n)())
        for cls, side in (
            ("PDScheduler", "decode"),
            ("PrefillScheduler", "prefill"),
            ("DecodeScheduler", "decode"),
        )
        for name in ("pd_queues", "describe_queues", "is_quiescent")
        if f"{cls}.{name}" in _OWN
    ),
    *(
        Query(f"TransferChannel.{name}", "pd", lambda s, n=name: list(getattr(s.system.channel, n)() or ()))
        for name in ("audit", "in_flight")
    ),
    Query("TransferChannel.is_idle", "pd", lambda s: s.system.channel.is_idle()),
    Query(
        "TransferChannel.clear_faults", "pd", lambda s: s.system.channel.clear_faults(), "no fault injected"
    ),
    Query("ChannelConfig.drain_bound", "pd", lambda s: s.system.channel.config.drain_bound),
    Query("ChannelConfig.max_message_life", "pd", lambda s: s.system.channel.config.max_message_life),
    Query("PDSpec.derived_sizes", "pd", lambda s: PDSpec().derived_sizes()),
    Query("PDSpec.decode_tracking_slots", "pd", lambda s: PDSpec().decode_tracking_slots()),

]

NO_BAD_CALL: dict[str, str] = {
    "PDSystem.step": "no argument, and allowed in every state (it drives both instances and the channel)",
}

_STEP_PHASE = "a phase of the instance's own step(), called only by the reference code"
_HOOK = "a hook the scheduler's own add_request/step calls (overridden by the PD instances)"
_PENDING = "bad-call rows pending (issue 15 follow-up): reached in the sweep only through PDSystem"
NOT_ENTRY_POINTS: dict[str, str] = {
    **{
        f"Scheduler.{m}": _HOOK
        for m in ("before_schedule", "after_results", "new_request", "enqueue_arrival")
    },
    "Scheduler.process_prefill_chunk": _HOOK,
    "Scheduler.check_handles_owned": "a contract check (ContractViolation on a broken handle), not an operation",
    "Scheduler.check_ended_requests_released": "a contract check (ContractViolation), not an operation",
    **{
        f"PrefillScheduler.{m}": _STEP_PHASE
        for m in (
            "poll_running_failures",
            "poll_waiting_failures",
            "pop_bootstrapped",
            "process_inflight_queue",
            "process_prefill_chunk",
            "send_kv_chunk",
            "before_schedule",
            "after_results",
            "enqueue_arrival",
            "new_request",
            "lease_drained",
            "transfer_may_touch",
        )
    },
    **{
        f"DecodeScheduler.{m}": _STEP_PHASE
        for m in (
            "commit_transfer",
            "get_new_prebuilt_batch",
            "pop_preallocated",
            "pop_transferred",
            "resume_retracted",
            "before_schedule",
            "enqueue_arrival",
            "lease_drained",
            "start_lease",
            "transfer_may_touch",
            "retract",
            "release_now",
            "match_and_lock",  # the decode radix cache's pre-allocation steps (issue 27 item 4)
            "unlock_prefix",
        )
    },
    **{
        f"PDScheduler.{m}": _STEP_PHASE
        for m in (
            "abort_for",
            "release_now",
            "process_leases",
            "start_lease",
            "lease_drained",
            "transfer_may_touch",
            "new_request",
        )
    },
    **{f"PDScheduler.{m}": _PENDING for m in ("__init__", "where_is", "holdings", "serves_alone")},
    "PrefillScheduler.__init__": _PENDING,
    "DecodeScheduler.__init__": _PENDING,
    "DecodeScheduler.serves_alone": _PENDING,
}
"""Public-by-name members that are not entry points for outside callers (or whose rows are pending), each
with why; the sweep accepts them, ``scripts/bad_input_sweep.py`` counts them apart."""
