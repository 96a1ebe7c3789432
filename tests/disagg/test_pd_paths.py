"""PD transitions one at a time: outputs, each fault of each component, aborts from every stage, leases,
retraction through the host copy, the PD busy terms, and the checks each broken on purpose."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, DoubleFree, ForeignSlot, InvalidArgument
from kvledger.contracts.owners import FREE_LIST, REQ_WAITING, Owner
from kvledger.contracts.sizing import decode_mamba_slots, decode_rows, default_pre_alloc_size
from kvledger.reference.disagg import DECODE, PREFILL, Component, Fault, PDSystem, Poll
from kvledger.reference.pools import MetadataBufferPool
from kvledger.reference.scheduler import ReqState
from tests.disagg.harness import build, expected, pd_spec, with_channel
from tests.scheduler.harness import Setup
from tests.scheduler.harness import build as build_plain

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")
PREFIX = list(range(10, 26))


def _drain(system: PDSystem, max_steps: int = 500) -> None:
    system.run_until_idle(max_steps)
    system.check_quiescent()
    for p, d in system.pairs.values():
        assert p.state.is_done and p.finish_reason and d.state.is_done and d.finish_reason, (p, d)
        if d.state is ReqState.FINISHED:
            assert d.output_ids == expected(system, d.origin_input_ids, d.max_new_tokens), d


def _step_until(system: PDSystem, cond: Callable[[], bool], limit: int = 100) -> None:
    for _ in range(limit):
        if cond():
            return
        system.step()
    raise AssertionError(f"not reached in {limit} steps: {system.describe()}")


# ------------------------------------------------------------------ outputs
@pytest.mark.parametrize(
    ("tree", "page_size", "hybrid", "overlap"),
    [
        ("mamba_radix", 1, True, False),
        ("mamba_radix", 1, True, True),
        ("radix", 4, False, False),
        ("none", 4, True, True),
    ],
)
def test_requests_finish_on_decode_with_their_alone_outputs(
    tree: str, page_size: int, hybrid: bool, overlap: bool
) -> None:
    system = build(tree=tree, page_size=page_size, hybrid=hybrid, overlap=overlap)
    for rid in range(6):
        system.add_request(rid, [*PREFIX, rid, rid + 1], 5)
    _drain(system)
    assert all(d.state is ReqState.FINISHED for _, d in system.pairs.values())
    assert all(p.state is ReqState.FINISHED and p.finish_reason == "transferred" for p, _ in system.pairs.values())
    assert system.prefill.stats.decode_batches == 0  # a prefill instance never decodes
    if tree != "none":
        assert system.prefill.stats.cached_prompt_tokens > 0


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["mamba_radix", "none"])
def test_the_tiny_model_on_decode_matches_the_request_run_alone(tree: str) -> None:
    """KV and Mamba state cross the channel through the kernels: the decode side's tokens are the
    request's own (a wrong byte, a stale state or a missed page would change them)."""
    system = build(tree=tree, model="tiny-hybrid", chunk=8)
    prompts = {0: PREFIX, 1: [*PREFIX, 5, 6], 2: [*PREFIX[:12], 7], 3: [1, 2], 4: [*PREFIX, 9]}
    for rid, p in prompts.items():
        system.add_request(rid, p, 5)
    _drain(system)
    assert all(d.state is ReqState.FINISHED for _, d in system.pairs.values())


