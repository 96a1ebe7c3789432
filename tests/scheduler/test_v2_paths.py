"""Mamba V2 (``extra_buffer``) one transition at a time, and each V2 contract broken on purpose.

Every re-enacted bug lives here, as a subclass or a scoped patch, never in the reference code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import kvledger.reference.radix.mamba_component as mamba_module  # the V2 policy computes the branching point
from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.reference.engine import EngineSpec, TreeKind
from kvledger.reference.radix import MambaRadixCache
from kvledger.reference.scheduler import ReqState, Scheduler, SchedulerConfig
from kvledger.reference.scheduler.cache_paths import MambaV2Path
from kvledger.reference.scheduler.memory import ReqMemory
from kvledger.reference.scheduler.request import Req
from kvledger.reference.scheduler.tracking import MambaTracking
from kvledger.sim.simulate import SimOptions
from tests.scheduler.harness import Setup, build, expected_output

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")


def v2_path(sched: Scheduler) -> MambaV2Path:
    """The scheduler's V2 cache path (where the tests swap in a broken tracking variant)."""
    path = sched.memory.path
    assert isinstance(path, MambaV2Path)
    return path


def v2(page_size: int = 1, overlap: bool = False, **kw: Any) -> Scheduler:
    options: dict[str, Any] = {
        "page_size": page_size,
        "tree": "mamba_radix",
        "hybrid": True,
        "kv_tokens": 256 if page_size < 16 else 512,
        "rows": 4,
        "mamba_slots": 8,
        "max_running": 4,
        "chunk": None,
        "max_prefill": 128,
        "overlap": overlap,
        "max_context_len": 128,
        "mamba_strategy": "extra_buffer",
        "mamba_track_interval": max(4, page_size),
        "mamba_chunk_size": 4,
    }
    options.update(kw)
    return build(Setup(**options))


def mamba_held(sched: Scheduler, req: Req) -> list[int]:
    return sorted(sched.mamba_pool.ledger.holdings(req.owner))


def until(sched: Scheduler, cond: Any, limit: int = 200) -> None:
    for _ in range(limit):
        if cond():
            return
        sched.step()
    raise AssertionError("condition never reached")


# ---------------------------------------------------------------------- the transitions
@needs_contracts
@pytest.mark.parametrize("overlap", [False, True])
def test_a_request_holds_its_working_and_k_tracking_slots_and_donates_with_a_replacement(
    overlap: bool,
) -> None:
    sched = v2(overlap=overlap)
    k = 2 if overlap else 1
    prompt = list(range(10, 21))  # 11 tokens: the prefill captures at 8
    req = sched.add_request(0, prompt, 6)
    sched.step()  # admitted and prefilled (and, without overlap, its result processed)
    assert req.mamba_ping_pong_track_buffer is not None and req.mamba_ping_pong_track_buffer.numel() == k
    until(sched, lambda: req.cache_protected_len == 8)  # the prefill's result: cache_unfinished_req
    assert req.mamba_last_track_seqlen is None
    node = sched.tree.match_prefix(prompt[:8]).last_node
    donated = int(node.mamba_value[0])
    ledger = sched.mamba_pool.ledger
    moves = [(m.op, m.src, m.dst) for m in ledger.history_of(donated)]
    assert ("alloc", "free_list", "req#0") in moves, moves  # a tracking slot of the request...
    assert ("donate", "req#0", f"node.mamba#{node.id}") in moves, moves  # ...handed to the node, no copy
    assert donated not in req.mamba_slots(), "the keep half went to the tree"
    assert len(mamba_held(sched, req)) == 1 + k and set(mamba_held(sched, req)) == set(req.mamba_slots())
    sched.run_until_idle(200)
    assert req.state is ReqState.FINISHED and req.output_ids == expected_output(prompt, 6)
    assert req.mamba_ping_pong_track_buffer is None and ledger.held_count(req.owner) == 0


