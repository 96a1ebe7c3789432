"""The two seed bugs, rebuilt deterministically.

(a) SGLang PR #16067's log (the legacy checker's false positive): a waiting request holds a
    copy-on-write Mamba slot; the late-2025 idle check counts it as leaked (``leaked_mamba_pages={191}``) and kills the
    server. Here the same state at the log's sizes: the legacy checker raises, the ledger's identity
    holds and names the holder, and aborting the request frees the slot. Fails if the waiting-holder
    term is dropped from the identity or if abort forgets the COW slot (B5, PR #12693).
(b) #16067's reverted fix (the museum's exhibit ``#16067``, which replaces ``Scheduler._cleanup_stopper``):
    free the COW slot whenever ``add_one_req`` did not return CONTINUE, even when the request was
    appended. Caught as a slot freed while an admitted request owns it. Fails if the
    scheduler's cleanup stops asking "was it appended?" (PR #21404).
"""

from __future__ import annotations

import pytest

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.identity import (
    LegacyCounters,
    LegacyLeakDetected,
    check_busy_identity,
    legacy_check_memory,
)
from kvledger.contracts.owners import REQ_WAITING, Owner
from kvledger.museum import exhibit
from kvledger.reference.pools import MambaPool, ReqToTokenPool, TokenToKVPoolAllocator
from kvledger.reference.radix import MambaRadixCache
from kvledger.reference.scheduler import Req, ReqState, Scheduler, SchedulerConfig
from tests.scheduler.harness import Setup, build, expected_output

# The log line of PR #16067 (rank TP3):
LOG_KV_SIZE = 396_701
LOG_KV_AVAILABLE = 6_016
LOG_KV_EVICTABLE = 390_685
LOG_MAMBA_SIZE = 454
LOG_MAMBA_AVAILABLE = 315
LOG_MAMBA_EVICTABLE = 138


def _legacy_counters(sched: Scheduler) -> LegacyCounters:
    tree = sched.tree
    mamba = sched.mamba_pool
    free_slots = frozenset(mamba.free_slots())
    return LegacyCounters(
        full_available_size=sched.kv_allocator.available_size(),
        full_evictable_size=tree.full_evictable_size(),
        full_size=sched.kv_allocator.size,
        full_protected_size=tree.full_protected_size(),
        mamba_available_size=mamba.available_size(),
        mamba_evictable_size=tree.mamba_evictable_size(),
        mamba_size=mamba.size,
        mamba_protected_size=tree.mamba_protected_size(),
        free_mamba_slots=free_slots,
        tree_mamba_slots=frozenset(
            int(owner_slot)
            for owner_slot in range(1, mamba.size + 1)
            if (o := mamba.ledger.owner_of(owner_slot)) is not None and o.kind.startswith("node")
        ),
    )


def _seed_16067_state() -> tuple[Scheduler, Req]:
    """The log's state: 138 cached sequences with states filling 390,685 KV tokens, one waiting request
    that matched one of them with copy-on-write and was not admitted (late-2025 policy: it keeps the slot)."""
    kv = TokenToKVPoolAllocator(LOG_KV_SIZE)
    mamba = MambaPool(LOG_MAMBA_SIZE, num_layers=1, conv_state_shape=(2,), temporal_state_shape=(2,))
    rows = ReqToTokenPool(8, 8192)
    tree = MambaRadixCache(kv, mamba)
    n_seq = LOG_MAMBA_EVICTABLE
    base_len, extra = divmod(LOG_KV_EVICTABLE, n_seq)
    filler = Owner("req", "warmup", REQ_WAITING)
    for i in range(n_seq):
        length = base_len + (1 if i < extra else 0)
        key = [i * 1_000_000 + t for t in range(length)]
        value = kv.alloc(length, filler)
        slot = mamba.alloc(1, filler)
        res = tree.insert(key, value, filler, mamba_slot=slot)
        assert res.mamba_adopted
    config = SchedulerConfig(cow_release_policy="keep", max_context_len=8192)
    sched = Scheduler(config, kv_allocator=kv, req_to_token_pool=rows, mamba_pool=mamba, tree=tree)
    first_len = base_len + (1 if extra else 0)
    prompt = [*range(first_len), 7, 7, 7]  # sequence 0 (cached with its state) plus a new question
    req = sched.add_request(1, prompt, 8)
    sched.memory.init_next_round_input(req, cow=True)  # matched, COW slot taken, then NO_TOKEN: kept
    return sched, req


