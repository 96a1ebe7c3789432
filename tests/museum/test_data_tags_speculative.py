"""Data tags through the speculative verify (issue 25): the tagged hash runner is also the verify forward.

It writes the drafted positions' KV (rejected drafts included), puts the working state back to the
accepted prefix and carries out the V2 capture at the length the scheduler records, so the machine's data
oracle checks contents on the speculative path too: the tokens are the hash runner's, every check passes
on the reference after every step, a corrupted state is named at the verify that reads it, and a bug that
records a verify's capture in the wrong ping-pong half (the counts and the output oracle pass it) is found
by the hunt with tags and not without, at the same seed and bound.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.museum.machines.data_oracle import check_scheduler_data
from kvledger.reference.engine import EngineSpec, build_engine
from kvledger.reference.scheduler import Scheduler
from kvledger.reference.scheduler.spec_config import SpeculativeConfig
from kvledger.reference.scheduler.speculative import SpecDecoding
from kvledger.reference.scheduler.tagging_runner import TaggingHashRunner, flat_states, kv_mismatches

from .test_data_oracle import SHARED, hunt_with

PROMPTS = [[*SHARED, 1, 2], [*SHARED, 3], [4, 5, 6], [*SHARED, 1, 2, 9]]
CONFIGS = {
    "v1": {"mamba_strategy": "no_buffer"},
    "v2": {"mamba_chunk_size": 4, "mamba_track_interval": 4},
    "v2-overlap": {"overlap": True, "mamba_chunk_size": 4, "mamba_track_interval": 8},
    "v2-page4-overlap": {"page_size": 4, "overlap": True, "mamba_chunk_size": 4, "mamba_track_interval": 8},
    "no-tree": {"tree": "none", "overlap": True},
}


def speculative_engine(model: str, **kw: Any) -> Scheduler:
    spec = EngineSpec(
        model=model,  # type: ignore[arg-type]
        kv_tokens=256,
        mamba_slots=10,
        chunk=8,
        speculative=SpeculativeConfig(num_steps=3, topk=1, num_draft_tokens=4),
        **kw,
    )
    sched = build_engine(spec)
    assert sched.speculative is not None
    sched.speculative.draw.scripted([0, 1, 3, 2])
    return sched


def run_checked(sched: Scheduler, max_new: int = 14) -> list[list[int]]:
    for i, prompt in enumerate(PROMPTS):
        sched.add_request(i, prompt, max_new)
    for _ in range(500):
        if not sched.has_work():
            break
        sched.step()
        check_scheduler_data(sched)
    assert not sched.has_work()
    return [r.output_ids for r in sched.requests.values()]


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_the_tagged_verify_keeps_the_hash_tokens_and_every_tag(config: str) -> None:
    tagged = speculative_engine("hash-tags", **CONFIGS[config])
    assert isinstance(tagged.runner, TaggingHashRunner)
    outputs = run_checked(tagged)  # the data oracle after every step, overlap's in-flight verifies included
    assert outputs == run_checked(speculative_engine("hash", **CONFIGS[config]))
    stats = tagged.speculative.stats  # type: ignore[union-attr]
    assert stats.verify_batches and stats.drafts_accepted and stats.tail_freed_tokens
    if "track" in str(CONFIGS[config]):
        assert stats.captures  # the V2 captures of the verifies were checked too


def first_verify() -> tuple[Scheduler, Any, int]:
    """An engine whose request 0 just had its first verify (no overlap: launched and processed in one
    step), with the verify's data-plane start."""
    sched = speculative_engine("hash-tags", mamba_strategy="no_buffer")
    spec = sched.speculative
    assert spec is not None
    spec.draw.scripted([0])
    req = sched.add_request(0, [*SHARED, 1, 2], 8)
    for _ in range(20):
        start = spec.data_start(req)
        sched.step()
        if spec.stats.verify_batches:
            return sched, req, start
    raise AssertionError("no verify within 20 steps")