# ------------------------------------------------------------------ faults, per component
@pytest.mark.parametrize(
    ("component", "fault", "prefill_end", "decode_end"),
    [
        (Component.KV, Fault.DELAY, "transferred", None),
        (Component.MAMBA, Fault.DELAY, "transferred", None),
        (Component.META, Fault.DELAY, "transferred", None),
        (Component.KV, Fault.DROP, "transferred", "transfer timeout"),  # the sender never knew
        (Component.META, Fault.DROP, "transferred", "transfer timeout"),
        (Component.KV, Fault.FAIL, "kv transfer failed", "kv transfer failed"),
        (Component.MAMBA, Fault.FAIL, "mamba transfer failed", "mamba transfer failed"),
        (Component.META, Fault.TIMEOUT, "meta transfer timed out", "meta transfer timed out"),
        (Component.BOOTSTRAP, Fault.FAIL, "bootstrap failed", "bootstrap failed"),
        (Component.BOOTSTRAP, Fault.TIMEOUT, "bootstrap timeout", "bootstrap timeout"),
        (Component.BOOTSTRAP, Fault.DELAY, "transferred", None),
    ],
)
def test_each_fault_ends_the_way_it_should(
    component: Component, fault: Fault, prefill_end: str, decode_end: str | None
) -> None:
    system = build()
    system.channel.inject(component, fault)
    p, d = system.add_request(0, PREFIX, 4)
    system.add_request(1, [*PREFIX, 99], 4)  # a bystander: unaffected
    _drain(system)
    assert p.finish_reason == prefill_end
    if decode_end is None:
        assert d.state is ReqState.FINISHED
    else:
        assert d.state is ReqState.ABORTED and d.finish_reason == decode_end
    assert system.pairs[1][1].state is ReqState.FINISHED
    assert system.channel.stats.faults[(component.value, fault.value)] == 1


# ------------------------------------------------------------------ aborts at every stage
PREFILL_STAGES = ["bootstrap", "waiting", "chunked", "inflight"]
DECODE_STAGES = ["prealloc", "transfer", "prebuilt", "running", "retracted"]


def _reach(system: PDSystem, side: str, stage: str) -> int:
    """A request (rid 1) in ``stage`` on ``side``; rid 0 occupies decode so that 'prebuilt' can wait."""
    system.add_request(0, [1, 2, 3, 4], 30)
    _step_until(system, lambda: bool(system.decode.running))
    prompt = list(range(40, 80)) if stage == "chunked" else [*PREFIX, 1]
    system.add_request(1, prompt, 6)
    req = system.pairs[1][0 if side == PREFILL else 1]
    if stage == "inflight":
        system.channel.inject(Component.KV, Fault.DELAY, room=2, times=4)
    if stage == "waiting":  # admission keeps failing: the request stays in the prefill waiting queue
        system.prefill.faults.fail_next("row", 1000)
        _step_until(system, lambda: system.prefill.stats.rollbacks > 0)
        system.prefill.faults.pending.clear()
        assert req.state is ReqState.WAITING and req.metadata_idx is not None
        return 1
    if stage == "retracted":
        _step_until(system, lambda: req.state is ReqState.RUNNING)
        system.decode.force_retract(2)
        assert req.state is ReqState.RETRACTED and req.host_copy is not None
        return 1
    _step_until(system, lambda: req.state.value == stage)
    return 1


@pytest.mark.parametrize(
    ("side", "stage"), [(PREFILL, s) for s in PREFILL_STAGES] + [(DECODE, s) for s in DECODE_STAGES]
)
@pytest.mark.parametrize("at", [PREFILL, DECODE])
def test_abort_from_every_stage_drains_both_sides(side: str, stage: str, at: str) -> None:
    system = build(decode_running=1, chunk=8)
    rid = _reach(system, side, stage)
    p, d = system.pairs[rid]
    aborted = system.abort(rid, at)
    _drain(system)
    assert rid not in system.undrained
    if aborted:
        target = p if at == PREFILL else d
        assert target.state is ReqState.ABORTED and target.finish_reason == "aborted by client"
    for inst, req in ((system.prefill, p), (system.decode, d)):
        for pool in inst.accounting.pools_by_name().values():
            assert pool.ledger.held_count(req.owner) == 0
    assert system.pairs[0][1].state is ReqState.FINISHED  # the other request is untouched
    assert system.longest_drain <= system.channel.config.drain_bound


