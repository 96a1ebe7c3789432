"""The radix prefix cache (KV) and the Mamba radix cache (KV + one state slot per node)."""

from __future__ import annotations

from kvledger.contracts.invariants.model import (
    Area,
    Invariant,
    Origin,
    Severity,
    contract,
    input_check,
    recount,
)

BASE = "kvledger/reference/radix/base.py"
PLAIN = "kvledger/reference/radix/radix_cache.py"
MAMBA = "kvledger/reference/radix/mamba_radix_cache.py"
TREE = "kvledger/contracts/tree_checks.py"
MACHINES = "tests/caches/test_stateful.py"

KV = ("radix-cache",)
STATE = ("mamba-radix-cache",)
BOTH = ("radix-cache", "mamba-radix-cache")
PLAIN_MACHINES = (f"{MACHINES}:PlainPage1", f"{MACHINES}:PlainPaged")
MAMBA_MACHINES = (f"{MACHINES}:MambaPage1", f"{MACHINES}:MambaPaged")

AREA = Area(
    key="caches",
    title="Radix caches",
    order=20,
    intro=(
        "Caches: `RadixCache` (KV only) and `MambaRadixCache` (KV plus one Mamba state slot per node)."
        " Both accept any page size, and the scheduler runs them at any page size. The Mamba radix cache"
        " runs under either of SGLang's strategies ([mamba-v2.md](mamba-v2.md)): V2, `extra_buffer` (the"
        " default of `EngineSpec` and `kvledger simulate`), at any page size, the tree built with the"
        " capture grid `mamba_cache_chunk_size` (which turns on the branching point of `match_prefix`),"
        " caching only the states the requests' tracking slots captured, taken by donation; or V1,"
        " `no_buffer`, at page size 1 only (states cached at token granularity: a fork of the working slot"
        " at the end of each chunk and of the prompt, the working slot itself at finish). The invariants"
        " below hold in both modes; V2's own are in their area below."
        " Every node owns its KV ids through `node.kv_owner` (ledger account `cache.protected` while"
        " `lock_ref > 0`, `cache.evictable` otherwise) and its state through `node.mamba_owner` (driven by"
        " `mamba_lock_ref`). Cheap identities are class invariants checked around every public call; the"
        " O(tree) recounts are pure functions in `kvledger/contracts/tree_checks.py`, run by `audit()`. The"
        " Hypothesis machines of `tests/caches/test_stateful.py` (both caches, page 1 and > 1) compare the"
        " tree with a set-of-prefixes model after every step and audit cache and pools.\n\n"
        "Typed errors (bad input changes nothing: tree, counters, LRU lists, locks, pools, ledgers):"
        " `InvalidKey` (unaligned key, `len(key) != len(value)`), `PrefixMismatch` (`value[:protected_len]`"
        " is not the tree's ids on the path), `ForeignSlot` / `DuplicateIds` (ids or a state slot the owner"
        " does not hold, repeated ids), `LockNotHeld` (double release, forged handle, a count that would go"
        " below zero), `ForeignNode` (a node or `LockRef` of another tree, a deleted node),"
        " `InvalidArgument` (negative evict, wrong dtype or type)."
    ),
    invariants=(
        Invariant(
            id="I-PROTECTED-DEF",
            title="KV counters equal a recount",
            statement=(
                "The token counters equal a recount: evictable = tokens of non-root nodes with"
                " `lock_ref == 0`, protected = those with `lock_ref > 0`, and each node's KV owner sits in"
                " the matching ledger account."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=BOTH,
            checks=(
                contract(
                    f"{PLAIN}:kv_counters_agree", "cheap: counters == ledger `cache.*` accounts, every call"
                ),
                recount(f"{TREE}:check_size_counters"),
            ),
            exercised_by=PLAIN_MACHINES + MAMBA_MACHINES,
        ),
        Invariant(
            id="I-LOCK-TREE",
            title="lock counts are the live locks below a node",
            statement=(
                "`lock_ref(n)` = live lock handles on `n` + the sum of its children's `lock_ref`; the root"
                " stays at 1. A release that would take a count below zero is refused, never reaches -1."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=BOTH,
            checks=(
                recount(f"{TREE}:check_lock_tree", "own counts from the live `LockRef` registry"),
                contract(f"{PLAIN}:RadixCache", "class invariant: the root stays locked exactly once"),
                input_check(f"{BASE}:RadixTreeBase._check_lock", "`LockNotHeld`"),
            ),
            exercised_by=PLAIN_MACHINES + MAMBA_MACHINES,
        ),
        Invariant(
            id="I-EVICT-LOCKED",
            title="eviction never frees what is locked",
            statement="Eviction never frees a node with `lock_ref > 0`, nor a state with `mamba_lock_ref > 0`.",
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=BOTH,
            checks=(
                contract(f"{PLAIN}:RadixCache._evict_leaf", "precondition"),
                contract(f"{MAMBA}:MambaRadixCache._evict_leaf", "precondition"),
                contract(
                    f"{MAMBA}:MambaRadixCache._tombstone", "precondition: a locked state is never tombstoned"
                ),
                contract(f"{PLAIN}:RadixCache.evict", "postcondition: protected unchanged"),
                contract(f"{MAMBA}:MambaRadixCache.evict_mamba", "postcondition: protected unchanged"),
            ),
            exercised_by=PLAIN_MACHINES + MAMBA_MACHINES,
        ),
        Invariant(
            id="I-NODE-NONEMPTY",
            title="no empty or unaligned node",
            statement=(
                "Every non-root node has `len(key) == len(value) > 0`, page-aligned, and owns whole"
                " allocator pages."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=BOTH,
            upstream=("B16: ghost node, SGLang #35821",),
            checks=(
                contract(f"{BASE}:RadixTreeBase._new_leaf", "precondition: never an empty node"),
                recount(f"{TREE}:check_node_keys"),
                input_check(f"{BASE}:RadixTreeBase._plan_insert", "`InvalidKey` for unaligned keys"),
            ),
            exercised_by=PLAIN_MACHINES + MAMBA_MACHINES,
        ),
        Invariant(
            id="I-KEYS",
            title="children are keyed by their first page",
            statement=(
                "Every non-root node is registered in its parent under its key's first page, with a matching"
                " `parent` link, reachable once from the root (no cycles, no shared children)."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=BOTH,
            upstream=("SGLang #36696: a split child kept its stale key",),
            checks=(
                recount(f"{TREE}:check_node_keys"),
                recount(f"{TREE}:collect_nodes", "no cycles"),
                contract(f"{BASE}:RadixTreeBase._unlink_leaf", "pop by first page"),
            ),
            exercised_by=PLAIN_MACHINES + MAMBA_MACHINES,
        ),
        Invariant(
            id="I-NO-TREE-ALIAS",
            title="no KV id in two nodes",
            statement=(
                "No KV id is in two nodes; with a ledger, each node's owner holds exactly its ids, so no"
                " request owns a tree id (a request's row may point at them)."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=BOTH,
            checks=(
                recount(f"{TREE}:check_no_alias"),
                input_check(
                    "kvledger/reference/radix/kv_side.py:KVSide.check_caller_ids",
                    "`ForeignSlot` for tree ids passed as the caller's",
                ),
            ),
            exercised_by=PLAIN_MACHINES + MAMBA_MACHINES,
        ),
        Invariant(
            id="I-MAMBA-DEF",
            title="state counters equal a recount",
            statement=(
                "State counters equal a recount: evictable = non-tombstone nodes with `mamba_lock_ref == 0`,"
                " protected = those with `> 0`; each state owner is in the matching account."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=STATE,
            checks=(
                contract(f"{MAMBA}:mamba_counters_agree", "cheap: counters == ledger `cache.*` accounts"),
                recount(f"{TREE}:check_mamba_counters"),
            ),
            exercised_by=MAMBA_MACHINES,
        ),
        Invariant(
            id="I-MAMBA-LOCK",
            title="state locks are the live locks that took the state",
            statement=(
                "`mamba_lock_ref(n)` = live locks on `n` that took the state; `0 <= mamba_lock_ref <="
                " lock_ref`; a tombstone has 0. `inc_lock_ref` takes the state lock iff the node has a state"
                " now, and records it."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=STATE,
            checks=(
                recount(f"{TREE}:check_mamba_lock"),
                contract(f"{MAMBA}:MambaRadixCache.inc_lock_ref", "postcondition"),
            ),
            exercised_by=MAMBA_MACHINES,
        ),
        Invariant(
            id="I-LOCK-SYMMETRY",
            title="a release undoes exactly what its lock took",
            statement=(
                "`dec_lock_ref` undoes exactly the components the `LockRef` recorded at `inc` time, never"
                " re-deriving them from the current `mamba_value`."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=STATE,
            upstream=("B14, fixed by SGLang PR #27147",),
            checks=(
                contract(
                    f"{MAMBA}:MambaRadixCache.dec_lock_ref", "postcondition: mamba_lock_ref == OLD - took"
                ),
                contract(f"{MAMBA}:MambaRadixCache._mamba_component_to_release", "the decision point"),
            ),
            exercised_by=(f"{MACHINES}:MambaPage1",),
        ),
        Invariant(
            id="I-TOMBSTONE",
            title="no unlocked tombstone leaf",
            statement=(
                "No unlocked leaf is a tombstone (evictions cascade through tombstone parents; releasing the"
                " last lock on a tombstone leaf deletes it); the root has no state and is in no LRU list;"
                " the state list holds exactly the non-root non-tombstone nodes. In V1 and V2 alike: every"
                " insert that creates a leaf carries a state (V2's branching points revive tombstones)."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=STATE,
            checks=(
                recount(f"{TREE}:check_tombstones"),
                contract(f"{BASE}:RadixTreeBase._prune_tombstones", "the cascade (any component's tombstone leaf)"),
            ),
            exercised_by=MAMBA_MACHINES,
        ),
        Invariant(
            id="I-LRU-ORDER",
            title="LRU lists are ordered by access time",
            statement=(
                "Each LRU list (full; state) holds its members once, oldest first in its own stamp's order"
                " (`last_access_time`; the state list's `mamba_access_time`, refreshed by other operations:"
                " spec/mamba-cache-vs-sglang.md R1-R3), with consistent links; after a match every node on"
                " the refreshed path is more recent than its parent."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=BOTH,
            upstream=("B3",),
            checks=(
                recount(f"{TREE}:check_lru"),
                recount("kvledger/reference/radix/lru.py:LRUList.oldest_first", "link symmetry, size"),
                contract(f"{TREE}:check_path_recency", "postcondition of both `match_prefix`"),
            ),
            exercised_by=PLAIN_MACHINES + MAMBA_MACHINES,
        ),
        Invariant(
            id="I-MAMBA-VALUE",
            title="a state is one slot, never shared",
            statement=(
                "A state is one slot; slots are pairwise distinct and held (ledger) by the node's state"
                " owner; a copy-on-write slot is the caller's own copy, never the tree's slot."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*STATE, "mamba-pool"),
            checks=(
                recount(f"{TREE}:check_mamba_values"),
                contract(f"{MAMBA}:_cow_slot_is_callers", "postcondition of `MambaRadixCache.match_prefix`"),
            ),
            exercised_by=MAMBA_MACHINES,
        ),
        Invariant(
            id="I-COW-SOURCE",
            title="the copy-on-write source stays pinned",
            statement=(
                "The copy-on-write source is a non-empty, non-tombstone node still in the tree, pinned"
                " (locked) across the pool-empty eviction retry until the copy is done."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=STATE,
            upstream=("B16",),
            checks=(
                contract(f"{MAMBA}:MambaRadixCache._copy_state", "preconditions"),
                contract(f"{MAMBA}:MambaRadixCache._pin_for_cow", "pinned around `evict_mamba(1)`"),
            ),
            exercised_by=MAMBA_MACHINES,
        ),
        Invariant(
            id="I-MATCH-STATE",
            title="a match ends at a node with a state",
            statement=(
                "`MambaRadixCache.match_prefix` returns the deepest node on the matched path that has a"
                " state (or the root), and KV ids exactly up to that node's depth."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=STATE,
            checks=(contract(f"{MAMBA}:MambaRadixCache.match_prefix", "postconditions"),),
            exercised_by=MAMBA_MACHINES,
        ),
    ),
)
