"""Scheduler transitions one at a time, and each scheduler contract broken on purpose."""

from __future__ import annotations

import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.owners import BATCH_INFLIGHT, REQ_CHUNKED, REQ_WAITING
from kvledger.museum import exhibit
from kvledger.reference.scheduler import ReqState, UnknownRequest
from tests.scheduler.harness import Setup, build, expected_output

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")


def _pool_state(sched) -> dict[str, object]:
    out: dict[str, object] = {}
    for pool in sched.accounting.pools():
        out[pool.name] = (
            pool.available_size(),
            dict(pool.ledger.account_sizes()) if pool.ledger.enabled else None,
        )
    if sched.tree is not None:
        out["tree"] = (sched.tree.evictable_size(), sched.tree.protected_size())
    return out


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("tree", ["mamba_radix", "radix", "none"])
def test_requests_finish_with_the_outputs_they_would_have_alone(tree: str, overlap: bool) -> None:
    sched = build(
        Setup(
            tree=tree,
            hybrid=tree != "radix",
            kv_tokens=160,
            rows=3,
            mamba_slots=5,
            chunk=8,
            overlap=overlap,
            mamba_strategy="no_buffer",  # Mamba V1 (EngineSpec's default is V2)
        )
    )
    prompts = {rid: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, rid, rid + 1] for rid in range(6)}
    for rid, p in prompts.items():
        sched.add_request(rid, p, 5)
    sched.run_until_idle(1000)
    sched.accounting.check_quiescent()
    for rid, p in prompts.items():
        req = sched.requests[rid]
        assert req.state is ReqState.FINISHED
        assert req.output_ids == expected_output(p, 5)
    if tree != "none":
        assert sched.stats.cached_prompt_tokens > 0


def test_a_chunked_and_retracted_prompt_counts_once_and_whole() -> None:
    """Prompt-token statistics: a 30-token prompt in chunks of 8, then retracted and re-admitted, is 30."""
    sched = build(Setup(tree="radix", hybrid=False, kv_tokens=200, rows=2, chunk=8, max_prefill=8))
    req = sched.add_request(0, list(range(30)), 6)
    while req not in sched.running:  # four chunks, then merged into the running batch
        sched.step()
    assert sched.stats.prompt_tokens == 30 and sched.stats.cached_prompt_tokens == 0
    assert sched.force_retract(1) == 1
    sched.run_until_idle(100)
    assert req.state is ReqState.FINISHED and req.retract_count == 1
    assert sched.stats.prompt_tokens == 30 and sched.stats.cached_prompt_tokens == 0
    other = sched.add_request(1, [*range(24), 99], 2)  # 24 tokens cached by request 0
    sched.run_until_idle(100)
    assert other.prefix_hit_tokens == 24
    assert sched.stats.prompt_tokens == 55 and sched.stats.cached_prompt_tokens == 24


def test_chunked_request_keeps_row_and_working_slot_across_chunks() -> None:
    sched = build(
        Setup(
            tree="mamba_radix",
            kv_tokens=200,
            rows=2,
            mamba_slots=4,
            chunk=8,
            max_prefill=8,
            mamba_strategy="no_buffer",
        )
    )
    req = sched.add_request(0, list(range(30)), 2)
    sched.step()
    assert req.state is ReqState.CHUNKED and req.owner.account is REQ_CHUNKED
    row, slot = req.req_pool_idx, int(req.mamba_pool_idx[0])
    sched.step()
    assert req.state is ReqState.CHUNKED and req.cache_protected_len == 8  # lock handed over to the chunk
    assert req.req_pool_idx == row and int(req.mamba_pool_idx[0]) == slot
    sched.run_until_idle(100)
    assert req.output_ids == expected_output(list(range(30)), 2)


