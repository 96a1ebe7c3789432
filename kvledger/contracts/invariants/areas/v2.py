"""Mamba V2 (``extra_buffer``): tracking slots, captures, branching points, donation, the insert length."""

from __future__ import annotations

from kvledger.contracts.invariants.model import (
    Area,
    Invariant,
    Origin,
    Severity,
    contract,
    oracle,
    proof,
)

TRACKING = "kvledger/reference/scheduler/tracking.py"
V2_PATH = "kvledger/reference/scheduler/cache_paths/mamba_v2.py"
ACCOUNTING = "kvledger/reference/scheduler/accounting.py"
SCHED = "kvledger/reference/scheduler/scheduler.py"
REQUEST = "kvledger/reference/scheduler/request.py"
RUNNER = "kvledger/reference/model/runner.py"
MAMBA_TREE = "kvledger/reference/radix/mamba_radix_cache.py"
TRACK = "kvledger/contracts/mamba_track.py"
STATE_ORACLE = "kvledger/reference/model/state_oracle.py"

SCHED_MACHINES = ("kvledger/museum/machines/scheduler.py:v2_machine",)
ORACLE_MACHINES = ("tests/model/test_oracle_v2.py:v2_oracle_machine",)
CACHE_MACHINES = ("tests/caches/test_stateful.py:MambaV2Machine",)
V2 = ("mamba-v2", "scheduler", "mamba-pool")

