"""Shared ownership of blocks (vLLM v1's BlockPool): holder sets, reference counts, the null block."""

from __future__ import annotations

from kvledger.contracts.invariants.model import Area, Invariant, Origin, Severity, contract, input_check

LEDGER = "kvledger/contracts/shared_owners.py"
ATTACH = "kvledger/engines/vllm/attach.py"
PARTS = ("vllm-block-pool",)
# kvledger states these over vLLM's bookkeeping; the identities themselves are vLLM's own
UPSTREAM = ("vLLM v1 BlockPool / KVCacheManager (vllm/v1/core), checked against release 0.34.0",)
MACHINES = ("kvledger/engines/vllm/machine.py:HybridMachine",)
HUNT = "kvledger/engines/vllm/hunt.py"

AREA = Area(
    key="shared",
    title="Shared ownership (vLLM v1 block pool)",
    order=60,
    intro=(
        "vLLM v1 shares a physical block between every request whose prefix hit it, with a reference"
        " count on the block, instead of one owner per slot. `SharedLedger` mirrors vLLM's real"
        " `KVCacheManager` (a full-attention group and a Mamba group in `align` mode) after every call of"
        " the attach and checks these identities. What is and isn't checked, and how vLLM's model differs"
        " from SGLang's: [vllm-attach.md](vllm-attach.md)."
    ),
    invariants=(
        Invariant(
            id="I-SHARED-REFCOUNT",
            title="a block's reference count is the number of its holders",
            statement=(
                "For every block but the null block, `ref_cnt` equals the number of requests whose block"
                " list (any KV cache group) contains it."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            upstream=UPSTREAM,
            parts=PARTS,
            checks=(contract(f"{LEDGER}:SharedLedger._check_counts", "after every attached call"),),
            exercised_by=MACHINES,
        ),
        Invariant(
            id="I-SHARED-FREE-QUEUE",
            title="the free queue holds exactly the unheld blocks, each once",
            statement=(
                "A block is in the free queue (as free or as an evictable cached block) if and only if no"
                " request holds it, and at most once; a held block there is a double free, an unheld"
                " block missing from it is a leak."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            upstream=UPSTREAM,
            parts=PARTS,
            checks=(contract(f"{LEDGER}:SharedLedger._check_counts", "after every attached call"),),
            exercised_by=MACHINES,
        ),
        Invariant(
            id="I-SHARED-HANDOUT",
            title="a held block is given to another request only as a prefix-cache hit",
            statement=(
                "A block that a call adds to a request's list while other requests hold it must be one"
                " that `get_computed_blocks` returned to that request; no request lists a real block twice"
                " in one group."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            upstream=UPSTREAM,
            parts=PARTS,
            checks=(contract(f"{LEDGER}:SharedLedger._check_handouts", "after every attached call"),),
            exercised_by=MACHINES,
        ),
        Invariant(
            id="I-SHARED-RELEASED",
            title="a freed request holds nothing",
            statement="After `free(request)`, no block (the null block included) lists the request as holder.",
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            upstream=UPSTREAM,
            parts=PARTS,
            checks=(
                contract(f"{LEDGER}:SharedLedger._check_released", "after every attached free"),
                input_check(f"{ATTACH}:WatchedHybrid.free", "free of a request never seen: UnknownRequest"),
            ),
            exercised_by=MACHINES,
        ),
        Invariant(
            id="I-SHARED-NULL",
            title="the null block is never free and never a real block",
            statement=(
                "The null block (id 0, the placeholder for skipped positions in Mamba `align` mode and"
                " sliding windows) is never in the free queue and never appears in a full-attention"
                " group's block list."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            upstream=UPSTREAM,
            parts=PARTS,
            checks=(contract(f"{LEDGER}:SharedLedger._check_null", "after every attached call"),),
            exercised_by=MACHINES,
        ),
        Invariant(
            id="I-SHARED-MAMBA-RETAINED",
            title="a request keeps only its live Mamba states",
            statement=(
                "In a Mamba group in `align` mode a request keeps at most 2 + its speculative and"
                " prefill-checkpoint blocks + ceil(in-flight tokens / block size) real state blocks: the"
                " state after its last processed token, the block being written and the one copied from,"
                " and the states of steps whose output has not come back. An older state is retired"
                " (freed, its slot replaced by the null block)."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            upstream=(
                *UPSTREAM,
                "vLLM PR #55450 (retirement stopped at null gaps; in 0.29.0, fixed in 0.30.0)",
            ),
            parts=PARTS,
            checks=(
                contract(f"{LEDGER}:SharedLedger._check_retained", "after every attached call"),
                contract(f"{ATTACH}:live_states", "the bound, from vLLM's request and spec"),
            ),
            exercised_by=(*MACHINES, f"{HUNT}:hunt"),
            notes=(
                "Found by the generic machine in vLLM 0.29.0 (chunked prefill with an asynchronous"
                " scheduler), clean in 0.30.0 at the same budget: tests/engines/vllm/test_vllm_history.py."
            ),
        ),
    ),
)