def test_a_sender_abort_that_arrives_after_the_commit_leaves_the_decode_serving_alone() -> None:
    """I-DRAIN's scope (found by the deep PD fuzz): the last KV lands and the decode commits while the
    prefill's abort is still on the way (latency 2). The decode stopped polling the room at the commit, so
    its copy goes on, waits in the prebuilt queue longer than the drain bound (rid 0 holds the only
    running slot) and finishes with its alone output; the prefill's copy drains within the bound."""
    system = build(with_channel(pd_spec(decode_running=1, chunk=None, overlap=True), latency=2, delay_steps=0))
    system.add_request(0, [1, 2, 3, 4], 40)
    _step_until(system, lambda: bool(system.decode.running))
    system.add_request(1, [*PREFIX, 1], 6)
    p, d = system.pairs[1]

    def last_messages_land_next_step() -> bool:
        room = system.channel.rooms.get(2)
        due = [m.resolve_step for m in room.unresolved.values()] if room is not None else []
        return not room.pending and len(due) == 3 and set(due) == {system.step_no + 1} if room else False

    _step_until(system, last_messages_land_next_step)
    assert p.state is ReqState.INFLIGHT and d.state is ReqState.TRANSFER
    assert system.abort(1, PREFILL)  # reaches the decode in 2 steps; the KV, state and metadata in 1
    system.step()
    assert d.state is ReqState.PREBUILT  # committed before the abort arrived
    _drain(system)  # the over-strict I-DRAIN (both copies, whatever their stage) raised here
    assert system.decode.serves_alone(d) and not system.prefill.serves_alone(p)
    assert p.state is ReqState.ABORTED and d.state is ReqState.FINISHED
    assert system.longest_drain <= system.channel.config.drain_bound
    assert d.first_token_step is not None and system.step_no - d.first_token_step > system.channel.config.drain_bound


@pytest.mark.parametrize(("page_size", "reserved"), [(1, 4), (4, 8)])
def test_a_prompt_whose_preallocation_never_fits_the_decode_pool_is_rejected_at_arrival(
    page_size: int, reserved: int
) -> None:
    """I-LIVENESS (found by the museum's PD machine): pre-allocation takes the prompt plus the reserved
    decode tokens at once; a prompt for which that exceeds the decode pool passed the scheduler's arrival
    check (prompt + max_new_tokens + a page fits) and waited in the pre-allocation queue forever."""
    decode_kv = 32
    system = build(
        pd_spec(tree="none", page_size=page_size, decode_kv=decode_kv, chunk=None, reserved_decode_tokens=reserved)
    )
    too_long = list(range(1, decode_kv - reserved + 2))  # one token past what pre-allocation can ever take
    fits = list(range(1, decode_kv - reserved - page_size + 1))
    assert len(too_long) + 1 + page_size <= decode_kv  # the plain scheduler's check alone would accept it
    p, d = system.add_request(0, too_long, 1)
    assert d.state is ReqState.REJECTED and d.finish_reason == "prompt + reserved decode tokens exceeds the KV pool"
    system.add_request(1, fits, 1)
    _drain(system)
    assert p.state.is_done and system.pairs[1][1].state is ReqState.FINISHED


# ------------------------------------------------------------------ leases
@needs_contracts
def test_a_decode_lease_holds_the_pages_until_the_sender_acknowledges() -> None:
    system = build()
    system.channel.inject(Component.KV, Fault.TIMEOUT)  # hangs for message_timeout steps
    system.add_request(0, PREFIX, 3)
    _step_until(system, lambda: any(True for _ in system.channel.in_flight()))
    d = system.pairs[0][1]
    pools = system.decode.accounting.pools_by_name()
    held = {name: set(pool.ledger.holdings(d.owner)) for name, pool in pools.items()}
    system.abort(0, DECODE)
    assert d.owner.account.name == "pd.decode.lease" and system.decode.lease_queue == [d]
    terms = {t.pool: t.held for t in system.decode.accounting.pool_terms()}
    assert terms["kv"] == {"pd.decode.lease": len(PREFIX)} and terms["metadata"] == {"pd.decode.lease": 1}
    while any(True for _ in system.channel.in_flight()):
        assert {name: set(pool.ledger.holdings(d.owner)) for name, pool in pools.items()} == held
        system.step()
    _drain(system)
    assert system.channel.stats.acks == 1 and system.decode.pd_stats.longest_lease >= 1


