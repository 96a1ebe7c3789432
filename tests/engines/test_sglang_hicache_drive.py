"""SGLang 0.5.23's HiCache host tier driven under the ledgers (``drive_hicache``): clean on the installed
release (write-through and write-back backups, acks, device and host eviction, load-back on a hit, failed
load-back transfers), and three bugs planted into SGLang's ``HiCacheController`` (scoped monkeypatches of
its class, the install untouched) found by the same machine at the same budget, each under its invariant:
a host slot freed twice, a host slot leaked on eviction, a load-back whose device slots leak when its
transfer fails."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvledger.engines.sglang.drive_hicache import STATS, hunt

BUDGET = 25  # examples of 30 steps each (about 3 CPU s clean); each planted bug fires in the first few
# The firing tests ask which invariant fires, not for the shortest repro: no shrinking (it replays the
# machine thousands of times, 40 CPU s for the load-back bug; `python -m ...drive_hicache` shrinks).


@pytest.fixture
def controller_cls(sgl: Any) -> Any:
    from sglang.srt.managers.cache_controller import HiCacheController

    return HiCacheController


def test_the_hicache_machine_runs_clean_on_sglangs_own_host_tier(controller_cls: Any) -> None:
    STATS.clear()
    assert hunt(BUDGET) == {"found": None, "steps": []}
    for kind in (
        "write",
        "write ack",
        "device eviction",
        "host eviction",
        "load-back",
        "load-back failed",
        "page 1, write_through",
        "page 4, write_back",
    ):
        assert STATS[kind] > 0, (kind, dict(STATS))
    assert STATS["runs clean"] >= BUDGET  # every example ended with everything back on all three pools


def test_a_host_slot_freed_twice_in_evict_host_is_named(monkeypatch: Any, controller_cls: Any) -> None:
    def evict_host(self: Any, host_indices: torch.Tensor, backup_only: bool = True) -> int:
        # the planted bug: the first page goes back twice (SGLang's slot_used check passes an id repeated
        # within one free, and the free list would hand it out twice)
        self.mem_pool_host.free(torch.cat([host_indices, host_indices[: self.mem_pool_host.page_size]]))
        return len(host_indices)

    monkeypatch.setattr(controller_cls, "evict_host", evict_host)
    found = hunt(BUDGET, shrink=False)["found"]
    assert found is not None and "freed twice (I-NODUP-FREE)" in found, found


def test_a_host_slot_leaked_on_host_eviction_is_named(monkeypatch: Any, controller_cls: Any) -> None:
    def evict_host(self: Any, host_indices: torch.Tensor, backup_only: bool = True) -> int:
        # the planted bug: the node's first host page is never given back
        self.mem_pool_host.free(host_indices[self.mem_pool_host.page_size :])
        return len(host_indices)

    monkeypatch.setattr(controller_cls, "evict_host", evict_host)
    found = hunt(BUDGET, shrink=False)["found"]
    assert found is not None and "node_host#" in found and "I-OWNER-RELEASE" in found, found


def test_a_load_back_that_keeps_its_device_slots_when_its_transfer_fails_is_named(
    monkeypatch: Any, controller_cls: Any
) -> None:
    release_load = controller_cls.load

    def load(self: Any, host_indices: torch.Tensor, priority: Any = None, node_id: int = -1) -> Any:
        device_indices = release_load(self, host_indices, priority=priority, node_id=node_id)
        engine = self.l2_transfer_engine
        if device_indices is not None and engine.fail_next:
            # the planted bug: a load whose transfer will fail gives up (drops the queued op) and reports
            # failure, but the device slots it took are never freed
            engine.fail_next = 0
            self.load_queue.pop()
            return None
        return device_indices

    monkeypatch.setattr(controller_cls, "load", load)
    found = hunt(BUDGET, shrink=False)["found"]
    assert found is not None and "load:" in found and "I-OWNER-RELEASE" in found, found


def test_a_transfer_that_pairs_host_and_device_rows_wrongly_is_named_by_the_data_tags(
    monkeypatch: Any, controller_cls: Any
) -> None:
    def move_indices(self: Any, host_indices: torch.Tensor, device_indices: torch.Tensor) -> Any:
        # the planted bug: the direct backend sorts the host indices but keeps the device indices in their
        # old order, so once the host free list is out of order row i lands in another row's slot
        return host_indices.sort().values, device_indices.cpu()

    monkeypatch.setattr(controller_cls, "move_indices", move_indices)
    found = hunt(BUDGET, shrink=False)["found"]
    assert found is not None and "does not hold the node's data (I-DATA-KV)" in found, found
