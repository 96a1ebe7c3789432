"""Hypothesis state machines: both caches, page 1 and page > 1, refine the abstract model in ``_model``.

Rules play the scheduler's request life cycle (match -> lock -> evict the shortfall -> alloc -> insert ->
unlock), aborts, extra locks, explicit evictions, bad input (which must be rejected without a trace)
and, for the Mamba tree, copy-on-write, chunk checkpoints with the lock hand-over, tombstone locks
(B14) and revival; for Mamba V2 (``extra_buffer``), the branching point of every match and the V2
checkpoint: a request captures at its branching point or on the chunk grid, donates that tracking slot
and takes a replacement. Pools are small, so eviction runs all the time. After every step: ``audit()``
of the cache and the pools, the tree equals the model, and the pools' ids/slots add up.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.contracts.errors import (
    ForeignNode,
    InvalidArgument,
    InvalidKey,
    LockNotHeld,
    PrefixMismatch,
)
from kvledger.contracts.mamba_track import extend_track_seqlen
from kvledger.contracts.owners import FREE_LIST
from kvledger.reference.radix import LockRef, MambaRadixCache, RadixCache

from ._helpers import (
    assert_rejected,
    audit_all,
    extract,
    make_allocator,
    make_mamba_pool,
    new_owner,
    nodes_of,
    path_tokens,
    read_tag,
    write_tag,
)
from ._model import CacheModel, Prefix

_tags = itertools.count(1)


@dataclass
class Req:
    """An admitted request: key, locked matched prefix, own KV and (Mamba) working slot."""

    owner: Any
    key: Prefix
    lock: LockRef
    lock_path: Prefix
    prefix_ids: torch.Tensor
    own: torch.Tensor
    protected: int
    working: torch.Tensor | None = None
    branching: int | None = None  # Mamba V2: the branching point its match reported
    tracking: list[torch.Tensor] = field(default_factory=list)  # Mamba V2: its replacement slots


class CacheMachine(RuleBasedStateMachine):
    """Shared rules; subclasses fix the cache kind and the page sizes."""

    PAGE_SIZES: tuple[int, ...] = (1,)
    MAMBA = False
    V2_CHUNK_PAGES: int | None = None  # Mamba V2: the capture grid in pages (None: V1)

    def __init__(self) -> None:
        super().__init__()
        self.cache: Any = None

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        self.ps = data.draw(st.sampled_from(self.PAGE_SIZES), label="page_size")
        pages = data.draw(st.integers(4, 10), label="pool_pages")
        alloc = make_allocator(self.ps, pages)
        if self.MAMBA:
            self.pool = make_mamba_pool(data.draw(st.integers(2, 5), label="mamba_slots"))
            self.chunk = None if self.V2_CHUNK_PAGES is None else self.V2_CHUNK_PAGES * self.ps
            self.cache = MambaRadixCache(alloc, self.pool, mamba_cache_chunk_size=self.chunk)
        else:
            self.cache = RadixCache(alloc)
        self.alloc = alloc
        self.model = CacheModel(self.ps)
        self.reqs: list[Req] = []
        self.extra: list[tuple[LockRef, Prefix]] = []
        self.released: list[LockRef] = []
        self.seen: list[Prefix] = []
        self.dead_nodes: list[Any] = []

    # ------------------------------------------------------------------ helpers
    def draw_key(self, data: Any, *, min_pages: int = 0, unaligned: bool = False) -> Prefix:
        ps = self.ps
        fresh_pages = data.draw(st.integers(0, 3))
        fresh = data.draw(st.lists(st.integers(0, 2), min_size=fresh_pages * ps, max_size=fresh_pages * ps))
        key: list[int] = fresh
        if self.seen and data.draw(st.booleans()):
            base = data.draw(st.sampled_from(self.seen))
            cut = data.draw(st.integers(0, len(base) // ps)) * ps
            key = list(base[:cut]) + fresh
        key = key[: 5 * ps]
        while len(key) < min_pages * ps:
            key += [data.draw(st.integers(0, 2)) for _ in range(ps)]
        if unaligned:
            key += [0] * data.draw(st.integers(0, ps - 1))
        return tuple(key)

    def locked(self) -> list[tuple[Prefix, bool]]:
        return [(r.lock_path, r.lock.took_mamba) for r in self.reqs] + [
            (path, lock.took_mamba) for lock, path in self.extra
        ]

    def extract(self) -> tuple[dict, dict]:
        return extract(self.cache, self.pool if self.MAMBA else None)

    def sync_shrink(self) -> tuple[int, int]:
        """After something that may only remove: check it against the model, adopt the new state."""
        pages, states = self.extract()
        self.model.check_shrink(pages, states, self.locked())
        lost = (len(self.model.pages) - len(pages), len(self.model.states) - len(states))
        self.model.pages, self.model.states = pages, states
        return lost

    def evict_full(self, n: int) -> int:
        evictable = self.cache.evictable_size()
        freed = self.cache.evict(n)
        lost_pages, _ = self.sync_shrink()
        assert freed == lost_pages * self.ps, "evict reports what left the tree"
        assert freed >= min(n, evictable), "evict frees what was asked whenever enough is unlocked"
        if freed:
            event("evicted KV")
        return freed

    def evict_states(self, n: int) -> int:
        evictable = self.cache.mamba_evictable_size()
        freed = self.cache.evict_mamba(n)
        _, lost_states = self.sync_shrink()
        assert freed == lost_states and freed >= min(n, evictable)
        return freed

    def alloc_kv(self, need: int, owner: Any) -> torch.Tensor | None:
        short = need - self.alloc.available_size()
        if short > 0:
            self.evict_full(short)
        return self.alloc.alloc(need, owner)

    def alloc_slot(self, owner: Any) -> torch.Tensor | None:
        slot = self.pool.alloc(1, owner)
        if slot is None:
            self.evict_states(1)
            slot = self.pool.alloc(1, owner)
        return slot

    def check_match(self, key: Prefix, m: Any) -> int:
        expect = self.model.longest_state(key) if self.MAMBA else self.model.longest(key)
        assert m.device_indices.numel() == expect, (
            f"match of {key} returned {m.device_indices.numel()}, not {expect}"
        )
        assert m.device_indices.tolist() == self.model.ids(key, expect)
        assert tuple(path_tokens(m.last_node)) == key[:expect]
        if self.MAMBA:
            want = None if self.chunk is None else self.model.branching(key, self.chunk)
            assert m.mamba_branching_seqlen == want, f"branching point {m.mamba_branching_seqlen} != {want}"
            if want is not None:
                event("branching point")
        return expect

    def release(self, lock: LockRef) -> None:
        self.cache.dec_lock_ref(lock)
        self.released.append(lock)
        self.sync_shrink()  # a released tombstone leaf is pruned (Mamba)

    def insert(self, req_owner: Any, key: Prefix, value: torch.Tensor, protected: int, slot: Any) -> Any:
        expect_prefix = self.model.longest(key)
        if expect_prefix > protected:
            event("duplicates freed")
        if self.MAMBA:
            expect_adopt = bool(key) and key not in self.model.states
            res = self.cache.insert(key, value, req_owner, mamba_slot=slot, protected_len=protected)
            assert (res.prefix_len, res.mamba_adopted) == (expect_prefix, expect_adopt)
            self.model.insert(key, value.tolist(), res.prefix_len)
            if res.mamba_adopted:
                self.model.states[key] = read_tag(self.pool, slot)
                event("state adopted")
            else:
                self.pool.free(slot, req_owner)
            return res
        prefix = self.cache.insert(key, value, req_owner, protected_len=protected)
        assert prefix == expect_prefix
        self.model.insert(key, value.tolist(), prefix)
        return prefix

    # ------------------------------------------------------------------ request life cycle
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        req = self.admit_one(data)
        if req is not None:
            self.reqs.append(req)

    @rule(data=st.data())
    def serve(self, data: st.DataObject) -> None:
        """The whole cycle in one step (what the benchmark does): fills the tree quickly."""
        req = self.admit_one(data)
        if req is not None:
            self.finish_one(req, len(req.key))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        req = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        self.finish_one(
            req, data.draw(st.integers(req.protected // self.ps, len(req.key) // self.ps)) * self.ps
        )

    def admit_one(self, data: st.DataObject) -> Req | None:
        key = self.draw_key(data, min_pages=1)
        self.seen.append(key)
        owner = new_owner()
        cow = self.MAMBA and data.draw(st.booleans(), label="cow")
        expect_tag = self.model.states.get(key[: self.model.longest_state(key)]) if self.MAMBA else None
        if self.MAMBA:
            slots_free = self.pool.available_size()
            m = self.cache.match_prefix(key, cow_owner=owner if cow else None)
            self.sync_shrink()  # the COW retry may have evicted a state
        else:
            m = self.cache.match_prefix(key)
        matched = self.check_match(key, m)
        working = None
        if self.MAMBA:
            if cow and matched:
                if m.cow_slot is None:
                    src_evictable = int(m.last_node.mamba_lock_ref == 0)  # pinned during the retry only
                    assert slots_free == 0 and self.cache.mamba_evictable_size() == src_evictable, (
                        "COW gave up although another state could have been evicted"
                    )
                    event("COW impossible")
                else:
                    assert read_tag(self.pool, m.cow_slot) == expect_tag, "COW copied the wrong state"
                    event("COW")
            else:
                assert m.cow_slot is None
        lock = self.cache.inc_lock_ref(m.last_node)  # before anything that may evict (as add_one_req does)
        assert lock.took_mamba == (self.MAMBA and matched > 0)
        if self.MAMBA:
            working = m.cow_slot if m.cow_slot is not None else self.alloc_slot(owner)
            if working is None:
                event("no state slot")
                self.release(lock)
                return None
        own = self.alloc_kv(len(key) - matched, owner)
        if own is None:
            event("no KV")
            self.release(lock)
            if working is not None:
                self.pool.free(working, owner)
            return None
        return Req(
            owner, key, lock, key[:matched], m.device_indices, own, matched, working, m.mamba_branching_seqlen
        )

    def finish_one(self, req: Req, cut: int) -> None:
        """cache_finished_req: insert ``key[:cut]``, free the uncached tail, release the lock."""
        value = torch.cat((req.prefix_ids, req.own))
        if self.MAMBA:
            assert req.working is not None
            write_tag(self.pool, req.working, next(_tags))
        self.insert(req.owner, req.key[:cut], value[:cut], req.protected, req.working)
        tail = req.own[cut - req.protected :]
        if tail.numel():
            self.alloc.free(tail, req.owner)  # the part it did not cache
        for slot in req.tracking:
            self.pool.free(slot, req.owner)
        self.release(req.lock)
        if self.alloc.ledger.enabled:
            assert self.alloc.ledger.held_count(req.owner) == 0, "a finished request still holds KV"

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        req = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        if req.own.numel():
            self.alloc.free(req.own, req.owner)
        if req.working is not None:
            self.pool.free(req.working, req.owner)
        for slot in req.tracking:
            self.pool.free(slot, req.owner)
        self.release(req.lock)

    @rule(data=st.data())
    def insert_unmatched(self, data: st.DataObject) -> None:
        """A request that computed its whole key without matching: every cached page is a duplicate."""
        key = self.draw_key(data, min_pages=1)
        self.seen.append(key)
        owner = new_owner()
        slot = None
        if self.MAMBA:
            slot = self.alloc_slot(owner)
            if slot is None:
                return
            write_tag(self.pool, slot, next(_tags))
        kv = self.alloc_kv(len(key), owner)
        if kv is None:
            if slot is not None:
                self.pool.free(slot, owner)
            return
        free_before = self.alloc.available_size()
        res = self.insert(owner, key, kv, 0, slot)
        prefix = res.prefix_len if self.MAMBA else res
        assert self.alloc.available_size() - free_before == prefix, "each duplicate freed exactly once"
        if self.alloc.ledger.enabled:
            assert self.alloc.ledger.held_count(owner) == 0, "duplicates not freed, or the rest not adopted"

    @rule(data=st.data())
    def match_only(self, data: st.DataObject) -> None:
        key = self.draw_key(data, unaligned=True)
        self.check_match(key, self.cache.match_prefix(key))

    @rule(data=st.data())
    def lock_extra(self, data: st.DataObject) -> None:
        key = self.draw_key(data)
        m = self.cache.match_prefix(key)
        matched = self.check_match(key, m)
        self.extra.append((self.cache.inc_lock_ref(m.last_node), key[:matched]))

    @precondition(lambda self: self.extra)
    @rule(data=st.data())
    def unlock_extra(self, data: st.DataObject) -> None:
        lock, _ = self.extra.pop(data.draw(st.integers(0, len(self.extra) - 1)))
        self.release(lock)

    @rule(n=st.integers(0, 24))
    def evict(self, n: int) -> None:
        before = self.nodes()
        self.evict_full(n)
        gone = [node for node_id, node in before.items() if node_id not in self.nodes()]
        self.dead_nodes = [*self.dead_nodes, *gone][-4:]  # bad handles for later calls

    def nodes(self) -> dict[int, Any]:
        out, stack = {}, [self.cache.root]
        while stack:
            node = stack.pop()
            out[id(node)] = node
            stack.extend(node.children.values())
        return out

    # ------------------------------------------------------------------ bad input
    @rule(data=st.data())
    def bad_input(self, data: st.DataObject) -> None:
        cache, owner = self.cache, new_owner()
        ids = torch.arange(self.ps, 2 * self.ps, dtype=torch.int64)
        kw = {"mamba_slot": None} if self.MAMBA else {}
        choice = data.draw(st.integers(0, 9))
        event(f"bad input {choice}")
        if choice == 0:
            key = self.draw_key(data, min_pages=1)
            assert_rejected(cache, InvalidKey, lambda: cache.insert(key, ids[:0], owner, **kw))
        elif choice == 1 and self.ps > 1:
            assert_rejected(
                cache,
                InvalidKey,
                lambda: cache.insert((7,) * (self.ps + 1), ids[:1].repeat(self.ps + 1), owner, **kw),
            )
        elif choice == 2:
            assert_rejected(cache, InvalidArgument, lambda: cache.evict(-data.draw(st.integers(1, 5))))
        elif choice == 3 and self.released:
            lock = data.draw(st.sampled_from(self.released))
            assert_rejected(cache, LockNotHeld, lambda: cache.dec_lock_ref(lock))
        elif choice == 4 and any(r.protected for r in self.reqs):
            req = data.draw(st.sampled_from([r for r in self.reqs if r.protected]))
            wrong = torch.cat((req.own, req.prefix_ids))[: len(req.key)]
            if not torch.equal(wrong[: req.protected], req.prefix_ids):
                assert_rejected(
                    cache,
                    PrefixMismatch,
                    lambda: cache.insert(req.key, wrong, req.owner, protected_len=req.protected, **kw),
                )
        elif choice == 5:  # wrong types, whatever the tree holds
            key = self.draw_key(data, min_pages=1)
            bad = data.draw(st.sampled_from(["nested", "float", "negative", "owner"]))
            if bad == "owner":
                call = lambda: cache.insert(key, ids[: len(key)], "req-1", **kw)
                assert_rejected(cache, InvalidArgument, call)
            else:
                token = {"nested": [0], "float": 0.5, "negative": -1}[bad]
                assert_rejected(cache, InvalidKey, lambda: cache.match_prefix([*key[:-1], token]))
        elif choice == 6:
            bad_count = data.draw(st.sampled_from([1.5, None, True]))
            assert_rejected(cache, InvalidArgument, lambda: cache.evict(bad_count))
        elif choice == 7:
            handle = data.draw(st.sampled_from([None, "node", 3]))
            assert_rejected(cache, InvalidArgument, lambda: cache.inc_lock_ref(handle))
            assert_rejected(cache, InvalidArgument, lambda: cache.dec_lock_ref(handle))
        elif choice == 8:  # a handle of another cache of the same kind
            other = self.foreign()
            node = other.match_prefix([]).last_node
            assert_rejected(cache, ForeignNode, lambda: cache.inc_lock_ref(node))
            lock = other.inc_lock_ref(node)
            assert_rejected(cache, ForeignNode, lambda: cache.dec_lock_ref(lock))
            other.dec_lock_ref(lock)
        elif choice == 9 and self.dead_nodes:  # a node eviction or a split took out of the tree
            node = data.draw(st.sampled_from(self.dead_nodes))
            assert_rejected(cache, ForeignNode, lambda: cache.inc_lock_ref(node))

    def foreign(self) -> Any:
        alloc = make_allocator(self.ps, 4)
        return MambaRadixCache(alloc, make_mamba_pool(2)) if self.MAMBA else RadixCache(alloc)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def refines_the_model(self) -> None:
        if self.cache is None:
            return
        audit_all(self.cache)
        pages, states = self.extract()
        assert pages == self.model.pages, "the tree's cached prefixes differ from the model's"
        assert states == self.model.states, "the tree's states differ from the model's"
        held = sum(r.own.numel() for r in self.reqs)
        assert self.alloc.available_size() + self.cache.total_size() + held == self.alloc.size, (
            "KV ids leaked"
        )
        if self.MAMBA:
            slots = sum((r.working is not None) + len(r.tracking) for r in self.reqs)
            assert self.pool.available_size() + self.cache.mamba_total_size() + slots == self.pool.size
        for r in self.reqs:
            if self.alloc.ledger.enabled:
                pages_of_req = self.cache._kv.ledger_ids(r.own).tolist()
                assert all(self.alloc.ledger.owner_of(p) is r.owner for p in pages_of_req)
                assert all(self.alloc.ledger.owner_of(p) is not FREE_LIST for p in pages_of_req)

    def teardown(self) -> None:
        if self.cache is None:
            return
        for req in self.reqs:
            if req.own.numel():
                self.alloc.free(req.own, req.owner)
            if req.working is not None:
                self.pool.free(req.working, req.owner)
            for slot in req.tracking:
                self.pool.free(slot, req.owner)
            self.cache.dec_lock_ref(req.lock)
        for lock, _ in self.extra:
            self.cache.dec_lock_ref(lock)
        audit_all(self.cache)
        assert self.cache.protected_size() == 0, "every lock released: nothing protected"
        self.cache.evict(self.cache.evictable_size())
        assert self.cache.total_size() == 0 and self.alloc.available_size() == self.alloc.size
        if self.MAMBA:
            assert self.pool.available_size() == self.pool.size
        audit_all(self.cache)


class MambaMachine(CacheMachine):
    MAMBA = True

    @rule(n=st.integers(0, 4))
    def evict_mamba(self, n: int) -> None:
        self.evict_states(n)

    @precondition(lambda self: any(len(r.key) - r.protected >= 2 * self.ps for r in self.reqs))
    @rule(data=st.data())
    def checkpoint(self, data: st.DataObject) -> None:
        """cache_unfinished_req after a chunk: fork the state, insert the chunk, re-match, hand over."""
        ps = self.ps
        req = data.draw(st.sampled_from([r for r in self.reqs if len(r.key) - r.protected >= 2 * ps]))
        cut = data.draw(st.integers(req.protected // ps + 1, len(req.key) // ps - 1)) * ps
        assert req.working is not None
        fork = self.pool.fork_from(req.working, req.owner)
        if fork is None:
            self.evict_states(1)
            fork = self.pool.fork_from(req.working, req.owner)
            if fork is None:
                event("checkpoint: no slot")
                return
        write_tag(self.pool, fork, next(_tags))
        value = torch.cat((req.prefix_ids, req.own))
        self.insert(req.owner, req.key[:cut], value[:cut], req.protected, fork)
        m = self.cache.match_prefix(req.key[:cut])
        assert self.check_match(req.key[:cut], m) == cut, "the chunk just cached must match with its state"
        assert torch.equal(m.device_indices[: req.protected], req.prefix_ids), "the locked prefix moved"
        new_lock = self.cache.inc_lock_ref(m.last_node)
        self.release(req.lock)
        req.lock, req.lock_path = new_lock, req.key[:cut]
        req.own = req.own[cut - req.protected :]
        req.prefix_ids, req.protected = m.device_indices, cut
        event("checkpoint")

    def tombstones(self) -> list[Any]:
        return [n for n in nodes_of(self.cache) if n.mamba_value is None]

    @precondition(lambda self: self.cache is not None and self.tombstones())
    @rule(data=st.data())
    def lock_tombstone(self, data: st.DataObject) -> None:
        """B14's first step: a holder locks a node while it is a tombstone (no state lock taken)."""
        node = data.draw(st.sampled_from(self.tombstones()))
        lock = self.cache.inc_lock_ref(node)
        assert not lock.took_mamba
        self.extra.append((lock, path_tokens(node)))
        event("tombstone locked")

    @precondition(lambda self: self.cache is not None and self.tombstones())
    @rule(data=st.data())
    def revive(self, data: st.DataObject) -> None:
        """A request finishing exactly at a tombstone: the node takes its state (revival)."""
        key = path_tokens(data.draw(st.sampled_from(self.tombstones())))
        owner = new_owner()
        slot = self.alloc_slot(owner)
        if slot is None:
            return
        kv = self.alloc_kv(len(key), owner)
        if kv is None:
            self.pool.free(slot, owner)
            return
        write_tag(self.pool, slot, next(_tags))
        if self.insert(owner, key, kv, 0, slot).mamba_adopted and key in self.model.pages:
            event("revived")

    @rule(data=st.data())
    def cow_into_held_slot(self, data: st.DataObject) -> None:
        """A waiting request that kept its COW slot from an earlier round re-matches into the same slot."""
        owner = new_owner()
        slot = self.alloc_slot(owner)
        if slot is None:
            return
        key = self.draw_key(data)
        expect_len = self.model.longest_state(key)
        expect_tag = self.model.states.get(key[:expect_len])
        m = self.cache.match_prefix(key, cow_owner=owner, cow_slot=slot)
        self.check_match(key, m)
        if expect_len:
            assert m.cow_slot is not None and read_tag(self.pool, slot) == expect_tag
        else:
            assert m.cow_slot is None
        self.pool.free(slot, owner)


