"""Bad calls on the pools: every public member of the four ownership pools and the KV buffer.

Each case makes exactly one thing wrong; where a valid id of the owner rides along, the call must still
change nothing (no partial free, no partial allocation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kvledger.reference.pools import (
    KVBufferPool,
    MambaPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from tests.sweep.scenes import PAGE, Scene
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

KVBuffer: Any = KVBufferPool  # typed as Any: the wrong-type arguments below are deliberate

POOLS = {
    "token": "TokenToKVPoolAllocator",
    "paged": "PagedTokenToKVPoolAllocator",
    "req": "ReqToTokenPool",
    "mamba": "MambaPool",
}
GROUPED = ("token", "paged", "mamba")  # pools with free groups
RESERVED = ("token", "paged", "mamba")  # pools with a reserved id below their domain
ID_POOLS = ("token", "req", "mamba")  # a repeated id is an error (the paged pool frees a page once)
BACKUP = ("token", "paged")

# ---------------------------------------------------------------------- every pool
ALLOC: list[Row] = [
    Row(NEGATIVE, "a negative count", "InvalidArgument", lambda s: s.pool.alloc(-1, s.a)),
    Row(WRONG_TYPE, "a float count", "InvalidArgument", lambda s: s.pool.alloc(1.0, s.a)),
    Row(WRONG_TYPE, "a bool count", "InvalidArgument", lambda s: s.pool.alloc(True, s.a)),
    Row(WRONG_TYPE, "a str count", "InvalidArgument", lambda s: s.pool.alloc("2", s.a)),
    Row(WRONG_TYPE, "a None count", "InvalidArgument", lambda s: s.pool.alloc(None, s.a)),
    Row(WRONG_TYPE, "an owner that is not an Owner", "InvalidArgument", lambda s: s.pool.alloc(s.unit, "a")),
    Row(WRONG_TYPE, "a None owner", "InvalidArgument", lambda s: s.pool.alloc(s.unit, None)),
]

FREE: list[Row] = [
    Row(DOUBLE, "an id that is free", "DoubleFree", lambda s: s.pool.free([s.free_ids[0]], s.a)),
    Row(
        DOUBLE,
        "own ids plus a free one",
        "DoubleFree",
        lambda s: s.pool.free([*s.a_ids[:1], s.free_ids[-1]], s.a),
    ),
    Row(FOREIGN, "another owner's id", "ForeignSlot", lambda s: s.pool.free(s.b_ids[:1], s.a), True),
    Row(
        FOREIGN,
        "own ids plus a foreign one",
        "ForeignSlot",
        lambda s: s.pool.free([s.a_ids[0], s.b_ids[-1]], s.a),
        True,
    ),
    Row(OUT_OF_RANGE, "an id past the end", "SlotOutOfRange", lambda s: s.pool.free([s.beyond[0]], s.a)),
    Row(
        OUT_OF_RANGE, "a huge id", "SlotOutOfRange", lambda s: s.pool.free(torch.tensor([s.beyond[-1]]), s.a)
    ),
    Row(OUT_OF_RANGE, "an int beyond int64", "SlotOutOfRange", lambda s: s.pool.free([2**70], s.a)),
    Row(
        NEGATIVE,
        "a negative id",
        "SlotOutOfRange",
        lambda s: s.pool.free(torch.tensor([s.a_ids[0], -1]), s.a),
    ),
    Row(NEGATIVE, "a negative Python int", "SlotOutOfRange", lambda s: s.pool.free(-1, s.a)),
    Row(
        WRONG_TYPE,
        "a float tensor",
        "InvalidArgument",
        lambda s: s.pool.free(torch.tensor(s.a_ids, dtype=torch.float32), s.a),
    ),
    Row(
        WRONG_TYPE,
        "a float64 tensor",
        "InvalidArgument",
        lambda s: s.pool.free(torch.tensor(s.a_ids, dtype=torch.float64), s.a),
    ),
    Row(
        WRONG_TYPE,
        "a bool tensor",
        "InvalidArgument",
        lambda s: s.pool.free(torch.ones(1, dtype=torch.bool), s.a),
    ),
    Row(
        WRONG_TYPE,
        "a uint8 tensor",
        "InvalidArgument",
        lambda s: s.pool.free(torch.tensor(s.a_ids, dtype=torch.uint8), s.a),
    ),
    Row(
        WRONG_TYPE,
        "an int16 tensor",
        "InvalidArgument",
        lambda s: s.pool.free(torch.tensor(s.a_ids, dtype=torch.int16), s.a),
    ),
    Row(WRONG_TYPE, "a 2-D tensor", "InvalidArgument", lambda s: s.pool.free(torch.tensor([s.a_ids]), s.a)),
    Row(
        WRONG_TYPE,
        "a tensor on the wrong device",
        "InvalidArgument",
        lambda s: s.pool.free(torch.tensor(s.a_ids, device="meta"), s.a),
    ),
    Row(WRONG_TYPE, "a Python float", "InvalidArgument", lambda s: s.pool.free(float(s.a_ids[0]), s.a)),
    Row(WRONG_TYPE, "a list with a float", "InvalidArgument", lambda s: s.pool.free([s.a_ids[0], 1.0], s.a)),
    Row(WRONG_TYPE, "a nested list", "InvalidArgument", lambda s: s.pool.free([[s.a_ids[0]]], s.a)),
    Row(WRONG_TYPE, "a bool", "InvalidArgument", lambda s: s.pool.free(True, s.a)),
    Row(WRONG_TYPE, "a str", "InvalidArgument", lambda s: s.pool.free("1", s.a)),
    Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.pool.free(None, s.a)),
    Row(WRONG_TYPE, "a generator", "InvalidArgument", lambda s: s.pool.free(iter(s.a_ids), s.a)),
    Row(WRONG_TYPE, "an owner that is not an Owner", "InvalidArgument", lambda s: s.pool.free(s.a_ids, "a")),
    Row(WRONG_TYPE, "a None owner", "InvalidArgument", lambda s: s.pool.free(s.a_ids, None)),
]

FREE_RESERVED: list[Row] = [
    Row(OUT_OF_RANGE, "the reserved id", "SlotOutOfRange", lambda s: s.pool.free([s.reserved[0]], s.a)),
    Row(
        OUT_OF_RANGE,
        "own ids plus the reserved id",
        "SlotOutOfRange",
        lambda s: s.pool.free([*s.a_ids, s.reserved[-1]], s.a),
    ),
]

FREE_REPEATS: list[Row] = [
    Row(DUPLICATE, "a repeated id", "DuplicateIds", lambda s: s.pool.free([s.a_ids[0], s.a_ids[0]], s.a)),
    Row(
        DUPLICATE,
        "int32 ids with a repeat",
        "DuplicateIds",
        lambda s: s.pool.free(torch.tensor([*s.a_ids, s.a_ids[-1]], dtype=torch.int32), s.a),
    ),
]


def _open_group(s: Scene) -> None:
    s.pool.free_group_begin()


def _open_group_and_free(s: Scene) -> None:
    s.pool.free_group_begin()
    s.pool.free(s.a_ids[:1], s.a)


GROUPS: dict[str, list[Row]] = {
    "free_group_begin": [
        Row(
            WRONG_STATE,
            "inside an open free group",
            "FreeGroupError",
            lambda s: s.pool.free_group_begin(),
            setup=_open_group,
        ),
    ],
    "free_group_end": [
        Row(WRONG_STATE, "without free_group_begin", "FreeGroupError", lambda s: s.pool.free_group_end()),
    ],
}


def _backup_then_free(s: Scene) -> None:
    s.snap = s.pool.backup_state()
    s.pool.free(s.a_ids, s.a)  # freed after the backup: restoring would take them back from nobody


def _backup_then_open_group(s: Scene) -> None:
    s.snap = s.pool.backup_state()
    s.pool.free_group_begin()


BACKUP_ROWS: dict[str, list[Row]] = {
    "backup_state": [
        Row(
            WRONG_STATE,
            "inside an open free group",
            "FreeGroupError",
            lambda s: s.pool.backup_state(),
            setup=_open_group,
        ),
    ],
    "restore_state": [
        Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.pool.restore_state(None)),
        Row(WRONG_TYPE, "a list of ids", "InvalidArgument", lambda s: s.pool.restore_state(s.free_ids)),
        Row(
            FOREIGN,
            "another pool's snapshot",
            "StaleSnapshot",
            lambda s: s.pool.restore_state(s.other.backup_state()),
        ),
        Row(
            WRONG_STATE,
            "a snapshot made stale by a free",
            "StaleSnapshot",
            lambda s: s.pool.restore_state(s.snap),
            setup=_backup_then_free,
        ),
        Row(
            WRONG_STATE,
            "inside an open free group",
            "FreeGroupError",
            lambda s: s.pool.restore_state(s.snap),
            setup=_backup_then_open_group,
        ),
    ],
    "attach_kv_buffer": [
        Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.pool.attach_kv_buffer(None)),
        Row(WRONG_TYPE, "a tensor", "InvalidArgument", lambda s: s.pool.attach_kv_buffer(torch.zeros(4))),
        Row(
            DEGENERATE,
            "a buffer with too few rows",
            "InvalidArgument",
            lambda s: s.pool.attach_kv_buffer(KVBufferPool(2, num_layers=1, num_kv_heads=1, head_dim=1)),
        ),
    ],
}


# ---------------------------------------------------------------------- constructors
def _ctor_rows(kind: str) -> list[Row]:
    build: dict[str, Callable[..., Any]] = {
        "token": lambda size=8, **kw: TokenToKVPoolAllocator(size, **kw),
        "paged": lambda size=8, **kw: PagedTokenToKVPoolAllocator(size, kw.pop("page_size", PAGE), **kw),
        "req": lambda size=8, **kw: ReqToTokenPool(size, kw.pop("max_context_len", 8), **kw),
        "mamba": lambda size=8, **kw: MambaPool(
            size,
            num_layers=kw.pop("num_layers", 1),
            conv_state_shape=kw.pop("conv_state_shape", (2,)),
            temporal_state_shape=kw.pop("temporal_state_shape", (2,)),
            **kw,
        ),
    }
    b = build[kind]
    rows = [
        Row(DEGENERATE, "size 0", "InvalidArgument", lambda s: b(0)),
        Row(NEGATIVE, "a negative size", "InvalidArgument", lambda s: b(-4)),
        Row(WRONG_TYPE, "a float size", "InvalidArgument", lambda s: b(8.0)),
        Row(WRONG_TYPE, "a None size", "InvalidArgument", lambda s: b(None)),
        Row(WRONG_TYPE, "a name that is not a str", "InvalidArgument", lambda s: b(name=3)),
        Row(WRONG_TYPE, "an unknown device", "InvalidArgument", lambda s: b(device="meta")),
        Row(WRONG_TYPE, "a device that is not a device", "InvalidArgument", lambda s: b(device=0.5)),
    ]
    if kind == "paged":
        rows += [
            Row(DEGENERATE, "page_size 0", "InvalidArgument", lambda s: b(8, page_size=0)),
            Row(DEGENERATE, "size below one page", "InvalidArgument", lambda s: b(2, page_size=4)),
            Row(WRONG_TYPE, "a float page_size", "InvalidArgument", lambda s: b(8, page_size=2.0)),
        ]
    if kind == "req":
        rows += [
            Row(DEGENERATE, "max_context_len 0", "InvalidArgument", lambda s: b(4, max_context_len=0)),
            Row(WRONG_TYPE, "a str max_context_len", "InvalidArgument", lambda s: b(4, max_context_len="8")),
        ]
    if kind == "mamba":
        rows += [
            Row(DEGENERATE, "num_layers 0", "InvalidArgument", lambda s: b(4, num_layers=0)),
            Row(WRONG_TYPE, "a list shape", "InvalidArgument", lambda s: b(4, conv_state_shape=[2])),
            Row(
                DEGENERATE,
                "a shape with a 0 dimension",
                "InvalidArgument",
                lambda s: b(4, temporal_state_shape=(2, 0)),
            ),
            Row(NEGATIVE, "a negative dimension", "InvalidArgument", lambda s: b(4, conv_state_shape=(-1,))),
            Row(WRONG_TYPE, "an integer dtype", "InvalidArgument", lambda s: b(4, conv_dtype=torch.int32)),
            Row(
                WRONG_TYPE,
                "a dtype that is not a dtype",
                "InvalidArgument",
                lambda s: b(4, ssm_dtype="float32"),
            ),
        ]
    return rows


# ---------------------------------------------------------------------- pool-specific
DECODE_COMMON: list[Row] = [
    Row(
        WRONG_TYPE,
        "a generator of seq_lens",
        "InvalidArgument",
        lambda s: s.pool.alloc_decode((x for x in [2]), [0], [s.a]),
    ),
    Row(
        WRONG_TYPE,
        "seq_lens as a tensor",
        "InvalidArgument",
        lambda s: s.pool.alloc_decode(torch.tensor([2]), [0], [s.a]),
    ),
    Row(WRONG_TYPE, "a float seq_len", "InvalidArgument", lambda s: s.pool.alloc_decode([2.0], [0], [s.a])),
    Row(WRONG_TYPE, "a str last_loc", "InvalidArgument", lambda s: s.pool.alloc_decode([2], ["0"], [s.a])),
    Row(
        WRONG_TYPE,
        "an owner that is not an Owner",
        "InvalidArgument",
        lambda s: s.pool.alloc_decode([PAGE + 1, 2], [0, 0], [s.b, "a"]),
    ),
    Row(
        WRONG_TYPE,
        "owners as a generator",
        "InvalidArgument",
        lambda s: s.pool.alloc_decode([1], [0], iter([s.a])),
    ),
    Row(DEGENERATE, "seq_len 0", "InvalidArgument", lambda s: s.pool.alloc_decode([0], [0], [s.a])),
    Row(NEGATIVE, "a negative seq_len", "InvalidArgument", lambda s: s.pool.alloc_decode([-3], [0], [s.a])),
    Row(DEGENERATE, "lengths differ", "InvalidArgument", lambda s: s.pool.alloc_decode([2], [0, 0], [s.a])),
]

PAGED: dict[str, list[Row]] = {
    "alloc": [
        Row(DEGENERATE, "not a page multiple", "InvalidArgument", lambda s: s.pool.alloc(PAGE + 1, s.a)),
    ],
    "free": [
        Row(
            DOUBLE,
            "a token of a free page",
            "DoubleFree",
            lambda s: s.pool.free([s.free_ids[0] + PAGE - 1], s.a),
        ),
        Row(
            FOREIGN,
            "a token of a foreign page",
            "ForeignSlot",
            lambda s: s.pool.free([s.a_ids[0], s.b_ids[1]], s.a),
            True,
        ),
        Row(
            OUT_OF_RANGE,
            "a token just past the last page",
            "SlotOutOfRange",
            lambda s: s.pool.free([7 * PAGE], s.a),
        ),
    ],
    "alloc_extend": [
        Row(
            DEGENERATE,
            "lengths differ",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([0], [1, 1], [-1], [s.a]),
        ),
        Row(
            OUT_OF_RANGE,
            "prefix > seq",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([5], [4], [-1], [s.a]),
        ),
        Row(
            NEGATIVE,
            "a negative seq_len",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([0], [-4], [-1], [s.a]),
        ),
        Row(
            NEGATIVE,
            "a negative prefix_len",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([-1], [4], [-1], [s.a]),
        ),
        Row(
            OUT_OF_RANGE,
            "last_loc at the wrong offset",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([2], [3], [s.partial_loc], [s.a]),
        ),
        Row(
            DOUBLE,
            "last_loc in a free page",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([1], [3], [s.free_ids[0]], [s.a]),
        ),
        Row(
            FOREIGN,
            "last_loc in a foreign page",
            "ForeignSlot",
            lambda s: s.pool.alloc_extend([1], [3], [s.b_ids[0]], [s.a]),
            True,
        ),
        Row(
            OUT_OF_RANGE,
            "last_loc outside the pool",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([1], [3], [0], [s.a]),
        ),
        Row(
            OUT_OF_RANGE,
            "last_loc beyond int64",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([1], [3], [2**70], [s.a]),
        ),
        Row(
            WRONG_TYPE,
            "last_loc not an int",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([1], [3], [float(s.a_ids[0])], [s.a]),
        ),
        Row(
            FOREIGN,
            "a valid request then a foreign one",
            "ForeignSlot",
            lambda s: s.pool.alloc_extend([0, 1], [PAGE, 2], [-1, s.b_ids[0]], [s.b, s.a]),
            True,
        ),
        Row(
            DUPLICATE,
            "one partial page continued twice",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([1, 1], [2, 2], [s.partial_loc, s.partial_loc], [s.a, s.a]),
        ),
        Row(
            WRONG_TYPE,
            "a generator of prefix_lens",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend(iter([0]), [PAGE], [-1], [s.a]),
        ),
        Row(
            WRONG_TYPE,
            "a float seq_len",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([0], [4.0], [-1], [s.a]),
        ),
        Row(
            WRONG_TYPE,
            "a bool prefix_len",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([False], [PAGE], [-1], [s.a]),
        ),
        Row(
            WRONG_TYPE,
            "a valid request then an owner that is not an Owner",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([0, 0], [PAGE, PAGE], [-1, -1], [s.b, None]),
        ),
    ],
    "alloc_decode": [
        *DECODE_COMMON,
        Row(
            FOREIGN,
            "last_loc in a foreign page",
            "ForeignSlot",
            lambda s: s.pool.alloc_decode([2], [s.b_ids[0]], [s.a]),
            True,
        ),
        Row(
            DOUBLE,
            "a valid request then last_loc in a free page",
            "InvalidArgument",
            lambda s: s.pool.alloc_decode([1, 2], [0, s.free_ids[0]], [s.b, s.a]),
        ),
        Row(
            OUT_OF_RANGE,
            "last_loc outside the pool",
            "InvalidArgument",
            lambda s: s.pool.alloc_decode([2], [10**6], [s.a]),
        ),
        Row(
            DUPLICATE,
            "one partial page continued twice",
            "InvalidArgument",
            lambda s: s.pool.alloc_decode([2, 2], [s.partial_loc, s.partial_loc], [s.a, s.a]),
        ),
    ],
    "pages_of": [
        Row(WRONG_TYPE, "a float tensor", "InvalidArgument", lambda s: s.pool.pages_of(torch.tensor([4.0]))),
        Row(WRONG_TYPE, "a str", "InvalidArgument", lambda s: s.pool.pages_of("4")),
        Row(
            OUT_OF_RANGE,
            "a token past the last page",
            "SlotOutOfRange",
            lambda s: s.pool.pages_of(torch.tensor([7 * PAGE])),
        ),
        Row(OUT_OF_RANGE, "a token of the padding page", "SlotOutOfRange", lambda s: s.pool.pages_of([1])),
        Row(NEGATIVE, "a negative token", "SlotOutOfRange", lambda s: s.pool.pages_of([-PAGE])),
    ],
}

TOKEN: dict[str, list[Row]] = {"alloc_decode": DECODE_COMMON}

REQ: dict[str, list[Row]] = {
    "write": [
        Row(
            DOUBLE,
            "to a free row",
            "InvalidArgument",
            lambda s: s.pool.write(s.free_ids[0], 0, torch.tensor([1])),
        ),
        Row(
            OUT_OF_RANGE,
            "to a row past the end",
            "SlotOutOfRange",
            lambda s: s.pool.write(5, 0, torch.tensor([1])),
        ),
        Row(
            NEGATIVE, "to a negative row", "InvalidArgument", lambda s: s.pool.write(-1, 0, torch.tensor([1]))
        ),
        Row(
            NEGATIVE,
            "at a negative start",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], -1, torch.tensor([1])),
        ),
        Row(
            OUT_OF_RANGE,
            "past max_context_len",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], 6, torch.tensor([1, 2, 3])),
        ),
        Row(
            OUT_OF_RANGE,
            "an id beyond int32",
            "SlotOutOfRange",
            lambda s: s.pool.write(s.a_ids[0], 0, torch.tensor([2**40])),
        ),
        Row(
            NEGATIVE,
            "a negative id",
            "SlotOutOfRange",
            lambda s: s.pool.write(s.a_ids[0], 0, torch.tensor([-1])),
        ),
        Row(
            WRONG_TYPE,
            "float ids",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], 0, torch.tensor([1.5, 2.5])),
        ),
        Row(
            WRONG_TYPE,
            "bool ids",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], 0, torch.tensor([True])),
        ),
        Row(
            WRONG_TYPE,
            "ids on the wrong device",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], 0, torch.tensor([1], device="meta")),
        ),
        Row(WRONG_TYPE, "a bool row", "InvalidArgument", lambda s: s.pool.write(True, 0, torch.tensor([1]))),
        Row(
            WRONG_TYPE,
            "a float start",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], 1.0, torch.tensor([1])),
        ),
    ],
    "write_each": [
        Row(
            DUPLICATE,
            "a row twice",
            "DuplicateIds",
            lambda s: s.pool.write_each([s.a_ids[0], s.a_ids[0]], [0, 1], [5, 6]),
        ),
        Row(
            DOUBLE,
            "a free row",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0], s.free_ids[0]], [0, 0], [5, 6]),
        ),
        Row(
            OUT_OF_RANGE, "a row past the end", "SlotOutOfRange", lambda s: s.pool.write_each([5], [0], [5])
        ),
        Row(
            OUT_OF_RANGE,
            "a position past the row",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0]], [8], [5]),
        ),
        Row(
            NEGATIVE,
            "a negative position",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0]], [-1], [5]),
        ),
        Row(NEGATIVE, "a negative row", "SlotOutOfRange", lambda s: s.pool.write_each([-1], [0], [5])),
        Row(
            NEGATIVE,
            "a negative value",
            "SlotOutOfRange",
            lambda s: s.pool.write_each([s.a_ids[0]], [0], [-5]),
        ),
        Row(
            DEGENERATE,
            "fewer values than rows",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0], s.a_ids[1]], [0, 0], [5]),
        ),
        Row(
            DEGENERATE,
            "fewer positions than rows",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0], s.a_ids[1]], [0], [5, 6]),
        ),
        Row(
            WRONG_TYPE,
            "rows as a generator",
            "InvalidArgument",
            lambda s: s.pool.write_each(iter([s.a_ids[0]]), [0], [5]),
        ),
        Row(
            WRONG_TYPE,
            "a float position",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0]], [0.0], [5]),
        ),
        Row(
            WRONG_TYPE,
            "float values",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0]], [0], [5.0]),
        ),
    ],
    "read": [
        Row(NEGATIVE, "a negative row", "InvalidArgument", lambda s: s.pool.read(-1, 0, 4)),
        Row(OUT_OF_RANGE, "a row past the end", "SlotOutOfRange", lambda s: s.pool.read(5, 0, 4)),
        Row(DOUBLE, "a free row", "InvalidArgument", lambda s: s.pool.read(s.free_ids[0], 0, 4)),
        Row(NEGATIVE, "a negative start", "InvalidArgument", lambda s: s.pool.read(s.a_ids[0], -2, 2)),
        Row(
            OUT_OF_RANGE,
            "end past max_context_len",
            "InvalidArgument",
            lambda s: s.pool.read(s.a_ids[0], 0, 9),
        ),
        Row(DEGENERATE, "end before start", "InvalidArgument", lambda s: s.pool.read(s.a_ids[0], 3, 1)),
        Row(WRONG_TYPE, "a float row", "InvalidArgument", lambda s: s.pool.read(float(s.a_ids[0]), 0, 2)),
        Row(
            WRONG_TYPE,
            "a tensor row",
            "InvalidArgument",
            lambda s: s.pool.read(torch.tensor(s.a_ids[0]), 0, 2),
        ),
        Row(WRONG_TYPE, "a None end", "InvalidArgument", lambda s: s.pool.read(s.a_ids[0], 0, None)),
    ],
    "forget_tail": [
        Row(DOUBLE, "a free row", "InvalidArgument", lambda s: s.pool.forget_tail(s.free_ids[0], 0)),
        Row(OUT_OF_RANGE, "a row past the end", "SlotOutOfRange", lambda s: s.pool.forget_tail(5, 0)),
        Row(NEGATIVE, "a negative row", "InvalidArgument", lambda s: s.pool.forget_tail(-1, 0)),
        Row(NEGATIVE, "a negative start", "InvalidArgument", lambda s: s.pool.forget_tail(s.a_ids[0], -1)),
        Row(
            OUT_OF_RANGE,
            "a start past max_context_len",
            "InvalidArgument",
            lambda s: s.pool.forget_tail(s.a_ids[0], 9),
        ),
        Row(WRONG_TYPE, "a float start", "InvalidArgument", lambda s: s.pool.forget_tail(s.a_ids[0], 1.0)),
        Row(WRONG_TYPE, "a None row", "InvalidArgument", lambda s: s.pool.forget_tail(None, 0)),
    ],
    "read_each": [
        Row(NEGATIVE, "a negative row", "SlotOutOfRange", lambda s: s.pool.read_each([-1], [0])),
        Row(
            NEGATIVE, "a negative position", "InvalidArgument", lambda s: s.pool.read_each([s.a_ids[0]], [-1])
        ),
        Row(OUT_OF_RANGE, "a row past the end", "SlotOutOfRange", lambda s: s.pool.read_each([5], [0])),
        Row(
            OUT_OF_RANGE,
            "a position past the row",
            "InvalidArgument",
            lambda s: s.pool.read_each([s.a_ids[0]], [8]),
        ),
        Row(DOUBLE, "a free row", "InvalidArgument", lambda s: s.pool.read_each([s.free_ids[0]], [0])),
        Row(
            DEGENERATE, "lengths differ", "InvalidArgument", lambda s: s.pool.read_each([s.a_ids[0]], [0, 1])
        ),
        Row(
            WRONG_TYPE,
            "rows as a generator",
            "InvalidArgument",
            lambda s: s.pool.read_each(iter([s.a_ids[0]]), [0]),
        ),
        Row(
            WRONG_TYPE, "a float position", "InvalidArgument", lambda s: s.pool.read_each([s.a_ids[0]], [1.0])
        ),
    ],
}

MAMBA: dict[str, list[Row]] = {
    "copy_from": [
        Row(
            DOUBLE, "a free source", "InvalidArgument", lambda s: s.pool.copy_from(s.free_ids[0], s.a_ids[0])
        ),
        Row(
            DOUBLE,
            "a freed (poisoned) source",
            "InvalidArgument",
            lambda s: s.pool.copy_from(s.a_ids[0], s.b_ids[0]),
            setup=lambda s: s.pool.free(s.a_ids[:1], s.a),
        ),
        Row(
            DOUBLE,
            "into a free slot",
            "InvalidArgument",
            lambda s: s.pool.copy_from(s.a_ids[0], s.free_ids[0]),
        ),
        Row(OUT_OF_RANGE, "from slot 0", "SlotOutOfRange", lambda s: s.pool.copy_from(0, s.a_ids[0])),
        Row(OUT_OF_RANGE, "past the end", "SlotOutOfRange", lambda s: s.pool.copy_from(s.a_ids[0], 7)),
        Row(
            NEGATIVE, "a negative destination", "SlotOutOfRange", lambda s: s.pool.copy_from(s.a_ids[0], -1)
        ),
        Row(
            DEGENERATE, "length mismatch", "InvalidArgument", lambda s: s.pool.copy_from(s.a_ids[:1], s.b_ids)
        ),
        Row(
            WRONG_TYPE,
            "a float index",
            "InvalidArgument",
            lambda s: s.pool.copy_from(torch.tensor([1.0]), s.b_ids[:1]),
        ),
        Row(
            WRONG_TYPE, "a None destination", "InvalidArgument", lambda s: s.pool.copy_from(s.a_ids[0], None)
        ),
        Row(
            DUPLICATE,
            "a slot onto itself",
            "InvalidArgument",
            lambda s: s.pool.copy_from(s.a_ids[0], s.a_ids[0]),
        ),
        Row(
            DUPLICATE,
            "a repeated destination",
            "DuplicateIds",
            lambda s: s.pool.copy_from(s.a_ids, [s.b_ids[0], s.b_ids[0]]),
        ),
    ],
    "fork_from": [
        Row(DEGENERATE, "two sources", "InvalidArgument", lambda s: s.pool.fork_from(s.a_ids, s.b)),
        Row(DEGENERATE, "no source", "InvalidArgument", lambda s: s.pool.fork_from([], s.b)),
        Row(DOUBLE, "a free slot", "InvalidArgument", lambda s: s.pool.fork_from(s.free_ids[0], s.b)),
        Row(OUT_OF_RANGE, "slot 0", "SlotOutOfRange", lambda s: s.pool.fork_from(0, s.b)),
        Row(NEGATIVE, "a negative slot", "SlotOutOfRange", lambda s: s.pool.fork_from(-3, s.b)),
        Row(WRONG_TYPE, "a float slot", "InvalidArgument", lambda s: s.pool.fork_from(1.0, s.b)),
        Row(
            WRONG_TYPE,
            "an owner that is not an Owner",
            "InvalidArgument",
            lambda s: s.pool.fork_from(s.a_ids[0], "b"),
        ),
    ],
    "poisoned": [
        Row(WRONG_TYPE, "a float tensor", "InvalidArgument", lambda s: s.pool.poisoned(torch.tensor([1.0]))),
        Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.pool.poisoned(None)),
        Row(
            OUT_OF_RANGE,
            "a slot past the end",
            "SlotOutOfRange",
            lambda s: s.pool.poisoned(torch.tensor([7])),
        ),
        Row(OUT_OF_RANGE, "the reserved slot", "SlotOutOfRange", lambda s: s.pool.poisoned([0])),
        Row(NEGATIVE, "a negative slot", "SlotOutOfRange", lambda s: s.pool.poisoned([-1])),
    ],
}

KV_BUFFER: dict[str, list[Row]] = {
    "__init__": [
        Row(
            DEGENERATE,
            "num_slots 0",
            "InvalidArgument",
            lambda s: KVBufferPool(0, num_layers=1, num_kv_heads=1, head_dim=1),
        ),
        Row(
            NEGATIVE,
            "negative heads",
            "InvalidArgument",
            lambda s: KVBufferPool(4, num_layers=1, num_kv_heads=-1, head_dim=1),
        ),
        Row(
            WRONG_TYPE,
            "a float head_dim",
            "InvalidArgument",
            lambda s: KVBuffer(4, num_layers=1, num_kv_heads=1, head_dim=2.0),
        ),
        Row(
            WRONG_TYPE,
            "an integer dtype",
            "InvalidArgument",
            lambda s: KVBufferPool(4, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.int64),
        ),
        Row(
            WRONG_TYPE,
            "an unknown device",
            "InvalidArgument",
            lambda s: KVBufferPool(4, num_layers=1, num_kv_heads=1, head_dim=1, device="meta"),
        ),
        Row(
            OUT_OF_RANGE,
            "num_slots 2**40 (beyond MAX_SIZE)",
            "SizeOutOfRange",
            lambda s: KVBufferPool(2**40, num_layers=1, num_kv_heads=1, head_dim=1),
        ),
        Row(
            OUT_OF_RANGE,
            "sizes within MAX_SIZE whose tensors cannot be allocated",
            "SizeOutOfRange",
            lambda s: KVBufferPool(2**31 - 1, num_layers=2**31 - 1, num_kv_heads=1, head_dim=1),
        ),
        Row(
            WRONG_TYPE,
            "a numpy int num_slots",
            "InvalidArgument",
            lambda s: KVBuffer(np.int64(4), num_layers=1, num_kv_heads=1, head_dim=1),
        ),
        Row(
            WRONG_TYPE,
            "a bool num_layers",
            "InvalidArgument",
            lambda s: KVBuffer(4, num_layers=True, num_kv_heads=1, head_dim=1),
        ),
    ],
    "for_allocator": [
        Row(
            WRONG_TYPE,
            "None",
            "InvalidArgument",
            lambda s: KVBufferPool.for_allocator(None, num_layers=1, num_kv_heads=1, head_dim=1),
        ),
        Row(
            WRONG_TYPE,
            "a tensor",
            "InvalidArgument",
            lambda s: KVBufferPool.for_allocator(torch.zeros(3), num_layers=1, num_kv_heads=1, head_dim=1),
        ),
        Row(
            DEGENERATE,
            "layers 0",
            "InvalidArgument",
            lambda s: KVBufferPool.for_allocator(
                TokenToKVPoolAllocator(4), num_layers=0, num_kv_heads=1, head_dim=1
            ),
        ),
    ],
    "set_kv_buffer": [
        Row(
            OUT_OF_RANGE,
            "a layer past the last",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(2, s.slots, s.kv, s.kv),
        ),
        Row(
            NEGATIVE,
            "a negative layer",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(-1, s.slots, s.kv, s.kv),
        ),
        Row(
            OUT_OF_RANGE,
            "a slot past the end",
            "SlotOutOfRange",
            lambda s: s.pool.set_kv_buffer(0, [1, 10], s.kv, s.kv),
        ),
        Row(
            NEGATIVE,
            "a negative slot",
            "SlotOutOfRange",
            lambda s: s.pool.set_kv_buffer(0, [1, -1], s.kv, s.kv),
        ),
        Row(
            DUPLICATE,
            "a repeated slot",
            "DuplicateIds",
            lambda s: s.pool.set_kv_buffer(0, [1, 1], s.kv, s.kv),
        ),
        Row(
            DEGENERATE,
            "k of the wrong shape",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, s.slots, s.kv[:1], s.kv),
        ),
        Row(
            WRONG_TYPE,
            "k of the wrong dtype",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, s.slots, s.kv.double(), s.kv),
        ),
        Row(
            WRONG_TYPE,
            "v not a tensor",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, s.slots, s.kv, None),
        ),
        Row(
            WRONG_TYPE,
            "a float slot",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, [1.0, 2.0], s.kv, s.kv),
        ),
        Row(
            WRONG_TYPE,
            "NaN in k (the freed-slot poison)",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, s.slots, torch.full_like(s.kv, float("nan")), s.kv),
        ),
        Row(
            WRONG_TYPE,
            "an infinite value in v",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, s.slots, s.kv, torch.full_like(s.kv, float("inf"))),
        ),
        Row(
            WRONG_TYPE,
            "k on another device",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, s.slots, s.kv.to("meta"), s.kv),
        ),
        Row(
            WRONG_TYPE,
            "slots on another device",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, torch.tensor([1, 2], device="meta"), s.kv, s.kv),
        ),
        Row(
            WRONG_TYPE,
            "a numpy int layer",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(np.int64(0), s.slots, s.kv, s.kv),
        ),
        Row(
            WRONG_TYPE,
            "a bool layer",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(True, s.slots, s.kv, s.kv),
        ),
        Row(
            OUT_OF_RANGE,
            "a slot beyond int64",
            "SlotOutOfRange",
            lambda s: s.pool.set_kv_buffer(0, [1, 2**70], s.kv, s.kv),
        ),
    ],
    "zero_slots": [
        Row(
            OUT_OF_RANGE,
            "a slot past the end",
            "SlotOutOfRange",
            lambda s: s.pool.zero_slots(torch.tensor([1, 10])),
        ),
        Row(NEGATIVE, "a negative slot", "SlotOutOfRange", lambda s: s.pool.zero_slots(torch.tensor([-1]))),
        Row(
            WRONG_TYPE, "a float tensor", "InvalidArgument", lambda s: s.pool.zero_slots(torch.tensor([1.0]))
        ),
    ],
    "poison_slots": [
        Row(
            OUT_OF_RANGE,
            "a slot past the end",
            "SlotOutOfRange",
            lambda s: s.pool.poison_slots(torch.tensor([2, 11])),
        ),
        Row(
            NEGATIVE, "a negative slot", "SlotOutOfRange", lambda s: s.pool.poison_slots(torch.tensor([-2]))
        ),
        Row(WRONG_TYPE, "a str", "InvalidArgument", lambda s: s.pool.poison_slots("1")),
    ],
    "poisoned": [
        Row(
            OUT_OF_RANGE,
            "a slot past the end",
            "SlotOutOfRange",
            lambda s: s.pool.poisoned(torch.tensor([10])),
        ),
        Row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.pool.poisoned(None)),
    ],
    "get_key_buffer": [
        Row(OUT_OF_RANGE, "a layer past the last", "InvalidArgument", lambda s: s.pool.get_key_buffer(2)),
        Row(NEGATIVE, "a negative layer", "InvalidArgument", lambda s: s.pool.get_key_buffer(-1)),
        Row(WRONG_TYPE, "a slice", "InvalidArgument", lambda s: s.pool.get_key_buffer(slice(0, 2))),
    ],
    "get_value_buffer": [
        Row(OUT_OF_RANGE, "a layer past the last", "InvalidArgument", lambda s: s.pool.get_value_buffer(2)),
        Row(NEGATIVE, "a negative layer", "InvalidArgument", lambda s: s.pool.get_value_buffer(-1)),
        Row(WRONG_TYPE, "a float layer", "InvalidArgument", lambda s: s.pool.get_value_buffer(0.0)),
    ],
}


def _pool_rows(kind: str) -> dict[str, list[Row]]:
    rows: dict[str, list[Row]] = {
        "__init__": _ctor_rows(kind),
        "alloc": list(ALLOC),
        "free": list(FREE),
    }
    if kind in RESERVED:
        rows["free"] += FREE_RESERVED
    if kind in ID_POOLS:
        rows["free"] += FREE_REPEATS
    if kind in GROUPED:
        rows.update(GROUPS)
        rows["free"].append(
            Row(
                DOUBLE,
                "an id freed inside the open group",
                "DoubleFree",
                lambda s: s.pool.free(s.a_ids[:1], s.a),
                setup=_open_group_and_free,
            )
        )
    if kind in BACKUP:
        rows.update(BACKUP_ROWS)
    extra = {"paged": PAGED, "token": TOKEN, "req": REQ, "mamba": MAMBA}[kind]
    for method, method_rows in extra.items():
        rows[method] = rows.get(method, []) + method_rows
    return rows


CASES: list[Case] = [
    *(c for kind, cls in POOLS.items() for c in method_cases(cls, kind, _pool_rows(kind))),
    *method_cases("KVBufferPool", "kv_buffer", KV_BUFFER),
]


def _q(cls: str, scene: str, name: str, call: Callable[[Scene], object], reason: str = "a read") -> Query:
    return Query(f"{cls}.{name}", scene, call, reason)


QUERIES: list[Query] = [
    *(
        q
        for kind, cls in POOLS.items()
        for q in (
            _q(cls, kind, "available_size", lambda s: s.pool.available_size()),
            _q(cls, kind, "pending_free_size", lambda s: s.pool.pending_free_size()),
            _q(cls, kind, "free_ids", lambda s: s.pool.free_ids()),
            _q(cls, kind, "pending_ids", lambda s: s.pool.pending_ids()),
            _q(cls, kind, "audit", lambda s: s.pool.audit(), "a full recount"),
        )
    ),
    *(
        _q(
            POOLS[kind],
            kind,
            "backup_state",
            lambda s: s.pool.backup_state(),
            "a snapshot, allowed outside a group",
        )
        for kind in BACKUP
    ),
    _q("MambaPool", "mamba", "conv_state", lambda s: s.pool.conv_state),
    _q("MambaPool", "mamba", "temporal_state", lambda s: s.pool.temporal_state),
    _q("MambaPool", "mamba", "states", lambda s: s.pool.states),
    _q("MambaPool", "mamba", "free_slots", lambda s: s.pool.free_slots()),
    _q("MambaPool", "mamba", "scheduled_writes", lambda s: s.pool.scheduled_writes()),
    _q("MambaPool", "mamba", "stored_states", lambda s: s.pool.stored_states(), "a view (no flush)"),
    _q("MambaPool", "mamba", "write_schedule", lambda s: s.pool.write_schedule(), "a view (no flush)"),
    _q(
        "MambaPool",
        "mamba",
        "flush",
        lambda s: s.pool.flush(),
        "applies scheduled writes: allowed in every state",
    ),
]
