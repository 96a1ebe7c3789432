"""Speculative decoding (EAGLE/MTP): the over-allocation before a verify, the row it needs, the rejected tail."""

from __future__ import annotations

from kvledger.contracts.invariants.model import (
    Area,
    Invariant,
    Origin,
    Severity,
    contract,
    input_check,
    oracle,
)

SPEC = "kvledger/reference/scheduler/speculative.py"
SPEC_CONFIG = "kvledger/reference/scheduler/spec_config.py"
MODEL = "kvledger/reference/model/speculative.py"
SCHED_MACHINES = ("kvledger/museum/machines/scheduler.py:SchedulerMachine",)
PARTS = ("speculative", "scheduler", "kv-token-pool", "kv-page-pool", "req-rows")

AREA = Area(
    key="speculative",
    title="Speculative decoding",
    order=37,
    intro=(
        "A speculative decode step (SGLang's EAGLE/MTP, `speculative_num_steps`, `speculative_eagle_topk`,"
        " `speculative_num_draft_tokens`) over-allocates the drafts' KV before a verify forward, keeps the"
        " accepted prefix and the target's bonus token, and gives the rest back. `kv_allocated_len` runs"
        " ahead of `kv_committed_len` between the allocation and the verify's result (I-REQ-LADDER still"
        " holds, with the row's width as its bound). The model, the footprint formula and the acceptance"
        " draws: [speculative.md](speculative.md)."
    ),
    invariants=(
        Invariant(
            id="I-SPEC-ROW",
            title="the request row holds the speculative over-allocation",
            statement=(
                "The request-to-token rows are at least `max_context_len` plus the speculative headroom wide"
                " (`4 + num_draft_tokens`, and at page > 1 the reserve plus a partly filled page: one step's"
                " `alloc_len_per_decode`, two with overlap); a narrower row pool is refused at construction"
                " (`RowTooNarrow`). Every over-allocation ends within the row, checked before the write, and"
                " after every step each running request has `kv_committed_len <= kv_allocated_len <=` the"
                " row width."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=PARTS,
            upstream=(
                "N18: SGLang PR #26972 (a narrow row clamped the release slice; the pages leaked)",
                "SGLang `eagle_prepare_for_decode` fail-fast on the row width",
            ),
            checks=(
                input_check(f"{SPEC}:SpecDecoding.check_row_width", "rows narrower than the headroom"),
                contract(f"{SPEC}:SpecDecoding.check_fits_row", "before each over-allocation's write"),
                contract(f"{SPEC}:SpecDecoding.check_requests", "after every step"),
            ),
            exercised_by=SCHED_MACHINES,
        ),
        Invariant(
            id="I-SPEC-TAIL",
            title="the rejected tail goes back in the same step",
            statement=(
                "When a verify's result is processed, the request keeps its committed length plus, when a"
                " launched batch (overlap) still writes them, one verify's positions; the KV of whole pages"
                " above that returns to the free list in the same step. After every step a running request"
                " that no launched batch references holds no KV beyond `kv_committed_len` (the page holding it"
                " aside), and one that a launched batch references none beyond `ceil_page(kv_committed_len +"
                " reserve)`."
            ),
            severity=Severity.BUG,
            origin=Origin.KVLEDGER,
            parts=PARTS,
            upstream=(
                "SGLang PR #12224 (`kv_committed_len`/`kv_allocated_len`, `pop_overallocated_kv_cache`)",
                "vLLM PR #57605 / V3 (spec rollback shrinking the requirement)",
            ),
            checks=(
                contract(f"{SPEC}:SpecDecoding.release_rejected_tail", "at each verify's result"),
                contract(f"{SPEC}:SpecDecoding.check_requests", "after every step"),
            ),
            exercised_by=SCHED_MACHINES,
        ),
        Invariant(
            id="I-SPEC-STATE",
            title="after a verify, the recurrent state is the accepted prefix's",
            statement=(
                "A verify advances the working Mamba state through every drafted position; afterwards the"
                " working slot holds exactly the state after the kept tokens (the accepted drafts and the"
                " bonus, cut at the finish), never a rejected draft's update. Mamba V2 captures only at an"
                " accepted position: the tracked length is a multiple of `mamba_track_interval` in"
                " `(start, kv_committed_len]` (I-TRACK-POINT), and the tracking half holds that prefix's state."
            ),
            severity=Severity.BUG,
            origin=Origin.SGLANG,
            parts=("speculative", "model-runner", "mamba-pool", "mamba-v2"),
            upstream=(
                "N3: vLLM PR #55178 (a padded tail persisted the state after placeholders)",
                "SGLang PR #35821 (clamp the speculative track step)",
            ),
            checks=(
                oracle(f"{MODEL}:check_state_at_committed", "the working state against the model run alone"),
            ),
            exercised_by=(
                "tests/model/test_speculative_oracle.py:test_verify_leaves_the_accepted_prefix_state",
            ),
        ),
    ),
)
