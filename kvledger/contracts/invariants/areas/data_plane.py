"""The data plane (debug builds): the right bytes are in the slots, not only the right counts."""

from __future__ import annotations

from kvledger.contracts.invariants.model import (
    Area,
    Invariant,
    Origin,
    Severity,
    contract,
    input_check,
    oracle,
    recount,
)

RUNNER = "kvledger/reference/model/runner.py"
MAMBA = "kvledger/reference/pools/mamba_pool.py"
KV_BUFFER = "kvledger/reference/pools/kv_buffer.py"
ORACLE_MACHINE = "tests/model/test_oracle.py:ModelOracleMachine"

AREA = Area(
    key="data-plane",
    title="Data plane (debug builds)",
    order=40,
    intro=(
        "Counting slots proves no slot was lost; these prove the right bytes are in them. They hold when"
        " the pools carry a real ledger (contracts on). Tensor contents move only through"
        " `kvledger/kernels`, whose Triton kernels are checked against their torch references."
    ),
    invariants=(
        Invariant(
            id="I-ZERO-ON-ALLOC",
            title="a slot is handed out zeroed",
            statement=(
                "A slot handed out is zeroed: Mamba slots always (a new request never inherits another's"
                " state), KV slots in debug builds."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("mamba-pool", "kv-token-pool", "kv-page-pool"),
            upstream=("llama.cpp / ik_llama #1696: a new sequence inherited a stale recurrent state",),
            checks=(
                contract(
                    f"{MAMBA}:MambaPool.alloc", "postcondition: every slot handed out is zero or scheduled to be"
                ),
                contract(f"{MAMBA}:MambaPool._apply_batch", "postcondition, where the bytes move: zero"),
            ),
            exercised_by=("tests/pools/test_pool_state_machines.py:MambaPoolMachine",),
        ),
        Invariant(
            id="I-POISON-ON-FREE",
            title="a freed slot is poisoned",
            statement=(
                "A freed KV slot (every token slot of a freed page) and a freed Mamba slot hold poison (NaN,"
                " or the integer minimum) until handed out again, so a stale read is visible in the data."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("mamba-pool", "kv-token-pool", "kv-page-pool"),
            checks=(
                contract(
                    f"{KV_BUFFER}:KVBufferPool.poison_slots", "postcondition: every slot reads as poisoned"
                ),
                contract(f"{MAMBA}:MambaPool._poison", "postcondition: every slot reads as poisoned"),
            ),
        ),
        Invariant(
            id="I-NO-POISON-READ",
            title="no read of a poisoned slot",
            statement=(
                "No forward reads a KV slot or Mamba slot holding poison while a live request references"
                " it; no copy reads a poisoned source."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("model-runner", "mamba-pool"),
            checks=(
                contract(f"{RUNNER}:TinyHybridRunner._check_reads"),
                contract(f"{RUNNER}:TinyHybridRunner._extend", "the Mamba slot a forward advances"),
                contract(f"{MAMBA}:MambaPool._copy_unchecked", "precondition: the source is not poisoned"),
                contract(f"{MAMBA}:MambaPool._apply_batch", "precondition, where the bytes move"),
            ),
            exercised_by=(ORACLE_MACHINE,),
        ),
        Invariant(
            id="I-WRITE-SCHEDULE",
            title="scheduled state writes are invisible",
            statement=(
                "The Mamba pool's scheduled zeroings and copies (spec/mamba-cache-vs-sglang.md §4) are"
                " invisible: every read of the state tensors sees them applied in the order they were made."
                " A scheduled write never targets or reads a free slot, no scheduled destination is also a"
                " source, and fewer than `FLUSH_AT` writes are pending."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("mamba-pool",),
            upstream=(
                "SGLang defers zeroing (`mamba_needs_clear`) and copy-on-write (`mamba_cow_src_index`) to"
                " the forward pass; the copy's source must stay pinned until then (PR #25000)",
            ),
            checks=(
                recount(f"{MAMBA}:MambaPool.audit", "the schedule's slots are held; its bookkeeping adds up"),
                contract(f"{MAMBA}:MambaPool", "class invariant: the schedule stays bounded"),
                oracle(
                    "tests/pools/test_mamba_schedule.py:ScheduleMachine",
                    "the pool against a dict of slot contents, read only now and then",
                ),
            ),
            exercised_by=("tests/pools/test_mamba_schedule.py:ScheduleMachine",),
        ),
        Invariant(
            id="I-KV-ROW-CONTENT",
            title="a row names the slot written for its token",
            statement=(
                "The KV slot a request's row names for position `q` was last written for that request's"
                " token at position `q`."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("model-runner", "req-rows"),
            checks=(
                contract(
                    f"{RUNNER}:TinyHybridRunner._check_reads",
                    "a shadow map slot -> (token, position) written by `set_kv_buffer`",
                ),
            ),
            exercised_by=(ORACLE_MACHINE,),
        ),
        Invariant(
            id="I-KERNEL-REF",
            title="each kernel equals its torch reference",
            statement=(
                "Each Triton kernel (KV store, slot copy, zero, poison, poison masks, fingerprint) equals its"
                " torch reference bit for bit, for fp32/bf16/fp16 (int32 for masks and fingerprints), int32"
                " and int64 indices, empty, single and permuted index sets; bad indices are rejected on the"
                " host before either backend runs."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("kernels",),
            checks=(
                oracle(
                    "kvledger/contracts/oracle.py:check_same_bits",
                    "the kernel tests compare every output with the reference's, bit for bit",
                ),
                input_check(
                    "kvledger/kernels/_checks.py:check_index",
                    "host-side bounds, dtype, device (`ValueError`)",
                ),
                input_check(
                    "kvledger/kernels/_checks.py:check_copy", "distinct destinations, disjoint pairs"
                ),
            ),
        ),
    ),
)
