"""Pools and their ledgers: ownership of KV token slots, KV pages, request rows and Mamba slots."""

from __future__ import annotations

from kvledger.contracts.invariants.model import (
    Area,
    Invariant,
    Origin,
    Severity,
    contract,
    input_check,
    oracle,
    proof,
    recount,
)

LEDGER = "kvledger/contracts/ledger.py"
FREE_LIST = "kvledger/reference/pools/id_free_list.py"
VALIDATE = "kvledger/reference/pools/validate.py"
TOKEN = "kvledger/reference/pools/token_allocator.py"
PAGED = "kvledger/reference/pools/paged_allocator.py"
ROWS = "kvledger/reference/pools/req_to_token.py"
MAMBA = "kvledger/reference/pools/mamba_pool.py"
ARITH = "kvledger/contracts/arith.py"
ORACLES = "kvledger/contracts/oracle.py"
MACHINES = "tests/pools/test_pool_state_machines.py"

ALL_POOLS = ("kv-token-pool", "kv-page-pool", "req-rows", "mamba-pool")
ID_MACHINES = (
    f"{MACHINES}:TokenAllocatorMachine",
    f"{MACHINES}:ReqToTokenMachine",
    f"{MACHINES}:MambaPoolMachine",
    f"{MACHINES}:PagedAllocatorMachine",
)