@needs_contracts
def test_decode_captures_every_interval_and_finish_caches_the_last_tracked_length() -> None:
    sched = v2(mamba_track_interval=4)
    prompt = list(range(30, 41))  # 11 tokens: prefill captures at 8, decode at 12, 16
    req = sched.add_request(0, prompt, 7)  # finishes with 11 + 6 = 17 tokens computed
    sched.run_until_idle(200)
    assert req.state is ReqState.FINISHED
    tree: MambaRadixCache = sched.tree
    match = tree.match_prefix([*prompt, *req.output_ids])
    assert match.device_indices.numel() == 16, "cached up to the last tracked length, no further"
    assert tree.evictable_size() == 16, "the KV above 16 went back to the free list at finish"
    stats = sched.memory.tracking.stats  # type: ignore[union-attr]
    assert stats["captures"] == 3 and stats["donations"] == 1


def test_nothing_tracked_nothing_cached() -> None:
    """A prompt shorter than one chunk and a decode that never reaches the interval: no insert (B16)."""
    sched = v2(mamba_chunk_size=8, mamba_track_interval=64)
    req = sched.add_request(0, [1, 2, 3, 4, 5], 3)
    sched.run_until_idle(50)
    assert req.state is ReqState.FINISHED
    assert sched.tree.total_size() == 0 and sched.tree.mamba_total_size() == 0
    sched.accounting.check_quiescent()


@pytest.mark.parametrize("page_size", [4, 16])
def test_page_sizes_above_one_run_v2_and_refuse_v1(page_size: int) -> None:
    sched = v2(page_size=page_size, chunk=32, mamba_track_interval=page_size)
    prompts = {rid: [*range(40, 72), rid, rid + 1, rid + 2] for rid in range(4)}
    for rid, prompt in prompts.items():
        sched.add_request(rid, prompt, 5)
    sched.run_until_idle(500)
    sched.accounting.check_quiescent()
    for rid, prompt in prompts.items():
        assert sched.requests[rid].output_ids == expected_output(prompt, 5)
    assert sched.stats.cached_prompt_tokens >= 32 * 3
    with pytest.raises(InvalidArgument, match="no_buffer"):
        v2(page_size=page_size, mamba_strategy="no_buffer")


@needs_contracts
def test_retraction_frees_the_tracking_slots_and_readmission_takes_fresh_ones() -> None:
    """The #26941 fix at the request level: a released request's tracking handle is cleared, so the next
    admission allocates (and the ledger agrees it owns) new tracking slots."""
    sched = v2(overlap=True)
    req = sched.add_request(0, list(range(10, 30)), 8)
    until(sched, lambda: req in sched.running)
    old = req.mamba_ping_pong_track_buffer.tolist()  # type: ignore[union-attr]
    assert sched.force_retract(1) == 1
    assert req.mamba_ping_pong_track_buffer is None and req.mamba_last_track_seqlen is None
    assert sched.mamba_pool.ledger.held_count(req.owner) == 0
    filler = sched.add_request(1, [90, 91, 92, 93, 94, 95, 96, 97, 98], 2)  # may take the freed slots
    until(sched, lambda: req.state is ReqState.RUNNING and req.mamba_ping_pong_track_buffer is not None)
    now = req.mamba_ping_pong_track_buffer.tolist()  # type: ignore[union-attr]
    assert all(sched.mamba_pool.ledger.owner_of(s) is req.owner for s in now)
    assert filler.mamba_ping_pong_track_buffer is None or not set(now) & set(filler.mamba_slots())
    sched.run_until_idle(300)
    assert req.output_ids == expected_output(list(range(10, 30)), 8)
    assert old  # it held some before


def test_admission_waits_for_all_of_its_slots() -> None:
    """With room for one request's working and tracking slots, the second request waits its turn
    (I-ATOMIC-ADMISSION: the demand is 1 + k, budgeted before anything is taken)."""
    sched = v2(overlap=True, mamba_slots=4, mamba_chunk_size=64, chunk=None)  # 1 + 2 = 3 per request
    a = sched.add_request(0, [1, 2, 3, 4, 5, 6], 4)
    b = sched.add_request(1, [7, 8, 9, 10, 11, 12], 4)
    sched.step()
    assert a.state is ReqState.RUNNING and b.state is ReqState.WAITING
    sched.run_until_idle(100)
    assert a.output_ids == expected_output([1, 2, 3, 4, 5, 6], 4)
    assert b.output_ids == expected_output([7, 8, 9, 10, 11, 12], 4)


