"""The museum's registry: one :class:`Exhibit` per historical bug, in catalogue order.

Sources: ``sglang-memory-model.md`` (B1-B22), ``pd-disaggregation-and-2026-bugs.md`` (N1-N18) and
``other-engines.md`` (vLLM). ``python -m kvledger.museum`` lists them; ``kvledger hunt`` puts them back
one at a time and runs the generic machines against them.
"""

from __future__ import annotations

from kvledger.museum import pd_bugs, spec_bugs
from kvledger.museum import scheduler_bugs as sb
from kvledger.museum.exhibit import Exhibit, Patch, replaced_name, replaced_names, replacing, replacing_all
from kvledger.reference.disagg import builder as pd_builder
from kvledger.reference.disagg.channel import TransferChannel
from kvledger.reference.disagg.decode import DecodeScheduler
from kvledger.reference.disagg.instance import PDScheduler
from kvledger.reference.disagg.prefill import PrefillScheduler
from kvledger.reference.radix import MambaRadixCache
from kvledger.reference.scheduler import Scheduler
from kvledger.reference.scheduler.cache_paths import MambaV2Path
from kvledger.reference.scheduler.memory import ReqMemory
from kvledger.reference.scheduler.spec_config import SpeculativeConfig
from kvledger.reference.scheduler.speculative import SpecDecoding
from kvledger.reference.scheduler.tracking import MambaTracking


def _exhibit(owner: object, name: str, wrap: sb.Wrap, **kw: object) -> Exhibit:
    return Exhibit(reenact=replacing(owner, name, wrap), replaces=replaced_name(owner, name), **kw)  # type: ignore[arg-type]


# B2 lived in three places of the pre-#12224 scheduler at once, and the release length (see scheduler_bugs).
_B2_PATCHES: tuple[Patch, ...] = (
    (Scheduler, "_drain_before_retract", sb.b2_retraction_does_not_drain),
    (Scheduler, "_check_retractable", sb.b2_retraction_accepts_a_launched_request),
    (Scheduler, "_discards_result", sb.b2_result_path_skips_the_retracted),
    (ReqMemory, "release_without_insert", sb.b2_retraction_frees_an_inferred_length),
)

