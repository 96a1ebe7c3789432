# ruff: noqa: E501  (generated: one exhibit per line)
"""The museum's exhibits as data, for ``kvledger museum``: generated from the catalogue, do not edit.

``kvledger.museum.catalogue`` builds each exhibit from the reference classes it patches (torch and the
whole engine); listing them must not cost that. ``tests/cli/test_museum_cli.py`` checks this copy
against the catalogue; after changing an exhibit, regenerate it: ``python -m kvledger.cli.museum_index``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIELDS = ("id", "title", "scope", "huntable", "machine", "replaces", "breaks", "upstream", "why_out_of_scope")


def build() -> tuple[dict[str, Any], ...]:
    """The rows, from the live catalogue (imports it, and so torch)."""
    from kvledger.museum import EXHIBITS as LIVE

    return tuple(
        {
            "id": e.id,
            "title": e.title,
            "scope": e.scope,
            "huntable": e.huntable,
            "machine": e.machine,
            "replaces": e.replaces,
            "breaks": list(e.breaks),
            "upstream": e.upstream,
            "why_out_of_scope": e.why_out_of_scope,
        }
        for e in LIVE
    )


def render(rows: tuple[dict[str, Any], ...]) -> str:
    head, _, _ = Path(__file__).read_text(encoding="utf-8").partition("\nEXHIBITS")
    body = "".join(f"    {row!r},\n" for row in rows)
    return f"{head}\nEXHIBITS: tuple[dict[str, Any], ...] = (\n{body})\n"


if __name__ == "__main__":
    Path(__file__).write_text(render(build()), encoding="utf-8")

EXHIBITS: tuple[dict[str, Any], ...] = (
    {'id': 'B1', 'title': "overlap: the result path frees a finished request's extra token again", 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'Scheduler.process_batch_result', 'breaks': ['I-NODUP-FREE', 'I-EXCLUSIVE', 'I-CAP'], 'upstream': 'sgl-project/sglang#6888 (PR #9068; removed by #12224)', 'why_out_of_scope': ''},
    {'id': 'B2', 'title': 'overlap: retraction frees an inferred KV length while the decode batch is in flight', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'Scheduler._drain_before_retract, Scheduler._check_retractable, Scheduler._discards_result, ReqMemory.release_without_insert', 'breaks': ['I-PARTITION', 'I-OWNER-RELEASE', 'I-COUNT'], 'upstream': 'sgl-project/sglang#11970 (PR #11981, #11976; #12224)', 'why_out_of_scope': ''},
    {'id': 'B3', 'title': 'Mamba LRU list out of order', 'scope': 'out of scope', 'huntable': False, 'machine': 'scheduler', 'replaces': '', 'breaks': ['I-LRU-ORDER'], 'upstream': 'sgl-project/sglang#12007 (#38482, #36696)', 'why_out_of_scope': "not in the issue's list: intermittent with no known mechanism; the cache machines' audit checks I-LRU-ORDER and tests/caches/test_contracts_fire.py breaks it by hand"},
    {'id': 'B4', 'title': 'PD prefill chunk boundary frees the working Mamba slot, the handle stays set', 'scope': 'in scope', 'huntable': True, 'machine': 'pd', 'replaces': 'PrefillScheduler.process_prefill_chunk', 'breaks': ['I-HANDLE-OWNED', 'I-NODUP-FREE', 'I-EXCLUSIVE', 'I-IDLE-IDENTITY'], 'upstream': 'sgl-project/sglang#12432 (fix #12994; per-chunk free removed by #17850)', 'why_out_of_scope': ''},
    {'id': 'B5', 'title': 'abort of a waiting request keeps its copy-on-write slot', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'ReqMemory.release_without_insert', 'breaks': ['I-OWNER-RELEASE', 'I-COUNT', 'I-PARTITION'], 'upstream': 'sgl-project/sglang PR #12693', 'why_out_of_scope': ''},
    {'id': '#16067', 'title': "the first seed's reverted fix: free the stopper's COW slot even when it was appended", 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'Scheduler._cleanup_stopper', 'breaks': ['I-COW-STOPPER', 'I-EXCLUSIVE'], 'upstream': 'sgl-project/sglang PR #16067 (reverted by #18910; fixed by #21404) — the first seed, B6', 'why_out_of_scope': ''},
    {'id': 'B7', 'title': 'an abort path of a waiting request bypasses the release helper', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'Scheduler._abort_now', 'breaks': ['I-OWNER-RELEASE', 'I-COUNT', 'I-LEDGER-AGREES'], 'upstream': 'sgl-project/sglang#20010, #20069 (PR #20182)', 'why_out_of_scope': ''},
    {'id': 'B8', 'title': 'a row freed while the launched batch still reads it', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'Scheduler._release_or_defer', 'breaks': ['I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT'], 'upstream': 'sgl-project/sglang PR #17850', 'why_out_of_scope': ''},
    {'id': 'B9', 'title': 'preemption/abort releases a request that already finished', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'Scheduler.abort', 'breaks': ['I-OWNER-RELEASE', 'I-NODUP-FREE'], 'upstream': 'sgl-project/sglang#17797 (PR #18694)', 'why_out_of_scope': ''},
    {'id': 'B10', 'title': 'PD decode abort of a prebuilt request leaks its pre-allocation', 'scope': 'in scope', 'huntable': True, 'machine': 'pd', 'replaces': 'DecodeScheduler._release_finished_or_aborted', 'breaks': ['I-OWNER-RELEASE', 'I-COUNT'], 'upstream': 'sgl-project/sglang PR #9817', 'why_out_of_scope': ''},
    {'id': 'B11', 'title': 'decode Mamba pool smaller than rows x slots per request', 'scope': 'in scope', 'huntable': True, 'machine': 'pd', 'replaces': 'kvledger.reference.disagg.builder.decode_mamba_slots', 'breaks': ['I-SIZING'], 'upstream': 'sgl-project/sglang PR #19002 (#20858, #22462, #23267, #23570)', 'why_out_of_scope': ''},
    {'id': 'B14', 'title': 'dec_lock_ref re-derives what it releases', 'scope': 'in scope', 'huntable': True, 'machine': 'cache', 'replaces': 'MambaRadixCache._mamba_component_to_release', 'breaks': ['I-LOCK-SYMMETRY', 'I-MAMBA-LOCK'], 'upstream': 'sgl-project/sglang PR #27147 (#21379)', 'why_out_of_scope': ''},
    {'id': 'B16', 'title': 'V2 finish with nothing tracked inserts a ghost node', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'MambaV2Path.cache_finished', 'breaks': ['I-NODE-NONEMPTY'], 'upstream': 'sgl-project/sglang PR #35821 (from #30451)', 'why_out_of_scope': ''},
    {'id': 'B17', 'title': 'a failed admission leaves the row and Mamba slot it took', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'ReqMemory._extend_one', 'breaks': ['I-ATOMIC-ADMISSION', 'I-COUNT'], 'upstream': 'sgl-project/sglang#34676 (PR #39787)', 'why_out_of_scope': ''},
    {'id': 'B18', 'title': "the idle checker's universe is range(size), the pool's is 1..size", 'scope': 'out of scope', 'huntable': False, 'machine': 'scheduler', 'replaces': '', 'breaks': ['I-DIAG-DOMAIN'], 'upstream': "(patch 'checker: exclude mamba dummy slot 0' in several 2026 trees)", 'why_out_of_scope': "the bug lives in a diagnostic, not in the accounting: kvledger's checks take their universe from the pool (the ledger), so there is no separate range to get wrong; the pool itself refuses slot 0 with SlotOutOfRange (I-DIAG-DOMAIN), tested in tests/pools"},
    {'id': 'B20', 'title': 'a mid-page split free under DCP frees a page twice', 'scope': 'out of scope', 'huntable': False, 'machine': 'scheduler', 'replaces': '', 'breaks': ['I-NODUP-FREE', 'I-PAGE-UNIT'], 'upstream': 'sgl-project/sglang PR #38941', 'why_out_of_scope': 'kvledger has no DCP: the allocator page is the page the tree caps on, so every seam is page aligned (floor_to_page) and no method can split a page between two frees without inventing a second grid; the paged pool refuses a page freed twice (I-NODUP-FREE, tests/pools)'},
    {'id': 'B21', 'title': 'chunked prefill without a radix tree loses its prefix bookkeeping', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'Scheduler.process_prefill_chunk', 'breaks': ['I-PARTITION', 'I-REQ-LADDER', 'I-COUNT', 'I-ROW-WRITE', 'I-DATA-STATE'], 'upstream': 'sgl-project/sglang PR #33996', 'why_out_of_scope': ''},
    {'id': 'vLLM-prediction', 'title': 'prediction != commitment: the can-allocate count differs from what allocate takes', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'ReqMemory.decode_demand_tokens', 'breaks': ['I-LIVENESS', 'I-ATOMIC-ADMISSION'], 'upstream': 'vLLM v1 predictor tests; nano-vllm PR #207; TRT-LLM PR #12404 (other-engines.md §3.1, #27, #41)', 'why_out_of_scope': ''},
    {'id': 'vLLM-oversize', 'title': 'a request larger than the pool blocks the waiting queue forever', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'Scheduler._never_fits', 'breaks': ['I-LIVENESS'], 'upstream': 'vllm-project/vllm#39734 (other-engines.md #9)', 'why_out_of_scope': ''},
    {'id': 'N1', 'title': 'V2 ping-pong tracking slots freed, the handle left set', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'MambaTracking.release', 'breaks': ['I-HANDLE-OWNED', 'I-REQ-MAMBA', 'I-COUNT', 'I-TRACK-POINT'], 'upstream': 'sgl-project/sglang#26941', 'why_out_of_scope': ''},
    {'id': 'N4', 'title': 'PD decode releases pages mid-transfer; the late write lands in another request', 'scope': 'in scope', 'huntable': True, 'machine': 'pd', 'replaces': 'DecodeScheduler.transfer_may_touch', 'breaks': ['I-WRITER-LEASE'], 'upstream': 'sgl-project/sglang#24527 (fixes #27372, #35049, #38961)', 'why_out_of_scope': ''},
    {'id': 'N4-reader', 'title': 'PD prefill releases source pages while a send still reads them', 'scope': 'in scope', 'huntable': True, 'machine': 'pd', 'replaces': 'PrefillScheduler.transfer_may_touch', 'breaks': ['I-WRITER-LEASE'], 'upstream': 'sgl-project/sglang#38961', 'why_out_of_scope': ''},
    {'id': 'N5', 'title': 'idle predicate blind to PD leases', 'scope': 'in scope', 'huntable': True, 'machine': 'pd', 'replaces': 'PDScheduler.is_quiescent', 'breaks': ['I-QUIESCENT', 'I-IDLE-IDENTITY'], 'upstream': 'sgl-project/sglang-omni PR #2080', 'why_out_of_scope': ''},
    {'id': 'N6a', 'title': 'decode-side abort leaves the prefill waiting entry holding its metadata slot', 'scope': 'in scope', 'huntable': True, 'machine': 'pd', 'replaces': 'PrefillScheduler.poll_waiting_failures', 'breaks': ['I-DRAIN'], 'upstream': 'sgl-project/sglang PR #28236', 'why_out_of_scope': ''},
    {'id': 'N9', 'title': 'transfer reported successful from the metadata alone', 'scope': 'in scope', 'huntable': True, 'machine': 'pd', 'replaces': 'TransferChannel._receiver_done', 'breaks': ['I-TRANSFER-ATOMIC'], 'upstream': 'sgl-project/sglang PR #30890', 'why_out_of_scope': ''},
    {'id': 'N18', 'title': 'request row too narrow for the speculative draft footprint', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'SpeculativeConfig.row_headroom', 'breaks': ['I-SPEC-ROW', 'I-REQ-LADDER', 'I-COUNT'], 'upstream': 'sgl-project/sglang PR #26972', 'why_out_of_scope': ''},
    {'id': 'B16-spec', 'title': 'Mamba V2 under speculative decoding tracks a drafted, not an accepted, length', 'scope': 'in scope', 'huntable': True, 'machine': 'scheduler', 'replaces': 'SpecDecoding.track_seqlen', 'breaks': ['I-TRACK-POINT', 'I-SPEC-STATE', 'I-DATA-STATE'], 'upstream': "sgl-project/sglang PR #35821 (from #30451), 'clamp spec track step'", 'why_out_of_scope': ''},
)