AREA = Area(
    key="pools",
    title="Pools and ledgers",
    order=10,
    intro=(
        "Pools: `TokenToKVPoolAllocator` (token slots `1..size`), `PagedTokenToKVPoolAllocator` (pages"
        " `1..size//p`), `ReqToTokenPool` (rows `0..size-1`), `MambaPool` (slots `1..size`), all built on"
        " `IdFreeList` and shadowed by one `Ledger` each in debug builds. The state machines of"
        " `tests/pools/test_pool_state_machines.py` compare every pool with a plain-Python model (an ordered"
        " free list and a set per owner) after every step and run `pool.audit()` in an `@invariant`."
    ),
    invariants=(
        Invariant(
            id="I-PARTITION",
            title="every id has exactly one owner",
            statement=(
                "Every id of a pool's domain has exactly one owner at every step boundary: the free list,"
                " the open free group, or one holder. The holdings are disjoint and cover the domain."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*ALL_POOLS, "ledger"),
            checks=(
                contract(
                    f"{LEDGER}:Ledger.transfer", "one owner entry per id; moves only ids the source holds"
                ),
                recount(f"{LEDGER}:Ledger.audit", "owner table, holdings and the pool's free list agree"),
                recount(f"{FREE_LIST}:IdFreeList.audit", "free list against the state mask and the ledger"),
            ),
            exercised_by=ID_MACHINES,
        ),
        Invariant(
            id="I-EXCLUSIVE",
            title="no id free and held, or held twice",
            statement=(
                "No id is both free and held, or held by two owners; an owner releases or hands over only"
                " what it holds."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*ALL_POOLS, "ledger"),
            checks=(
                input_check(
                    f"{LEDGER}:Ledger.require_held_by", "`ForeignSlot` for ids the caller does not hold"
                ),
                contract(
                    f"{LEDGER}:Ledger.transfer",
                    "internal paths (`_free_unchecked`): names the slot, its holder and its history",
                ),
            ),
            exercised_by=ID_MACHINES,
        ),
        Invariant(
            id="I-NODUP-FREE",
            title="an id is freed at most once",
            statement=(
                "An id is freed at most once per allocation; the free list never holds an id twice."
                " (SGLang reports 1026 free slots of 1024 after a double free.)"
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*ALL_POOLS, "ledger"),
            checks=(
                input_check(
                    f"{FREE_LIST}:IdFreeList.validate_release",
                    "state mask: `DoubleFree`, also for ids pending in a free group, with or without a ledger",
                ),
                contract(f"{LEDGER}:Ledger.transfer", "internal paths"),
                recount(f"{LEDGER}:Ledger.audit", "free list without duplicates"),
            ),
            exercised_by=ID_MACHINES,
        ),
        Invariant(
            id="I-COUNT",
            title="the identity: accounts sum to the pool size",
            statement=(
                "Per pool, in the pool's unit: free + pending_free + cache.evictable + cache.protected +"
                " req.waiting + req.chunked + req.running + batch.inflight (+ any declared account) == size."
                " The ledger's accounts sum to the size and its free account equals the pool's"
                " `available_size()`; after every scheduler step the same identity holds from the"
                " implementation's own counters (the busy identity)."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*ALL_POOLS, "ledger", "scheduler"),
            checks=(
                contract(
                    f"{LEDGER}:Ledger._check_count",
                    "at every transfer and retag (the ledger's public boundaries): the accounts sum to the size",
                ),
                contract(
                    f"{TOKEN}:TokenToKVPoolAllocator", "class invariant: ledger free == available_size()"
                ),
                contract(f"{PAGED}:PagedTokenToKVPoolAllocator", "class invariant, in pages"),
                contract(f"{ROWS}:ReqToTokenPool", "class invariant, in rows"),
                contract(f"{MAMBA}:MambaPool", "class invariant, in slots"),
                contract(
                    "kvledger/contracts/identity.py:check_busy_identity",
                    "the busy identity after every scheduler step, with every holder term",
                ),
                contract(
                    "kvledger/reference/scheduler/accounting.py:Accounting._count_identities",
                    "contracts off: the same identity after every step (`IdentityFailure`)",
                ),
                contract(
                    "kvledger/reference/scheduler/accounting.py:Accounting.culprits",
                    "on a failure: the ids in dispute, their ledger owner, the bookkeeping's claim, the moves",
                ),
                recount(f"{LEDGER}:Ledger.audit", "per-account recount"),
                proof(
                    "kvledger/contracts/identity.py:identity_gap", "the gap arithmetic, proved by CrossHair"
                ),
                proof(f"{ARITH}:accounts_sum_to_size"),
            ),
        ),
        Invariant(
            id="I-CAP",
            title="no pool reports more than it has",
            statement="`0 <= available + pending <= size`, and every term of the identity is `>= 0`.",
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*ALL_POOLS, "radix-cache", "scheduler"),
            checks=(
                contract(f"{TOKEN}:TokenToKVPoolAllocator", "class invariant, with or without a ledger"),
                contract(f"{PAGED}:PagedTokenToKVPoolAllocator", "class invariant"),
                contract(f"{ROWS}:ReqToTokenPool", "class invariant"),
                contract(f"{MAMBA}:MambaPool", "class invariant"),
                contract("kvledger/contracts/identity.py:check_busy_identity", "no negative term"),
            ),
        ),
        Invariant(
            id="I-DIAG-DOMAIN",
            title="one id domain for allocator, ledger and diagnostics",
            statement=(
                "The ledger and every diagnostic enumerate exactly the ids the pool hands out. Slot 0 and"
                " page 0 are reserved padding: never handed out, never owned, refused as input."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*ALL_POOLS, "ledger"),
            upstream=("B18: a leak diagnostic over the wrong id domain",),
            checks=(
                input_check(f"{VALIDATE}:check_in_range", "`SlotOutOfRange` for ids outside the domain"),
                contract(
                    f"{FREE_LIST}:IdFreeList.__init__", "the ledger is built over the free list's own range"
                ),
                recount(f"{LEDGER}:Ledger.audit", "a reserved id has no owner"),
                recount(f"{FREE_LIST}:IdFreeList.audit", "reserved ids stay RESERVED"),
            ),
            exercised_by=ID_MACHINES,
        ),
        Invariant(
            id="I-NO-PARTIAL",
            title="a refused call changes nothing",
            statement=(
                "A rejected call changes nothing (free list, state mask, free-group buffer, ledger, counts,"
                " log, tensor contents); an allocation is all or nothing across the batch, `None` when short."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=ALL_POOLS,
            checks=(
                contract(
                    f"{TOKEN}:TokenToKVPoolAllocator.alloc",
                    "postcondition: a refused allocation leaves `available_size()` as it was",
                ),
                input_check(
                    f"{VALIDATE}:as_index_tensor", "validation before any mutation, in every pool method"
                ),
            ),
            exercised_by=ID_MACHINES,
        ),
        Invariant(
            id="I-REUSE-ORDER",
            title="ids are reused in SGLang's order",
            statement=(
                "`alloc(n)` takes the head of the free list; a free puts ids back at the tail (`fifo`:"
                " token slots, rows, Mamba slots) or at the head (`lifo`: pages, in first-seen order), and"
                " `free_group_end` returns the whole buffer as one batch."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=ALL_POOLS,
            upstream=("vLLM #51482: reuse order changes which stale data a bug exposes",),
            checks=(
                oracle(
                    f"{ORACLES}:check_free_list_order",
                    "the state machines compare the free list, in order, with the model after every step",
                ),
            ),
            exercised_by=ID_MACHINES,
        ),
        Invariant(
            id="I-PAGE-UNIT",
            title="the page is the unit of ownership",
            statement=(
                "For the paged pool the unit of ownership is the page: freeing any token of a page frees the"
                " page once, several tokens of one page in one call are one page; `alloc_extend` and"
                " `alloc_decode` fill the request's own partial last page before taking new pages."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("kv-page-pool",),
            checks=(
                contract(
                    f"{PAGED}:PagedTokenToKVPoolAllocator.free",
                    "postcondition: each distinct page freed once",
                ),
                input_check(
                    f"{PAGED}:PagedTokenToKVPoolAllocator._check_partial_page",
                    "`last_loc` offset, page held by the caller",
                ),
                proof(f"{ARITH}:extend_page_plan"),
                proof(f"{ARITH}:decode_needs_new_page"),
                proof(f"{ARITH}:pages_needed"),
            ),
            exercised_by=(f"{MACHINES}:PagedAllocatorMachine",),
        ),
        Invariant(
            id="I-PENDING",
            title="ids freed in a free group wait for its end",
            statement=(
                "An id freed inside a free group is owned by the group's pending owner (account"
                " `pending_free`): not available, refused by a second free, and back on the free list only"
                " at `free_group_end`. `backup_state`/`restore_state` refuse to run inside a group."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("kv-token-pool", "kv-page-pool", "mamba-pool", "ledger"),
            checks=(
                input_check(f"{FREE_LIST}:IdFreeList.free_group_begin", "`FreeGroupError` on misuse"),
                contract(f"{FREE_LIST}:IdFreeList.release", "ledger moves to the pending owner"),
                recount(f"{LEDGER}:Ledger.audit", "the free group agrees with the ledger"),
            ),
            exercised_by=(f"{MACHINES}:FreeGroupRules",),
        ),
        Invariant(
            id="I-ROLLBACK",
            title="restore_state only rolls back what was allocated since",
            statement=(
                "`restore_state` only rolls back allocations made since `backup_state` (their ids return to"
                " the free list from whoever holds them); a snapshot that would take back an id freed"
                " since, or one from another pool, is refused."
            ),
            severity=Severity.OPERATING_ERROR,
            origin=Origin.KVLEDGER,
            parts=("kv-token-pool", "kv-page-pool"),
            checks=(input_check(f"{FREE_LIST}:IdFreeList.restore", "`StaleSnapshot`"),),
            exercised_by=(f"{MACHINES}:BackupRules",),
        ),
        Invariant(
            id="I-TYPED-INPUT",
            title="bad input is a typed error",
            statement=(
                "Bad input (wrong dtype, device, shape or type; negative count; out-of-range or reserved id;"
                " repeated id) is a `KVLedgerError` subclass, never a bare `ValueError`/`IndexError` and"
                " never a `ContractViolation`, and it changes nothing."
            ),
            severity=Severity.OPERATING_ERROR,
            origin=Origin.KVLEDGER,
            parts=(*ALL_POOLS, "radix-cache", "scheduler"),
            checks=(
                input_check(f"{VALIDATE}:as_index_tensor", "ids: dtype, device, shape, ints beyond int64"),
                input_check(f"{VALIDATE}:check_count", "counts: ints >= 0, no bools or floats"),
                input_check(f"{VALIDATE}:check_unique", "`DuplicateIds`"),
                input_check(f"{MAMBA}:MambaPool.copy_from", "a copy onto itself or a repeated destination"),
            ),
            exercised_by=ID_MACHINES,
        ),
        Invariant(
            id="I-COPY",
            title="Mamba states are copied, never shared",
            statement=(
                "`copy_from` / `fork_from` / copy-on-write copy state, never share it: afterwards each"
                " destination holds its source's state bit for bit, as the source was when the copy was"
                " made, and the sources are left alone. The copy may be scheduled (I-WRITE-SCHEDULE)."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("mamba-pool",),
            checks=(
                contract(
                    f"{MAMBA}:MambaPool._copy_unchecked",
                    "postcondition: the copy is scheduled, or the fingerprints already match",
                ),
                contract(
                    f"{MAMBA}:MambaPool._apply_batch",
                    "postcondition, where the bytes move: destination fingerprint == source's",
                ),
                input_check(
                    f"{MAMBA}:MambaPool.copy_from", "repeated destinations, a source that is a destination"
                ),
            ),
            exercised_by=(f"{MACHINES}:MambaPoolMachine",),
        ),
    ),
)
