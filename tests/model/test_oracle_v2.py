"""Mamba V2 (``extra_buffer``) through the data plane: the tiny model reads the working state, captures
and donations move real states through the pool, and two oracles hold at page 1, 4 and 16, overlap on
and off.

* Output oracle (I-OUTPUT-ORACLE): every finished request generates what it generates alone.
* State oracle (``state_oracle.cached_state_mismatches``): every state the tree caches is, bit for bit,
  the state of its own prefix computed alone. A capture at the wrong length, into the wrong half or not
  carried out shows here before any output differs.

Each oracle is shown to catch a broken capture, and the overlap scheduler is shown to need its second
tracking slot (with one, a decode capture overwrites the state a donation is about to hand over).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, run_state_machine_as_test

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.oracle import check_output_oracle
from kvledger.museum.machines.scheduler import SchedulerMachine, chunk_sizes, v2_options
from kvledger.reference.engine import model_weights
from kvledger.reference.model.runner import TinyHybridRunner
from kvledger.reference.model.state_oracle import cached_state_mismatches
from kvledger.reference.scheduler import Scheduler
from kvledger.reference.scheduler import config as scheduler_config
from tests.scheduler.harness import Setup, build, long_fuzz_settings, model_expected_output

VOCAB = 128
PREFIX = list(range(10, 50))
PROMPTS = {
    0: PREFIX,
    1: [*PREFIX, 5, 6],
    2: [*PREFIX[:21], 7, 8, 9],  # branches inside the first request's path: a branching point
    3: [1, 2],
    4: [*PREFIX, 9],
    5: [*PREFIX[:21], 7, 8, 1, 2, 3, 4],
}


def v2_setup(page_size: int, overlap: bool, **kw: object) -> Setup:
    options: dict[str, object] = {
        "page_size": page_size,
        "tree": "mamba_radix",
        "hybrid": True,
        "model": "tiny-hybrid",
        "vocab_size": VOCAB,
        "kv_tokens": 512 if page_size > 1 else 256,
        "rows": 4,
        "mamba_slots": 12,
        "max_running": 3,
        "chunk": 32 if page_size == 16 else 16,
        "max_prefill": 64,
        "overlap": overlap,
        "max_context_len": 128,
        "mamba_strategy": "extra_buffer",
        "mamba_track_interval": max(4, page_size),
        "mamba_chunk_size": 4,
    }
    options.update(kw)
    return Setup(**options)  # type: ignore[arg-type]


def mismatched(sched: Scheduler) -> list[int]:
    """Requests whose output differs from the same request run alone (I-OUTPUT-ORACLE)."""
    bad = []
    for req in sched.requests.values():
        expected = model_expected_output(req.origin_input_ids, req.max_new_tokens, vocab_size=VOCAB)
        try:
            check_output_oracle(req, req.output_ids, expected)
        except ContractViolation:
            bad.append(req.rid)
    return bad


def run_prompts(setup: Setup, max_new: int = 9) -> Scheduler:
    sched = build(setup)
    for rid, prompt in PROMPTS.items():
        sched.add_request(rid, prompt, max_new)
    sched.run_until_idle(3000)
    return sched


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_v2_outputs_and_cached_states_match_the_model_alone(page_size: int, overlap: bool) -> None:
    sched = run_prompts(v2_setup(page_size, overlap))
    sched.accounting.check_quiescent()
    assert mismatched(sched) == []
    assert cached_state_mismatches(sched.tree, sched.mamba_pool, model_weights(VOCAB)) == []
    tracking = sched.memory.tracking
    assert tracking is not None and tracking.k == (2 if overlap else 1)
    # The V2 paths were taken: captures in prefill and decode, donations, a branching point, cache hits.
    assert tracking.stats["captures"] > 0 and tracking.stats["donations"] > 0, tracking.stats
    assert tracking.stats["branching_captures"] > 0, tracking.stats
    assert sched.stats.cached_prompt_tokens > 0
    assert sched.tree.mamba_total_size() > 0


def test_v1_at_page_1_still_holds_both_oracles() -> None:
    sched = run_prompts(v2_setup(1, False, mamba_strategy="no_buffer"))
    assert sched.memory.tracking is None
    assert mismatched(sched) == []
    assert cached_state_mismatches(sched.tree, sched.mamba_pool, model_weights(VOCAB)) == []


@contextmanager
def captures_skipped() -> Iterator[None]:
    """A scoped fault: the runner plans captures but never copies the working state into the slot."""
    saved = TinyHybridRunner._capture
    TinyHybridRunner._capture = lambda self, reqs, tracks, at: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        TinyHybridRunner._capture = saved  # type: ignore[method-assign]


@pytest.mark.fires("I-OUTPUT-ORACLE")
@pytest.mark.parametrize("page_size", [1, 16])
def test_a_skipped_capture_is_caught_by_both_oracles(page_size: int) -> None:
    with captures_skipped():
        sched = run_prompts(v2_setup(page_size, False))
    assert mismatched(sched), "a donated slot that never got its state must change some output"
    assert cached_state_mismatches(sched.tree, sched.mamba_pool, model_weights(VOCAB))


@contextmanager
def one_tracking_slot() -> Iterator[None]:
    """A scoped patch: one ping-pong slot even with overlap (what the second slot prevents)."""
    saved = scheduler_config.ping_pong_size
    scheduler_config.ping_pong_size = lambda extra_buffer, overlap: 1 if extra_buffer else 0  # type: ignore[assignment]
    try:
        yield
    finally:
        scheduler_config.ping_pong_size = saved  # type: ignore[assignment]


def _capture_then_overwrite(setup: Setup) -> Scheduler:
    """A 11-token prompt captures at 8 in prefill; its first decode step reaches 12, a multiple of the
    interval, and with overlap that step is launched before the prefill's result donates the state at 8.
    A second request then starts from the 8-token node."""
    sched = build(setup)
    shared = list(range(20, 28))
    sched.add_request(0, [*shared, 1, 2, 3], 6)
    sched.run_until_idle(500)
    sched.add_request(1, [*shared, 9, 9, 9, 9], 6)
    sched.run_until_idle(500)
    return sched


def test_overlap_needs_two_tracking_slots() -> None:
    setup = v2_setup(1, True, chunk=16, mamba_track_interval=4, mamba_chunk_size=4)
    sched = _capture_then_overwrite(setup)
    assert mismatched(sched) == [] and sched.stats.cached_prompt_tokens == 8
    assert cached_state_mismatches(sched.tree, sched.mamba_pool, model_weights(VOCAB)) == []
    with one_tracking_slot():
        broken = _capture_then_overwrite(setup)
    assert broken.memory.tracking is not None and broken.memory.tracking.k == 1
    assert broken.stats.cached_prompt_tokens == 8
    assert cached_state_mismatches(broken.tree, broken.mamba_pool, model_weights(VOCAB))
    assert mismatched(broken) == [1]


# ---------------------------------------------------------------------- the oracle machine under V2
@st.composite
def v2_model_setups(draw: st.DrawFn, page_size: int) -> Setup:
    overlap = draw(st.booleans())
    v2 = v2_options(draw, page_size, overlap)
    grid = max(page_size, int(v2["mamba_chunk_size"]))  # type: ignore[call-overload]
    k = 2 if overlap else 1
    return Setup(
        page_size=page_size,
        tree="mamba_radix",
        hybrid=True,
        model="tiny-hybrid",
        vocab_size=VOCAB,
        kv_tokens=draw(st.integers(96 if page_size == 16 else 64, 256)) // page_size * page_size,
        rows=draw(st.integers(1, 4)),
        mamba_slots=draw(st.integers(2 + k, 6 + k)),
        max_running=draw(st.integers(1, 4)),
        chunk=draw(st.sampled_from(chunk_sizes(page_size, grid))),
        max_prefill=draw(st.sampled_from([16, 32])),
        overlap=overlap,
        cow_release_policy=draw(st.sampled_from(["if_not_appended", "keep"])),
        max_context_len=96,
        **v2,  # type: ignore[arg-type]
    )


def v2_oracle_machine(page_size: int) -> type[SchedulerMachine]:
    """The scheduler machine with the tiny model under V2 at one page size: both oracles at teardown."""

    class V2OracleMachine(SchedulerMachine):
        @initialize(setup=v2_model_setups(page_size))
        def init(self, setup: Setup) -> None:
            self.setup = setup
            self.sched = build(setup)
            self.next_rid = 0
            event(f"overlap={setup.overlap}")

        def expected(self, prompt: list[int], max_new_tokens: int) -> list[int]:
            return model_expected_output(prompt, max_new_tokens, self.setup.eos_token_id, vocab_size=VOCAB)

        def teardown(self) -> None:
            super().teardown()
            sched = getattr(self, "sched", None)
            if sched is not None:
                assert cached_state_mismatches(sched.tree, sched.mamba_pool, model_weights(VOCAB)) == []

    V2OracleMachine.__name__ = V2OracleMachine.__qualname__ = f"ModelOracleMachineV2Page{page_size}"
    return V2OracleMachine


ORACLE_V2_BUDGET = settings(settings(), max_examples=30)
TestModelOracleMachineV2Page1 = v2_oracle_machine(1).TestCase
TestModelOracleMachineV2Page4 = v2_oracle_machine(4).TestCase
TestModelOracleMachineV2Page16 = v2_oracle_machine(16).TestCase
for _case in (TestModelOracleMachineV2Page1, TestModelOracleMachineV2Page4, TestModelOracleMachineV2Page16):
    _case.settings = ORACLE_V2_BUDGET
del _case


@pytest.mark.deep
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_model_oracle_v2_long_fuzz(page_size: int) -> None:
    """Nightly-style fuzzing of the V2 oracle machine: ``pytest -m deep``."""
    run_state_machine_as_test(v2_oracle_machine(page_size), settings=long_fuzz_settings(300, 60))