EXHIBITS: tuple[Exhibit, ...] = (
    _exhibit(
        Scheduler,
        "process_batch_result",
        sb.b1_result_path_frees_the_extra_token,
        id="B1",
        upstream="sgl-project/sglang#6888 (PR #9068; removed by #12224)",
        title="overlap: the result path frees a finished request's extra token again",
        mechanism=(
            "With the overlap scheduler, batch N+1 is launched before batch N's results are processed, so a "
            "request that finishes in N decodes one extra token in N+1. The release of the finished request "
            "frees everything it allocated, that token included; the result path of N+1 then freed the "
            "discarded token's KV a second time (available_size > max_total_num_tokens)."
        ),
        breaks=("I-NODUP-FREE", "I-EXCLUSIVE", "I-CAP"),
    ),
    Exhibit(
        reenact=replacing_all(*_B2_PATCHES),
        replaces=replaced_names(*_B2_PATCHES),
        id="B2",
        upstream="sgl-project/sglang#11970 (PR #11981, #11976; #12224)",
        title="overlap: retraction frees an inferred KV length while the decode batch is in flight",
        mechanism=(
            "With the overlap scheduler, retraction ran in get_next_batch_to_run while the previous decode "
            "batch's results were still unprocessed, so each running request in that batch had allocated "
            "one KV token more than len(input) + len(output) - 1. Retraction freed that inferred length "
            "(len(input) + max(len(output) - 1, 0)) instead of what the request had allocated, and the "
            "batch's result path skipped the retracted request (is_retracted), so the last token stayed "
            "allocated with no owner (59 tokens in the report). The row was freed at once too, but only a "
            "later round's prefill could reuse it, after the batch's results: no in-flight hazard."
        ),
        breaks=("I-PARTITION", "I-OWNER-RELEASE", "I-COUNT"),
    ),
    Exhibit(
        id="B3",
        upstream="sgl-project/sglang#12007 (#38482, #36696)",
        title="Mamba LRU list out of order",
        mechanism=(
            "Intermittent: the Mamba LRU list's order disagreed with last_access_time at the idle sanity check. "
            "Later fixes point at splits that moved the unmatched suffix to MRU (#38482) and a split child "
            "registered under a stale key (#36696)."
        ),
        breaks=("I-LRU-ORDER",),
        reenact=None,
        scope="out of scope",
        why_out_of_scope=(
            "not in the issue's list: intermittent with no known mechanism; the cache machines' audit "
            "checks I-LRU-ORDER and tests/caches/test_contracts_fire.py breaks it by hand"
        ),
    ),
    Exhibit(
        id="B4",
        upstream="sgl-project/sglang#12432 (fix #12994; per-chunk free removed by #17850)",
        title="PD prefill chunk boundary frees the working Mamba slot, the handle stays set",
        mechanism=(
            "PD prefill, hybrid model, chunked prefill: every chunk boundary freed the request's row together "
            "with its working Mamba slot and left req.mamba_pool_idx set. The slot was free and in use at "
            "once (another request could take it) and was freed again at the end; SGLang's idle check saw "
            "the over-free much later (mamba_available_size=473, mamba_evictable_size=4 for a pool of 476). "
            "This is also the second seed (#12432 chunk path)."
        ),
        # I-IDLE-IDENTITY too: upstream's own idle check is where the over-free surfaced, and a hunt whose
        # shrink stops early (a clock-cut shrink under load) may report that failure of the same bug first.
        breaks=("I-HANDLE-OWNED", "I-NODUP-FREE", "I-EXCLUSIVE", "I-IDLE-IDENTITY"),
        reenact=pd_bugs.b4_chunk_frees_mamba_slot,
        replaces=replaced_name(PrefillScheduler, "process_prefill_chunk"),
        machine="pd",
    ),
    _exhibit(
        ReqMemory,
        "release_without_insert",
        sb.b5_release_skips_the_lone_cow_slot,
        id="B5",
        upstream="sgl-project/sglang PR #12693",
        title="abort of a waiting request keeps its copy-on-write slot",
        mechanism=(
            "match_prefix gives a waiting request a copy-on-write Mamba slot before it is admitted. The abort "
            "path released only requests holding a row, so a request cancelled while waiting kept the slot "
            "for good: a true leak, one slot per cancelled request."
        ),
        breaks=("I-OWNER-RELEASE", "I-COUNT", "I-PARTITION"),
    ),
    _exhibit(
        Scheduler,
        "_cleanup_stopper",
        sb.b6_16067_frees_the_stopper_slot_on_failure,
        id="#16067",
        upstream="sgl-project/sglang PR #16067 (reverted by #18910; fixed by #21404) — the first seed, B6",
        title="the first seed's reverted fix: free the stopper's COW slot even when it was appended",
        mechanism=(
            "To stop the waiting request's copy-on-write slot from tripping the idle check (the first seed, "
            "#15840), #16067 freed the slot whenever add_one_req did not return CONTINUE. But NO_TOKEN/OTHER "
            "also come back after the request was appended (the budget ran out with it), and then the slot "
            "is the admitted request's working slot: it was freed under a running request (KL divergence, "
            "reverted). #21404 frees it only when the request was not appended."
        ),
        breaks=("I-COW-STOPPER", "I-EXCLUSIVE"),
    ),
    _exhibit(
        Scheduler,
        "_abort_now",
        sb.b7_waiting_abort_bypasses_the_release,
        id="B7",
        upstream="sgl-project/sglang#20010, #20069 (PR #20182)",
        title="an abort path of a waiting request bypasses the release helper",
        mechanism=(
            "The queue-length-limit and waiting-timeout aborts took a waiting request out of the queue and "
            "ended it without calling the release helper the client abort used, so its copy-on-write slot "
            "leaked (Qwen3.5-27B at 20 concurrent). kvledger has one abort path; the exhibit makes it bypass "
            "the release for a waiting request, as those paths did."
        ),
        breaks=("I-OWNER-RELEASE", "I-COUNT", "I-LEDGER-AGREES"),
    ),
    _exhibit(
        Scheduler,
        "_release_or_defer",
        sb.b8_release_without_deferral,
        id="B8",
        upstream="sgl-project/sglang PR #17850",
        title="a row freed while the launched batch still reads it",
        mechanism=(
            "With overlap, the scheduler freed a request's row (at a chunk boundary or at finish) while the "
            "forward of the launched batch still read it; the next admission wrote another request's prefix "
            "into that row and corrupted the running one."
        ),
        breaks=("I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT",),
    ),
    _exhibit(
        Scheduler,
        "abort",
        sb.b9_abort_releases_an_ended_request,
        id="B9",
        upstream="sgl-project/sglang#17797 (PR #18694)",
        title="preemption/abort releases a request that already finished",
        mechanism=(
            "Priority preemption picked a running request that had already finished and been released, and "
            "released it again; #12224's idempotency flag turned the double free into 'Committed KV cache "
            "already freed'. kvledger's abort of an ended request is the same release path."
        ),
        breaks=("I-OWNER-RELEASE", "I-NODUP-FREE"),
    ),
    Exhibit(
        id="B10",
        upstream="sgl-project/sglang PR #9817",
        title="PD decode abort of a prebuilt request leaks its pre-allocation",
        mechanism=(
            "A PD decode request pre-allocated and transferred waits in the prebuilt queue; the abort handler "
            "did not call release_kv_cache for it, so its row, KV and Mamba slot leaked."
        ),
        breaks=("I-OWNER-RELEASE", "I-COUNT"),
        reenact=pd_bugs.b10_decode_abort_leaks_prebuilt,
        replaces=replaced_name(DecodeScheduler, "_release_finished_or_aborted"),
        machine="pd",
    ),
    Exhibit(
        id="B11",
        upstream="sgl-project/sglang PR #19002 (#20858, #22462, #23267, #23570)",
        title="decode Mamba pool smaller than rows x slots per request",
        mechanism=(
            "The PD decode Mamba pool was sized by max_num_reqs, without the pre-allocated rows it also serves "
            "(and later with pre_alloc added on top of an explicit size); _pre_alloc then found no working "
            "slot: 'Not enough space for mamba ping pong idx'."
        ),
        breaks=("I-SIZING",),
        reenact=pd_bugs.b11_decode_mamba_pool_ignores_rows,
        replaces=f"{pd_builder.__name__}.decode_mamba_slots",
        machine="pd",
    ),
    _exhibit(
        MambaRadixCache,
        "_mamba_component_to_release",
        sb.b14_dec_rederives_the_mamba_lock,
        id="B14",
        upstream="sgl-project/sglang PR #27147 (#21379)",
        title="dec_lock_ref re-derives what it releases",
        mechanism=(
            "inc_lock_ref on a tombstone takes the KV locks and no Mamba lock; if the node's state is revived "
            "before the matching dec_lock_ref, a dec that re-reads node.mamba_value releases a Mamba lock it "
            "never took (negative counters, 'full_lock_ref mismatch'). The fix records what inc skipped."
        ),
        breaks=("I-LOCK-SYMMETRY", "I-MAMBA-LOCK"),
        machine="cache",
    ),
    _exhibit(
        MambaV2Path,
        "cache_finished",
        sb.b16_finish_inserts_an_empty_key,
        id="B16",
        upstream="sgl-project/sglang PR #35821 (from #30451)",
        title="V2 finish with nothing tracked inserts a ghost node",
        mechanism=(
            "Mamba V2's cache_finished_req with cache_len 0 (or None: nothing tracked) inserted anyway and "
            "created a node with an empty key, a stale copy-on-write source that poisoned later matches."
        ),
        breaks=("I-NODE-NONEMPTY",),
    ),
    _exhibit(
        ReqMemory,
        "_extend_one",
        sb.b17_rollback_forgets_the_side_allocations,
        id="B17",
        upstream="sgl-project/sglang#34676 (PR #39787)",
        title="a failed admission leaves the row and Mamba slot it took",
        mechanism=(
            "HybridReqToTokenPool.alloc took the row and the main Mamba slot, then failed on the next "
            "allocation (ping-pong slots, or KV) and asserted; the partial allocation stayed and the "
            "scheduler died. Atomic admission takes all or nothing."
        ),
        breaks=("I-ATOMIC-ADMISSION", "I-COUNT"),
    ),
    Exhibit(
        id="B18",
        upstream="(patch 'checker: exclude mamba dummy slot 0' in several 2026 trees)",
        title="the idle checker's universe is range(size), the pool's is 1..size",
        mechanism=(
            "_check_mamba_memory expected slots range(size) after MambaPool reserved slot 0 and handed out "
            "1..size: slot 0 reported leaked whenever it ran, slot size never expected."
        ),
        breaks=("I-DIAG-DOMAIN",),
        reenact=None,
        scope="out of scope",
        why_out_of_scope=(
            "the bug lives in a diagnostic, not in the accounting: kvledger's checks take their universe "
            "from the pool (the ledger), so there is no separate range to get wrong; the pool itself refuses "
            "slot 0 with SlotOutOfRange (I-DIAG-DOMAIN), tested in tests/pools"
        ),
    ),
    Exhibit(
        id="B20",
        upstream="sgl-project/sglang PR #38941",
        title="a mid-page split free under DCP frees a page twice",
        mechanism=(
            "With decode context parallelism the allocator page is page_size x dcp (512 tokens) while the "
            "Mamba cache cap is on a 64-token grid; cache_finished_req freed two pieces whose seam lay "
            "inside one page, and page-granular frees freed that page twice."
        ),
        breaks=("I-NODUP-FREE", "I-PAGE-UNIT"),
        reenact=None,
        scope="out of scope",
        why_out_of_scope=(
            "kvledger has no DCP: the allocator page is the page the tree caps on, so every seam is page "
            "aligned (floor_to_page) and no method can split a page between two frees without inventing a "
            "second grid; the paged pool refuses a page freed twice (I-NODUP-FREE, tests/pools)"
        ),
    ),
    _exhibit(
        Scheduler,
        "process_prefill_chunk",
        sb.b21_chunk_without_insert_drops_the_prefix,
        id="B21",
        upstream="sgl-project/sglang PR #33996",
        title="chunked prefill without a radix tree loses its prefix bookkeeping",
        mechanism=(
            "With ChunkCache (--disable-radix-cache) the insert between chunks is skipped, and the fake-"
            "bootstrap path skipped recording the prefix with it: the next chunk restarted at prefix 0, "
            "allocated the whole sequence again and orphaned the first chunk's pages."
        ),
        # issue 25: the restart at 0 rewrites positions holding its own ids (I-ROW-WRITE) and runs from a
        # working state that already holds the first chunk's (I-DATA-STATE)
        breaks=("I-PARTITION", "I-REQ-LADDER", "I-COUNT", "I-ROW-WRITE", "I-DATA-STATE"),
    ),
    _exhibit(
        ReqMemory,
        "decode_demand_tokens",
        sb.vllm_prediction_counts_tokens_not_pages,
        id="vLLM-prediction",
        upstream="vLLM v1 predictor tests; nano-vllm PR #207; TRT-LLM PR #12404 (other-engines.md §3.1, #27, #41)",
        title="prediction != commitment: the can-allocate count differs from what allocate takes",
        mechanism=(
            "An engine decides from a prediction (can_allocate, the decode fit) and then allocates; when the "
            "prediction counts differently from the allocation (tokens instead of pages, a stale cached "
            "count, one reusable block too many) the allocation fails after the decision: 'No free blocks "
            "left', an IndexError, or a stall. Here the decode-fit estimate counts a token per request while "
            "a token that opens a page takes the page."
        ),
        breaks=("I-LIVENESS", "I-ATOMIC-ADMISSION"),
    ),
    _exhibit(
        Scheduler,
        "_never_fits",
        sb.vllm_oversize_request_waits,
        id="vLLM-oversize",
        upstream="vllm-project/vllm#39734 (other-engines.md #9)",
        title="a request larger than the pool blocks the waiting queue forever",
        mechanism=(
            "A request within max_model_len but larger than the whole KV pool passes the arrival check and "
            "waits at the head of the queue: it can never be admitted and nothing behind it is either."
        ),
        breaks=("I-LIVENESS",),
    ),
    _exhibit(
        MambaTracking,
        "release",
        sb.n1_release_keeps_the_tracking_handle,
        id="N1",
        upstream="sgl-project/sglang#26941",
        title="V2 ping-pong tracking slots freed, the handle left set",
        mechanism=(
            "With extra_buffer a request holds a working slot and k ping-pong tracking slots. free_mamba_cache "
            "freed the tracking slots but left mamba_ping_pong_track_buffer set, and alloc skips the "
            "allocation when it is set: a retracted (or aborted and retried) request came back with slots "
            "it no longer owned, free or someone else's, while the counting identity stayed balanced."
            " The tracked length is left set with the handle: a request released with a stale one breaks"
            " I-TRACK-POINT at once (the shortest way the hunt meets it, since its edge draws)."
        ),
        breaks=("I-HANDLE-OWNED", "I-REQ-MAMBA", "I-COUNT", "I-TRACK-POINT"),
    ),
    Exhibit(
        id="N4",
        upstream="sgl-project/sglang#24527 (fixes #27372, #35049, #38961)",
        title="PD decode releases pages mid-transfer; the late write lands in another request",
        mechanism=(
            "An abort or failure on the decode side freed the pre-allocated pages, row and metadata slot at "
            "once, without waiting for the prefill's writer; the pages went to the next request and the "
            "late write landed in its KV."
        ),
        breaks=("I-WRITER-LEASE",),
        reenact=pd_bugs.n4_decode_releases_mid_transfer,
        replaces=replaced_name(DecodeScheduler, "transfer_may_touch"),
        machine="pd",
    ),
    Exhibit(
        id="N4-reader",
        upstream="sgl-project/sglang#38961",
        title="PD prefill releases source pages while a send still reads them",
        mechanism=(
            "On Failed the prefill ran release_kv_cache at once while a send could still read the source "
            "pages, row and state slot."
        ),
        breaks=("I-WRITER-LEASE",),
        reenact=pd_bugs.n4_prefill_releases_while_sending,
        replaces=replaced_name(PrefillScheduler, "transfer_may_touch"),
        machine="pd",
    ),
    Exhibit(
        id="N5",
        upstream="sgl-project/sglang-omni PR #2080",
        title="idle predicate blind to PD leases",
        mechanism=(
            "is_fully_idle() did not see the PD holders (an ended request whose KV lease waits for the other "
            "side), so idle-only work (flush_cache, the idle leak check) ran over live state."
        ),
        breaks=("I-QUIESCENT", "I-IDLE-IDENTITY"),
        reenact=pd_bugs.n5_idle_predicate_ignores_leases,
        replaces=replaced_name(PDScheduler, "is_quiescent"),
        machine="pd",
    ),
    Exhibit(
        id="N6a",
        upstream="sgl-project/sglang PR #28236",
        title="decode-side abort leaves the prefill waiting entry holding its metadata slot",
        mechanism=(
            "A request aborted by the decode side after bootstrap sat in the prefill's waiting queue holding "
            "its metadata slot, since nothing polled its sender there; it left only when scheduled."
        ),
        breaks=("I-DRAIN",),
        reenact=pd_bugs.n6a_waiting_queue_not_polled,
        replaces=replaced_name(PrefillScheduler, "poll_waiting_failures"),
        machine="pd",
    ),
    Exhibit(
        id="N9",
        upstream="sgl-project/sglang PR #30890",
        title="transfer reported successful from the metadata alone",
        mechanism=(
            "Mooncake's final chunk discarded the status of maybe_send_extra (the Mamba/SWA state) and "
            "reported Success from the metadata transfer alone; decode committed a stale state."
        ),
        breaks=("I-TRANSFER-ATOMIC",),
        reenact=pd_bugs.n9_success_from_metadata_alone,
        replaces=replaced_name(TransferChannel, "_receiver_done"),
        machine="pd",
    ),
    _exhibit(
        SpeculativeConfig,
        "row_headroom",
        spec_bugs.n18_row_headroom_ignores_the_draft_tree,
        id="N18",
        upstream="sgl-project/sglang PR #26972",
        title="request row too narrow for the speculative draft footprint",
        mechanism=(
            "Spec v2 tree drafting (topk > 1, page > 1) over-allocates topk partly filled pages per step, twice "
            "with the overlap scheduler, before the verify; the request-to-token row kept only 4 + "
            "num_draft_tokens positions beyond the context. Past the row's end release_kv_cache's slice clamped "
            "silently and the over-allocated pages were never freed ('pool memory leak detected'). The fix "
            "widened the row to the reserve plus a page and added a fail-fast check of the row width."
        ),
        breaks=("I-SPEC-ROW", "I-REQ-LADDER", "I-COUNT"),
    ),
    _exhibit(
        SpecDecoding,
        "track_seqlen",
        spec_bugs.b16_spec_track_step_not_clamped,
        id="B16-spec",
        upstream="sgl-project/sglang PR #35821 (from #30451), 'clamp spec track step'",
        title="Mamba V2 under speculative decoding tracks a drafted, not an accepted, length",
        mechanism=(
            "With extra_buffer and speculative decoding a verify advances the state over every drafted "
            "position, and the decode capture is due when the length crosses a multiple of "
            "mamba_track_interval. Taken on the drafted positions, the tracking step recorded a length that "
            "only rejected drafts reached: mamba_last_track_seqlen beyond kv_committed_len, its tracking half "
            "holding a rejected draft's state, later cached for a prefix the request never committed. "
            "PR #35821 clamps the step to the accepted length."
        ),
        # I-DATA-STATE: the machines' data tags see the rejected draft's state in the recorded tracking half
        breaks=("I-TRACK-POINT", "I-SPEC-STATE", "I-DATA-STATE"),
    ),
)

BY_ID: dict[str, Exhibit] = {e.id: e for e in EXHIBITS}


def exhibit(exhibit_id: str) -> Exhibit:
    """The exhibit with this id (``B5``, ``#16067``, ``N4``, ...); case-insensitive."""
    for key, value in BY_ID.items():
        if key.lower() == exhibit_id.lower():
            return value
    raise KeyError(f"no exhibit {exhibit_id!r}; known: {', '.join(BY_ID)}")


def huntable() -> list[Exhibit]:
    return [e for e in EXHIBITS if e.huntable]
