"""Data tags (the hunt machines): every state and KV slot holds what its owner's tokens imply."""

from __future__ import annotations

from kvledger.contracts.invariants.model import Area, Invariant, Origin, Severity, contract, oracle

RUNNER = "kvledger/reference/scheduler/tagging_runner.py"
ROWS = "kvledger/reference/pools/row_writes.py"
ORACLE = "kvledger/museum/machines/data_oracle.py"
SCHEDULER_MACHINE = "tests/scheduler/test_scheduler_machine.py:TestSchedulerMachine"
PD_MACHINE = "tests/disagg/test_pd_machine.py:TestPDMachine"

AREA = Area(
    key="data-tags",
    title="Data tags (the hunt machines)",
    order=42,
    intro=(
        "The hash runner computes no state, so counts alone cannot tell one state slot from another. The"
        ' generic machines (`kvledger hunt`) run the tagged hash runner (`model="hash-tags"`,'
        " `kvledger/reference/scheduler/tagging_runner.py`): the same tokens, and in every state it advances"
        " and every KV slot it fills, through `kvledger/kernels`, a tag that is a pure function of the"
        " prefix it stands for (`kvledger/contracts/data_tags.py`), as a real recurrent state is. Copies,"
        " captures, donations, host copies and PD landings must carry the tags along; the runner checks what"
        " each forward reads, and the machines check everything held after every rule"
        " (`kvledger/museum/machines/data_oracle.py`)."
    ),
    invariants=(
        Invariant(
            id="I-DATA-STATE",
            title="every state slot holds the state of its owner's prefix",
            statement=(
                "A Mamba slot holds the state of the prefix its holder stands for, in every layer and both"
                " components: a tree node's, the state of its whole path; a request's working (or waiting"
                " copy-on-write) slot, the state of its first `kv_committed_len` tokens (so a forward starts"
                " from the state of the tokens before it); a V2 keep half, the state at"
                " `mamba_last_track_seqlen`; a retracted request's host copy, the state at its length."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("mamba-pool", "mamba-radix-cache", "mamba-v2", "scheduler", "pd-decode", "pd-channel"),
            upstream=(
                "issue 25: content bugs invisible to counts (the wrong ping-pong half donated, a capture"
                " recorded at the wrong point, a backup missing a component, a copy in the wrong direction)",
            ),
            checks=(
                contract(
                    f"{RUNNER}:TaggingHashRunner._advance_states", "the working state each forward reads"
                ),
                oracle(
                    f"{ORACLE}:check_scheduler_data",
                    "tree states, working and tracking slots, after every rule",
                ),
                oracle(f"{ORACLE}:check_host_copy", "a retracted PD decode request's host copy"),
            ),
            exercised_by=(SCHEDULER_MACHINE, PD_MACHINE),
            notes=(
                "Behind I-TRANSFER-ATOMIC, which trusts the channel's record of what landed: a decode request"
                " that committed its transfer holds the landed state, so a landing recorded but never written"
                " is found here (`tests/museum/test_data_oracle.py`)."
            ),
        ),
        Invariant(
            id="I-DATA-KV",
            title="every KV position holds its prefix's tag",
            statement=(
                "The KV slot a request's row names for position `p`, and the KV slot a tree node names for"
                " position `p` of its path, holds the tag of the tokens up to and including `p` (so does"
                " a retracted request's host copy of its K/V)."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("kv-token-pool", "kv-page-pool", "req-rows", "radix-cache", "pd-channel"),
            checks=(
                contract(
                    f"{RUNNER}:TaggingHashRunner._check_kv_reads", "every position a forward attends to"
                ),
                oracle(f"{ORACLE}:check_scheduler_data", "every position the tree caches, after every rule"),
                oracle(f"{ORACLE}:check_host_copy"),
            ),
            exercised_by=(SCHEDULER_MACHINE, PD_MACHINE),
            notes=(
                "The tiny hybrid model's runner checks the same at its reads with a shadow map of what was"
                " written where (I-KV-ROW-CONTENT); the tags need no shadow: the contents say it."
            ),
        ),
        Invariant(
            id="I-ROW-WRITE",
            title="a row write never covers an id its request still owns",
            statement=(
                "A write of positions of a request's `req_to_token` row covers no position that the request"
                " filled with a KV id it still owns (in the KV ledger): such an id would be lost, or named"
                " twice. A rewrite is of positions whose ids changed hands first (the re-match after an"
                " insert points the row at the tree's ids); positions past what the row's current owner has"
                " written (a reused row's stale ids) are not its own."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("req-rows", "kv-token-pool", "kv-page-pool", "scheduler"),
            upstream=(
                "issue 25: a row overwrite found only because unwritten positions still held padding id 0"
                " (B21, SGLang PR #33996: a chunk restarted at prefix 0 over its own first chunk)",
            ),
            checks=(
                contract(f"{ROWS}:RowWriteGuard.check_span", "ReqToTokenPool.write, before the write"),
                contract(f"{ROWS}:RowWriteGuard.check_cells", "ReqToTokenPool.write_each, before the write"),
            ),
            exercised_by=(SCHEDULER_MACHINE, PD_MACHINE),
        ),
    ),
)
