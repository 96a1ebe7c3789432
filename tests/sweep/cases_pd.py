"""Bad calls on the PD parts: ``MetadataBufferPool``, ``PDSystem``, ``PDSpec``, ``ChannelConfig`` and
``build_pd`` (the system's entry points), plus the scheduler's arrival check the system calls on both
instances (``Scheduler.validate_arrival``).

Scenes (``tests/sweep/scenes.py``): ``metadata``, a pool with slots held by ``a`` (one written) and ``b``;
``pd``, a system with a finished request (rid 0), one between the instances (1) and one waiting (2).
"""

from __future__ import annotations

from typing import Any

import torch

from kvledger.reference.disagg import (
    ChannelConfig,
    DecodeScheduler,
    PDScheduler,
    PDSpec,
    PDSystem,
    PrefillScheduler,
    TransferChannel,
    build_pd,
)
from kvledger.reference.engine import EngineSpec
from kvledger.reference.engine import build_parts as _build_parts
from kvledger.reference.pools import MetadataBufferPool
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
]

CHANNEL_INIT: list[Row] = [
    Row(WRONG_TYPE, "a dict config", "InvalidArgument", lambda s: TransferChannel({"latency": 1})),
    Row(
        WRONG_TYPE, "an EngineSpec as the config", "InvalidArgument", lambda s: TransferChannel(EngineSpec())
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
    *_cases("PDSystem.add_request", "pd", ADD),
    *_cases("PDSystem.abort", "pd", ABORT),
    *_cases("PDSystem.run_until_idle", "pd", RUN),
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
    Query("MetadataBufferPool.ledger", "metadata", lambda s: s.pool.ledger),
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
]

NO_BAD_CALL: dict[str, str] = {
    "PDSystem.step": "no argument, and allowed in every state (it drives both instances and the channel)",
    "PDSystem.check_quiescent": "no argument; a check that raises ContractViolation unless the system is idle",
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
    **{f"PDScheduler.{m}": _PENDING for m in ("__init__", "add_request", "where_is", "holdings", "serves_alone")},
    "PrefillScheduler.__init__": _PENDING,
    "DecodeScheduler.__init__": _PENDING,
    "DecodeScheduler.serves_alone": _PENDING,
    **{
        f"TransferChannel.{m}": "the channel's per-room protocol, driven by the instances; " + _PENDING
        for m in (
            "abort",
            "advance",
            "attach",
            "close",
            "describe_room",
            "failure_reason",
            "init_receiver",
            "inject",
            "missing_components",
            "open",
            "reads_drained",
            "receiver_status",
            "request_drain",
            "send_chunk",
            "sender_status",
            "writes_drained",
            "writes_may_land",
        )
    },
}
"""Public-by-name members that are not entry points for outside callers (or whose rows are pending), each
with why; the sweep accepts them, ``scripts/bad_input_sweep.py`` counts them apart."""
