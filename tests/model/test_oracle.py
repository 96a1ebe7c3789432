"""The tiny hybrid model as an end-to-end oracle.

* Pooled and alone runs agree token for token (the model is batch- and chunk-invariant by design).
* Inside the scheduler state machine (cache on and off, chunking, retraction, overlap, aborts of
  other requests), every finished request's output equals the same request run alone.
* Three deliberate data faults are each caught: skipping the copy-on-write copy, using a tombstone's
  (missing, stale) state, reading a freed and poisoned slot. With contracts on, the fault is caught by
  the oracle or by the contract that guards it; in a process with ``KVLEDGER_CONTRACTS=0`` and the
  read checks off, by the oracle alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, run_state_machine_as_test

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.museum.machines.scheduler import SchedulerMachine
from kvledger.reference.engine import TreeKind, model_weights
from kvledger.reference.model import generate_alone
from tests.model.faults import run_fault
from tests.scheduler.harness import Setup, build, long_fuzz_settings, model_expected_output
from tests.scheduler.harness import ledgers as with_ledgers

ROOT = Path(__file__).resolve().parents[2]
TEST_VOCAB = 128  # the machine's prompts use ids < 100; a small vocabulary keeps the model cheap


def test_generate_alone_is_deterministic_and_prompt_dependent() -> None:
    weights = model_weights(32000)
    a = generate_alone(weights, [1, 2, 3, 4], 8)
    assert a == generate_alone(weights, [1, 2, 3, 4], 8)
    assert len(a) == 8
    assert a != generate_alone(weights, [1, 2, 3, 5], 8)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("tree", ["mamba_radix", "none"])
def test_pooled_runs_match_alone_runs(tree: TreeKind, overlap: bool) -> None:
    sched = build(
        Setup(
            tree=tree,
            hybrid=True,
            model="tiny-hybrid",
            kv_tokens=160,
            rows=3,
            mamba_slots=6,
            chunk=8,
            max_prefill=32,
            overlap=overlap,
            max_context_len=96,
            mamba_strategy="no_buffer",  # Mamba V1 (EngineSpec's default is V2)
        )
    )
    prefix = list(range(10, 30))
    prompts = {0: prefix, 1: [*prefix, 5, 6], 2: [*prefix[:12], 7], 3: [1, 2], 4: [*prefix, 9]}
    for rid, p in prompts.items():
        sched.add_request(rid, p, 5)
    sched.run_until_idle(500)
    for rid, p in prompts.items():
        assert sched.requests[rid].output_ids == model_expected_output(p, 5), rid
    if tree == "mamba_radix":
        assert sched.stats.cached_prompt_tokens > 0  # the cache was used, states were copied


@st.composite
def model_setups(draw: st.DrawFn) -> Setup:
    tree: TreeKind = draw(st.sampled_from(["mamba_radix", "none"]))
    return Setup(
        page_size=1,
        tree=tree,
        hybrid=True,
        model="tiny-hybrid",
        vocab_size=TEST_VOCAB,
        kv_tokens=draw(st.integers(64, 160)),
        rows=draw(st.integers(1, 4)),
        mamba_slots=draw(st.integers(2, 6)),
        max_running=draw(st.integers(1, 4)),
        chunk=draw(st.sampled_from([None, 8])),
        max_prefill=draw(st.sampled_from([16, 32])),
        overlap=draw(st.booleans()),
        cow_release_policy=draw(st.sampled_from(["if_not_appended", "keep"])),
        max_context_len=96,
        mamba_strategy="no_buffer",  # Mamba V1 (EngineSpec's default is V2; V2: test_oracle_v2.py)
    )


class ModelOracleMachine(SchedulerMachine):
    """The scheduler machine with the tiny model: the teardown's oracle is ``generate_alone``."""

    @initialize(setup=model_setups())
    def init(self, setup: Setup) -> None:
        self.setup = setup
        self.sched = build(setup)
        self.next_rid = 0

    def expected(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        return model_expected_output(prompt, max_new_tokens, self.setup.eos_token_id, vocab_size=TEST_VOCAB)


TestModelOracleMachine = ModelOracleMachine.TestCase


def test_no_fault_no_mismatch() -> None:
    assert run_fault("none") == {"fault": "none", "mismatched": [], "caught": None}


@pytest.mark.fires("I-OUTPUT-ORACLE")
def test_skipped_cow_copy_is_caught_by_the_oracle() -> None:
    result = run_fault("skip_cow_copy")
    assert result["mismatched"], result  # no counting contract can see a copy that never happened


@pytest.mark.skipif(not switch.ENABLED, reason="contracts are off")
def test_stale_tombstone_state_is_caught_by_match_state_contract() -> None:
    result = run_fault("stale_tombstone_state")
    assert result["caught"] and "mamba_radix_cache.py" in result["caught"], result


@pytest.mark.skipif(not switch.ENABLED, reason="contracts are off")
@pytest.mark.fires("I-NO-POISON-READ")
def test_poisoned_slot_read_is_caught_by_the_read_contract() -> None:
    result = run_fault("read_poisoned_slot")
    assert result["caught"] and "I-NO-POISON-READ" in result["caught"], result


def _run_with_contracts_off(fault: str) -> dict[str, object]:
    env = dict(os.environ, KVLEDGER_CONTRACTS="0", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "tests.model.faults", fault, "--no-integrity"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("fault", ["none", "skip_cow_copy", "stale_tombstone_state", "read_poisoned_slot"])
def test_oracle_alone_catches_each_fault_with_contracts_off(fault: str) -> None:
    result = _run_with_contracts_off(fault)
    if fault == "none":
        assert result["mismatched"] == [] and result["caught"] is None, result
    elif fault == "read_poisoned_slot":
        # The release level poisons nothing (poison on free is a `full` check, spec/checking-levels.md): the
        # early-freed slot keeps its K/V, so the output can stay right; the free list's own count check
        # must then refuse the request's second free of that slot. Either way the fault is not silent.
        assert result["mismatched"] or str(result["caught"]).startswith("DoubleFree"), result
    else:
        assert result["mismatched"], result


@pytest.mark.skipif(not switch.ENABLED, reason="contracts are off")
@pytest.mark.fires("I-KV-ROW-CONTENT")
def test_row_pointing_at_another_tokens_slot_is_caught_at_the_read() -> None:
    """I-KV-ROW-CONTENT: a row entry that names a slot written for another token fires before any output."""
    sched = build(
        Setup(
            tree="none",
            hybrid=True,
            model="tiny-hybrid",
            kv_tokens=96,
            rows=2,
            mamba_slots=3,
            chunk=None,
            max_context_len=64,
        )
    )
    a = sched.add_request(0, [1, 2, 3, 4], 6)
    b = sched.add_request(1, [9, 8, 7, 6], 6)
    sched.step()
    sched.step()
    other = int(sched.req_to_token_pool.read(b.req_pool_idx, 0, 1)[0])  # b's slot for token 9 at position 0
    # Straight into the table: the checked write would refuse it first (I-ROW-WRITE: a's own slot there)
    sched.req_to_token_pool.req_to_token[a.req_pool_idx, 0] = other
    with pytest.raises(ContractViolation, match="I-KV-ROW-CONTENT"):
        sched.step()


@pytest.mark.skipif(not switch.ENABLED, reason="contracts are off")
@pytest.mark.fires("I-KV-ROW-CONTENT")
def test_row_pointing_at_the_same_token_at_another_position_is_caught_at_the_read() -> None:
    """I-KV-ROW-CONTENT keeps positions too: the same token's K/V from another position is wrong KV."""
    sched = build(Setup(tree="none", hybrid=True, model="tiny-hybrid", kv_tokens=64, rows=1, mamba_slots=2))
    req = sched.add_request(0, [5, 5, 5, 5], 4)
    sched.step()
    first = sched.req_to_token_pool.read(req.req_pool_idx, 0, 1)
    # position 2 now names position 0's slot (straight into the table, past I-ROW-WRITE's checked write)
    sched.req_to_token_pool.req_to_token[req.req_pool_idx, 2] = first[0]
    with pytest.raises(ContractViolation, match=r"I-KV-ROW-CONTENT: .* position 2 \(token 5\) reads slot"):
        sched.step()


@pytest.mark.parametrize("ledgers", [False, True])
def test_the_read_checks_run_exactly_when_the_pools_keep_a_ledger(ledgers: bool) -> None:
    spec = Setup(tree="none", hybrid=True, model="tiny-hybrid", kv_tokens=64, rows=1, mamba_slots=2)
    sched = build(with_ledgers(spec, ledgers))
    assert sched.runner.check_integrity is ledgers  # type: ignore[attr-defined]


@pytest.mark.deep
def test_model_oracle_long_fuzz() -> None:
    """Nightly-style fuzzing of the oracle machine: ``pytest -m deep``."""
    run_state_machine_as_test(
        ModelOracleMachine,
        settings=long_fuzz_settings(1000, 60),
    )
