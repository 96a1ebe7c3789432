"""Bad calls on the pools: every public member of the four ownership pools and the KV buffer.

Each case makes exactly one thing wrong; where a valid id of the owner rides along, the call must still
change nothing (no partial free, no partial allocation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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

Call = Callable[[Scene], object]
# (category, label, expected error, call, needs the ledger, set-up before the snapshot)
Row = tuple[str, str, str, Call, bool, Call | None]


def _row(
    category: str, label: str, error: str, call: Call, ledger: bool = False, setup: Call | None = None
) -> Row:
    return (category, label, error, call, ledger, setup)


# ---------------------------------------------------------------------- every pool
ALLOC: list[Row] = [
    _row(NEGATIVE, "a negative count", "InvalidArgument", lambda s: s.pool.alloc(-1, s.a)),
    _row(WRONG_TYPE, "a float count", "InvalidArgument", lambda s: s.pool.alloc(1.0, s.a)),
    _row(WRONG_TYPE, "a bool count", "InvalidArgument", lambda s: s.pool.alloc(True, s.a)),
    _row(WRONG_TYPE, "a str count", "InvalidArgument", lambda s: s.pool.alloc("2", s.a)),
    _row(WRONG_TYPE, "a None count", "InvalidArgument", lambda s: s.pool.alloc(None, s.a)),
    _row(WRONG_TYPE, "an owner that is not an Owner", "InvalidArgument", lambda s: s.pool.alloc(s.unit, "a")),
    _row(WRONG_TYPE, "a None owner", "InvalidArgument", lambda s: s.pool.alloc(s.unit, None)),
]

FREE: list[Row] = [
    _row(DOUBLE, "an id that is free", "DoubleFree", lambda s: s.pool.free([s.free_ids[0]], s.a)),
    _row(
        DOUBLE,
        "own ids plus a free one",
        "DoubleFree",
        lambda s: s.pool.free([*s.a_ids[:1], s.free_ids[-1]], s.a),
    ),
    _row(FOREIGN, "another owner's id", "ForeignSlot", lambda s: s.pool.free(s.b_ids[:1], s.a), True),
    _row(
        FOREIGN,
        "own ids plus a foreign one",
        "ForeignSlot",
        lambda s: s.pool.free([s.a_ids[0], s.b_ids[-1]], s.a),
        True,
    ),
    _row(OUT_OF_RANGE, "an id past the end", "SlotOutOfRange", lambda s: s.pool.free([s.beyond[0]], s.a)),
    _row(
        OUT_OF_RANGE, "a huge id", "SlotOutOfRange", lambda s: s.pool.free(torch.tensor([s.beyond[-1]]), s.a)
    ),
    _row(OUT_OF_RANGE, "an int beyond int64", "SlotOutOfRange", lambda s: s.pool.free([2**70], s.a)),
    _row(
        NEGATIVE,
        "a negative id",
        "SlotOutOfRange",
        lambda s: s.pool.free(torch.tensor([s.a_ids[0], -1]), s.a),
    ),
    _row(NEGATIVE, "a negative Python int", "SlotOutOfRange", lambda s: s.pool.free(-1, s.a)),
    _row(
        WRONG_TYPE,
        "a float tensor",
        "InvalidArgument",
        lambda s: s.pool.free(torch.tensor(s.a_ids, dtype=torch.float32), s.a),
    ),
    _row(
        WRONG_TYPE,
        "a float64 tensor",
        "InvalidArgument",
        lambda s: s.pool.free(torch.tensor(s.a_ids, dtype=torch.float64), s.a),
    ),
    _row(
        WRONG_TYPE,
        "a bool tensor",
        "InvalidArgument",
        lambda s: s.pool.free(torch.ones(1, dtype=torch.bool), s.a),
    ),
    _row(
        WRONG_TYPE,
        "a uint8 tensor",
        "InvalidArgument",
        lambda s: s.pool.free(torch.tensor(s.a_ids, dtype=torch.uint8), s.a),
    ),
    _row(
        WRONG_TYPE,
        "an int16 tensor",
        "InvalidArgument",
        lambda s: s.pool.free(torch.tensor(s.a_ids, dtype=torch.int16), s.a),
    ),
    _row(WRONG_TYPE, "a 2-D tensor", "InvalidArgument", lambda s: s.pool.free(torch.tensor([s.a_ids]), s.a)),
    _row(
        WRONG_TYPE,
        "a tensor on the wrong device",
        "InvalidArgument",
        lambda s: s.pool.free(torch.tensor(s.a_ids, device="meta"), s.a),
    ),
    _row(WRONG_TYPE, "a Python float", "InvalidArgument", lambda s: s.pool.free(float(s.a_ids[0]), s.a)),
    _row(WRONG_TYPE, "a list with a float", "InvalidArgument", lambda s: s.pool.free([s.a_ids[0], 1.0], s.a)),
    _row(WRONG_TYPE, "a nested list", "InvalidArgument", lambda s: s.pool.free([[s.a_ids[0]]], s.a)),
    _row(WRONG_TYPE, "a bool", "InvalidArgument", lambda s: s.pool.free(True, s.a)),
    _row(WRONG_TYPE, "a str", "InvalidArgument", lambda s: s.pool.free("1", s.a)),
    _row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.pool.free(None, s.a)),
    _row(WRONG_TYPE, "a generator", "InvalidArgument", lambda s: s.pool.free(iter(s.a_ids), s.a)),
    _row(WRONG_TYPE, "an owner that is not an Owner", "InvalidArgument", lambda s: s.pool.free(s.a_ids, "a")),
    _row(WRONG_TYPE, "a None owner", "InvalidArgument", lambda s: s.pool.free(s.a_ids, None)),
]

FREE_RESERVED: list[Row] = [
    _row(OUT_OF_RANGE, "the reserved id", "SlotOutOfRange", lambda s: s.pool.free([s.reserved[0]], s.a)),
    _row(
        OUT_OF_RANGE,
        "own ids plus the reserved id",
        "SlotOutOfRange",
        lambda s: s.pool.free([*s.a_ids, s.reserved[-1]], s.a),
    ),
]

FREE_REPEATS: list[Row] = [
    _row(DUPLICATE, "a repeated id", "DuplicateIds", lambda s: s.pool.free([s.a_ids[0], s.a_ids[0]], s.a)),
    _row(
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
        _row(
            WRONG_STATE,
            "inside an open free group",
            "FreeGroupError",
            lambda s: s.pool.free_group_begin(),
            setup=_open_group,
        ),
    ],
    "free_group_end": [
        _row(WRONG_STATE, "without free_group_begin", "FreeGroupError", lambda s: s.pool.free_group_end()),
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
        _row(
            WRONG_STATE,
            "inside an open free group",
            "FreeGroupError",
            lambda s: s.pool.backup_state(),
            setup=_open_group,
        ),
    ],
    "restore_state": [
        _row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.pool.restore_state(None)),
        _row(WRONG_TYPE, "a list of ids", "InvalidArgument", lambda s: s.pool.restore_state(s.free_ids)),
        _row(
            FOREIGN,
            "another pool's snapshot",
            "StaleSnapshot",
            lambda s: s.pool.restore_state(s.other.backup_state()),
        ),
        _row(
            WRONG_STATE,
            "a snapshot made stale by a free",
            "StaleSnapshot",
            lambda s: s.pool.restore_state(s.snap),
            setup=_backup_then_free,
        ),
        _row(
            WRONG_STATE,
            "inside an open free group",
            "FreeGroupError",
            lambda s: s.pool.restore_state(s.snap),
            setup=_backup_then_open_group,
        ),
    ],
    "attach_kv_buffer": [
        _row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.pool.attach_kv_buffer(None)),
        _row(WRONG_TYPE, "a tensor", "InvalidArgument", lambda s: s.pool.attach_kv_buffer(torch.zeros(4))),
        _row(
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
        _row(DEGENERATE, "size 0", "InvalidArgument", lambda s: b(0)),
        _row(NEGATIVE, "a negative size", "InvalidArgument", lambda s: b(-4)),
        _row(WRONG_TYPE, "a float size", "InvalidArgument", lambda s: b(8.0)),
        _row(WRONG_TYPE, "a None size", "InvalidArgument", lambda s: b(None)),
        _row(WRONG_TYPE, "a name that is not a str", "InvalidArgument", lambda s: b(name=3)),
        _row(WRONG_TYPE, "an unknown device", "InvalidArgument", lambda s: b(device="meta")),
        _row(WRONG_TYPE, "a device that is not a device", "InvalidArgument", lambda s: b(device=0.5)),
    ]
    if kind == "paged":
        rows += [
            _row(DEGENERATE, "page_size 0", "InvalidArgument", lambda s: b(8, page_size=0)),
            _row(DEGENERATE, "size below one page", "InvalidArgument", lambda s: b(2, page_size=4)),
            _row(WRONG_TYPE, "a float page_size", "InvalidArgument", lambda s: b(8, page_size=2.0)),
        ]
    if kind == "req":
        rows += [
            _row(DEGENERATE, "max_context_len 0", "InvalidArgument", lambda s: b(4, max_context_len=0)),
            _row(WRONG_TYPE, "a str max_context_len", "InvalidArgument", lambda s: b(4, max_context_len="8")),
        ]
    if kind == "mamba":
        rows += [
            _row(DEGENERATE, "num_layers 0", "InvalidArgument", lambda s: b(4, num_layers=0)),
            _row(WRONG_TYPE, "a list shape", "InvalidArgument", lambda s: b(4, conv_state_shape=[2])),
            _row(
                DEGENERATE,
                "a shape with a 0 dimension",
                "InvalidArgument",
                lambda s: b(4, temporal_state_shape=(2, 0)),
            ),
            _row(NEGATIVE, "a negative dimension", "InvalidArgument", lambda s: b(4, conv_state_shape=(-1,))),
            _row(WRONG_TYPE, "an integer dtype", "InvalidArgument", lambda s: b(4, conv_dtype=torch.int32)),
            _row(
                WRONG_TYPE,
                "a dtype that is not a dtype",
                "InvalidArgument",
                lambda s: b(4, ssm_dtype="float32"),
            ),
        ]
    return rows


# ---------------------------------------------------------------------- pool-specific
DECODE_COMMON: list[Row] = [
    _row(
        WRONG_TYPE,
        "a generator of seq_lens",
        "InvalidArgument",
        lambda s: s.pool.alloc_decode((x for x in [2]), [0], [s.a]),
    ),
    _row(
        WRONG_TYPE,
        "seq_lens as a tensor",
        "InvalidArgument",
        lambda s: s.pool.alloc_decode(torch.tensor([2]), [0], [s.a]),
    ),
    _row(WRONG_TYPE, "a float seq_len", "InvalidArgument", lambda s: s.pool.alloc_decode([2.0], [0], [s.a])),
    _row(WRONG_TYPE, "a str last_loc", "InvalidArgument", lambda s: s.pool.alloc_decode([2], ["0"], [s.a])),
    _row(
        WRONG_TYPE,
        "an owner that is not an Owner",
        "InvalidArgument",
        lambda s: s.pool.alloc_decode([PAGE + 1, 2], [0, 0], [s.b, "a"]),
    ),
    _row(
        WRONG_TYPE,
        "owners as a generator",
        "InvalidArgument",
        lambda s: s.pool.alloc_decode([1], [0], iter([s.a])),
    ),
    _row(DEGENERATE, "seq_len 0", "InvalidArgument", lambda s: s.pool.alloc_decode([0], [0], [s.a])),
    _row(NEGATIVE, "a negative seq_len", "InvalidArgument", lambda s: s.pool.alloc_decode([-3], [0], [s.a])),
    _row(DEGENERATE, "lengths differ", "InvalidArgument", lambda s: s.pool.alloc_decode([2], [0, 0], [s.a])),
]

PAGED: dict[str, list[Row]] = {
    "alloc": [
        _row(DEGENERATE, "not a page multiple", "InvalidArgument", lambda s: s.pool.alloc(PAGE + 1, s.a)),
    ],
    "free": [
        _row(
            DOUBLE,
            "a token of a free page",
            "DoubleFree",
            lambda s: s.pool.free([s.free_ids[0] + PAGE - 1], s.a),
        ),
        _row(
            FOREIGN,
            "a token of a foreign page",
            "ForeignSlot",
            lambda s: s.pool.free([s.a_ids[0], s.b_ids[1]], s.a),
            True,
        ),
        _row(
            OUT_OF_RANGE,
            "a token just past the last page",
            "SlotOutOfRange",
            lambda s: s.pool.free([7 * PAGE], s.a),
        ),
    ],
    "alloc_extend": [
        _row(
            DEGENERATE,
            "lengths differ",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([0], [1, 1], [-1], [s.a]),
        ),
        _row(
            OUT_OF_RANGE,
            "prefix > seq",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([5], [4], [-1], [s.a]),
        ),
        _row(
            NEGATIVE,
            "a negative seq_len",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([0], [-4], [-1], [s.a]),
        ),
        _row(
            NEGATIVE,
            "a negative prefix_len",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([-1], [4], [-1], [s.a]),
        ),
        _row(
            OUT_OF_RANGE,
            "last_loc at the wrong offset",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([2], [3], [s.partial_loc], [s.a]),
        ),
        _row(
            DOUBLE,
            "last_loc in a free page",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([1], [3], [s.free_ids[0]], [s.a]),
        ),
        _row(
            FOREIGN,
            "last_loc in a foreign page",
            "ForeignSlot",
            lambda s: s.pool.alloc_extend([1], [3], [s.b_ids[0]], [s.a]),
            True,
        ),
        _row(
            OUT_OF_RANGE,
            "last_loc outside the pool",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([1], [3], [0], [s.a]),
        ),
        _row(
            OUT_OF_RANGE,
            "last_loc beyond int64",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([1], [3], [2**70], [s.a]),
        ),
        _row(
            WRONG_TYPE,
            "last_loc not an int",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([1], [3], [float(s.a_ids[0])], [s.a]),
        ),
        _row(
            FOREIGN,
            "a valid request then a foreign one",
            "ForeignSlot",
            lambda s: s.pool.alloc_extend([0, 1], [PAGE, 2], [-1, s.b_ids[0]], [s.b, s.a]),
            True,
        ),
        _row(
            DUPLICATE,
            "one partial page continued twice",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([1, 1], [2, 2], [s.partial_loc, s.partial_loc], [s.a, s.a]),
        ),
        _row(
            WRONG_TYPE,
            "a generator of prefix_lens",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend(iter([0]), [PAGE], [-1], [s.a]),
        ),
        _row(
            WRONG_TYPE,
            "a float seq_len",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([0], [4.0], [-1], [s.a]),
        ),
        _row(
            WRONG_TYPE,
            "a bool prefix_len",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([False], [PAGE], [-1], [s.a]),
        ),
        _row(
            WRONG_TYPE,
            "a valid request then an owner that is not an Owner",
            "InvalidArgument",
            lambda s: s.pool.alloc_extend([0, 0], [PAGE, PAGE], [-1, -1], [s.b, None]),
        ),
    ],
    "alloc_decode": [
        *DECODE_COMMON,
        _row(
            FOREIGN,
            "last_loc in a foreign page",
            "ForeignSlot",
            lambda s: s.pool.alloc_decode([2], [s.b_ids[0]], [s.a]),
            True,
        ),
        _row(
            DOUBLE,
            "a valid request then last_loc in a free page",
            "InvalidArgument",
            lambda s: s.pool.alloc_decode([1, 2], [0, s.free_ids[0]], [s.b, s.a]),
        ),
        _row(
            OUT_OF_RANGE,
            "last_loc outside the pool",
            "InvalidArgument",
            lambda s: s.pool.alloc_decode([2], [10**6], [s.a]),
        ),
        _row(
            DUPLICATE,
            "one partial page continued twice",
            "InvalidArgument",
            lambda s: s.pool.alloc_decode([2, 2], [s.partial_loc, s.partial_loc], [s.a, s.a]),
        ),
    ],
    "pages_of": [
        _row(WRONG_TYPE, "a float tensor", "InvalidArgument", lambda s: s.pool.pages_of(torch.tensor([4.0]))),
        _row(WRONG_TYPE, "a str", "InvalidArgument", lambda s: s.pool.pages_of("4")),
        _row(
            OUT_OF_RANGE,
            "a token past the last page",
            "SlotOutOfRange",
            lambda s: s.pool.pages_of(torch.tensor([7 * PAGE])),
        ),
        _row(OUT_OF_RANGE, "a token of the padding page", "SlotOutOfRange", lambda s: s.pool.pages_of([1])),
        _row(NEGATIVE, "a negative token", "SlotOutOfRange", lambda s: s.pool.pages_of([-PAGE])),
    ],
}

TOKEN: dict[str, list[Row]] = {"alloc_decode": DECODE_COMMON}

REQ: dict[str, list[Row]] = {
    "write": [
        _row(
            DOUBLE,
            "to a free row",
            "InvalidArgument",
            lambda s: s.pool.write(s.free_ids[0], 0, torch.tensor([1])),
        ),
        _row(
            OUT_OF_RANGE,
            "to a row past the end",
            "SlotOutOfRange",
            lambda s: s.pool.write(5, 0, torch.tensor([1])),
        ),
        _row(
            NEGATIVE, "to a negative row", "InvalidArgument", lambda s: s.pool.write(-1, 0, torch.tensor([1]))
        ),
        _row(
            NEGATIVE,
            "at a negative start",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], -1, torch.tensor([1])),
        ),
        _row(
            OUT_OF_RANGE,
            "past max_context_len",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], 6, torch.tensor([1, 2, 3])),
        ),
        _row(
            OUT_OF_RANGE,
            "an id beyond int32",
            "SlotOutOfRange",
            lambda s: s.pool.write(s.a_ids[0], 0, torch.tensor([2**40])),
        ),
        _row(
            NEGATIVE,
            "a negative id",
            "SlotOutOfRange",
            lambda s: s.pool.write(s.a_ids[0], 0, torch.tensor([-1])),
        ),
        _row(
            WRONG_TYPE,
            "float ids",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], 0, torch.tensor([1.5, 2.5])),
        ),
        _row(
            WRONG_TYPE,
            "bool ids",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], 0, torch.tensor([True])),
        ),
        _row(
            WRONG_TYPE,
            "ids on the wrong device",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], 0, torch.tensor([1], device="meta")),
        ),
        _row(WRONG_TYPE, "a bool row", "InvalidArgument", lambda s: s.pool.write(True, 0, torch.tensor([1]))),
        _row(
            WRONG_TYPE,
            "a float start",
            "InvalidArgument",
            lambda s: s.pool.write(s.a_ids[0], 1.0, torch.tensor([1])),
        ),
    ],
    "write_each": [
        _row(
            DUPLICATE,
            "a row twice",
            "DuplicateIds",
            lambda s: s.pool.write_each([s.a_ids[0], s.a_ids[0]], [0, 1], [5, 6]),
        ),
        _row(
            DOUBLE,
            "a free row",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0], s.free_ids[0]], [0, 0], [5, 6]),
        ),
        _row(
            OUT_OF_RANGE, "a row past the end", "SlotOutOfRange", lambda s: s.pool.write_each([5], [0], [5])
        ),
        _row(
            OUT_OF_RANGE,
            "a position past the row",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0]], [8], [5]),
        ),
        _row(
            NEGATIVE,
            "a negative position",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0]], [-1], [5]),
        ),
        _row(NEGATIVE, "a negative row", "SlotOutOfRange", lambda s: s.pool.write_each([-1], [0], [5])),
        _row(
            NEGATIVE,
            "a negative value",
            "SlotOutOfRange",
            lambda s: s.pool.write_each([s.a_ids[0]], [0], [-5]),
        ),
        _row(
            DEGENERATE,
            "fewer values than rows",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0], s.a_ids[1]], [0, 0], [5]),
        ),
        _row(
            DEGENERATE,
            "fewer positions than rows",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0], s.a_ids[1]], [0], [5, 6]),
        ),
        _row(
            WRONG_TYPE,
            "rows as a generator",
            "InvalidArgument",
            lambda s: s.pool.write_each(iter([s.a_ids[0]]), [0], [5]),
        ),
        _row(
            WRONG_TYPE,
            "a float position",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0]], [0.0], [5]),
        ),
        _row(
            WRONG_TYPE,
            "float values",
            "InvalidArgument",
            lambda s: s.pool.write_each([s.a_ids[0]], [0], [5.0]),
        ),
    ],
    "read": [
        _row(NEGATIVE, "a negative row", "InvalidArgument", lambda s: s.pool.read(-1, 0, 4)),
        _row(OUT_OF_RANGE, "a row past the end", "SlotOutOfRange", lambda s: s.pool.read(5, 0, 4)),
        _row(DOUBLE, "a free row", "InvalidArgument", lambda s: s.pool.read(s.free_ids[0], 0, 4)),
        _row(NEGATIVE, "a negative start", "InvalidArgument", lambda s: s.pool.read(s.a_ids[0], -2, 2)),
        _row(
            OUT_OF_RANGE,
            "end past max_context_len",
            "InvalidArgument",
            lambda s: s.pool.read(s.a_ids[0], 0, 9),
        ),
        _row(DEGENERATE, "end before start", "InvalidArgument", lambda s: s.pool.read(s.a_ids[0], 3, 1)),
        _row(WRONG_TYPE, "a float row", "InvalidArgument", lambda s: s.pool.read(float(s.a_ids[0]), 0, 2)),
        _row(
            WRONG_TYPE,
            "a tensor row",
            "InvalidArgument",
            lambda s: s.pool.read(torch.tensor(s.a_ids[0]), 0, 2),
        ),
        _row(WRONG_TYPE, "a None end", "InvalidArgument", lambda s: s.pool.read(s.a_ids[0], 0, None)),
    ],
    "read_each": [
        _row(NEGATIVE, "a negative row", "SlotOutOfRange", lambda s: s.pool.read_each([-1], [0])),
        _row(
            NEGATIVE, "a negative position", "InvalidArgument", lambda s: s.pool.read_each([s.a_ids[0]], [-1])
        ),
        _row(OUT_OF_RANGE, "a row past the end", "SlotOutOfRange", lambda s: s.pool.read_each([5], [0])),
        _row(
            OUT_OF_RANGE,
            "a position past the row",
            "InvalidArgument",
            lambda s: s.pool.read_each([s.a_ids[0]], [8]),
        ),
        _row(DOUBLE, "a free row", "InvalidArgument", lambda s: s.pool.read_each([s.free_ids[0]], [0])),
        _row(
            DEGENERATE, "lengths differ", "InvalidArgument", lambda s: s.pool.read_each([s.a_ids[0]], [0, 1])
        ),
        _row(
            WRONG_TYPE,
            "rows as a generator",
            "InvalidArgument",
            lambda s: s.pool.read_each(iter([s.a_ids[0]]), [0]),
        ),
        _row(
            WRONG_TYPE, "a float position", "InvalidArgument", lambda s: s.pool.read_each([s.a_ids[0]], [1.0])
        ),
    ],
}

MAMBA: dict[str, list[Row]] = {
    "copy_from": [
        _row(
            DOUBLE, "a free source", "InvalidArgument", lambda s: s.pool.copy_from(s.free_ids[0], s.a_ids[0])
        ),
        _row(
            DOUBLE,
            "a freed (poisoned) source",
            "InvalidArgument",
            lambda s: s.pool.copy_from(s.a_ids[0], s.b_ids[0]),
            setup=lambda s: s.pool.free(s.a_ids[:1], s.a),
        ),
        _row(
            DOUBLE,
            "into a free slot",
            "InvalidArgument",
            lambda s: s.pool.copy_from(s.a_ids[0], s.free_ids[0]),
        ),
        _row(OUT_OF_RANGE, "from slot 0", "SlotOutOfRange", lambda s: s.pool.copy_from(0, s.a_ids[0])),
        _row(OUT_OF_RANGE, "past the end", "SlotOutOfRange", lambda s: s.pool.copy_from(s.a_ids[0], 7)),
        _row(
            NEGATIVE, "a negative destination", "SlotOutOfRange", lambda s: s.pool.copy_from(s.a_ids[0], -1)
        ),
        _row(
            DEGENERATE, "length mismatch", "InvalidArgument", lambda s: s.pool.copy_from(s.a_ids[:1], s.b_ids)
        ),
        _row(
            WRONG_TYPE,
            "a float index",
            "InvalidArgument",
            lambda s: s.pool.copy_from(torch.tensor([1.0]), s.b_ids[:1]),
        ),
        _row(
            WRONG_TYPE, "a None destination", "InvalidArgument", lambda s: s.pool.copy_from(s.a_ids[0], None)
        ),
        _row(
            DUPLICATE,
            "a slot onto itself",
            "InvalidArgument",
            lambda s: s.pool.copy_from(s.a_ids[0], s.a_ids[0]),
        ),
        _row(
            DUPLICATE,
            "a repeated destination",
            "DuplicateIds",
            lambda s: s.pool.copy_from(s.a_ids, [s.b_ids[0], s.b_ids[0]]),
        ),
    ],
    "fork_from": [
        _row(DEGENERATE, "two sources", "InvalidArgument", lambda s: s.pool.fork_from(s.a_ids, s.b)),
        _row(DEGENERATE, "no source", "InvalidArgument", lambda s: s.pool.fork_from([], s.b)),
        _row(DOUBLE, "a free slot", "InvalidArgument", lambda s: s.pool.fork_from(s.free_ids[0], s.b)),
        _row(OUT_OF_RANGE, "slot 0", "SlotOutOfRange", lambda s: s.pool.fork_from(0, s.b)),
        _row(NEGATIVE, "a negative slot", "SlotOutOfRange", lambda s: s.pool.fork_from(-3, s.b)),
        _row(WRONG_TYPE, "a float slot", "InvalidArgument", lambda s: s.pool.fork_from(1.0, s.b)),
        _row(
            WRONG_TYPE,
            "an owner that is not an Owner",
            "InvalidArgument",
            lambda s: s.pool.fork_from(s.a_ids[0], "b"),
        ),
    ],
    "poisoned": [
        _row(WRONG_TYPE, "a float tensor", "InvalidArgument", lambda s: s.pool.poisoned(torch.tensor([1.0]))),
        _row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.pool.poisoned(None)),
        _row(
            OUT_OF_RANGE,
            "a slot past the end",
            "SlotOutOfRange",
            lambda s: s.pool.poisoned(torch.tensor([7])),
        ),
        _row(OUT_OF_RANGE, "the reserved slot", "SlotOutOfRange", lambda s: s.pool.poisoned([0])),
        _row(NEGATIVE, "a negative slot", "SlotOutOfRange", lambda s: s.pool.poisoned([-1])),
    ],
}

KV_BUFFER: dict[str, list[Row]] = {
    "__init__": [
        _row(
            DEGENERATE,
            "num_slots 0",
            "InvalidArgument",
            lambda s: KVBufferPool(0, num_layers=1, num_kv_heads=1, head_dim=1),
        ),
        _row(
            NEGATIVE,
            "negative heads",
            "InvalidArgument",
            lambda s: KVBufferPool(4, num_layers=1, num_kv_heads=-1, head_dim=1),
        ),
        _row(
            WRONG_TYPE,
            "a float head_dim",
            "InvalidArgument",
            lambda s: KVBuffer(4, num_layers=1, num_kv_heads=1, head_dim=2.0),
        ),
        _row(
            WRONG_TYPE,
            "an integer dtype",
            "InvalidArgument",
            lambda s: KVBufferPool(4, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.int64),
        ),
        _row(
            WRONG_TYPE,
            "an unknown device",
            "InvalidArgument",
            lambda s: KVBufferPool(4, num_layers=1, num_kv_heads=1, head_dim=1, device="meta"),
        ),
    ],
    "for_allocator": [
        _row(
            WRONG_TYPE,
            "None",
            "InvalidArgument",
            lambda s: KVBufferPool.for_allocator(None, num_layers=1, num_kv_heads=1, head_dim=1),
        ),
        _row(
            WRONG_TYPE,
            "a tensor",
            "InvalidArgument",
            lambda s: KVBufferPool.for_allocator(torch.zeros(3), num_layers=1, num_kv_heads=1, head_dim=1),
        ),
        _row(
            DEGENERATE,
            "layers 0",
            "InvalidArgument",
            lambda s: KVBufferPool.for_allocator(
                TokenToKVPoolAllocator(4), num_layers=0, num_kv_heads=1, head_dim=1
            ),
        ),
    ],
    "set_kv_buffer": [
        _row(
            OUT_OF_RANGE,
            "a layer past the last",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(2, s.slots, s.kv, s.kv),
        ),
        _row(
            NEGATIVE,
            "a negative layer",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(-1, s.slots, s.kv, s.kv),
        ),
        _row(
            OUT_OF_RANGE,
            "a slot past the end",
            "SlotOutOfRange",
            lambda s: s.pool.set_kv_buffer(0, [1, 10], s.kv, s.kv),
        ),
        _row(
            NEGATIVE,
            "a negative slot",
            "SlotOutOfRange",
            lambda s: s.pool.set_kv_buffer(0, [1, -1], s.kv, s.kv),
        ),
        _row(
            DUPLICATE,
            "a repeated slot",
            "DuplicateIds",
            lambda s: s.pool.set_kv_buffer(0, [1, 1], s.kv, s.kv),
        ),
        _row(
            DEGENERATE,
            "k of the wrong shape",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, s.slots, s.kv[:1], s.kv),
        ),
        _row(
            WRONG_TYPE,
            "k of the wrong dtype",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, s.slots, s.kv.double(), s.kv),
        ),
        _row(
            WRONG_TYPE,
            "v not a tensor",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, s.slots, s.kv, None),
        ),
        _row(
            WRONG_TYPE,
            "a float slot",
            "InvalidArgument",
            lambda s: s.pool.set_kv_buffer(0, [1.0, 2.0], s.kv, s.kv),
        ),
    ],
    "zero_slots": [
        _row(
            OUT_OF_RANGE,
            "a slot past the end",
            "SlotOutOfRange",
            lambda s: s.pool.zero_slots(torch.tensor([1, 10])),
        ),
        _row(NEGATIVE, "a negative slot", "SlotOutOfRange", lambda s: s.pool.zero_slots(torch.tensor([-1]))),
        _row(
            WRONG_TYPE, "a float tensor", "InvalidArgument", lambda s: s.pool.zero_slots(torch.tensor([1.0]))
        ),
    ],
    "poison_slots": [
        _row(
            OUT_OF_RANGE,
            "a slot past the end",
            "SlotOutOfRange",
            lambda s: s.pool.poison_slots(torch.tensor([2, 11])),
        ),
        _row(
            NEGATIVE, "a negative slot", "SlotOutOfRange", lambda s: s.pool.poison_slots(torch.tensor([-2]))
        ),
        _row(WRONG_TYPE, "a str", "InvalidArgument", lambda s: s.pool.poison_slots("1")),
    ],
    "poisoned": [
        _row(
            OUT_OF_RANGE,
            "a slot past the end",
            "SlotOutOfRange",
            lambda s: s.pool.poisoned(torch.tensor([10])),
        ),
        _row(WRONG_TYPE, "None", "InvalidArgument", lambda s: s.pool.poisoned(None)),
    ],
    "get_key_buffer": [
        _row(OUT_OF_RANGE, "a layer past the last", "InvalidArgument", lambda s: s.pool.get_key_buffer(2)),
        _row(NEGATIVE, "a negative layer", "InvalidArgument", lambda s: s.pool.get_key_buffer(-1)),
        _row(WRONG_TYPE, "a slice", "InvalidArgument", lambda s: s.pool.get_key_buffer(slice(0, 2))),
    ],
    "get_value_buffer": [
        _row(OUT_OF_RANGE, "a layer past the last", "InvalidArgument", lambda s: s.pool.get_value_buffer(2)),
        _row(NEGATIVE, "a negative layer", "InvalidArgument", lambda s: s.pool.get_value_buffer(-1)),
        _row(WRONG_TYPE, "a float layer", "InvalidArgument", lambda s: s.pool.get_value_buffer(0.0)),
    ],
}


def _cases(cls: str, scene: str, rows: dict[str, list[Row]]) -> list[Case]:
    return [
        Case(
            f"{cls}.{method}",
            cat,
            label,
            "empty" if method == "__init__" else scene,
            call,
            err,
            ledger,
            setup,
        )
        for method, method_rows in rows.items()
        for cat, label, err, call, ledger, setup in method_rows
    ]


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
            _row(
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
    *(c for kind, cls in POOLS.items() for c in _cases(cls, kind, _pool_rows(kind))),
    *_cases("KVBufferPool", "kv_buffer", KV_BUFFER),
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
            _q(cls, kind, "ledger", lambda s: s.pool.ledger),
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
    _q(
        "MambaPool",
        "mamba",
        "flush",
        lambda s: s.pool.flush(),
        "applies scheduled writes: allowed in every state",
    ),
]
