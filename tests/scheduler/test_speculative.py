"""Speculative decoding in the reference scheduler: over-allocation, drawn acceptance, the rejected tail,
the row width, retraction and abort with drafts outstanding (spec/speculative.md)."""

from __future__ import annotations

import random

import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.museum.machines.oracles import expected_output
from kvledger.reference.engine import EngineSpec, build_engine, build_parts
from kvledger.reference.pools import ReqToTokenPool
from kvledger.reference.scheduler import ReqState, Scheduler, SchedulerConfig
from kvledger.reference.scheduler.spec_config import RowTooNarrow, SpeculativeConfig

CONFIGS = [
    # page, overlap, strategy, topk
    (1, False, "no_buffer", 1),
    (1, True, "extra_buffer", 2),  # V1 with overlap is refused under speculative decoding (EngineSpec)
    (1, False, "extra_buffer", 1),
    (1, True, "extra_buffer", 1),
    (16, False, "extra_buffer", 2),
    (16, True, "extra_buffer", 1),
]


def engine(
    page: int, overlap: bool, strategy: str, topk: int, *, rate: float = 0.6, kv: int = 2048
) -> Scheduler:
    spec = SpeculativeConfig(num_steps=3, topk=topk, num_draft_tokens=4, accept_rate=rate, seed=1)
    v2 = (
        {"mamba_track_interval": 16 if page == 1 else 32, "mamba_chunk_size": 8}
        if strategy == "extra_buffer"
        else {}
    )
    return build_engine(
        EngineSpec(
            page_size=page,
            kv_tokens=kv,
            rows=8,
            mamba_slots=24,
            max_running=6,
            chunk=64,
            max_prefill=128,
            overlap=overlap,
            mamba_strategy=strategy,  # type: ignore[arg-type]
            max_context_len=256,
            speculative=spec,
            **v2,  # type: ignore[arg-type]
        )
    )


def add_workload(s: Scheduler, n: int = 10, seed: int = 0) -> None:
    rng = random.Random(seed)
    base = [rng.randrange(100) for _ in range(20)]
    for i in range(n):
        prompt = base[: rng.randrange(5, 20)] + [rng.randrange(100) for _ in range(rng.randrange(1, 30))]
        s.add_request(i, prompt, rng.randrange(1, 40))


@pytest.mark.parametrize(("page", "overlap", "strategy", "topk"), CONFIGS)
def test_outputs_equal_one_token_decoding(page: int, overlap: bool, strategy: str, topk: int) -> None:
    s = engine(page, overlap, strategy, topk)
    add_workload(s)
    s.run_until_idle()
    s.accounting.check_quiescent()
    assert s.stats.finished == 10
    for r in s.requests.values():
        assert r.output_ids == expected_output(r.origin_input_ids, r.max_new_tokens, None)
    st = s.speculative.stats  # type: ignore[union-attr]
    assert st.tokens_per_step > 1.0  # speculation saved steps
    assert st.tail_freed_tokens > 0  # rejected tails were given back
    assert st.over_allocation_peak >= s.speculative.reserve  # type: ignore[union-attr]
    if strategy == "extra_buffer":
        assert st.captures > 0  # decode captures happened at accepted positions


def test_scripted_acceptance_gives_exact_tokens_per_step() -> None:
    s = engine(1, False, "no_buffer", 1)
    assert s.speculative is not None
    s.speculative.draw.scripted([2])  # every verify accepts 2 drafts: 3 tokens a step
    s.add_request(0, list(range(10)), 31)  # 1 token from the prefill, then 10 verifies of 3
    s.run_until_idle()
    st = s.speculative.stats
    assert st.request_steps == 10 and st.tokens_kept == 30 and st.accept_histogram == {2: 10}
    assert s.requests[0].output_ids == expected_output(list(range(10)), 31, None)


def test_over_allocation_then_the_tail_returns_in_the_same_step() -> None:
    s = engine(1, False, "no_buffer", 1)
    assert s.speculative is not None
    s.speculative.draw.scripted([0])  # nothing accepted: 1 token kept of 4 positions
    s.add_request(0, list(range(10)), 8)
    s.step()  # prefill
    free_before = s.kv_allocator.available_size()
    s.step()  # verify: 4 positions allocated, 1 committed, 3 freed in the step
    req = s.requests[0]
    assert req.kv_committed_len == req.kv_allocated_len == 11
    assert s.kv_allocator.available_size() == free_before - 1
    assert s.speculative.stats.tail_freed_tokens == 3


