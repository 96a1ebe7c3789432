"""Adding a pool kind (spec/pool-kinds.md), shown with a throwaway one that lives in this file only.

A host tier of slots, one per admitted request: its description (a :class:`PoolKind`), its pool class (on
:class:`~kvledger.reference.pools.base.IdPool`), its request field (a :class:`Req` subclass whose
``handles()`` names it), its holdings manager (what admission takes, a rollback gives back and a release
frees: :mod:`kvledger.reference.scheduler.holdings`) and a scheduler that has it (``pool_kinds``, the pool
under the attribute the description names, the manager added to its coordinator). Nothing else is
edited: admission, its rollback and every release path move the new kind's ids through the manager;
I-HANDLE-OWNED checks its handle; the identity after every step, the ledger cross-check, the census
behind a failure report, the per-step snapshot and the event log pick it up from its description.

5. Its tree component (spec/architecture.md, "Adding a tree component"): a cached prefix keeps a host copy
per node (written through at insert), registered by the kind's name, built into a plain ``RadixCache``
(``components=``); the tree matches, inserts, locks, evicts and audits it through the component's hooks,
the description's ``cached`` names it, and the identity and ledger cross-check count the tree's host
copies from the component's counters. Still this one file.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from kvledger.audit.record import Recorder
from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation, LockNotHeld
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, Owner
from kvledger.contracts.pool_kinds import POOL_KINDS, PoolKind
from kvledger.reference.pools import ReqToTokenPool, TokenToKVPoolAllocator
from kvledger.reference.pools.base import IdPool
from kvledger.reference.radix import RadixCache, TreeNode
from kvledger.reference.radix.component import TreeComponent, component_class, register_component
from kvledger.reference.scheduler import Scheduler, SchedulerConfig
from kvledger.reference.scheduler.holdings import AllocationFailed, Undo
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
    cached="host",  # its tree component's kind: the tree's host copies are in the identity
)


# ---------------------------------------------------------------------- 3. its request field and manager
@dataclass(eq=False, repr=False)
class HostReq(Req):
    host_slot: int | None = None  # the kind's handle

    def handles(self) -> list[tuple[str, str, list[int]]]:
        out = super().handles()
        if self.host_slot is not None:
            out.append(("host_slot", HOST.name, [self.host_slot]))
        return out


class HostHoldings:
    """The host slot of every admitted request: taken at admission, given back by a rollback or a release.
    Short of slots, it asks the tree for the component of its kind to give back unlocked host copies."""

    name = "host"
    fields: tuple[str, ...] = ("host_slot",)

    def __init__(self, pool: HostSlotPool, copies: HostCopies | None = None) -> None:
        self.pool = pool
        self.copies = copies

    def save(self, req: Req) -> object:
        return _host(req).host_slot

    def restore(self, req: Req, saved: object) -> None:
        _host(req).host_slot = saved  # type: ignore[assignment]

    def take(self, req: Req, undo: Undo) -> None:
        r = _host(req)
        if r.host_slot is not None:
            return
        slot = self.pool.alloc(r.owner)
        if slot is None and self.copies is not None and self.copies.evict_component(1):
            slot = self.pool.alloc(r.owner)
        if slot is None:
            raise AllocationFailed("host")
        undo.append((lambda ids, owner: self.pool.free(ids[0], owner), [slot], r))
        r.host_slot = slot

    def release(self, req: Req, tree_len: int) -> None:
        r = _host(req)
        if r.host_slot is not None:
            self.pool.free(r.host_slot, r.owner)
            r.host_slot = None


def _host(req: Req) -> HostReq:
    assert isinstance(req, HostReq)
    return req


# ---------------------------------------------------------------------- 5. its tree component
@register_component
class HostCopies(TreeComponent):
    """A cached node's host copy: one host slot per node, taken at insert (write-through) when the pool has
    one, locked with the node (a lock on the node pins its copy), given back when the node goes or when
    the kind is short (``evict_component``: unlocked copies, oldest first; the node keeps its KV)."""

    kind = "host"

    def __init__(self, pool: HostSlotPool) -> None:
        super().__init__()
        self.pool = pool
        self.owners: dict[int, Owner] = {}
        self.slots: dict[int, int] = {}  # node id -> its copy's slot, oldest first
        self.locks: dict[int, int] = {}

    def on_new_node(self, node: TreeNode) -> None:
        self.owners[node.id] = Owner("node.host", node.id, CACHE_EVICTABLE)

    def held(self, node: TreeNode) -> tuple[list[int], Owner] | None:
        return ([self.slots[node.id]], self.owners[node.id]) if node.id in self.slots else None

    def commit_insert(self, node: TreeNode, arg: object, owner: Owner, op: str) -> bool:
        if node.id in self.slots or not node.key:
            return False
        slot = self.pool.alloc(self.owners[node.id])
        if slot is None:
            return False  # no host slot free: the node is cached on the device only
        self.slots[node.id] = slot
        self.counts.evictable += 1
        return True

    def lock(self, node: TreeNode) -> bool:
        if node.id not in self.slots:
            return False
        if not self.locks.get(node.id):
            self.counts.evictable -= 1
            self.counts.protected += 1
            self.owners[node.id].set_account(CACHE_PROTECTED, "lock")
        self.locks[node.id] = self.locks.get(node.id, 0) + 1
        return True

    def check_unlock(self, lock: Any, op: str) -> None:
        if self.locks.get(lock.node.id, 0) < 1:
            raise LockNotHeld(f"{op}: {lock.node!r} holds no host-copy lock")

    def unlock(self, node: TreeNode) -> None:
        self.locks[node.id] -= 1
        if not self.locks[node.id]:
            del self.locks[node.id]
            self.counts.evictable += 1
            self.counts.protected -= 1
            self.owners[node.id].set_account(CACHE_EVICTABLE, "unlock")

    def free_node(self, node: TreeNode, op: str) -> None:
        if node.id in self.slots:
            self._free(node.id)
        del self.owners[node.id]

    def _free(self, node_id: int) -> None:
        self.pool.free(self.slots.pop(node_id), self.owners[node_id])
        self.counts.evictable -= 1

    def evict_component(self, amount: int) -> int:
        victims = [n for n in self.slots if not self.locks.get(n)][:amount]
        for node_id in victims:
            self._free(node_id)
        return len(victims)

    def audit(self, root: TreeNode, nodes: Any, own_locks: Any) -> None:
        locked = [n for n in nodes if n.id in self.slots and self.locks.get(n.id)]
        if (len(self.slots) - len(locked), len(locked)) != (self.counts.evictable, self.counts.protected):
            raise ContractViolation(f"I-PROTECTED-DEF: host copies {self.slots} vs counts {self.counts}")
        for n in nodes:
            if self.locks.get(n.id, 0) != own_locks.get(id(n), 0):
                raise ContractViolation(f"I-LOCK-TREE: {n!r} host locks {self.locks.get(n.id, 0)}")


# ---------------------------------------------------------------------- 4. a scheduler that has it
class HostTierScheduler(Scheduler):
    pool_kinds = (*POOL_KINDS, HOST)

    def __init__(self, config: SchedulerConfig, *, host_pool: HostSlotPool, **parts: Any) -> None:
        self.host_pool = host_pool  # before the accounting is built: it reads the pools of its kinds
        super().__init__(config, **parts)
        tree = parts.get("tree")
        copies = tree.component(HOST.name) if tree is not None and HOST.name in tree.cached_kinds() else None
        assert copies is None or isinstance(copies, HostCopies)
        self.memory.holdings_of.add(HostHoldings(host_pool, copies))

    def new_request(self, rid: int, prompt: list[int], max_new_tokens: int) -> Req:
        return HostReq(rid, prompt, max_new_tokens, arrival_step=self.step_no)


def _engine(host_slots: int = 4, checks: CheckLevel | None = None, *, cached: bool = False) -> HostTierScheduler:
    host_pool = HostSlotPool(host_slots, checks=checks)
    kv = TokenToKVPoolAllocator(256, checks=checks)
    return HostTierScheduler(
        SchedulerConfig(max_context_len=64),
        host_pool=host_pool,
        kv_allocator=kv,
        req_to_token_pool=ReqToTokenPool(4, 64, checks=checks),
        tree=RadixCache(kv, components=[HostCopies(host_pool)]) if cached else None,
    )


def _copies(s: HostTierScheduler) -> HostCopies:
    assert s.tree is not None
    copies = s.tree.component(HOST.name)
    assert isinstance(copies, HostCopies)
    return copies


def _running(s: HostTierScheduler, rid: int = 1) -> HostReq:
    s.add_request(rid, list(range(1, 9)), 6)
    for _ in range(3):
        s.step()
        for r in s.running:
            if r.rid == rid:
                return _host(r)
    raise AssertionError(s.describe_queues())


# ---------------------------------------------------------------------- the tests
def test_admission_takes_the_new_kind_and_release_gives_it_back() -> None:
    s = _engine()
    req = _running(s)
    assert req.host_slot is not None  # taken by the real admission (the coordinator's reservation)
    assert s.host_pool.available_size() == 3
    assert ("host_slot", "host", [req.host_slot]) in req.handles()
    s.run_until_idle(100)  # finish: the release path gives it back and clears the handle
    assert req.host_slot is None
    assert s.host_pool.available_size() == 4


def test_a_failed_admission_rolls_the_new_kind_back_with_the_rest() -> None:
    s = _engine(host_slots=1)
    first = _running(s, 1)  # holds the only host slot
    rows_free = s.req_to_token_pool.available_size()
    s.add_request(2, list(range(11, 19)), 6)
    s.step()  # the second takes a row and KV, then finds no host slot: the reservation rolls back
    (second,) = [_host(r) for r in s.waiting]
    assert s.stats.rollbacks >= 1
    assert (second.host_slot, second.req_pool_idx, second.kv_allocated_len) == (None, None, 0)
    assert s.req_to_token_pool.available_size() == rows_free  # its row went back
    if s.kv_allocator.ledger.enabled:
        assert s.kv_allocator.ledger.held_count(second.owner) == 0  # and its KV
    slot = first.host_slot
    s.run_until_idle(100)  # the first finishes and gives the slot back; the second is admitted with it
    assert second.finish_step is not None and second.host_slot is None
    assert s.stats.rollbacks >= 1 and s.host_pool.available_size() == 1 and slot is not None


@needs_contracts
def test_a_handle_of_the_new_kind_naming_a_freed_slot_is_caught() -> None:
    s = _engine()
    req = _running(s)
    slot = req.host_slot
    assert slot is not None
    s.host_pool.free(slot, req.owner)  # behind the manager's back: the handle now names a free slot
    with pytest.raises(ContractViolation, match="I-HANDLE-OWNED") as caught:
        s.step()
    assert "host_slot" in str(caught.value)


def test_the_identity_covers_the_new_kind() -> None:
    s = _engine()
    assert [k.name for k in s.accounting.kinds] == ["kv", "req", "host"]
    req = _running(s)
    s.step()  # the busy identity and (contracts on) the ledger cross-check, over every kind
    (host,) = [t for t in s.accounting.terms() if t.pool == "host"]
    assert (host.size, host.free, host.unit) == (4, 3, "slots")
    assert host.held == {req.owner.account.name: 1}
    assert s.accounting.snapshot()["host"]["free"] == 3
    assert s.accounting.units()["host"] == "slots"
    s.run_until_idle(100)  # quiescent: the idle identity, the full recount and every pool's audit
    assert s.accounting.pool_terms()[-1].free == 4


@needs_contracts
def test_a_leak_of_the_new_kind_is_reported_with_its_slot() -> None:
    s = _engine()
    req = _running(s)
    slot = req.host_slot
    req.host_slot = None  # forgotten, never freed: a leak
    with pytest.raises(ContractViolation, match=r"\[host\]") as caught:
        s.step()
    assert f"[{slot}]" in str(caught.value)  # the census names the leaked slot


def test_the_event_log_records_the_new_kind() -> None:
    s = _engine(checks=max(switch.LEVEL, CheckLevel.LEDGER))  # the recorder reads real ledgers
    out = io.StringIO()
    with Recorder(s, out, source="tests"):
        req = _running(s)
        slot = req.host_slot
        s.step()
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {"ev": "pool", "pool": "host", "first": 1, "size": 4, "unit": 1, "unit_name": "slots"} in events
    assert any(e["ev"] == "alloc" and e["pool"] == "host" and e["ids"] == [slot] for e in events)
    assert any(e["ev"] == "step" and "host" in e["terms"] for e in events)


# ---------------------------------------------------------------------- the tree component's tests
def test_the_new_kind_has_a_registered_tree_component() -> None:
    s = _engine(cached=True)
    assert component_class("host") is HostCopies
    assert s.tree is not None and s.tree.cached_kinds() == ("kv", "host")
    assert [k.name for k in s.accounting.kinds] == ["kv", "req", "host"]


def test_cached_prefixes_keep_host_copies_matched_locked_counted_and_evicted() -> None:
    s = _engine(host_slots=6, cached=True)
    copies, tree = _copies(s), s.tree
    assert tree is not None
    s.add_request(1, list(range(1, 9)), 4)
    s.run_until_idle(100)  # inserted at prefill and at finish: the new nodes took host copies
    cached = len(copies.slots)
    assert cached >= 1 and tree.counts.of("host").evictable == cached
    assert s.host_pool.available_size() == 6 - cached
    (host,) = [t for t in s.accounting.terms() if t.pool == "host"]
    assert (host.free, host.evictable, host.protected) == (6 - cached, cached, 0)  # the identity counts them
    s.add_request(2, list(range(1, 9)), 4)  # the same prompt: matched and locked, copies pinned with it
    s.step()
    req = s.requests[2]
    assert req.lock is not None and "host" in req.lock.took
    assert tree.counts.of("host").protected >= 1
    (host,) = [t for t in s.accounting.terms() if t.pool == "host"]
    assert host.protected == tree.counts.of("host").protected
    s.run_until_idle(100)  # the lock goes with the request; the quiescent audit recounts the component
    assert tree.counts.of("host").protected == 0
    tree.evict(tree.total_size())  # the nodes go, and their host copies with them
    assert not copies.slots and s.host_pool.available_size() == 6
    tree.audit()


def test_a_short_host_pool_takes_back_the_trees_unlocked_copies() -> None:
    s = _engine(host_slots=2, cached=True)
    s.add_request(1, list(range(1, 9)), 4)
    s.run_until_idle(100)
    copies = _copies(s)
    first = set(copies.slots)
    assert first and s.host_pool.available_size() == 2 - len(first)
    for rid in (2, 3):  # new prompts: each admission needs a host slot the tree holds
        s.add_request(rid, list(range(10 * rid, 10 * rid + 8)), 4)
    s.run_until_idle(200)
    assert all(s.requests[rid].finish_step is not None for rid in (2, 3))
    assert not first & set(copies.slots)  # the first prompt's copies went back to the pool, its KV stayed
    assert s.tree is not None and s.tree.match_prefix(list(range(1, 9))).device_indices.numel() >= 8


@needs_contracts
def test_a_component_lock_that_forgets_its_counters_is_caught() -> None:
    s = _engine(host_slots=6, cached=True)
    s.add_request(1, list(range(1, 9)), 4)
    s.run_until_idle(100)
    copies = _copies(s)

    def lock_without_counts(node: TreeNode) -> bool:  # pins the copy, moves no counter or account
        copies.locks[node.id] = copies.locks.get(node.id, 0) + 1
        return node.id in copies.slots

    copies.lock = lock_without_counts  # type: ignore[method-assign]
    s.add_request(2, list(range(1, 9)), 4)
    with pytest.raises(ContractViolation, match=r"I-CAP: negative terms \{'protected': -1\}: \[host\]") as caught:
        s.run_until_idle(100)
    # The ids are right, the counters wrong: the census claims the tree's copies through the component.
    assert "[host] no id in dispute" in str(caught.value)
