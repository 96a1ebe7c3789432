"""The machines' edge draws land requests exactly at, one below and one above each capacity boundary."""

from __future__ import annotations

import pytest

from kvledger.museum.machines.cache import CacheMachine
from kvledger.museum.machines.edges import OFFSETS, at_edge, fit, multiples
from kvledger.museum.machines.scheduler import SchedulerMachine, land, max_context_len_edges, request_edges
from kvledger.reference.engine import EngineSpec

V2 = EngineSpec(
    page_size=4, tree="mamba_radix", hybrid=True, kv_tokens=48, rows=3, mamba_slots=5, max_running=2, chunk=16,
    max_prefill=32, overlap=True, max_context_len=96, mamba_strategy="extra_buffer", mamba_track_interval=8,
    mamba_chunk_size=4,
)  # fmt: skip


def test_an_edge_draw_names_a_boundary_plus_its_offset() -> None:
    assert at_edge([10, 20, 30], None) is None
    assert at_edge([], (0, 1)) is None
    assert [at_edge([10, 20, 30], (pick, off)) for pick, off in [(0, -1), (4, 0), (5, 1)]] == [9, 20, 31]
    assert fit([1, 2, 3], 2, [9]) == [1, 2] and fit([1, 2], 5, [7, 8]) == [1, 2, 7, 8, 7]
    assert multiples(16, 40) == [16, 32] and multiples(4, 96) == [4, 8, 12]


@pytest.mark.parametrize("offset", OFFSETS)
def test_every_request_boundary_is_reached_exactly(offset: int) -> None:
    edges = request_edges(V2)
    assert ("total", 96) in edges and ("total", 48 - 4) in edges and ("prompt", 16) in edges
    assert ("prompt", 8) in edges  # V2's track interval
    for pick, (kind, at) in enumerate(edges):
        prompt, max_new = land(V2, [5, 6, 7], 6, (pick, offset), [5, 6, 7])
        length = len(prompt) + (max_new if kind == "total" else 0)
        assert length == at + offset, (kind, at, offset, len(prompt), max_new)
    assert land(V2, [5, 6, 7], 6, None, [9]) == ([5, 6, 7], 6)


def test_the_pool_edges_hold_the_longest_request_with_its_spare_page_or_miss_by_one_page() -> None:
    assert max_context_len_edges(96, 16) == [96, 112, 128]
    assert max_context_len_edges(96, 1) == [96, 97, 98]


def test_a_request_at_the_kv_pool_edge_is_admitted_and_one_token_more_is_rejected() -> None:
    machine = SchedulerMachine()
    machine.init(setup=V2, faults=[])
    kinds = request_edges(V2)
    fits = kinds.index(("total", V2.kv_tokens - V2.page_size))
    machine.arrive(family=0, suffix=[3], max_new=4, edge=(fits, 0))
    machine.arrive(family=0, suffix=[3], max_new=4, edge=(fits, 1))
    first, second = (machine.sched.requests[rid] for rid in (0, 1))
    assert len(first.origin_input_ids) + first.max_new_tokens == V2.kv_tokens - V2.page_size
    assert not first.state.is_done and second.state.is_done  # the second: rejected at arrival
    machine.arrive_at_capacity(family=1, suffix=[4], max_new=2, capacity=0, offset=1)  # rows + 1
    assert len(machine.sched.requests) == 2 + V2.rows + 1
    machine.identities_hold()
    machine.teardown()


@pytest.mark.parametrize(("pick", "offset", "evicted"), [(0, 0, False), (0, 1, True), (2, 0, True)])
def test_a_cache_key_at_the_free_pages_edge_evicts_only_past_it(pick: int, offset: int, evicted: bool) -> None:
    machine = CacheMachine()
    machine.setup(kind=2, page=1, pool_pages=8, mamba_slots=2)  # plain tree, page 2
    machine.insert_unmatched(key=([1, 2, 3], None, 0))  # 3 pages cached, evictable: 5 free
    free_pages = machine.alloc.available_size() // machine.ps
    assert machine.kv_edges() == [free_pages, 8, 8]
    machine.admit(key=([4], None, 0), cow=False, edge=(pick, offset))
    (req,) = machine.reqs
    pages = {0: free_pages, 2: 8}[pick] + offset  # the free pages now, or the whole pool; then the offset
    assert len(req.own) == pages * machine.ps  # nothing of the key was cached: it allocates every page
    assert (machine.cache.total_size() < 6) == evicted
    machine.refines_the_model()
    machine.teardown()