# ------------------------------------------------------------------ retraction and the host copy
@pytest.mark.slow
def test_retracted_decode_requests_resume_from_their_host_copy_with_the_same_tokens() -> None:
    system = build(model="tiny-hybrid", tree="none", decode_running=3)
    for rid in range(3):
        system.add_request(rid, [*PREFIX[: 8 + rid], rid], 8)
    _step_until(system, lambda: len(system.decode.running) == 3)
    system.step()
    assert system.decode.force_retract(2) == 2
    assert len(system.decode.retracted_queue) == 2
    assert all(r.state is ReqState.RETRACTED for r in system.decode.retracted_queue)
    _drain(system)
    assert system.decode.pd_stats.resumes == 2
    assert all(d.state is ReqState.FINISHED for _, d in system.pairs.values())


# ------------------------------------------------------------------ the PD busy check
@needs_contracts
@pytest.mark.fires("I-COUNT")
def test_pd_busy_terms_name_every_holder_and_the_ledger_agrees() -> None:
    system = build()
    system.channel.inject(Component.KV, Fault.DELAY, times=3)
    system.add_request(0, PREFIX, 3)
    _step_until(system, lambda: system.pairs[0][0].state is ReqState.INFLIGHT)
    p_terms = {t.pool: t for t in system.prefill.accounting.pool_terms()}
    d_terms = {t.pool: t for t in system.decode.accounting.pool_terms()}
    assert p_terms["req"].held == {"pd.prefill.inflight": 1} and p_terms["mamba"].held == {"pd.prefill.inflight": 1}
    assert p_terms["metadata"].held == {"pd.prefill.inflight": 1}
    assert d_terms["kv"].held == {"pd.decode.transfer": len(PREFIX)}
    assert d_terms["metadata"].held == {"pd.decode.transfer": 1}
    for inst, terms in ((system.prefill, p_terms), (system.decode, d_terms)):
        inst.accounting.cross_check_ledgers(list(terms.values()))
    # The busy identity without the PD term is a leak, as SGLang's running-batch-only busy check would see.
    from kvledger.contracts.identity import PoolTerms, check_busy_identity

    t = d_terms["kv"]
    with pytest.raises(ContractViolation, match=r"I-COUNT: 16 tokens unaccounted \(leak\)"):
        check_busy_identity(PoolTerms(t.pool, t.unit, t.size, t.free, t.evictable, t.protected, t.pending, {}))


@needs_contracts
@pytest.mark.fires("I-COUNT")
def test_the_pd_busy_check_names_a_request_whose_metadata_bookkeeping_lies() -> None:
    system = build()
    p, _ = system.add_request(0, PREFIX, 3)
    system.prefill.faults.fail_next("row", 1000)  # admission keeps failing: it stays waiting
    _step_until(system, lambda: system.prefill.stats.rollbacks > 0)
    assert p.state is ReqState.WAITING and p.metadata_idx is not None
    p.metadata_idx = None  # the request forgets its slot; the ledger does not
    with pytest.raises(ContractViolation, match=r"I-COUNT: 1 slots unaccounted \(leak\): \[metadata\]"):
        system.step()