@needs_contracts
def test_a_failed_tracking_allocation_rolls_the_whole_admission_back() -> None:
    sched = v2(overlap=True)
    req = sched.add_request(0, list(range(10, 22)), 3)
    free_before = sched.mamba_pool.available_size()
    with patched(MambaTracking, "alloc", lambda self, r: None):
        sched.step()
    assert req.state is ReqState.WAITING and req.mamba_ping_pong_track_buffer is None
    assert sched.mamba_pool.available_size() == free_before and sched.stats.rollbacks == 1
    sched.run_until_idle(100)
    assert req.output_ids == expected_output(list(range(10, 22)), 3)


@needs_contracts
def test_a_donation_without_a_replacement_slot_is_skipped_not_asserted() -> None:
    """Every slot held or locked: the request keeps its tracked state and its KV, and finishes correctly
    (SGLang asserted "Can not alloc mamba cache" here: #36770, #40128, #37619)."""
    sched = v2(mamba_slots=2, overlap=False, mamba_track_interval=64)
    prompt = list(range(10, 21))
    req = sched.add_request(0, prompt, 3)
    sched.step()  # working + 1 tracking slot: the pool is full
    assert sched.mamba_pool.available_size() == 0
    sched.run_until_idle(50)
    assert sched.memory.tracking.stats["donations_skipped"] >= 1  # type: ignore[union-attr]
    assert req.output_ids == expected_output(prompt, 3)
    sched.accounting.check_quiescent()


# ---------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"page_size": 4, "mamba_track_interval": 6}, "multiple of page_size"),
        ({"page_size": 4, "mamba_chunk_size": 6}, "one must divide the other"),
        ({"page_size": 1, "mamba_chunk_size": 64, "chunked_prefill_size": 32}, "never capture"),
        ({"page_size": 1, "overlap": True, "mamba_track_interval": 1}, "overlap"),
        ({"mamba_scheduler_strategy": "big_buffer"}, "unknown mamba_scheduler_strategy"),
    ],
)
def test_extra_buffer_configuration_is_checked(options: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"mamba_scheduler_strategy": "extra_buffer", "chunked_prefill_size": None}
    base.update(options)
    with pytest.raises(InvalidArgument, match=message):
        SchedulerConfig(**base)


def test_the_pool_must_hold_one_requests_working_and_tracking_slots() -> None:
    with pytest.raises(InvalidArgument, match="tracking slot"):
        v2(overlap=True, mamba_slots=2)


def test_the_tree_must_branch_on_the_schedulers_grid() -> None:
    sched = v2()
    tree = MambaRadixCache(sched.kv_allocator, sched.mamba_pool, mamba_cache_chunk_size=8)
    with pytest.raises(InvalidArgument, match="mamba_cache_chunk_size=4"):
        Scheduler(
            sched.config,
            kv_allocator=sched.kv_allocator,
            req_to_token_pool=sched.req_to_token_pool,
            mamba_pool=sched.mamba_pool,
            tree=tree,
        )


def test_engine_spec_defaults_to_v2_as_simulate_does() -> None:
    """The library's default is the one ``kvledger simulate`` and the README use: Mamba V2
    (``extra_buffer``), with a chunked prefill of at least one capture grid; V1 is asked for by name."""
    spec = EngineSpec()
    assert spec.mamba_strategy == SimOptions().mamba_strategy == "extra_buffer"
    assert spec.mamba_track_interval == SimOptions().mamba_track_interval
    assert spec.mamba_chunk_size == SimOptions().mamba_chunk_size
    sched = build(spec)
    assert sched.config.extra_buffer and sched.memory.tracking is not None
    assert spec.chunk is not None and spec.chunk >= sched.config.mamba_cache_chunk_size
    sched.add_request(0, list(range(1, 70)), 3)  # one grid of 64: the prefill captures a state
    sched.run_until_idle(50)
    assert sched.requests[0].output_ids == expected_output(list(range(1, 70)), 3)
    assert sched.tree is not None
    assert sched.tree.match_prefix(list(range(1, 70))).device_indices.numel() == 64
    sched.accounting.check_quiescent()
    v1 = build(Setup(mamba_strategy="no_buffer"))
    assert not v1.config.extra_buffer and v1.memory.tracking is None


