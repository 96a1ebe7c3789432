"""Adding a pool kind (spec/pool-kinds.md), shown with a throwaway one that lives in this file only.

A host tier of slots, one per running request: its description (a :class:`PoolKind`), its pool class (on
:class:`~kvledger.reference.pools.base.IdPool`) and a scheduler that has it (``pool_kinds`` plus the pool
under the attribute the description names). Nothing else is edited: the identity after every step, the
ledger cross-check, the census behind a failure report, the per-step snapshot and the event log pick the
new kind up from its description.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import torch

from kvledger.audit.record import Recorder
from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import Owner
from kvledger.contracts.pool_kinds import POOL_KINDS, PoolKind
from kvledger.reference.pools import ReqToTokenPool, TokenToKVPoolAllocator
from kvledger.reference.pools.base import IdPool
from kvledger.reference.scheduler import Scheduler, SchedulerConfig
from kvledger.reference.scheduler.request import Req

needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="the ledger cross-check needs contracts on")


# ---------------------------------------------------------------------- 1. the pool class
class HostSlotPool(IdPool):
    """Host-memory slots ``1..size`` (slot 0 padding), one owner each."""

    def __init__(self, size: int, *, name: str = "host", checks: CheckLevel | None = None) -> None:
        self.size = size
        self._init_pool(name, "cpu", 1, size, reuse="fifo", checks=checks)

    def alloc(self, owner: Owner) -> int | None:
        ids = self.free_list.alloc(1, owner)
        return None if ids is None else int(ids[0])

    def free(self, slot: int, owner: Owner) -> None:
        self.free_list.free_checked(torch.tensor([slot], dtype=torch.int64), owner, "free", "slot")


# ---------------------------------------------------------------------- 2. its description
def _host_ids(s: Any, r: Any) -> set[int]:
    return set() if r.host_slot is None else {r.host_slot}


HOST = PoolKind(
    name="host",
    unit="slots",
    attr="host_pool",
    held_units=lambda s, r: int(r.host_slot is not None),
    held_ids=_host_ids,
    handles=("host_slot",),
    fields=("host_slot",),
)


# ---------------------------------------------------------------------- 3. a scheduler that has it
class HostTierScheduler(Scheduler):
    pool_kinds = (*POOL_KINDS, HOST)

    def __init__(self, config: SchedulerConfig, *, host_pool: HostSlotPool, **parts: Any) -> None:
        self.host_pool = host_pool  # before the accounting is built: it reads the pools of its kinds
        super().__init__(config, **parts)

    def new_request(self, rid: int, prompt: list[int], max_new_tokens: int) -> Req:
        req = super().new_request(rid, prompt, max_new_tokens)
        req.host_slot = None  # type: ignore[attr-defined]  # the kind's handle field
        return req


def _engine(host_slots: int = 4, checks: CheckLevel | None = None) -> HostTierScheduler:
    return HostTierScheduler(
        SchedulerConfig(max_context_len=64),
        host_pool=HostSlotPool(host_slots, checks=checks),
        kv_allocator=TokenToKVPoolAllocator(256, checks=checks),
        req_to_token_pool=ReqToTokenPool(4, 64, checks=checks),
    )


def _running(s: HostTierScheduler) -> Req:
    s.add_request(1, list(range(1, 9)), 6)
    for _ in range(3):
        s.step()
        if s.running:
            return s.running[0]
    raise AssertionError(s.describe_queues())


def test_the_identity_covers_the_new_kind() -> None:
    s = _engine()
    assert [k.name for k in s.accounting.kinds] == ["kv", "req", "host"]
    req = _running(s)
    slot = s.host_pool.alloc(req.owner)
    assert slot is not None
    req.host_slot = slot  # type: ignore[attr-defined]
    s.step()  # the busy identity and (contracts on) the ledger cross-check, over every kind
    (host,) = [t for t in s.accounting.terms() if t.pool == "host"]
    assert (host.size, host.free, host.unit) == (4, 3, "slots")
    assert host.held == {req.owner.account.name: 1}
    assert s.accounting.snapshot()["host"]["free"] == 3
    assert s.accounting.units()["host"] == "slots"
    s.host_pool.free(slot, req.owner)
    req.host_slot = None  # type: ignore[attr-defined]
    s.run_until_idle(100)  # quiescent: the idle identity, the full recount and every pool's audit
    assert s.accounting.pool_terms()[-1].free == 4


@needs_contracts
def test_a_leak_of_the_new_kind_is_reported_with_its_slot() -> None:
    s = _engine()
    req = _running(s)
    slot = s.host_pool.alloc(req.owner)
    req.host_slot = slot  # type: ignore[attr-defined]
    s.step()
    req.host_slot = None  # type: ignore[attr-defined]  # forgotten, never freed: a leak
    with pytest.raises(ContractViolation, match=r"\[host\]") as caught:
        s.step()
    assert f"[{slot}]" in str(caught.value)  # the census names the leaked slot


def test_the_event_log_records_the_new_kind() -> None:
    s = _engine(checks=max(switch.LEVEL, CheckLevel.LEDGER))  # the recorder reads real ledgers
    out = io.StringIO()
    with Recorder(s, out, source="tests"):
        req = _running(s)
        slot = s.host_pool.alloc(req.owner)
        req.host_slot = slot  # type: ignore[attr-defined]
        s.step()
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {"ev": "pool", "pool": "host", "first": 1, "size": 4, "unit": 1, "unit_name": "slots"} in events
    assert any(e["ev"] == "alloc" and e["pool"] == "host" and e["ids"] == [slot] for e in events)
    assert any(e["ev"] == "step" and "host" in e["terms"] for e in events)