@pytest.mark.parametrize("state", ["waiting", "waiting_cow", "chunked", "running"])
@pytest.mark.parametrize("overlap", [False, True])
def test_abort_from_every_state_releases_everything(state: str, overlap: bool) -> None:
    sched = build(
        Setup(
            tree="mamba_radix",
            kv_tokens=200,
            rows=2,
            mamba_slots=5,
            chunk=8,
            max_prefill=8,
            overlap=overlap,
            cow_release_policy="keep",
            mamba_strategy="no_buffer",  # Mamba V1 (EngineSpec's default is V2)
        )
    )
    sched.add_request(0, list(range(10)), 2)
    sched.run_until_idle(100)
    if state == "waiting":
        req = sched.add_request(1, [50, 51, 52], 3)
    elif state == "waiting_cow":
        req = sched.add_request(1, [*range(10), 60], 3)
        sched.memory.init_next_round_input(req, cow=True)
        assert req.mamba_pool_idx is not None
    elif state == "chunked":
        req = sched.add_request(1, list(range(100, 140)), 3)
        sched.step()
        assert req.state is ReqState.CHUNKED
    else:
        req = sched.add_request(1, [70, 71], 30)
        for _ in range(3):
            sched.step()
        assert req.state is ReqState.RUNNING
    assert sched.abort(1) is True
    sched.run_until_idle(100)
    assert req.state is ReqState.ABORTED and req.finish_reason == "aborted by client"
    for pool in sched.accounting.pools():
        assert pool.ledger.held_count(req.owner) == 0
    sched.accounting.check_quiescent()
    assert sched.abort(1) is False  # idempotent


def test_abort_unknown_request_is_a_typed_error() -> None:
    sched = build(Setup())
    with pytest.raises(UnknownRequest):
        sched.abort(99)


@pytest.mark.fires("I-TYPED-INPUT")
def test_bad_requests_are_typed_errors_and_change_nothing() -> None:
    sched = build(Setup())
    before = _pool_state(sched)
    for rid, prompt, max_new in [(0, [], 3), (0, [1, -2], 3), (0, [1], 0), (0, [1], True), ("x", [1], 2)]:
        with pytest.raises(InvalidArgument):
            sched.add_request(rid, prompt, max_new)  # type: ignore[arg-type]
    sched.add_request(0, [1], 1)
    with pytest.raises(InvalidArgument):
        sched.add_request(0, [2], 1)  # duplicate id
    assert _pool_state(sched) == before
    assert list(sched.requests) == [0]


def test_a_request_that_can_never_fit_is_rejected_not_queued() -> None:
    sched = build(Setup(kv_tokens=64, max_context_len=256))
    big = sched.add_request(0, list(range(70)), 4)
    small = sched.add_request(1, [1, 2, 3], 2)
    assert big.state is ReqState.REJECTED and "KV pool" in (big.finish_reason or "")
    assert big not in sched.waiting
    sched.run_until_idle(50)
    assert small.state is ReqState.FINISHED


def test_retraction_releases_without_insert_and_requeues() -> None:
    sched = build(
        Setup(tree="radix", hybrid=False, kv_tokens=64, rows=4, chunk=None, max_prefill=64, max_running=4)
    )
    for rid in range(3):
        sched.add_request(rid, [rid * 10 + i for i in range(8)], 20)
    for _ in range(3):
        sched.step()
    running = list(sched.running)
    assert running
    assert sched.force_retract(1) == 1
    victim = next(r for r in running if r.state is ReqState.WAITING)
    assert victim.is_retracted and victim.owner.account is REQ_WAITING
    assert victim.req_pool_idx is None and victim.lock is None
    for pool in sched.accounting.pools():
        assert pool.ledger.held_count(victim.owner) == 0
    sched.run_until_idle(500)
    for rid in range(3):
        r = sched.requests[rid]
        assert r.output_ids == expected_output(r.origin_input_ids, 20)


def test_decode_pressure_retracts_and_everything_still_finishes() -> None:
    sched = build(
        Setup(tree="radix", hybrid=False, kv_tokens=72, rows=6, chunk=None, max_prefill=64, max_running=6)
    )
    for rid in range(6):
        sched.add_request(rid, [rid * 10 + i for i in range(6)], 16)
    sched.run_until_idle(2000)
    assert sched.stats.retractions > 0
    assert all(r.state is ReqState.FINISHED for r in sched.requests.values())
    sched.accounting.check_quiescent()