AREA = Area(
    key="mamba-v2",
    title="Mamba V2 (extra_buffer)",
    order=35,
    intro=(
        "SGLang's `extra_buffer` strategy (PR #14792): any page size and the overlap scheduler; each"
        " admitted request holds a working slot and `k` ping-pong tracking slots (2 with overlap, 1"
        " without); a forward captures the state into a tracking slot once per extend of at least one chunk"
        " (at the branching point `match_prefix` reported when it lies inside the extend) and every"
        " `mamba_track_interval` decoded tokens; the tree takes a tracked state by donation, and only the"
        " tracked length is cached. V1 against V2, side by side: [mamba-v2.md](mamba-v2.md). These hold in"
        " V2 (I-REQ-MAMBA also in V1, with `k = 0`); the invariants of the other areas hold in both modes"
        " (I-TOMBSTONE included: every V2 insert carries a state)."
    ),
    invariants=(
        Invariant(
            id="I-REQ-MAMBA",
            title="what Mamba slots a request's handles name",
            statement=(
                "A request without a row names at most its copy-on-write slot and no tracking slots; an"
                " admitted request names its working slot and, under V2, exactly `k` tracking slots (2 with"
                " overlap, 1 without); all distinct. Every release clears the tracking handle."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=V2,
            upstream=("sglang-memory-model.md §5.4", "SGLang PR #14792", "N1: SGLang PR #26941"),
            checks=(
                contract(f"{TRACKING}:check_req_mamba", "per request"),
                contract(
                    f"{ACCOUNTING}:Accounting._count_changed", "every request that changed, after every step"
                ),
                contract(
                    f"{TRACKING}:MambaTracking.plan_extend", "no extend under V2 without tracking slots"
                ),
                contract(
                    f"{TRACKING}:MambaTracking.release", "frees the tracking slots and clears the handle"
                ),
                proof(f"{TRACK}:ping_pong_size"),
            ),
            exercised_by=SCHED_MACHINES,
        ),
        Invariant(
            id="I-STATE-BOUND",
            title="a request holds at most 1 + k state slots",
            statement=(
                "The ledger never gives a live request more than `1 + k` Mamba slots (its working slot and its"
                " `k` tracking slots), whatever its handles say; a donation hands one over and takes one"
                " replacement."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=(*V2, "ledger"),
            upstream=("V1: vLLM PR #55450 (states retained past the bound, 71 -> 9 blocks per Mamba group)",),
            checks=(
                contract(f"{TRACKING}:MambaTracking.check_requests", "names the slots beyond the handles"),
                proof(f"{TRACK}:mamba_slot_demand"),
            ),
            exercised_by=SCHED_MACHINES,
        ),
        Invariant(
            id="I-TRACK-POINT",
            title="captures happen where V2 says, and hold that length's state",
            statement=(
                "An extend of at least one chunk captures exactly once: at the branching point when it lies"
                " inside the extend on the chunk grid counted from the extend's start, else at the last grid"
                " point; a decode step captures when the length reaches a multiple of `mamba_track_interval`."
                " The capture goes into a tracking slot of the request, inside the forward's extend."
                " `mamba_last_track_seqlen` is None or a page boundary in `(cache_protected_len,"
                " kv_committed_len]`, and the keep half holds the state of exactly that prefix."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*V2, "model-runner"),
            upstream=("SGLang PR #14792 (`_mamba_radix_cache_v2_req_prepare_for_extend`)",),
            checks=(
                contract(
                    f"{SCHED}:Scheduler", "class invariant over the requests whose tracked fields changed"
                ),
                contract(f"{REQUEST}:track_point_holds", "per request"),
                contract(
                    f"{RUNNER}:TinyHybridRunner._track_of",
                    "the capture lies in the extend, in a tracking slot",
                ),
                proof(f"{TRACK}:extend_track_seqlen"),
                proof(f"{TRACK}:mamba_cache_chunk_size"),
                oracle(
                    f"{STATE_ORACLE}:cached_state_mismatches",
                    "every cached state is its prefix's, bit for bit",
                ),
            ),
            exercised_by=(*SCHED_MACHINES, *ORACLE_MACHINES),
        ),
        Invariant(
            id="I-BRANCHING",
            title="match reports the V2 branching point",
            statement=(
                "In V2, `match_prefix` reports `mamba_branching_seqlen`, the matched KV length rounded down to"
                " the chunk, exactly when the match went past the deepest node with a state and that length"
                " reaches one chunk; in V1 never."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("mamba-radix-cache", "mamba-v2"),
            upstream=("SGLang PR #14792 (`_match_post_processor`)",),
            checks=(
                contract(
                    f"{MAMBA_TREE}:MambaRadixCache.match_prefix", "postcondition: V2 only, on the chunk grid"
                ),
                proof(f"{TRACK}:branching_seqlen"),
                oracle(
                    "tests/caches/test_differential.py:test_mamba_v2_cache_agrees_with_the_rule_model",
                    "every match against the rule model",
                ),
            ),
            exercised_by=CACHE_MACHINES,
        ),
        Invariant(
            id="I-DONATION",
            title="a donation hands over the keep half and takes a replacement",
            statement=(
                "`cache_unfinished_req` hands the keep half (the tracking slot holding the last captured"
                " state) to the tree, a ledger move request -> node with op `donate`, never a copy, and puts a"
                " freshly allocated slot in its place, so the request still holds `k` distinct tracking slots;"
                " with no slot to be had even after evicting one state, the donation is skipped (never an"
                " assertion)."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*V2, "mamba-radix-cache"),
            upstream=(
                "2026 SGLang: donation instead of a fork",
                "SGLang #36770 / #40128 / #37619 (the assertion)",
            ),
            checks=(
                contract(
                    f"{TRACKING}:MambaTracking.donate",
                    "postconditions: k distinct slots, the donated still the request's",
                ),
                proof(f"{TRACK}:other_track_idx"),
            ),
            exercised_by=(*SCHED_MACHINES, *CACHE_MACHINES),
        ),
        Invariant(
            id="I-V2-CACHE-LEN",
            title="V2 caches exactly the tracked length",
            statement=(
                "Under V2, `cache_unfinished_req` and `cache_finished_req` insert exactly"
                " `tokens[:mamba_last_track_seqlen]`, and the tracked state lands at the node that ends there;"
                " with nothing tracked since the last insert nothing is inserted (no ghost node, B16); at finish"
                " the KV above the cached length goes back with everything else the request held."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=(*V2, "mamba-radix-cache", "kv-token-pool", "kv-page-pool"),
            upstream=("SGLang PR #14792", "B16: SGLang PR #35821"),
            checks=(
                contract(
                    f"{V2_PATH}:MambaV2Path._check_tracked_insert", "the state's node ends at the tracked length"
                ),
                contract(f"{V2_PATH}:MambaV2Path.check_released", "nothing left after a V2 finish"),
                oracle(f"{STATE_ORACLE}:cached_state_mismatches", "every cached state against its prefix"),
            ),
            exercised_by=(*SCHED_MACHINES, *ORACLE_MACHINES),
        ),
    ),
)