@pytest.mark.fires("I-DATA-STATE")
def test_a_verify_from_a_working_state_of_another_prefix_is_named() -> None:
    sched, req, _ = first_verify()
    conv, _ = flat_states(sched.mamba_pool)
    conv[0, int(req.mamba_pool_idx), 0, 1] += 1  # the length one component claims
    with pytest.raises(ContractViolation, match=r"I-DATA-STATE: req#0.* starts a forward at \d+ tokens"):
        sched.step()


def test_a_rejected_drafts_kv_position_holds_that_drafts_tag_and_is_never_trusted() -> None:
    """Page 1: the verify wrote 4 positions, accepted none; the positions above the committed length hold
    the tags of a drafted prefix (not of the kept one) and went back to the free list with the tail."""
    sched, req, start = first_verify()  # one token kept (the bonus), the tail of 3 positions freed
    assert sched.speculative is not None
    drafted = sched.req_to_token_pool.req_to_token[req.req_pool_idx, start : start + 4].tolist()
    assert req.kv_committed_len == start + 1
    runner: Any = sched.runner
    kept = runner.prefix_tags.tags(req.context_ids())
    assert not kv_mismatches(runner.kv_buffer, drafted[:1], [kept[start + 1]], [start])
    beyond = list(range(start + 1, start + 4))
    assert kv_mismatches(runner.kv_buffer, drafted[1:], [kept[-1]] * 3, beyond) == [0, 1, 2]
    assert sched.speculative.stats.tail_freed_tokens == 3
    check_scheduler_data(sched)


def test_v1_with_overlap_under_speculative_decoding_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="extra_buffer"):
        EngineSpec(
            overlap=True,
            mamba_strategy="no_buffer",
            speculative=SpeculativeConfig(num_steps=3, topk=1, num_draft_tokens=4),
        )


@pytest.mark.fires("I-DATA-STATE")
def test_why_v1_with_overlap_is_refused_under_speculative_decoding() -> None:
    """The refusal's reason, found by these tags: a verify launched before the previous batch's results
    moves the working state to its accepted prefix while ``kv_committed_len`` waits for those results, and
    V1 caches the working state itself (a chunk's fork, a finish's adoption): a state of more tokens than
    its node. Shown by stepping around ``EngineSpec``'s refusal for this one engine."""
    spec = EngineSpec(
        model="hash-tags",
        kv_tokens=256,
        mamba_slots=10,
        chunk=8,
        mamba_strategy="no_buffer",
        speculative=SpeculativeConfig(num_steps=3, topk=1, num_draft_tokens=4),
    )
    object.__setattr__(spec, "overlap", True)  # past __post_init__, which refuses this combination
    sched = build_engine(spec)
    assert sched.speculative is not None and sched.config.overlap
    sched.speculative.draw.scripted([0, 1, 3, 2])
    with pytest.raises(ContractViolation, match=r"I-DATA-STATE: tree Node#\d+.* should hold the state"):
        run_checked(sched)


def capture_recorded_in_the_other_half(self: SpecDecoding, req: Any, start: int, drafted_end: int) -> None:
    """A verify's capture recorded without flipping the ping-pong index: the recorded length now names the
    half holding the previous capture (the counts are the same; only the contents disagree)."""
    tracking = self.s.memory.tracking
    if tracking is not None and req.mamba_ping_pong_track_buffer is not None:
        seqlen = self.track_seqlen(start, req.kv_committed_len, drafted_end, tracking.interval)
        if seqlen is not None:
            self.stats.captures += 1
            req.mamba_last_track_seqlen = seqlen
    self.release_rejected_tail(req)


@pytest.mark.slow
def test_the_hunt_finds_a_speculative_capture_in_the_wrong_half_only_with_tags() -> None:
    bug = (SpecDecoding, "_after_verify", capture_recorded_in_the_other_half)
    found = hunt_with(bug, "scheduler", batches=20)
    assert found.found and found.invariant == "I-DATA-STATE", found.message
    assert "tracking slot" in found.message
    missed = hunt_with(bug, "scheduler", batches=20, oracle=False)
    assert not missed.found, missed.message  # the same seed and bound, without tags: nothing to see