def test_overlap_page4_extra_token_is_freed_exactly_once() -> None:
    """B1 (#6888): with overlap a finished request decodes one extra token, here onto a new page."""
    sched = build(
        Setup(
            tree="radix",
            hybrid=False,
            page_size=4,
            kv_tokens=96,
            rows=4,
            chunk=None,
            max_prefill=64,
            overlap=True,
        )
    )
    for rid in range(4):
        sched.add_request(rid, [rid * 10 + i for i in range(8)], 1)  # 8 tokens: the extra one opens a page
    sched.run_until_idle(100)
    assert sched.stats.discarded_tokens > 0
    sched.accounting.check_quiescent()
    assert sched.kv_allocator.available_size() + sched.tree.evictable_size() == sched.kv_allocator.size


@needs_contracts
def test_atomic_admission_rolls_back_on_an_injected_failure() -> None:
    """I-ATOMIC-ADMISSION (B17): row and Mamba slot taken, then KV fails: nothing is left behind."""
    sched = build(
        Setup(
            tree="mamba_radix", kv_tokens=128, rows=3, mamba_slots=4, chunk=None, mamba_strategy="no_buffer"
        )
    )
    req = sched.add_request(0, [1, 2, 3, 4], 3)
    before = _pool_state(sched)
    sched.faults.fail_next("kv")
    assert sched.step() is None
    assert sched.stats.rollbacks == 1 and sched.faults.fired == 1
    assert _pool_state(sched) == before
    assert req.state is ReqState.WAITING and req.owner.account is REQ_WAITING and req.lock is None
    sched.run_until_idle(50)
    assert req.output_ids == expected_output([1, 2, 3, 4], 3)


@needs_contracts
@pytest.mark.fires("I-ATOMIC-ADMISSION")
def test_a_rollback_that_forgets_an_allocation_is_caught() -> None:
    """B17 (museum exhibit): the row and Mamba slot taken before the KV failure are not undone."""
    sched = build(
        Setup(
            tree="mamba_radix", kv_tokens=128, rows=3, mamba_slots=4, chunk=None, mamba_strategy="no_buffer"
        )
    )
    sched.add_request(0, [1, 2, 3, 4], 3)
    sched.faults.fail_next("kv")
    with exhibit("B17").installed(), pytest.raises(ContractViolation, match="I-ATOMIC-ADMISSION"):
        sched.step()


@needs_contracts
@pytest.mark.fires("I-IDLE-IDENTITY")
def test_a_lock_left_at_quiescence_is_caught() -> None:
    """Quiescent (no request, no batch) but a tree node still locked: protected must be 0 there."""
    sched = build(Setup(tree="radix", hybrid=False, kv_tokens=64))
    sched.add_request(0, [1, 2, 3, 4, 5], 2)
    sched.run_until_idle(50)
    leaked = sched.tree.inc_lock_ref(sched.tree.match_prefix([1, 2, 3, 4]).last_node)  # nobody releases it
    assert sched.is_quiescent() and sched.tree.protected_size() > 0
    with pytest.raises(ContractViolation, match=r"I-IDLE-IDENTITY: quiescent but .*protected=4"):
        sched.accounting.check_quiescent()
    sched.tree.dec_lock_ref(leaked)
    sched.accounting.check_quiescent()


@pytest.mark.fires("I-LIVENESS")
def test_a_request_that_can_never_fit_blocks_the_queue_without_the_arrival_check() -> None:
    """vLLM #39734 (museum exhibit ``vLLM-oversize``): without the rejection at arrival the big request
    waits forever."""
    sched = build(Setup(kv_tokens=64, max_context_len=256))
    with exhibit("vLLM-oversize").installed():
        sched.add_request(0, list(range(70)), 4)  # 74 tokens can never fit in 64 slots
    with pytest.raises(ContractViolation, match="I-LIVENESS: not drained after 30 steps"):
        sched.run_until_idle(30)


@needs_contracts
@pytest.mark.fires("I-OWNER-RELEASE")
def test_double_release_is_a_contract_violation() -> None:
    sched = build(Setup())
    req = sched.add_request(0, [1, 2, 3], 1)
    sched.run_until_idle(20)
    with pytest.raises(ContractViolation, match="released twice"):
        sched.memory.cache_finished(req)


