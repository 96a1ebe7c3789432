"""The caches against their abstract model: what the generic cache machine checks after every rule."""

from __future__ import annotations

from kvledger.contracts.invariants.model import Area, Invariant, Origin, Severity, contract, oracle

BASE = "kvledger/museum/machines/cache_base.py"
MAMBA = "kvledger/museum/machines/cache.py"
MODEL = "kvledger/museum/machines/cache_model.py"
MAMBA_TREE = "kvledger/reference/radix/mamba_radix_cache.py"
MACHINES = "tests/caches/test_stateful.py"

BOTH = ("radix-cache", "mamba-radix-cache")
ALL_MACHINES = (
    f"{MACHINES}:PlainPage1",
    f"{MACHINES}:PlainPaged",
    f"{MACHINES}:MambaPage1",
    f"{MACHINES}:MambaPaged",
)

AREA = Area(
    key="models",
    title="Caches against their abstract model",
    order=25,
    intro=(
        "The cache machine (`kvledger/museum/machines/cache_base.py`, `cache.py`, run by `kvledger hunt`"
        " and `tests/caches/test_stateful.py`) checks the radix caches against an abstract model"
        " (`cache_model.py`): a prefix-closed set of page-aligned token prefixes, each with the KV ids of"
        " its last page, and (Mamba) the set of prefixes with a state, each with the tag the machine wrote"
        " into it. A radix tree is one representation of that set; these invariants say what the"
        " representation must agree with. Every machine check raises a `ContractViolation` naming its"
        " invariant (`kvledger/museum/machines/checks.py`): the ones below, or an invariant of the caches,"
        " pools or scheduler where the check states exactly that (I-COUNT, I-EVICT-LOCKED, I-MAMBA-LOCK,"
        " I-COPY, I-BRANCHING, I-DONATION, I-HANDLE-OWNED, I-OWNER-RELEASE, I-IDLE-IDENTITY,"
        " I-NO-PARTIAL, I-TYPED-INPUT)."
    ),
    invariants=(
        Invariant(
            id="I-MODEL-TREE",
            title="the tree holds exactly the model's prefixes and states",
            statement=(
                "After every step the tree's cached page-aligned prefixes, with the KV ids of each last"
                " page, equal the model's, and (Mamba) the prefixes that have a state, with the state's"
                " contents, equal the model's."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=BOTH,
            checks=(oracle(f"{BASE}:RadixCacheMachine.refines_the_model", "extract the tree, compare"),),
            exercised_by=ALL_MACHINES,
        ),
        Invariant(
            id="I-MODEL-MATCH",
            title="a match returns the model's longest prefix",
            statement=(
                "`match_prefix(key)` returns the model's longest cached prefix of `key` (for the Mamba"
                " tree, the longest that has a state), the ids the model holds for it, and a last node whose"
                " path is that prefix; a chunk just cached matches at its full length and leaves the"
                " request's locked prefix where it was."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=BOTH,
            checks=(
                oracle(f"{BASE}:RadixCacheMachine.check_match", "length, ids and last node"),
                oracle(f"{MAMBA}:MambaCacheMachine.checkpoint", "the chunk just cached matches whole"),
            ),
            exercised_by=ALL_MACHINES,
        ),
        Invariant(
            id="I-MODEL-INSERT",
            title="an insert reports the model's duplicates and adoption",
            statement=(
                "`insert(key, value)` reports as `prefix_len` the model's longest cached prefix of `key`,"
                " frees each of those duplicate ids exactly once and adopts the rest; the Mamba tree adopts"
                " the state exactly when the model has none at `key`."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=BOTH,
            checks=(
                oracle(f"{BASE}:RadixCacheMachine.insert", "prefix_len and adoption"),
                oracle(f"{BASE}:RadixCacheMachine.insert_unmatched", "each duplicate freed once"),
            ),
            exercised_by=ALL_MACHINES,
        ),
        Invariant(
            id="I-MODEL-SHRINK",
            title="eviction only removes",
            statement=(
                "Eviction (and a release that prunes a tombstone leaf) only removes prefixes and states:"
                " nothing appears, a kept prefix keeps its ids and a kept state its contents, and only leaves go"
                " (the cached set stays prefix-closed)."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=BOTH,
            checks=(
                oracle(f"{MODEL}:CacheModel.check_shrink", "before and after, as sets"),
                contract(f"{MAMBA_TREE}:MambaRadixCache._evict_leaf", "precondition: only leaves go"),
            ),
            exercised_by=ALL_MACHINES,
        ),
        Invariant(
            id="I-MODEL-EVICT",
            title="evict frees what it reports, as much as was asked",
            statement=(
                "`evict(n)` reports exactly the tokens that left the tree and frees at least"
                " `min(n, evictable)`; `evict_mamba(n)` likewise in states."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=BOTH,
            checks=(
                oracle(f"{BASE}:RadixCacheMachine.evict_full"),
                oracle(f"{BASE}:RadixCacheMachine.evict_states"),
                contract(f"{MAMBA_TREE}:MambaRadixCache.evict_full", "postcondition"),
                contract(f"{MAMBA_TREE}:MambaRadixCache.evict_mamba", "postcondition"),
            ),
            exercised_by=ALL_MACHINES,
        ),
        Invariant(
            id="I-UNLOCK-PATH",
            title="a release unlocks exactly the nodes its lock locked",
            statement=(
                "`dec_lock_ref` takes one lock off exactly the nodes on the path from the root to the node"
                " the lock was taken on (the path recorded at `inc_lock_ref`; a node split off that path"
                " since carries the lock too) and changes no other node's lock count."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=BOTH,
            upstream=("issue 25: a lock taken on one node and released on another, found only at the next insert",),
            checks=(
                oracle(f"{BASE}:RadixCacheMachine.check_unlocked", "lock counts before and after each release"),
            ),
            exercised_by=ALL_MACHINES,
            notes=(
                "Checked by the machines, not the caches: the lock's own postcondition (I-LOCK-TREE) sees only"
                " the node the handle names, and the recount in `audit()` (I-LOCK-TREE) only at the next audit,"
                " after other rules may have moved the damage."
            ),
        ),
        Invariant(
            id="I-MODEL-COW",
            title="copy-on-write happens when it can, never when not asked",
            statement=(
                "A match asked for copy-on-write that found a state returns a copy slot, giving up only when"
                " no slot is free and no state but the pinned source is evictable; a match not asked for"
                " it, or that found no state, returns none."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=("mamba-radix-cache",),
            checks=(
                oracle(f"{BASE}:RadixCacheMachine.admit_one"),
                oracle(f"{MAMBA}:MambaCacheMachine.cow_into_held_slot"),
            ),
            exercised_by=(f"{MACHINES}:MambaPage1", f"{MACHINES}:MambaPaged"),
        ),
    ),
)