class MambaV2Machine(MambaMachine):
    """Mamba V2 (``extra_buffer``): branching points on every match, and the V2 checkpoint."""

    V2_CHUNK_PAGES = 2

    def v2_cut(self, req: Req) -> int | None:
        assert self.chunk is not None
        return extend_track_seqlen(req.protected, len(req.key) - req.protected, self.chunk, req.branching)

    @precondition(lambda self: any(self.v2_cut(r) for r in self.reqs))
    @rule(data=st.data())
    def track_and_donate(self, data: st.DataObject) -> None:
        """cache_unfinished_req under V2: the state captured at the branching point (or the chunk grid)
        goes to the tree by donation, a replacement slot takes its place, the lock moves to the new node."""
        req = data.draw(st.sampled_from([r for r in self.reqs if self.v2_cut(r)]))
        cut = self.v2_cut(req)
        assert cut is not None and cut % self.ps == 0
        if cut == req.branching:
            event("captured at the branching point")
        tracked = self.alloc_slot(req.owner)  # the tracking slot the forward captured into
        if tracked is None:
            event("V2 checkpoint: no tracking slot")
            return
        replacement = self.alloc_slot(req.owner)
        if replacement is None:
            self.pool.free(tracked, req.owner)
            event("V2 checkpoint: no replacement, donation skipped")
            return
        write_tag(self.pool, tracked, next(_tags))
        value = torch.cat((req.prefix_ids, req.own))
        res = self.cache.insert(
            req.key[:cut],
            value[:cut],
            req.owner,
            mamba_slot=tracked,
            protected_len=req.protected,
            state_op="donate",
        )
        expect_adopt = req.key[:cut] not in self.model.states
        assert res.mamba_adopted == expect_adopt and path_tokens(res.node) == req.key[:cut]
        self.model.insert(req.key[:cut], value[:cut].tolist(), res.prefix_len)
        if res.mamba_adopted:
            self.model.states[req.key[:cut]] = read_tag(self.pool, tracked)
            if self.pool.ledger.enabled:
                assert self.pool.ledger.owner_of(int(tracked)) is res.node.mamba_owner
            event("V2 donation adopted")
        else:
            self.pool.free(tracked, req.owner)
        req.tracking.append(replacement)
        m = self.cache.match_prefix(req.key[:cut])
        assert self.check_match(req.key[:cut], m) == cut
        new_lock = self.cache.inc_lock_ref(m.last_node)
        self.release(req.lock)
        req.lock, req.lock_path = new_lock, req.key[:cut]
        req.own = req.own[cut - req.protected :]
        req.prefix_ids, req.protected = m.device_indices, cut


class PlainPage1(CacheMachine):
    PAGE_SIZES = (1,)


class PlainPaged(CacheMachine):
    PAGE_SIZES = (2, 4)


class MambaPage1(MambaMachine):
    PAGE_SIZES = (1,)


class MambaPaged(MambaMachine):
    PAGE_SIZES = (2,)


class MambaV2Page1(MambaV2Machine):
    PAGE_SIZES = (1,)


class MambaV2Paged(MambaV2Machine):
    PAGE_SIZES = (4, 16)


TestPlainPage1 = PlainPage1.TestCase
TestPlainPaged = PlainPaged.TestCase
TestMambaPage1 = MambaPage1.TestCase
TestMambaPaged = MambaPaged.TestCase
TestMambaV2Page1 = MambaV2Page1.TestCase
TestMambaV2Paged = MambaV2Paged.TestCase