def test_seed_16067_legacy_false_positive_ledger_names_holder() -> None:
    sched, req = _seed_16067_state()
    assert sched.kv_allocator.available_size() == LOG_KV_AVAILABLE
    assert sched.tree.full_evictable_size() == LOG_KV_EVICTABLE
    assert sched.mamba_pool.available_size() == LOG_MAMBA_AVAILABLE
    assert sched.tree.mamba_evictable_size() == LOG_MAMBA_EVICTABLE
    assert req.mamba_pool_idx is not None
    slot = int(req.mamba_pool_idx[0])

    # The legacy checker reports the waiting request's slot as leaked.
    with pytest.raises(LegacyLeakDetected, match=rf"leaked_mamba_pages=\{{{slot}\}}"):
        legacy_check_memory(_legacy_counters(sched))

    # The ledger's identity holds, with the waiting request as a term, and names the holder.
    terms = {t.pool: t for t in sched.accounting.pool_terms()}
    check_busy_identity(terms["mamba"])
    assert terms["mamba"].held == {REQ_WAITING.name: 1}
    sched.accounting.cross_check_ledgers(list(terms.values()))
    assert sched.mamba_pool.ledger.owner_of(slot) is req.owner
    assert not sched.is_quiescent()  # so the idle identity must not be asserted here

    # Aborting the waiting request frees exactly that slot; then the legacy check passes too.
    assert sched.abort(req.rid)
    assert req.state is ReqState.ABORTED and req.mamba_pool_idx is None
    assert sched.mamba_pool.ledger.owner_of(slot).kind == "free_list"
    assert sched.mamba_pool.available_size() == LOG_MAMBA_AVAILABLE + 1
    legacy_check_memory(_legacy_counters(sched))
    sched.accounting.check_quiescent()


def _appended_then_other_setup(policy: str) -> tuple[Scheduler, list[int]]:
    """A cached prefix with a state, then a request whose extend exhausts ``max_prefill_tokens``:
    ``add_one_req`` appends it and ``budget_state`` then answers OTHER (case (e) of the result table)."""
    sched = build(
        Setup(
            tree="mamba_radix",
            kv_tokens=256,
            rows=4,
            mamba_slots=6,
            max_running=4,
            chunk=None,
            max_prefill=16,
            cow_release_policy=policy,
            max_context_len=128,
            mamba_strategy="no_buffer",  # Mamba V1 (EngineSpec's default is V2)
        )
    )
    warm = list(range(100, 110))
    sched.add_request(0, warm, 2)
    sched.run_until_idle(100)
    prompt = [*warm, *range(200, 216)]  # 10 cached tokens with a state, 16 to extend: rem_input 16 -> 0
    return sched, prompt


@pytest.mark.fires("I-COW-STOPPER")
def test_seed_16067_reverted_variant_is_caught() -> None:
    sched, prompt = _appended_then_other_setup("if_not_appended")
    req = sched.add_request(1, prompt, 3)
    caught = pytest.raises(ContractViolation, match=r"COW slot \d+ released while req#1\[req.running\]")
    with exhibit("#16067").installed(), caught:
        sched.step()
    assert req.lock is not None  # it had been admitted (appended, locked) when its slot was freed


def test_seed_21404_policy_keeps_the_slot_of_an_appended_request() -> None:
    sched, prompt = _appended_then_other_setup("if_not_appended")
    req = sched.add_request(1, prompt, 3)
    sched.step()
    assert req.state is ReqState.RUNNING and req.prefix_hit_tokens == 10  # hit, admitted, slot kept
    sched.run_until_idle(100)
    assert req.output_ids == expected_output(prompt, 3)
    sched.accounting.check_quiescent()


def test_not_appended_stopper_gives_its_cow_slot_back() -> None:
    """#21404's other half: a request matched with COW but not appended frees the slot at once."""
    sched = build(
        Setup(
            tree="mamba_radix",
            kv_tokens=256,
            rows=1,
            mamba_slots=6,
            max_running=4,
            chunk=None,
            max_prefill=64,
            max_context_len=128,
            mamba_strategy="no_buffer",  # Mamba V1 (EngineSpec's default is V2)
        )
    )
    warm = list(range(100, 110))
    sched.add_request(0, warm, 2)
    sched.run_until_idle(100)
    sched.add_request(1, [*warm, 1, 2], 30)  # admitted: takes the only row
    sched.step()
    blocked = sched.add_request(2, [*warm, 3, 4], 5)  # matched with COW, then no row: NO_TOKEN
    sched.step()
    assert blocked.state is ReqState.WAITING and blocked.mamba_pool_idx is None
    assert sched.mamba_pool.ledger.held_count(blocked.owner) == 0
    sched.run_until_idle(500)
    sched.accounting.check_quiescent()


def test_abort_of_a_waiting_request_with_cow_slot_releases_it() -> None:
    """B5 (PR #12693) and B7 (#20182): the abort path must free the lone COW slot."""
    sched, req = _seed_16067_state()
    before = sched.mamba_pool.available_size()
    sched.abort(req.rid)
    assert sched.mamba_pool.available_size() == before + 1
    assert sched.mamba_pool.ledger.held_count(req.owner) == 0