@needs_contracts
@pytest.mark.fires("I-REQ-LADDER")
def test_ladder_violation_fires() -> None:
    """I-REQ-LADDER: the class invariant catches a request whose bookkeeping is out of order."""
    sched = build(Setup())
    req = sched.add_request(0, [1, 2, 3, 4], 5)
    sched.step()
    req.kv_committed_len = req.kv_allocated_len + 1
    with pytest.raises(ContractViolation, match="I-REQ-LADDER"):
        sched.step()


@needs_contracts
@pytest.mark.fires("I-COUNT")
def test_busy_identity_names_the_request_whose_bookkeeping_lies() -> None:
    """I-COUNT: a request that forgets a KV slot it holds is named, with the slot's history."""
    sched = build(Setup(tree="none", hybrid=False, kv_tokens=64))
    req = sched.add_request(0, [1, 2, 3, 4], 5)
    sched.step()
    sched.step()
    req.cache_protected_len += 1  # claims one token less than it owns (ladder still holds)
    with pytest.raises(ContractViolation) as exc:
        sched.accounting.after_step()
    assert "I-COUNT: 1 tokens unaccounted (leak)" in str(exc.value)
    req.cache_protected_len -= 1
    sched.accounting.after_step()  # consistent again


@needs_contracts
@pytest.mark.fires("I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT")
def test_row_reassigned_while_in_flight_is_caught() -> None:
    """I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT (B8, museum exhibit): releasing a finished request at once instead of
    deferring it."""
    sched = build(
        Setup(tree="none", hybrid=False, kv_tokens=128, rows=1, chunk=None, overlap=True, max_running=2)
    )
    sched.add_request(0, [1, 2, 3], 1)
    sched.add_request(1, [4, 5, 6], 1)
    with exhibit("B8").installed(), pytest.raises(ContractViolation, match="in-flight"):
        sched.run_until_idle(50)


def test_deferred_release_is_accounted_to_the_inflight_batch() -> None:
    sched = build(Setup(tree="none", hybrid=False, kv_tokens=128, rows=2, chunk=None, overlap=True))
    req = sched.add_request(0, [1, 2, 3], 1)
    seen_inflight = False
    while sched.has_work():
        sched.step()
        if req.owner.account is BATCH_INFLIGHT and not req.released:
            seen_inflight = True
            terms = {t.pool: t for t in sched.accounting.pool_terms()}
            assert terms["req"].held.get(BATCH_INFLIGHT.name) == 1
    assert seen_inflight
    sched.accounting.check_quiescent()


@needs_contracts
@pytest.mark.fires("I-QUIESCENT")
def test_check_quiescent_refuses_outside_quiescence() -> None:
    sched = build(Setup())
    sched.add_request(0, [1, 2], 2)
    with pytest.raises(ContractViolation, match="outside quiescence"):
        sched.accounting.check_quiescent()


def test_cow_of_a_later_request_cannot_starve_an_earlier_reservation() -> None:
    """I-ATOMIC-ADMISSION / I-LIVENESS: a livelock the oracle machine found.

    A is appended with a Mamba slot promised; B then copy-on-writes the last free slot at match time and
    its lock protects the only evictable state. Admitting B too would make A's allocation fail every
    round (admit, roll back, repeat). B must be refused instead, and both finish.
    """
    sched = build(
        Setup(
            tree="mamba_radix",
            kv_tokens=96,
            rows=4,
            mamba_slots=2,
            max_running=4,
            chunk=None,
            max_prefill=64,
            max_context_len=64,
            mamba_strategy="no_buffer",  # Mamba V1 (EngineSpec's default is V2)
        )
    )
    warm = list(range(1, 9))
    sched.add_request(0, warm, 1)
    sched.run_until_idle(20)
    assert sched.mamba_pool.available_size() == 1 and sched.tree.mamba_evictable_size() == 1
    a = sched.add_request(1, [50], 3)
    b = sched.add_request(2, [*warm, 9], 3)
    sched.run_until_idle(100)
    assert sched.stats.rollbacks == 0
    assert a.output_ids == expected_output([50], 3) and b.output_ids == expected_output([*warm, 9], 3)
