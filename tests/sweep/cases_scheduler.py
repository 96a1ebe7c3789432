"""Bad calls on the scheduler and the engine builder: ``Scheduler``, ``SchedulerConfig``, ``FaultInjector``,
``EngineSpec``, ``build_engine`` and ``model_weights``.

Scenes (``tests/sweep/scenes.py``): a scheduler with requests finished (rid 0), running (1), chunked (2)
and waiting (3), built with overlap off (``sched``: nothing in flight between steps) and on
(``sched_overlap``: the last launched batch in flight); each scene also carries a request and a batch of
another scheduler built the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kvledger.reference.config_fields import MAX_SIZE
from kvledger.reference.engine import EngineSpec, build_engine, model_weights
from kvledger.reference.pools import MambaPool, ReqToTokenPool, TokenToKVPoolAllocator
from kvledger.reference.radix import MambaRadixCache, RadixCache
from kvledger.reference.scheduler import FaultInjector, Scheduler, SchedulerConfig, SpeculativeConfig
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
)

Sched: Any = Scheduler  # typed as Any: the wrong-type arguments below are deliberate
Config: Any = SchedulerConfig
Spec: Any = EngineSpec
build: Any = build_engine
weights: Any = model_weights


# ---------------------------------------------------------------------- constructor collaborators
def _kv(size: int = 64) -> TokenToKVPoolAllocator:
    return TokenToKVPoolAllocator(size)


def _rows() -> ReqToTokenPool:
    return ReqToTokenPool(4, 64)


def _mamba() -> MambaPool:
    return MambaPool(4, num_layers=1, conv_state_shape=(2,), temporal_state_shape=(2,))


def _sched(**kw: Any) -> object:
    args: dict[str, Any] = {"kv_allocator": _kv(), "req_to_token_pool": _rows()}
    args.update(kw)
    config = args.pop("config", SchedulerConfig())
    return Sched(config, **args)


def _tree_over_other_allocator(s: Scene) -> object:
    return _sched(tree=RadixCache(_kv()))


def _mamba_tree_without_pool(s: Scene) -> object:
    kv = _kv()
    return _sched(kv_allocator=kv, tree=MambaRadixCache(kv, _mamba()))


def _mamba_tree_over_other_pool(s: Scene) -> object:
    kv = _kv()
    return _sched(kv_allocator=kv, mamba_pool=_mamba(), tree=MambaRadixCache(kv, _mamba()))


SCHED_INIT: list[Row] = [
    Row(WRONG_TYPE, "a None config", "InvalidArgument", lambda s: _sched(config=None)),
    Row(WRONG_TYPE, "a dict config", "InvalidArgument", lambda s: _sched(config={"page_size": 1})),
    Row(WRONG_TYPE, "a None kv_allocator", "InvalidArgument", lambda s: _sched(kv_allocator=None)),
    Row(WRONG_TYPE, "a None req_to_token_pool", "InvalidArgument", lambda s: _sched(req_to_token_pool=None)),
    Row(
        WRONG_TYPE,
        "a KV allocator as the row pool",
        "InvalidArgument",
        lambda s: _sched(req_to_token_pool=_kv()),
    ),
    Row(
        WRONG_TYPE, "a KV allocator as the Mamba pool", "InvalidArgument", lambda s: _sched(mamba_pool=_kv())
    ),
    Row(WRONG_TYPE, "a tensor as the tree", "InvalidArgument", lambda s: _sched(tree=torch.zeros(1))),
    Row(
        DEGENERATE,
        "page sizes differ",
        "InvalidArgument",
        lambda s: _sched(config=SchedulerConfig(page_size=4)),
    ),
    Row(FOREIGN, "a tree over another allocator", "InvalidArgument", _tree_over_other_allocator),
    Row(WRONG_STATE, "a Mamba tree without the Mamba pool", "InvalidArgument", _mamba_tree_without_pool),
    Row(FOREIGN, "a Mamba tree over another Mamba pool", "InvalidArgument", _mamba_tree_over_other_pool),
    Row(WRONG_TYPE, "a runner without forward", "InvalidArgument", lambda s: _sched(runner=object())),
    Row(WRONG_TYPE, "an on_step that is not callable", "InvalidArgument", lambda s: _sched(on_step=5)),
]

# ---------------------------------------------------------------------- requests in
ADD: list[Row] = [
    Row(WRONG_TYPE, "a bool rid", "InvalidArgument", lambda s: s.sched.add_request(True, [1, 2], 2)),
    Row(WRONG_TYPE, "a float rid", "InvalidArgument", lambda s: s.sched.add_request(9.0, [1, 2], 2)),
    Row(WRONG_TYPE, "a str rid", "InvalidArgument", lambda s: s.sched.add_request("9", [1, 2], 2)),
    Row(
        WRONG_TYPE,
        "a numpy int rid",
        "InvalidArgument",
        lambda s: s.sched.add_request(np.int64(9), [1, 2], 2),
    ),
    Row(NEGATIVE, "a negative rid", "InvalidArgument", lambda s: s.sched.add_request(-1, [1, 2], 2)),
    Row(
        OUT_OF_RANGE, "a rid beyond int64", "InvalidArgument", lambda s: s.sched.add_request(2**70, [1, 2], 2)
    ),
    Row(
        OUT_OF_RANGE,
        "a rid whose PD room would not fit int64",
        "InvalidArgument",
        lambda s: s.sched.add_request(2**63 - 1, [1, 2], 2),
    ),
    Row(
        DUPLICATE, "the rid of a running request", "InvalidArgument", lambda s: s.sched.add_request(1, [1], 2)
    ),
    Row(
        DUPLICATE,
        "the rid of a finished request",
        "InvalidArgument",
        lambda s: s.sched.add_request(0, [1], 2),
    ),
    Row(
        WRONG_TYPE,
        "a generator prompt",
        "InvalidArgument",
        lambda s: s.sched.add_request(9, (t for t in [1, 2]), 2),
    ),
    Row(WRONG_TYPE, "a str prompt", "InvalidArgument", lambda s: s.sched.add_request(9, "12", 2)),
    Row(
        WRONG_TYPE,
        "a tensor prompt",
        "InvalidArgument",
        lambda s: s.sched.add_request(9, torch.tensor([1, 2]), 2),
    ),
    Row(WRONG_TYPE, "a None prompt", "InvalidArgument", lambda s: s.sched.add_request(9, None, 2)),
    Row(WRONG_TYPE, "a dict prompt", "InvalidArgument", lambda s: s.sched.add_request(9, {1: 2}, 2)),
    Row(DEGENERATE, "an empty prompt", "InvalidArgument", lambda s: s.sched.add_request(9, [], 2)),
    Row(WRONG_TYPE, "a float token", "InvalidArgument", lambda s: s.sched.add_request(9, [1, 2.0], 2)),
    Row(WRONG_TYPE, "a bool token", "InvalidArgument", lambda s: s.sched.add_request(9, [1, True], 2)),
    Row(WRONG_TYPE, "a nested token", "InvalidArgument", lambda s: s.sched.add_request(9, [[1], [2]], 2)),
    Row(WRONG_TYPE, "a None token", "InvalidArgument", lambda s: s.sched.add_request(9, [1, None], 2)),
    Row(NEGATIVE, "a negative token", "InvalidArgument", lambda s: s.sched.add_request(9, [1, -1], 2)),
    Row(
        OUT_OF_RANGE,
        "a token at the vocabulary size",
        "InvalidArgument",
        lambda s: s.sched.add_request(9, [1, 32000], 2),
    ),
    Row(
        OUT_OF_RANGE,
        "a token beyond int64",
        "InvalidArgument",
        lambda s: s.sched.add_request(9, [1, 2**70], 2),
    ),
    Row(DEGENERATE, "max_new_tokens 0", "InvalidArgument", lambda s: s.sched.add_request(9, [1, 2], 0)),
    Row(
        NEGATIVE, "a negative max_new_tokens", "InvalidArgument", lambda s: s.sched.add_request(9, [1, 2], -3)
    ),
    Row(
        WRONG_TYPE, "a float max_new_tokens", "InvalidArgument", lambda s: s.sched.add_request(9, [1, 2], 2.0)
    ),
    Row(
        WRONG_TYPE, "a bool max_new_tokens", "InvalidArgument", lambda s: s.sched.add_request(9, [1, 2], True)
    ),
]

ABORT: list[Row] = [
    Row(WRONG_TYPE, "a str rid", "InvalidArgument", lambda s: s.sched.abort("1")),
    Row(WRONG_TYPE, "a None rid", "InvalidArgument", lambda s: s.sched.abort(None)),
    Row(WRONG_TYPE, "a bool rid", "InvalidArgument", lambda s: s.sched.abort(True)),
    Row(
        WRONG_TYPE,
        "a request object instead of its rid",
        "InvalidArgument",
        lambda s: s.sched.abort(s.running),
    ),
    Row(FOREIGN, "an unknown rid", "UnknownRequest", lambda s: s.sched.abort(99)),
    Row(NEGATIVE, "a negative rid", "InvalidArgument", lambda s: s.sched.abort(-1)),
    Row(OUT_OF_RANGE, "a rid beyond int64", "InvalidArgument", lambda s: s.sched.abort(2**70)),
]


# ---------------------------------------------------------------------- retraction
def _retract_running(s: Scene) -> None:
    s.sched.retract(s.running)


def _in_flight_decode(s: Scene) -> None:
    """Step the overlap scheduler until the batch in flight is a decode batch with the running request."""
    for _ in range(20):
        if s.sched.inflight and s.sched.inflight[0].is_decode and s.running in s.sched.inflight[0].reqs:
            return
        s.sched.step()
    raise AssertionError("no decode batch with the running request came in flight")


RETRACT: list[Row] = [
    Row(WRONG_STATE, "a waiting request", "InvalidState", lambda s: s.sched.retract(s.waiting)),
    Row(WRONG_STATE, "a chunked request", "InvalidState", lambda s: s.sched.retract(s.chunked)),
    Row(WRONG_STATE, "a finished request", "InvalidState", lambda s: s.sched.retract(s.finished)),
    Row(
        DOUBLE,
        "a request retracted already",
        "InvalidState",
        lambda s: s.sched.retract(s.running),
        setup=_retract_running,
    ),
    Row(FOREIGN, "another scheduler's request", "UnknownRequest", lambda s: s.sched.retract(s.foreign_req)),
    Row(WRONG_TYPE, "a rid instead of a request", "InvalidArgument", lambda s: s.sched.retract(1)),
    Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.sched.retract(None)),
]

RETRACT_OVERLAP: list[Row] = [
    Row(
        WRONG_STATE,
        "a request a batch in flight references",
        "InvalidState",
        lambda s: s.sched.retract(s.running),
        setup=_in_flight_decode,
    ),
]

FORCE_RETRACT: list[Row] = [
    Row(DEGENERATE, "count 0", "InvalidArgument", lambda s: s.sched.force_retract(0)),
    Row(NEGATIVE, "a negative count", "InvalidArgument", lambda s: s.sched.force_retract(-1)),
    Row(WRONG_TYPE, "a float count", "InvalidArgument", lambda s: s.sched.force_retract(1.0)),
    Row(WRONG_TYPE, "a None count", "InvalidArgument", lambda s: s.sched.force_retract(None)),
    Row(OUT_OF_RANGE, "a count beyond MAX_SIZE", "SizeOutOfRange", lambda s: s.sched.force_retract(2**70)),
]

# ---------------------------------------------------------------------- batches
PROCESS: list[Row] = [
    Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.sched.process_batch_result(None)),
    Row(
        WRONG_TYPE,
        "a request instead of a batch",
        "InvalidArgument",
        lambda s: s.sched.process_batch_result(s.running),
    ),
    Row(
        DOUBLE,
        "a batch processed already",
        "BatchNotInFlight",
        lambda s: s.sched.process_batch_result(s.processed[-1]),
    ),
    Row(
        FOREIGN,
        "another scheduler's batch",
        "BatchNotInFlight",
        lambda s: s.sched.process_batch_result(s.foreign_batch),
    ),
]


def _outside_step(method: str) -> list[Row]:
    return [
        Row(WRONG_STATE, "outside step()", "InvalidState", lambda s: getattr(s.sched, method)()),
    ]


RUN_UNTIL_IDLE: list[Row] = [
    Row(DEGENERATE, "max_steps 0", "InvalidArgument", lambda s: s.sched.run_until_idle(0)),
    Row(NEGATIVE, "a negative max_steps", "InvalidArgument", lambda s: s.sched.run_until_idle(-5)),
    Row(WRONG_TYPE, "a float max_steps", "InvalidArgument", lambda s: s.sched.run_until_idle(10.0)),
    Row(WRONG_TYPE, "a str max_steps", "InvalidArgument", lambda s: s.sched.run_until_idle("10")),
]

FAULTS: list[Row] = [
    Row(
        WRONG_TYPE,
        "an unknown allocation kind",
        "InvalidArgument",
        lambda s: s.sched.faults.fail_next("disk"),
    ),
    Row(WRONG_TYPE, "a None kind", "InvalidArgument", lambda s: s.sched.faults.fail_next(None)),
    Row(DEGENERATE, "times 0", "InvalidArgument", lambda s: s.sched.faults.fail_next("kv", 0)),
    Row(NEGATIVE, "negative times", "InvalidArgument", lambda s: s.sched.faults.fail_next("kv", -2)),
    Row(WRONG_TYPE, "float times", "InvalidArgument", lambda s: s.sched.faults.fail_next("row", 1.5)),
    Row(NEGATIVE, "negative after", "InvalidArgument", lambda s: s.sched.faults.fail_next("kv", after=-1)),
    Row(WRONG_TYPE, "float after", "InvalidArgument", lambda s: s.sched.faults.fail_next("kv", after=0.5)),
    Row(
        OUT_OF_RANGE,
        "a plan longer than MAX_PLAN",
        "InvalidArgument",
        lambda s: s.sched.faults.fail_next("mamba", 2, after=10**18),
    ),
]

# ---------------------------------------------------------------------- configuration and the builder
# every size field of the configurations: an int in [1 (or 0), MAX_SIZE], refused beyond it
CONFIG_SIZES = (
    "page_size",
    "max_running_requests",
    "max_prefill_tokens",
    "chunked_prefill_size",
    "max_context_len",
    "clip_max_new_tokens",
    "retract_decode_steps",
    "finished_window",
    "mamba_track_interval",
    "mamba_chunk_size",
)
SPEC_SIZES = (
    "page_size",
    "kv_tokens",
    "rows",
    "mamba_slots",
    "mamba_layers",
    "max_running",
    "chunk",
    "max_prefill",
    "max_context_len",
    "vocab_size",
    "reserved_rows",
)  # and the V2 sizes, in SPEC_V2

CONFIG: list[Row] = [
    Row(WRONG_TYPE, "a float page_size", "InvalidArgument", lambda s: Config(page_size=1.5)),
    Row(DEGENERATE, "page_size 0", "InvalidArgument", lambda s: Config(page_size=0)),
    Row(DEGENERATE, "max_running_requests 0", "InvalidArgument", lambda s: Config(max_running_requests=0)),
    Row(WRONG_TYPE, "a str max_context_len", "InvalidArgument", lambda s: Config(max_context_len="4096")),
    Row(
        OUT_OF_RANGE,
        "a chunk smaller than a page",
        "InvalidArgument",
        lambda s: Config(page_size=4, chunked_prefill_size=2),
    ),
    Row(NEGATIVE, "a negative finished_window", "InvalidArgument", lambda s: Config(finished_window=-1)),
    Row(
        WRONG_TYPE,
        "an unknown cow_release_policy",
        "InvalidArgument",
        lambda s: Config(cow_release_policy="always"),
    ),
    Row(
        OUT_OF_RANGE,
        "min ratio above init ratio",
        "InvalidArgument",
        lambda s: Config(min_new_token_ratio=0.9),
    ),
    Row(WRONG_TYPE, "a NaN ratio", "InvalidArgument", lambda s: Config(init_new_token_ratio=float("nan"))),
    Row(NEGATIVE, "a negative ratio decay", "InvalidArgument", lambda s: Config(new_token_ratio_decay=-0.1)),
    Row(WRONG_TYPE, "an int overlap", "InvalidArgument", lambda s: Config(overlap=1)),
    Row(WRONG_TYPE, "a bool eos_token_id", "InvalidArgument", lambda s: Config(eos_token_id=True)),
    Row(NEGATIVE, "a negative eos_token_id", "InvalidArgument", lambda s: Config(eos_token_id=-1)),
    Row(DEGENERATE, "clip_max_new_tokens 0", "InvalidArgument", lambda s: Config(clip_max_new_tokens=0)),
    *(
        Row(OUT_OF_RANGE, f"{name} 2**70", "SizeOutOfRange", lambda s, n=name: Config(**{n: 2**70}))
        for name in CONFIG_SIZES
    ),
    Row(WRONG_TYPE, "a numpy int page_size", "InvalidArgument", lambda s: Config(page_size=np.int64(1))),
]

SPEC_V2: list[Row] = [
    Row(WRONG_TYPE, "an unknown mamba_strategy", "InvalidArgument", lambda s: Spec(mamba_strategy="v3")),
    Row(
        WRONG_TYPE,
        "a bool mamba_track_interval",
        "InvalidArgument",
        lambda s: Spec(mamba_track_interval=True),
    ),
    Row(WRONG_TYPE, "a float mamba_chunk_size", "InvalidArgument", lambda s: Spec(mamba_chunk_size=8.0)),
    Row(
        DEGENERATE,
        "V1 Mamba radix cache with pages",
        "InvalidArgument",
        lambda s: Spec(page_size=4, kv_tokens=64, chunk=8, mamba_strategy="no_buffer"),
    ),
    Row(
        DEGENERATE,
        "V2 (the default) with a chunked prefill below the capture grid",
        "InvalidArgument",
        lambda s: Spec(chunk=16),
    ),
    Row(OUT_OF_RANGE, "a V2 kernel chunk of 2**70", "SizeOutOfRange", lambda s: Spec(mamba_chunk_size=2**70)),
    Row(
        OUT_OF_RANGE,
        "a track interval of 2**70",
        "SizeOutOfRange",
        lambda s: Spec(mamba_track_interval=2**70),
    ),
    Row(DEGENERATE, "a track interval of 0", "InvalidArgument", lambda s: Spec(mamba_track_interval=0)),
]

CONFIG_V2: list[Row] = [
    Row(
        WRONG_TYPE, "an unknown strategy", "InvalidArgument", lambda s: Config(mamba_scheduler_strategy="v3")
    ),
    Row(
        DEGENERATE,
        "track interval 0",
        "InvalidArgument",
        lambda s: Config(mamba_scheduler_strategy="extra_buffer", mamba_track_interval=0),
    ),
    Row(WRONG_TYPE, "a float track interval", "InvalidArgument", lambda s: Config(mamba_track_interval=2.5)),
    Row(
        DEGENERATE,
        "a kernel chunk that does not divide the page",
        "InvalidArgument",
        lambda s: Config(
            page_size=4, mamba_scheduler_strategy="extra_buffer", mamba_chunk_size=6, mamba_track_interval=4
        ),
    ),
    Row(
        WRONG_STATE,
        "interval 1 with overlap",
        "InvalidArgument",
        lambda s: Config(overlap=True, mamba_scheduler_strategy="extra_buffer", mamba_track_interval=1),
    ),
    Row(
        DEGENERATE,
        "a chunked prefill below the capture grid",
        "InvalidArgument",
        lambda s: Config(mamba_scheduler_strategy="extra_buffer", chunked_prefill_size=32),
    ),
]

SPEC: list[Row] = [
    Row(DEGENERATE, "page_size 0", "InvalidArgument", lambda s: Spec(page_size=0, tree="radix")),
    Row(WRONG_TYPE, "an unknown tree", "InvalidArgument", lambda s: Spec(tree="btree")),
    Row(WRONG_TYPE, "an unknown model", "InvalidArgument", lambda s: Spec(model="gpt")),
    Row(DEGENERATE, "kv_tokens 0", "InvalidArgument", lambda s: Spec(kv_tokens=0)),
    Row(
        OUT_OF_RANGE,
        "kv_tokens not a whole number of pages",
        "InvalidArgument",
        lambda s: Spec(page_size=4, kv_tokens=130, tree="radix", hybrid=False),
    ),
    Row(WRONG_TYPE, "a float rows", "InvalidArgument", lambda s: Spec(rows=1.5)),
    Row(NEGATIVE, "negative mamba_slots", "InvalidArgument", lambda s: Spec(mamba_slots=-1)),
    Row(WRONG_STATE, "a Mamba tree without a Mamba pool", "InvalidArgument", lambda s: Spec(hybrid=False)),
    Row(
        WRONG_STATE,
        "the tiny model without a Mamba pool",
        "InvalidArgument",
        lambda s: Spec(tree="radix", hybrid=False, model="tiny-hybrid"),
    ),
    Row(
        OUT_OF_RANGE,
        "a V1 Mamba tree at page size 4",
        "InvalidArgument",
        lambda s: Spec(page_size=4, kv_tokens=64, mamba_strategy="no_buffer"),
    ),
    Row(DEGENERATE, "chunk 0", "InvalidArgument", lambda s: Spec(chunk=0)),
    Row(
        WRONG_STATE,
        "speculative decoding under overlap with the Mamba tree in V1",
        "InvalidArgument",
        lambda s: Spec(overlap=True, mamba_strategy="no_buffer", speculative=SpeculativeConfig()),
    ),
    Row(
        OUT_OF_RANGE,
        "an eos_token_id outside the vocabulary",
        "InvalidArgument",
        lambda s: Spec(eos_token_id=32000),
    ),
    Row(DEGENERATE, "vocab_size 0", "InvalidArgument", lambda s: Spec(vocab_size=0)),
    Row(WRONG_TYPE, "a str overlap", "InvalidArgument", lambda s: Spec(overlap="yes")),
    *(
        Row(OUT_OF_RANGE, f"{name} 2**70", "SizeOutOfRange", lambda s, n=name: Spec(**{n: 2**70}))
        for name in SPEC_SIZES
    ),
    Row(
        OUT_OF_RANGE, "kv_tokens one above MAX_SIZE", "SizeOutOfRange", lambda s: Spec(kv_tokens=MAX_SIZE + 1)
    ),
    Row(NEGATIVE, "negative reserved_rows", "InvalidArgument", lambda s: Spec(reserved_rows=-1)),
    Row(WRONG_TYPE, "a numpy int kv_tokens", "InvalidArgument", lambda s: Spec(kv_tokens=np.int64(128))),
    Row(WRONG_TYPE, "a bool rows", "InvalidArgument", lambda s: Spec(rows=True)),
    Row(
        DEGENERATE,
        "fewer KV tokens than a page",
        "InvalidArgument",
        lambda s: Spec(tree="radix", page_size=4, kv_tokens=2),
    ),
]

BUILD: list[Row] = [
    Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: build(None)),
    Row(WRONG_TYPE, "a dict", "InvalidArgument", lambda s: build({"page_size": 1})),
    Row(WRONG_TYPE, "a SchedulerConfig", "InvalidArgument", lambda s: build(SchedulerConfig())),
    # Sizes within MAX_SIZE whose pools no machine holds: refused before anything is allocated (the free
    # list of MAX_SIZE Mamba slots alone is 50 GiB, the states exabytes; built, it would be killed half-way).
    Row(
        OUT_OF_RANGE,
        "Mamba slots x layers no machine holds",
        "SizeOutOfRange",
        lambda s: build(Spec(tree="none", mamba_slots=MAX_SIZE, mamba_layers=MAX_SIZE)),
    ),
    Row(
        OUT_OF_RANGE,
        "rows x max_context_len no machine holds",
        "SizeOutOfRange",
        lambda s: build(Spec(tree="none", hybrid=False, rows=MAX_SIZE, max_context_len=MAX_SIZE)),
    ),
]

WEIGHTS: list[Row] = [
    Row(DEGENERATE, "vocab_size 0", "InvalidArgument", lambda s: weights(0)),
    Row(NEGATIVE, "a negative vocab_size", "InvalidArgument", lambda s: weights(-1)),
    Row(WRONG_TYPE, "a float vocab_size", "InvalidArgument", lambda s: weights(32000.0)),
    Row(WRONG_TYPE, "a list vocab_size", "InvalidArgument", lambda s: weights([32000])),
]


QUEUED_REQUEST: list[Row] = [
    Row(WRONG_TYPE, "a str rid", "InvalidArgument", lambda s: s.sched.queued_request("1")),
    Row(
        WRONG_TYPE,
        "a request object instead of its rid",
        "InvalidArgument",
        lambda s: s.sched.queued_request(s.running),
    ),
    Row(NEGATIVE, "a negative rid", "InvalidArgument", lambda s: s.sched.queued_request(-1)),
]

Draft: Any = SpeculativeConfig

SPECULATIVE: list[Row] = [
    Row(DEGENERATE, "num_steps 0", "InvalidArgument", lambda s: Draft(num_steps=0)),
    Row(
        DEGENERATE,
        "num_draft_tokens 1 (no draft to verify)",
        "InvalidArgument",
        lambda s: Draft(num_draft_tokens=1),
    ),
    Row(
        OUT_OF_RANGE,
        "more draft tokens than the draft tree holds",
        "InvalidArgument",
        lambda s: Draft(num_steps=2, topk=1, num_draft_tokens=4),
    ),
    Row(OUT_OF_RANGE, "accept_rate above 1", "InvalidArgument", lambda s: Draft(accept_rate=1.5)),
    Row(NEGATIVE, "a negative accept_rate", "InvalidArgument", lambda s: Draft(accept_rate=-0.1)),
    Row(WRONG_TYPE, "a NaN accept_rate", "InvalidArgument", lambda s: Draft(accept_rate=float("nan"))),
    Row(WRONG_TYPE, "a str seed", "InvalidArgument", lambda s: Draft(seed="0")),
    Row(OUT_OF_RANGE, "topk 2**70", "SizeOutOfRange", lambda s: Draft(topk=2**70)),
]

MTP: list[Row] = [
    Row(DEGENERATE, "k 0", "InvalidArgument", lambda s: SpeculativeConfig.mtp(0)),
    Row(WRONG_TYPE, "a str k", "InvalidArgument", lambda s: SpeculativeConfig.mtp(Draft("3"))),
]

FOOTPRINT: dict[str, list[Row]] = {
    "alloc_len_per_decode": [
        Row(DEGENERATE, "page_size 0", "InvalidArgument", lambda s: Draft().alloc_len_per_decode(0)),
        Row(WRONG_TYPE, "a str page_size", "InvalidArgument", lambda s: Draft().alloc_len_per_decode("4")),
    ],
    "reserve": [
        Row(NEGATIVE, "a negative page_size", "InvalidArgument", lambda s: Draft().reserve(-1, False)),
        Row(WRONG_TYPE, "a str overlap", "InvalidArgument", lambda s: Draft().reserve(4, "yes")),
    ],
    "row_headroom": [
        Row(DEGENERATE, "page_size 0", "InvalidArgument", lambda s: Draft().row_headroom(0, False)),
        Row(WRONG_TYPE, "an int overlap", "InvalidArgument", lambda s: Draft().row_headroom(4, 1)),
    ],
}


def _cases(member: str, scene: str, rows: list[Row], suffix: str = "") -> list[Case]:
    return [row.case(member, scene, suffix) for row in rows]


_BOTH = ("sched", "sched_overlap", "sched_v2")


def _both(method: str, rows: list[Row]) -> list[Case]:
    return [c for scene in _BOTH for c in _cases(f"Scheduler.{method}", scene, rows, f" ({scene})")]


CASES: list[Case] = [
    *_cases("Scheduler.__init__", "empty", SCHED_INIT),
    *_both("add_request", ADD),
    *_both("abort", ABORT),
    *_both("retract", RETRACT),
    *_cases("Scheduler.retract", "sched_overlap", RETRACT_OVERLAP),
    *_both("force_retract", FORCE_RETRACT),
    *_both("process_batch_result", PROCESS),
    *(
        c
        for m in ("get_next_batch_to_run", "get_new_batch_prefill", "update_running_batch")
        for c in _both(m, _outside_step(m))
    ),
    *_both("run_until_idle", RUN_UNTIL_IDLE),
    *_cases("FaultInjector.fail_next", "sched", FAULTS),
    *_cases("SchedulerConfig.__init__", "empty", CONFIG),
    *_cases("EngineSpec.__init__", "empty", SPEC),
    *_cases("EngineSpec.__init__", "empty", SPEC_V2),
    *_cases("SchedulerConfig.__init__", "empty", CONFIG_V2),
    *_cases("build_engine", "empty", BUILD),
    *_cases("model_weights", "empty", WEIGHTS),
    *_cases("SpeculativeConfig.__init__", "empty", SPECULATIVE),
    *_cases("SpeculativeConfig.mtp", "empty", MTP),
    *(c for name, rows in FOOTPRINT.items() for c in _cases(f"SpeculativeConfig.{name}", "empty", rows)),
    *_both("queued_request", QUEUED_REQUEST),
]

QUERIES: list[Query] = [
    *(
        Query(f"Scheduler.{name}", scene, lambda s, n=name: getattr(s.sched, n)())
        for name in (
            "describe_queues",
            "ended_count",
            "has_work",
            "is_quiescent",
            "live_requests",
            "queued_requests",
        )
        for scene in ("sched_overlap",)
    ),
    *(
        Query(f"SchedulerConfig.{name}", "sched_v2", lambda s, n=name: getattr(s.sched.config, n))
        for name in ("extra_buffer", "mamba_cache_chunk_size", "mamba_ping_pong_size", "max_allocated_len")
    ),
    Query("Scheduler.batches_launched", "sched_overlap", lambda s: s.sched.batches_launched),
    Query("SpeculativeConfig.max_accept", "empty", lambda s: SpeculativeConfig().max_accept),
    Query(
        "FaultInjector.__init__", "sched", lambda s: FaultInjector(), "a fresh injector: nothing to misuse"
    ),
]

NO_BAD_CALL: dict[str, str] = {
    "Scheduler.step": "no argument, and allowed in every state (it is what drives the scheduler)",
}
