"""The attach mirrors vLLM's block moves; each shared-ownership invariant fires on a corrupted pool.

The corruptions are made in the test on vLLM's live objects (a scoped change to one block or one
request's list), never in vLLM's source: each is the state a known class of bug leaves behind.
Each test runs with the full read-back after every call and with the incremental one.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvledger.contracts.shared_owners import SharedOwnershipViolation
from kvledger.engines.vllm.attach import BadAuditCadence, UnknownRequest, WatchedHybrid
from kvledger.engines.vllm.build import HybridLayout, build_hybrid
from kvledger.engines.vllm.drive import HybridDriver

BLOCK = 4


def admit(w: WatchedHybrid, rid: str, prompt: list[int]) -> Any:
    w.new_step()  # each admission in its own scheduler step, so earlier steps' blocks are hittable
    req = w.built.new_request(rid, prompt)
    hit, n_hit = w.get_computed_blocks(req)
    assert w.allocate_slots(req, len(prompt) - n_hit, n_hit, hit) is not None
    req.num_computed_tokens = len(prompt)
    return req


def decode(w: WatchedHybrid, req: Any, token: int) -> None:
    req.append_output_token_ids(token)
    assert w.allocate_slots(req, 1) is not None
    req.num_computed_tokens += 1


# every test runs with a full read-back after each call, and incremental (only the touched blocks;
# the one full audit is at build), so each invariant is shown to fire in both modes
@pytest.fixture(params=[1, 1000], ids=["full", "incremental"])
def watched(request: pytest.FixtureRequest) -> WatchedHybrid:
    return WatchedHybrid(build_hybrid(HybridLayout(num_blocks=24, block_size=BLOCK)), audit_every=request.param)


def test_a_shared_prefix_is_a_hit_held_by_both(watched: WatchedHybrid) -> None:
    a = admit(watched, "a", list(range(16)))
    decode(watched, a, 99)
    b = admit(watched, "b", [*range(16), 99, 5, 6, 7, 8])
    shared = set(watched.manager.get_block_ids("a")[0]) & set(watched.manager.get_block_ids("b")[0])
    assert shared, "b's prompt extends a's: its full-attention prefix must be a hit"
    for block in shared:
        assert watched.ledger.holders[block] == frozenset({"a", "b"})
        assert watched.built.block_pool.blocks[block].ref_cnt == 2
    watched.free(a)
    watched.free(b)
    assert watched.num_free_blocks() == 23
    assert any(m.kind == "release" for m in watched.moves)


def test_eviction_is_recorded(watched: WatchedHybrid) -> None:
    small = WatchedHybrid(build_hybrid(HybridLayout(num_blocks=8, block_size=BLOCK)))
    a = admit(small, "a", list(range(12)))
    small.free(a)
    admit(small, "b", list(range(50, 70)))
    assert any(m.kind == "evict" for m in small.moves)
    assert watched.calls == 1


@pytest.mark.fires("I-SHARED-REFCOUNT")
def test_refcount_differs_from_holders(watched: WatchedHybrid) -> None:
    a = admit(watched, "a", list(range(8)))
    block = watched.built.block_pool.blocks[watched.manager.get_block_ids("a")[0][0]]
    block.ref_cnt += 1  # a leaked reference: a touch with no page-table entry behind it
    with pytest.raises(SharedOwnershipViolation, match=r"I-SHARED-REFCOUNT .*block \d+: ref_cnt=2"):
        decode(watched, a, 1)


@pytest.mark.fires("I-SHARED-FREE-QUEUE")
def test_held_block_in_free_queue(watched: WatchedHybrid) -> None:
    a = admit(watched, "a", list(range(8)))
    pool = watched.built.block_pool
    block = pool.blocks[watched.manager.get_block_ids("a")[0][0]]
    pool.free_block_queue.append(block)  # a double free: the block goes back while "a" holds it
    with pytest.raises(SharedOwnershipViolation, match=r"I-SHARED-FREE-QUEUE.*held by \['a'\]"):
        decode(watched, a, 1)


@pytest.mark.fires("I-SHARED-FREE-QUEUE")
def test_leaked_block_is_named(watched: WatchedHybrid) -> None:
    a = admit(watched, "a", list(range(8)))
    pool = watched.built.block_pool
    full = watched.built.single_type_managers[0]
    lost = full.req_to_blocks["a"].pop()  # the page table forgets a block: its reference is gone
    lost.ref_cnt -= 1
    with pytest.raises(
        SharedOwnershipViolation, match=r"leaked\). holders now: \[\]. last moves: .*release a"
    ):
        watched.free(a)
    assert pool is watched.built.block_pool


@pytest.mark.fires("I-SHARED-HANDOUT")
def test_block_handed_to_a_second_request_without_a_hit(watched: WatchedHybrid) -> None:
    admit(watched, "a", list(range(8)))
    b = admit(watched, "b", list(range(40, 48)))
    full = watched.built.single_type_managers[0]
    stolen = full.req_to_blocks["a"][0]
    full.req_to_blocks["b"].append(stolen)  # the same physical block in two page tables
    stolen.ref_cnt += 1
    with pytest.raises(SharedOwnershipViolation, match=r"I-SHARED-HANDOUT.*not a prefix-cache hit"):
        decode(watched, b, 1)


@pytest.mark.fires("I-SHARED-RELEASED")
def test_freed_request_keeps_a_holder(watched: WatchedHybrid, monkeypatch: pytest.MonkeyPatch) -> None:
    a = admit(watched, "a", list(range(8)))
    full = watched.built.single_type_managers[0]
    kept = list(full.req_to_blocks["a"])
    real_free = watched.manager.free

    def free_forgetting_one_list(request: Any) -> None:
        real_free(request)
        full.req_to_blocks["a"] = kept[:1]  # the list survives the free (a stale page table)
        kept[0].ref_cnt += 1

    monkeypatch.setattr(watched.manager, "free", free_forgetting_one_list)
    with pytest.raises(SharedOwnershipViolation, match=r"I-SHARED-RELEASED.*a was freed"):
        watched.free(a)


@pytest.mark.fires("I-SHARED-NULL")
def test_null_block_handed_out_or_freed(watched: WatchedHybrid) -> None:
    a = admit(watched, "a", list(range(8)))
    pool = watched.built.block_pool
    pool.free_block_queue.append(pool.null_block)  # the null block freed like a real block
    with pytest.raises(SharedOwnershipViolation, match=r"I-SHARED-NULL.*null block is in the free queue"):
        decode(watched, a, 1)
    other = WatchedHybrid(build_hybrid(HybridLayout(num_blocks=24, block_size=BLOCK)), watched.audit_every)
    b = admit(other, "b", list(range(8)))
    other.built.single_type_managers[0].req_to_blocks["b"].append(other.built.block_pool.null_block)
    with pytest.raises(SharedOwnershipViolation, match=r"I-SHARED-NULL.*held as a real block by"):
        decode(other, b, 1)


def test_unknown_request_is_a_typed_error(watched: WatchedHybrid) -> None:
    stranger = watched.built.new_request("x", [1, 2, 3])
    before = watched.num_free_blocks()
    with pytest.raises(UnknownRequest):
        watched.free(stranger)
    assert watched.num_free_blocks() == before


def test_audit_cadence_is_checked_and_counted(watched: WatchedHybrid) -> None:
    with pytest.raises(BadAuditCadence):
        WatchedHybrid(watched.built, audit_every=0)
    a = admit(watched, "a", list(range(8)))
    decode(watched, a, 1)
    watched.free(a)
    full = watched.audit_every == 1
    assert watched.audits == (watched.calls if full else 1)
    assert watched.ledger.held == {}


def test_incremental_read_back_sees_the_same_moves_as_the_full_one() -> None:
    """One random scheduler-shaped run (chunked, asynchronous, with evictions in a small pool) under
    both modes: the incremental read-back derives exactly the moves and holders the full one does."""
    runs = []
    for audit_every in (1, 1000):
        layout = HybridLayout(num_blocks=20, block_size=BLOCK, max_model_len=48)
        driver = HybridDriver(WatchedHybrid(build_hybrid(layout), audit_every), chunk=8, async_depth=1)
        rng = random.Random(5)
        for _ in range(150):
            roll = rng.random()
            if roll < 0.3 or not driver.running:
                base = 100 * rng.randrange(3)  # three shared prefixes: hits, shared blocks
                driver.admit(driver.arrive(list(range(base, base + rng.randint(4, 24)))))
            elif roll < 0.8:
                driver.decode(rng.choice(sorted(driver.running)), rng.randrange(9))
            elif roll < 0.9:
                driver.preempt(rng.choice(sorted(driver.running)))
            else:
                driver.finish(rng.choice(sorted(driver.running)))
        runs.append(driver.watched)
    full, incremental = runs
    assert incremental.audits == 1 and full.audits == full.calls
    assert incremental.moves == full.moves  # same blocks, holders, kinds, in the same order
    assert any(m.kind == "evict" for m in full.moves) and any(m.kind == "release" for m in full.moves)
    assert incremental.ledger.holders == full.ledger.holders
    assert incremental.ledger.held == full.ledger.held