def test_v2_rules_apply_only_with_the_mamba_radix_cache() -> None:
    """Without the Mamba radix cache nothing is tracked: the default strategy does not impose V2's chunk rule."""
    trees: tuple[TreeKind, ...] = ("radix", "none")
    for tree in trees:
        sched = build(Setup(tree=tree, hybrid=tree == "none", chunk=8))
        assert not sched.config.extra_buffer and sched.memory.tracking is None
    with pytest.raises(InvalidArgument, match="mamba_cache_chunk_size 64"):
        Setup(chunk=8)  # the Mamba radix cache under V2: refused when the spec is made, before any pool


# ---------------------------------------------------------------------- contracts broken on purpose
@contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    saved = obj.__dict__[name]
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


@needs_contracts
@pytest.mark.fires("I-REQ-MAMBA")
def test_an_admission_that_skips_the_tracking_slots_is_caught() -> None:
    sched = v2()
    sched.add_request(0, list(range(10, 21)), 3)
    with (
        patched(MambaTracking, "needs_slots", lambda self, req: False),
        pytest.raises(ContractViolation, match="I-REQ-MAMBA"),
    ):
        sched.step()


class LeakyDonation(MambaTracking):
    """A donation that forks the keep half for the tree (the late-2025 way) *and* takes a replacement
    (the 2026 way): the old keep half stays with the request, named by no handle."""

    def donate(self, req: Req) -> torch.Tensor | None:
        pp = req.mamba_ping_pong_track_buffer
        assert pp is not None
        keep = self.keep_idx(req)
        fork = self.mamba_pool.fork_from(pp[keep : keep + 1], req.owner)
        replacement = self.mamba_pool.alloc(1, req.owner)
        if fork is None or replacement is None:
            return None
        req.mamba_ping_pong_track_buffer = self._refilled(pp, keep, replacement)
        return fork


@needs_contracts
@pytest.mark.fires("I-STATE-BOUND")
def test_a_request_left_holding_more_than_1_plus_k_slots_is_named() -> None:
    sched = v2()
    path = v2_path(sched)
    old = path.tracking
    path.tracking = LeakyDonation(
        mamba_pool=old.mamba_pool, tree=old.tree, k=old.k, chunk=old.chunk, interval=old.interval
    )
    sched.add_request(0, list(range(10, 21)), 3)
    with pytest.raises(ContractViolation, match=r"I-STATE-BOUND: req#0\[req.running\] holds 3 Mamba slots"):
        sched.run_until_idle(20)


class OffGridTracking(MambaTracking):
    """Records the captured length one token past where the capture happened."""

    def plan_extend(self, req: Req, start: int, end: int) -> None:
        super().plan_extend(req, start, end)
        if req.mamba_last_track_seqlen is not None:
            req.mamba_last_track_seqlen += 1


@needs_contracts
@pytest.mark.fires("I-TRACK-POINT")
def test_a_tracked_length_off_the_page_grid_is_caught() -> None:
    sched = v2(page_size=4, mamba_track_interval=4)
    path = v2_path(sched)
    old = path.tracking
    path.tracking = OffGridTracking(
        mamba_pool=old.mamba_pool, tree=old.tree, k=old.k, chunk=old.chunk, interval=old.interval
    )
    sched.add_request(0, list(range(10, 21)), 3)
    with pytest.raises(ContractViolation, match="I-TRACK-POINT"):
        sched.run_until_idle(20)


@needs_contracts
@pytest.mark.fires("I-TRACK-POINT")
def test_a_capture_outside_the_forward_is_refused_by_the_runner() -> None:
    sched = v2(model="tiny-hybrid", vocab_size=128)
    req = sched.add_request(0, list(range(10, 21)), 3)
    original = MambaTracking.plan_extend

    def late(self: MambaTracking, r: Req, start: int, end: int) -> None:
        original(self, r, start, end)
        if r.mamba_track is not None:
            r.mamba_track = type(r.mamba_track)(end + 4, r.mamba_track.slot)

    with patched(MambaTracking, "plan_extend", late), pytest.raises(ContractViolation, match="I-TRACK-POINT"):
        sched.step()
    assert req.mamba_track is not None


