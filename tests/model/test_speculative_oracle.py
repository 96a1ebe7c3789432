"""Speculative decoding through the tiny hybrid model: the verify runs over the drafts through the pools,
and the recurrent state left behind is the accepted prefix's (I-SPEC-STATE), V1 and V2, pages 1 and 16,
overlap on and off. Three data oracles: after every step the working state of every running request equals
the state of its accepted prefix computed alone; every state the tree caches is its prefix's; every output
equals the request generated alone, one token at a time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kvledger.reference.engine import EngineSpec, build_engine, model_weights
from kvledger.reference.model.speculative import SpeculativeTinyRunner, check_state_at_committed
from kvledger.reference.model.state_oracle import cached_state_mismatches
from kvledger.reference.scheduler import Scheduler
from kvledger.reference.scheduler.spec_config import SpeculativeConfig
from tests.scheduler.harness import model_expected_output

VOCAB = 128
PREFIX = list(range(10, 50))
PROMPTS = {0: PREFIX, 1: [*PREFIX, 5, 6], 2: [*PREFIX[:21], 7, 8, 9], 3: [1, 2], 4: [*PREFIX, 9]}


def run(page: int, overlap: bool, strategy: str, *, rate: float = 0.6) -> tuple[Scheduler, int]:
    v2 = {"mamba_track_interval": max(8, page), "mamba_chunk_size": 4} if strategy == "extra_buffer" else {}
    sched = build_engine(
        EngineSpec(
            page_size=page,
            model="tiny-hybrid",
            vocab_size=VOCAB,
            kv_tokens=1024,
            rows=4,
            mamba_slots=12,
            max_running=3,
            chunk=32 if page == 16 else 16,
            max_prefill=64,
            overlap=overlap,
            max_context_len=128,
            mamba_strategy=strategy,  # type: ignore[arg-type]
            speculative=SpeculativeConfig.mtp(3, accept_rate=rate, seed=2),
            **v2,  # type: ignore[arg-type]
        )
    )
    assert isinstance(sched.runner, SpeculativeTinyRunner)
    weights = model_weights(VOCAB)
    for rid, prompt in PROMPTS.items():
        sched.add_request(rid, prompt, 13)
    checked = 0
    while sched.has_work():
        sched.step()
        for req in sched.running:
            in_flight = any(req in b.reqs for b in sched.inflight)
            length = (
                len(req.context_ids()) - 1 if in_flight else None
            )  # the data plane runs ahead with overlap
            check_state_at_committed(req, sched.mamba_pool, weights, length)
            checked += 1
    return sched, checked


@pytest.mark.parametrize(
    ("page", "overlap", "strategy"),
    [
        (1, False, "no_buffer"),
        (1, False, "extra_buffer"),
        (1, True, "extra_buffer"),
        (16, False, "extra_buffer"),
        (16, True, "extra_buffer"),
    ],
)
def test_verify_leaves_the_accepted_prefix_state(page: int, overlap: bool, strategy: str) -> None:
    sched, checked = run(page, overlap, strategy)
    sched.accounting.check_quiescent()
    assert checked > 0
    for req in sched.requests.values():
        assert req.output_ids == model_expected_output(
            req.origin_input_ids, req.max_new_tokens, vocab_size=VOCAB
        )
    assert cached_state_mismatches(sched.tree, sched.mamba_pool, model_weights(VOCAB)) == []
    st = sched.speculative.stats  # type: ignore[union-attr]
    assert st.tokens_per_step > 1.2 and st.tail_freed_tokens > 0
    if strategy == "extra_buffer":
        assert st.captures > 0  # decode captures from the kept-aside states, at accepted positions


@contextmanager
def rejected_drafts_kept() -> Iterator[None]:
    """A scoped fault: the verify never puts the state back, so the rejected drafts' updates stay."""
    saved = SpeculativeTinyRunner._restore
    SpeculativeTinyRunner._restore = lambda self, reqs, mslots, snaps, kept: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        SpeculativeTinyRunner._restore = saved  # type: ignore[method-assign]


@pytest.mark.fires("I-SPEC-STATE")
def test_a_state_not_put_back_is_caught_by_the_state_oracle() -> None:
    with rejected_drafts_kept(), pytest.raises(AssertionError, match="I-SPEC-STATE"):
        run(1, False, "no_buffer", rate=0.3)