# ------------------------------------------------------------------ I-HANDLE-OWNED is generic
@needs_contracts
@pytest.mark.fires("I-HANDLE-OWNED")
def test_handle_owned_fires_on_the_plain_scheduler_for_a_slot_freed_behind_the_handle() -> None:
    sched = build_plain(Setup(tree="none", kv_tokens=96, rows=2, mamba_slots=3, chunk=None))
    req = sched.add_request(0, [1, 2, 3, 4], 6)
    sched.step()
    slot = req.mamba_pool_idx
    assert slot is not None
    sched.mamba_pool._free_unchecked(slot, req.owner, "a path that forgot the handle")
    named = rf"I-HANDLE-OWNED: req#0\[req.running\].mamba_pool_idx names mamba ids \[{int(slot[0])}\]"
    with pytest.raises(ContractViolation, match=named):
        sched.step()
    assert sched.check_handles_owned.__doc__ and "O(" in sched.check_handles_owned.__doc__


@needs_contracts
def test_handle_check_costs_one_lookup_per_live_handle_not_per_pool_slot() -> None:
    sched = build_plain(Setup(tree="none", kv_tokens=4096, rows=64, mamba_slots=512, chunk=None, max_running=2))
    sched.add_request(0, [1, 2, 3], 4)
    sched.add_request(1, [4, 5, 6], 4)
    sched.step()
    assert sched.check_handles_owned() == 4  # two rows and two Mamba slots, out of 576 ids


# ------------------------------------------------------------------ the metadata pool
def test_metadata_pool_alloc_free_and_contents() -> None:
    pool = MetadataBufferPool(3, name="meta")
    a = Owner("req", 1, REQ_WAITING)
    b = Owner("req", 2, REQ_WAITING)
    i, j = pool.alloc(a), pool.alloc(b)
    assert i == 0 and j == 1 and pool.available_size() == 1 and pool.read(i) == (0, 0)
    pool.set_buf(i, 7, 42)
    assert pool.read(i) == (7, 42)
    with pytest.raises(ForeignSlot):
        pool.free(i, b)
    pool.free(i, a)
    with pytest.raises(DoubleFree):
        pool.free(i, a)
    with pytest.raises(InvalidArgument):
        pool.set_buf(i, 7, 1)  # not allocated any more
    with pytest.raises(InvalidArgument):
        pool.set_buf(j, 0, 1)  # room 0 marks an empty slot
    if pool.ledger.enabled:
        assert pool.poisoned(i) and pool.ledger.owner_of(i) is FREE_LIST
    assert pool.alloc(a) == 2 and pool.alloc(a) == 0 and pool.alloc(a) is None
    pool.audit()


# ------------------------------------------------------------------ sizing (I-SIZING)
def test_decode_sizing_follows_sglang() -> None:
    assert default_pre_alloc_size(4) == 8 and default_pre_alloc_size(32) == 64 and default_pre_alloc_size(33) == 0
    assert decode_rows(4, 8) == 12
    assert decode_mamba_slots(4, 12, 1) == 12 and decode_mamba_slots(40, 12, 3) == 40
    assert decode_mamba_slots(0, 12, 3) == 36
    system = build(decode_running=2, decode_mamba=1)
    rows = system.decode.req_to_token_pool
    assert rows.size == 6 and rows.reserved_rows == 1 and system.decode.mamba_pool.size == 6
    with pytest.raises(InvalidArgument):
        rows.write(0, 0, torch.tensor([1]))  # row 0 is padding


def test_bad_pd_input_is_typed_and_changes_nothing() -> None:
    system = build()
    with pytest.raises(InvalidArgument):
        system.add_request(0, [], 3)
    with pytest.raises(InvalidArgument):
        system.add_request(-1, [1], 3)
    with pytest.raises(InvalidArgument):
        system.abort(0, "router")
    assert not system.pairs and system.channel.is_idle()
    with pytest.raises(InvalidArgument):
        pd_spec(tree="none", page_size=4, decode_mamba=1).__class__(
            prefill=pd_spec().prefill, decode=pd_spec(page_size=4, tree="none").decode
        )
    system.add_request(0, [1, 2], 2)
    with pytest.raises(InvalidArgument):
        system.add_request(0, [1, 2], 2)
    assert system.channel.sender_status(1) is not Poll.FAILED