@needs_contracts
@pytest.mark.fires("I-BRANCHING")
def test_a_branching_point_off_the_chunk_grid_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    sched = v2()
    sched.add_request(0, list(range(10, 30)), 2)
    sched.run_until_idle(50)
    monkeypatch.setattr(mamba_module, "branching_seqlen", lambda matched, state, chunk: chunk + 1)
    with pytest.raises(ContractViolation, match="I-BRANCHING"):
        sched.tree.match_prefix([*range(10, 19), 99, 99])  # goes past the state at 20? no: splits at 9


@needs_contracts
@pytest.mark.fires("I-DONATION")
def test_a_donation_without_a_replacement_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    sched = v2(overlap=True)
    sched.add_request(0, list(range(10, 21)), 3)
    monkeypatch.setattr(
        MambaTracking,
        "_refilled",
        staticmethod(lambda pp, keep, replacement: torch.cat((pp[:keep], pp[keep + 1 :]))),
    )
    with pytest.raises(ContractViolation, match="I-DONATION"):
        sched.run_until_idle(20)


@needs_contracts
@pytest.mark.fires("I-V2-CACHE-LEN")
def test_v1s_insert_length_under_v2_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inserting the whole committed length (V1's rule) with the state tracked at a shorter length."""
    sched = v2()
    sched.add_request(0, list(range(10, 23)), 3)  # 13 tokens: captured at 12, committed 13
    monkeypatch.setattr(MambaV2Path, "_tracked_insert_len", staticmethod(lambda req: req.kv_committed_len))
    with pytest.raises(ContractViolation, match="I-V2-CACHE-LEN: req#0"):
        sched.run_until_idle(20)


@needs_contracts
@pytest.mark.fires("I-V2-CACHE-LEN")
def test_kv_left_above_the_cached_length_at_finish_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finish that frees only from the committed length (V1's range): V2 frees from the cached one."""
    sched = v2(mamba_track_interval=64)
    sched.add_request(0, list(range(10, 23)), 3)
    original = ReqMemory._free_owned

    def v1_range(self: ReqMemory, req: Req, kv_from: int) -> None:
        original(self, req, max(kv_from, req.kv_committed_len - 1))

    monkeypatch.setattr(ReqMemory, "_free_owned", v1_range)
    with pytest.raises(ContractViolation, match=r"I-V2-CACHE-LEN: req#0.* still holds"):
        sched.run_until_idle(20)


@pytest.mark.parametrize("rows", [1, 2])
def test_a_later_match_cannot_take_the_tracking_slot_promised_to_an_earlier_request(rows: int) -> None:
    """I-LIVENESS / I-ATOMIC-ADMISSION under V2 with ``keep`` (issue 13, found by the V2 oracle machine).

    Three Mamba slots: the tree caches one state, two are free. A matches it, copies it into one free
    slot and is appended with its tracking slot promised (the last free one; the cached state is locked
    by A). B matches the same state next: its copy-on-write would take that promised slot, B itself is
    refused (no row or no Mamba slot left) and, with ``keep``, holds the copy; A's tracking allocation
    then fails and A is rolled back holding its copy too. From then on A needs one slot while B's copy
    and A's own locked source are all there is: nothing is evictable and the queue never drains. The
    round must stop before matching a request it cannot admit.
    """
    sched = v2(rows=rows, mamba_slots=3, max_running=2, cow_release_policy="keep")
    warm = list(range(1, 10))
    sched.add_request(0, warm, 1)
    sched.run_until_idle(50)
    assert sched.mamba_pool.available_size() == 2 and sched.tree.mamba_evictable_size() == 1
    a = sched.add_request(1, [*warm, 20], 3)
    b = sched.add_request(2, [*warm, 30], 3)
    sched.step()
    assert a.state is ReqState.RUNNING and b.state is ReqState.WAITING
    assert b.mamba_slots() == [], "B was matched (and copied a state) in a round that could not admit it"
    sched.run_until_idle(100)
    assert sched.stats.rollbacks == 0
    assert a.output_ids == expected_output([*warm, 20], 3) and b.output_ids == expected_output([*warm, 30], 3)
    assert sched.stats.cached_prompt_tokens == 16  # both hit the cached state at 8
    sched.accounting.check_quiescent()