def test_overlap_keeps_one_verify_for_the_batch_in_flight() -> None:
    s = engine(1, True, "extra_buffer", 1)
    assert s.speculative is not None
    s.speculative.draw.scripted([1])
    s.add_request(0, list(range(10)), 20)
    for _ in range(4):
        s.step()
    req = s.requests[0]
    assert any(req in b.reqs for b in s.inflight)
    assert req.kv_committed_len < req.kv_allocated_len <= req.kv_committed_len + s.speculative.reserve


@pytest.mark.parametrize("overlap", [False, True])
def test_retraction_and_abort_with_drafts_outstanding(overlap: bool) -> None:
    s = engine(16, overlap, "extra_buffer", 1)
    add_workload(s, n=6, seed=3)
    for _ in range(6):
        s.step()
    assert any(r.kv_allocated_len > r.kv_committed_len for r in s.running) or overlap is False
    assert s.force_retract(1) == 1
    victim = next(r for r in s.running)
    s.abort(victim.rid)
    s.run_until_idle()
    s.accounting.check_quiescent()
    for r in s.requests.values():
        if r.state is ReqState.FINISHED:
            assert r.output_ids == expected_output(r.origin_input_ids, r.max_new_tokens, None)


def test_request_that_cannot_hold_its_reserve_is_rejected() -> None:
    s = engine(16, True, "extra_buffer", 4, kv=64)
    req = s.add_request(0, list(range(8)), 4)
    assert req.state is ReqState.REJECTED and "speculative reserve" in (req.finish_reason or "")


def test_configuration_errors() -> None:
    with pytest.raises(InvalidArgument, match="num_draft_tokens 9 exceeds"):
        SpeculativeConfig(num_steps=2, topk=2, num_draft_tokens=9)
    with pytest.raises(InvalidArgument, match=">= 2"):
        SpeculativeConfig(num_steps=2, topk=1, num_draft_tokens=1)
    with pytest.raises(InvalidArgument, match="accept_rate"):
        SpeculativeConfig(accept_rate=1.5)
    with pytest.raises(InvalidArgument, match="use >= 8"):
        SchedulerConfig(
            overlap=True,
            mamba_scheduler_strategy="extra_buffer",
            mamba_track_interval=4,
            mamba_chunk_size=4,
            chunked_prefill_size=64,
            speculative=SpeculativeConfig.mtp(3),
        )


def test_footprint_follows_sglang() -> None:
    chain = SpeculativeConfig.mtp(3)
    assert chain.alloc_len_per_decode(1) == 4 and chain.reserve(1, True) == 8
    tree = SpeculativeConfig(num_steps=3, topk=4, num_draft_tokens=8)
    assert tree.alloc_len_per_decode(1) == 12
    assert tree.alloc_len_per_decode(16) == 2 * 16 * 4  # ceil((15 + 3 + 15) / 16) pages per branch
    assert tree.row_headroom(16, True) == 2 * 128 + 15
    assert chain.row_headroom(1, False) == 8  # 4 + num_draft_tokens


@pytest.mark.fires("I-SPEC-ROW")
def test_rows_narrower_than_the_headroom_are_refused() -> None:
    parts = build_parts(EngineSpec(page_size=16, kv_tokens=1024, speculative=SpeculativeConfig(3, 2, 4)))
    narrow = ReqToTokenPool(4, parts.config.max_context_len + 10)
    kwargs = parts.scheduler_kwargs() | {"req_to_token_pool": narrow}
    with pytest.raises(RowTooNarrow, match="I-SPEC-ROW"):
        Scheduler(parts.config, **kwargs)


@pytest.mark.fires("I-SPEC-ROW")
def test_an_over_allocation_past_the_row_fails_before_the_write() -> None:
    s = engine(1, False, "no_buffer", 1)
    assert s.speculative is not None
    s.speculative.reserve = 300  # fits the pool, not the row of 256 + 8 positions
    s.add_request(0, list(range(10)), 8)
    s.step()
    with pytest.raises(ContractViolation, match="I-SPEC-ROW"):
        s.step()


@pytest.mark.fires("I-SPEC-TAIL")
@pytest.mark.skipif(not switch.ENABLED, reason="I-SPEC-TAIL is a per-step cross-check of the level full")
def test_a_kept_rejected_tail_is_caught_at_the_step() -> None:
    s = engine(1, False, "no_buffer", 1)
    assert s.speculative is not None
    s.speculative.draw.scripted([0])
    s.speculative.release_rejected_tail = lambda req: None  # type: ignore[method-assign]
    s.add_request(0, list(range(10)), 8)
    s.step()
    with pytest.raises(ContractViolation, match="I-SPEC-TAIL"):
        s.step()
