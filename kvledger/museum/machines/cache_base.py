"""The cache machine's base: the rules every radix cache has, the invariants, and the key draws.

A Hypothesis state machine over the radix caches (the full machine, with the Mamba tree's rules, is
:class:`.cache.CacheMachine`). Its initialize rule draws the cache kind (``KINDS``) and the page size
(``PAGE_SIZES``); a subclass narrows them (``tests/caches/test_stateful.py`` runs one subclass per cache
and page range). Rules play the scheduler's request life cycle (match -> lock -> evict the shortfall ->
alloc -> insert -> unlock), aborts, extra locks, explicit evictions and bad input (which must be rejected
without a trace). Pools are tiny (4 to 10 pages, 2 to 5 state slots), so eviction runs all the time;
about one key in three that allocates is drawn to need exactly the free pages, the free plus evictable
pages or the whole pool, one fewer or one more (:meth:`RadixCacheMachine.at_kv_edge`).
After every step: ``audit()`` of the cache and the pools, the tree equals the abstract model
(:mod:`.cache_model`), and the pools' ids and slots add up; at teardown every lock is released and the
tree evicts to empty. ``hypothesis.target`` steers toward locks held, tombstones and pool pressure.

Every rule draws plain arguments (ints, lists of ints, booleans): a key is a ``KeyDraw`` tuple (fresh page
codes, which earlier key to extend, how many of its pages to keep) and a pick among requests, locks or
nodes is an index taken modulo the list, so ``kvledger hunt`` can write the rule calls Hypothesis printed
as a plain script that replays them. The machine knows no exhibit.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.contracts.owners import FREE_LIST
from kvledger.museum.machines.cache_bad_input import BAD_INPUT_CASES, reject_bad_input
from kvledger.museum.machines.cache_model import CacheModel, Prefix, diff
from kvledger.museum.machines.cache_support import (
    audit_all,
    cut_for_finish,
    extract,
    make_allocator,
    make_mamba_pool,
    new_owner,
    nodes_of,
    path_tokens,
    read_tag,
    write_tag,
)
from kvledger.museum.machines.checks import model_check, violation
from kvledger.museum.machines.edges import Edge, at_edge, edge_draws, fit
from kvledger.museum.machines.notes import event, target
from kvledger.reference.radix import LockRef, MambaRadixCache, RadixCache

CacheKind = str  # "mamba" (V1), "mamba_v2" (extra_buffer), "plain"
KINDS: tuple[CacheKind, ...] = ("mamba", "mamba_v2", "plain")
MAX_KEY_PAGES = 5
V2_CHUNK_PAGES = 2  # Mamba V2: the capture grid in pages

# (fresh page codes, which earlier key to extend or None, how many of its pages to keep): both picks are
# taken modulo what exists when the rule runs
KeyDraw = tuple[list[int], int | None, int]
key_draws = st.tuples(
    st.lists(st.integers(0, 8), max_size=3), st.none() | st.integers(0, 63), st.integers(0, MAX_KEY_PAGES)
)
picks = st.integers(0, 63)

_tags = itertools.count(1)


class Unset:
    """No expectation given: ``check_match`` takes the branching point from the model as it is now."""


UNSET = Unset()


def next_tag() -> int:
    """A fresh tag to write into a state slot (the model tells states apart by their tags)."""
    return next(_tags)


def page_of(code: int, page_size: int) -> list[int]:
    """The tokens of a page from its code 0..8: tokens alternate ``code % 3`` and ``code // 3 % 3``, so pages
    may share their first token and still differ (a paged tree keys its children by the whole page)."""
    return [(code, code // 3)[i % 2] % 3 for i in range(page_size)]


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


class RadixCacheMachine(RuleBasedStateMachine):
    """The rules every cache kind has (the plain radix tree's); :mod:`.cache` adds the Mamba ones.
    ``KINDS`` and ``PAGE_SIZES`` are what the initialize rule draws from."""

    KINDS: tuple[CacheKind, ...] = ("plain",)
    PAGE_SIZES: tuple[int, ...] = (1, 2, 4)

    def __init__(self) -> None:
        super().__init__()
        self.cache: Any = None
        self.mamba = False
        self.chunk: int | None = None  # Mamba V2: the capture grid in tokens
        self.max_locks = 0
        self.max_tombstones = 0
        self.max_pressure = 0.0

    @initialize(
        kind=st.integers(0, len(KINDS) - 1),
        page=st.integers(0, 3),
        pool_pages=st.integers(4, 10),
        mamba_slots=st.integers(2, 5),
    )
    def setup(self, kind: int, page: int, pool_pages: int, mamba_slots: int) -> None:
        self.kind = self.KINDS[kind % len(self.KINDS)]
        self.ps = self.PAGE_SIZES[page % len(self.PAGE_SIZES)]
        alloc = make_allocator(self.ps, pool_pages)
        self.mamba = self.kind != "plain"
        if self.mamba:
            self.pool = make_mamba_pool(mamba_slots)
            self.chunk = V2_CHUNK_PAGES * self.ps if self.kind == "mamba_v2" else None
            self.cache = MambaRadixCache(alloc, self.pool, mamba_cache_chunk_size=self.chunk)
        else:
            self.cache = RadixCache(alloc)
        self.alloc = alloc
        self.model = CacheModel(self.ps)
        self.reqs: list[Req] = []
        self.extra: list[tuple[LockRef, Prefix]] = []
        self.released: list[LockRef] = []
        self.lock_paths: dict[LockRef, Prefix] = {}  # each live lock -> the path it took (I-UNLOCK-PATH)
        self.seen: list[Prefix] = []
        self.dead_nodes: list[Any] = []
        event(f"cache={self.kind} page={self.ps}")

    # ------------------------------------------------------------------ helpers
    def key(self, draw: KeyDraw, *, min_pages: int = 0, tail: int = 0) -> Prefix:
        """The key a ``KeyDraw`` names now: a page-aligned cut of an earlier key (if any), fresh pages after
        it, at most ``MAX_KEY_PAGES`` pages, padded to ``min_pages``; ``tail`` unaligned tokens after it."""
        ps = self.ps
        codes, base_pick, cut_pick = draw
        key: list[int] = [t for code in codes for t in page_of(code, ps)]
        if self.seen and base_pick is not None:
            base = self.seen[base_pick % len(self.seen)]
            cut = cut_pick % (len(base) // ps + 1) * ps
            key = list(base[:cut]) + key
        key = key[: MAX_KEY_PAGES * ps]
        while len(key) < min_pages * ps:
            key += page_of(0, ps)
        return (*key, *[0] * (tail % ps))

    def kv_edges(self) -> list[int]:
        """The KV pool's boundaries now, in pages: free (more needs an eviction), free + evictable (more
        cannot be had), the whole pool."""
        ps, free = self.ps, self.alloc.available_size()
        return [free // ps, (free + self.cache.evictable_size()) // ps, self.alloc.size // ps]

    def at_kv_edge(self, key: Prefix, edge: Edge, held: int) -> Prefix:
        """``key`` cut or extended (with page 0) so that the pages it allocates past its first ``held``
        tokens sit at the KV boundary ``edge`` names (:meth:`kv_edges`), one below or one above; at
        least one page. A key extended past the tree's pages allocates exactly that; one whose filler
        pages happen to be cached allocates less."""
        ps = self.ps
        target = at_edge(self.kv_edges(), edge)
        assert target is not None
        pages = max(held // ps + target, 1)
        event("key at a KV pool edge")
        return tuple(fit(key, pages * ps, page_of(0, ps)))

    def locked(self) -> list[tuple[Prefix, bool]]:
        return [(r.lock_path, r.lock.took_mamba) for r in self.reqs] + [
            (path, lock.took_mamba) for lock, path in self.extra
        ]

    def extract(self) -> tuple[dict, dict]:
        return extract(self.cache, self.pool if self.mamba else None)

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
        model_check(
            freed == lost_pages * self.ps,
            "I-MODEL-EVICT",
            lambda: f"evict reports {freed} tokens freed, but {lost_pages} pages of {self.ps} left the tree",
        )
        model_check(
            freed >= min(n, evictable),
            "I-MODEL-EVICT",
            lambda: f"evict({n}) freed {freed} although {evictable} tokens were evictable",
        )
        if freed:
            event("evicted KV")
        return freed

    def evict_states(self, n: int) -> int:
        evictable = self.cache.mamba_evictable_size()
        freed = self.cache.evict_mamba(n)
        _, lost_states = self.sync_shrink()
        model_check(
            freed == lost_states and freed >= min(n, evictable),
            "I-MODEL-EVICT",
            lambda: f"evict_mamba({n}) reports {freed} states freed; {lost_states} left the tree,"
            f" {evictable} were evictable",
        )
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

    def expected_branching(self, key: Prefix) -> int | None:
        return None if self.chunk is None else self.model.branching(key, self.chunk)

    def check_match(self, key: Prefix, m: Any, branching: int | Unset | None = UNSET) -> int:
        """The match against the model. ``branching``: the branching point expected, when it must be
        taken from the tree as matched (before a copy-on-write eviction the match made; SGLang computes
        it there too), not from the model now."""
        expect = self.model.longest_state(key) if self.mamba else self.model.longest(key)
        got = m.device_indices.tolist()
        model_check(len(got) == expect, "I-MODEL-MATCH", lambda: f"match of {key} returned {len(got)}, not {expect}")
        model_check(
            got == self.model.ids(key, expect),
            "I-MODEL-MATCH",
            lambda: f"match of {key} returned ids {got}, the model's are {self.model.ids(key, expect)}",
        )
        last = tuple(path_tokens(m.last_node))
        model_check(
            last == key[:expect], "I-MODEL-MATCH", lambda: f"match of {key} ended at the node of {last}"
        )
        if self.mamba:
            want = self.expected_branching(key) if isinstance(branching, Unset) else branching
            model_check(
                m.mamba_branching_seqlen == want,
                "I-BRANCHING",
                lambda: f"match of {key}: branching point {m.mamba_branching_seqlen}, the model's is {want}",
            )
            if want is not None:
                event("branching point")
        return expect

    def acquire(self, node: Any) -> LockRef:
        """``inc_lock_ref(node)``, recording the path the lock took (what its release must undo)."""
        lock = self.cache.inc_lock_ref(node)
        self.lock_paths[lock] = path_tokens(node)
        return lock

    def release(self, lock: LockRef) -> None:
        path = self.lock_paths.pop(lock)
        before = [(node, node.lock_ref, node.mamba_lock_ref) for node in nodes_of(self.cache)]
        self.cache.dec_lock_ref(lock)
        self.check_unlocked(path, before, lock)
        self.released.append(lock)
        self.sync_shrink()  # a released tombstone leaf is pruned (Mamba)

    def check_unlocked(self, path: Prefix, before: list[tuple[Any, int, int]], lock: Any = None) -> None:
        """I-UNLOCK-PATH: the release took one lock off exactly the nodes on the path its lock was taken on
        (recorded at acquire; a node split off that path since carries the lock too) and off no other; and
        (Mamba) the state lock off the lock's own node if the lock took one, off no other node."""
        alive = {id(node) for node in nodes_of(self.cache)}  # a released tombstone leaf may be pruned
        wrong = []
        for node, lock_ref, mamba_lock_ref in before:
            if id(node) not in alive:
                continue
            on_path = path_tokens(node)
            want = 1 if path[: len(on_path)] == on_path else 0
            if lock_ref - node.lock_ref != want:
                wrong.append(f"{on_path}: lock_ref {lock_ref} -> {node.lock_ref}")
            want_state = int(lock is not None and lock.took_mamba and node is lock.node)
            if mamba_lock_ref - node.mamba_lock_ref != want_state:
                wrong.append(f"{on_path}: mamba_lock_ref {mamba_lock_ref} -> {node.mamba_lock_ref}")
        if wrong:
            raise violation("I-UNLOCK-PATH", f"the release of a lock taken on {path} changed {wrong}")

    def insert(self, req_owner: Any, key: Prefix, value: torch.Tensor, protected: int, slot: Any) -> Any:
        expect_prefix = self.model.longest(key)
        if expect_prefix > protected:
            event("duplicates freed")
        if self.mamba:
            expect_adopt = bool(key) and key not in self.model.states
            res = self.cache.insert(key, value, req_owner, mamba_slot=slot, protected_len=protected)
            model_check(
                (res.prefix_len, res.mamba_adopted) == (expect_prefix, expect_adopt),
                "I-MODEL-INSERT",
                lambda: f"insert of {key} reported (prefix_len, adopted) = {(res.prefix_len, res.mamba_adopted)},"
                f" the model's are {(expect_prefix, expect_adopt)}",
            )
            self.model.insert(key, value.tolist(), res.prefix_len)
            if res.mamba_adopted:
                self.model.states[key] = read_tag(self.pool, slot)
                event("state adopted")
            else:
                self.pool.free(slot, req_owner)
            return res
        prefix = self.cache.insert(key, value, req_owner, protected_len=protected)
        model_check(
            prefix == expect_prefix,
            "I-MODEL-INSERT",
            lambda: f"insert of {key} reported prefix_len {prefix}, the model's is {expect_prefix}",
        )
        self.model.insert(key, value.tolist(), prefix)
        return prefix

    def tombstones(self) -> list[Any]:
        return [n for n in nodes_of(self.cache) if n.mamba_value is None]

    # ------------------------------------------------------------------ request life cycle
    @rule(key=key_draws, cow=st.booleans(), edge=edge_draws)
    def admit(self, key: KeyDraw, cow: bool, edge: Edge = None) -> None:
        req = self.admit_one(key, cow, edge)
        if req is not None:
            self.reqs.append(req)

    @rule(key=key_draws, cow=st.booleans(), edge=edge_draws)
    def serve(self, key: KeyDraw, cow: bool, edge: Edge = None) -> None:
        """The whole cycle in one step (what the benchmark does): fills the tree quickly."""
        req = self.admit_one(key, cow, edge)
        if req is not None:
            self.finish_one(req, len(req.key))

    @precondition(lambda self: self.reqs)
    @rule(pick=picks, cut=picks)
    def finish(self, pick: int, cut: int) -> None:
        """Finish a request, caching ``key[:cut]`` (at least its locked prefix, page-aligned)."""
        req = self.reqs.pop(pick % len(self.reqs))
        self.finish_one(req, cut_for_finish(req.protected, len(req.key), self.ps, cut))

    def admit_one(self, draw: KeyDraw, cow: bool, edge: Edge = None) -> Req | None:
        key = self.key(draw, min_pages=1)
        if edge is not None:  # the KV it allocates (past its state match) at a pool boundary
            held = self.model.longest_state(key) if self.mamba else self.model.longest(key)
            key = self.at_kv_edge(key, edge, held)
        self.seen.append(key)
        owner = new_owner()
        cow = self.mamba and cow
        expect_tag = self.model.states.get(key[: self.model.longest_state(key)]) if self.mamba else None
        branching: int | Unset | None = UNSET
        if self.mamba:
            slots_free = self.pool.available_size()
            branching = self.expected_branching(key)  # of the tree as matched, before the COW retry
            m = self.cache.match_prefix(key, cow_owner=owner if cow else None)
            self.sync_shrink()  # the COW retry may have evicted a state (and pruned tombstones matched)
        else:
            m = self.cache.match_prefix(key)
        matched = self.check_match(key, m, branching)
        working = None
        if self.mamba:
            if cow and matched:
                if m.cow_slot is None:
                    src_evictable = int(m.last_node.mamba_lock_ref == 0)  # pinned during the retry only
                    model_check(
                        slots_free == 0 and self.cache.mamba_evictable_size() == src_evictable,
                        "I-MODEL-COW",
                        lambda: f"COW gave up with {slots_free} free slots and"
                        f" {self.cache.mamba_evictable_size()} evictable states (the source's {src_evictable})",
                    )
                    event("COW impossible")
                else:
                    got_tag = read_tag(self.pool, m.cow_slot)
                    model_check(
                        got_tag == expect_tag,
                        "I-COPY",
                        lambda: f"COW copied state {got_tag} into {m.cow_slot}, the matched node's is {expect_tag}",
                    )
                    event("COW")
            else:
                model_check(
                    m.cow_slot is None, "I-MODEL-COW", lambda: f"a match without COW returned slot {m.cow_slot}"
                )
        lock = self.acquire(m.last_node)  # before anything that may evict (as add_one_req does)
        model_check(
            lock.took_mamba == (self.mamba and matched > 0),
            "I-MAMBA-LOCK",
            lambda: f"a lock on a match of {matched} tokens took_mamba={lock.took_mamba}",
        )
        if self.mamba:
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
        if self.mamba:
            assert req.working is not None
            write_tag(self.pool, req.working, next_tag())
        self.insert(req.owner, req.key[:cut], value[:cut], req.protected, req.working)
        tail = req.own[cut - req.protected :]
        if tail.numel():
            self.alloc.free(tail, req.owner)  # the part it did not cache
        for slot in req.tracking:
            self.pool.free(slot, req.owner)
        self.release(req.lock)
        if self.alloc.ledger.enabled:
            model_check(
                self.alloc.ledger.held_count(req.owner) == 0,
                "I-OWNER-RELEASE",
                lambda: f"finished {req.owner!r} still holds {self.alloc.ledger.held_count(req.owner)} KV ids",
            )

    @precondition(lambda self: self.reqs)
    @rule(pick=picks)
    def abort(self, pick: int) -> None:
        req = self.reqs.pop(pick % len(self.reqs))
        self.free_request_ids(req)
        self.release(req.lock)

    def free_request_ids(self, req: Req) -> None:
        """Give back what a request holds outside the tree: its own KV, working slot and tracking slots."""
        if req.own.numel():
            self.alloc.free(req.own, req.owner)
        if req.working is not None:
            self.pool.free(req.working, req.owner)
        for slot in req.tracking:
            self.pool.free(slot, req.owner)

    @rule(key=key_draws, edge=edge_draws)
    def insert_unmatched(self, key: KeyDraw, edge: Edge = None) -> None:
        """A request that computed its whole key without matching: every cached page is a duplicate."""
        tokens = self.key(key, min_pages=1)
        if edge is not None:  # its whole key allocated: at a pool boundary
            tokens = self.at_kv_edge(tokens, edge, 0)
        self.seen.append(tokens)
        owner = new_owner()
        slot = None
        if self.mamba:
            slot = self.alloc_slot(owner)
            if slot is None:
                return
            write_tag(self.pool, slot, next_tag())
        kv = self.alloc_kv(len(tokens), owner)
        if kv is None:
            if slot is not None:
                self.pool.free(slot, owner)
            return
        free_before = self.alloc.available_size()
        res = self.insert(owner, tokens, kv, 0, slot)
        prefix = res.prefix_len if self.mamba else res
        model_check(
            self.alloc.available_size() - free_before == prefix,
            "I-MODEL-INSERT",
            lambda: f"insert of {len(tokens)} tokens with {prefix} duplicates freed"
            f" {self.alloc.available_size() - free_before}: each duplicate is freed exactly once",
        )
        if self.alloc.ledger.enabled:
            model_check(
                self.alloc.ledger.held_count(owner) == 0,
                "I-MODEL-INSERT",
                lambda: f"{owner!r} still holds {self.alloc.ledger.held_count(owner)} KV ids after insert:"
                " duplicates not freed, or the rest not adopted",
            )

    @rule(key=key_draws, tail=st.integers(0, 15))
    def match_only(self, key: KeyDraw, tail: int) -> None:
        tokens = self.key(key, tail=tail)
        self.check_match(tokens, self.cache.match_prefix(tokens))

    @rule(key=key_draws)
    def lock_extra(self, key: KeyDraw) -> None:
        """Another holder locks what a key matches (a node with a state, or the root)."""
        tokens = self.key(key)
        m = self.cache.match_prefix(tokens)
        matched = self.check_match(tokens, m)
        self.extra.append((self.acquire(m.last_node), tokens[:matched]))

    @precondition(lambda self: self.extra)
    @rule(pick=picks)
    def unlock_extra(self, pick: int) -> None:
        lock, _ = self.extra.pop(pick % len(self.extra))
        if lock.took_mamba != (lock.node.mamba_value is not None):
            event("unlock: the node's state changed since the lock")
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

    @rule(case=st.integers(0, BAD_INPUT_CASES - 1), pick=picks, variant=st.integers(0, 11), key=key_draws)
    def bad_input(self, case: int, pick: int, variant: int, key: KeyDraw) -> None:
        """Bad input of every kind the caches type: rejected with its error, nothing changed."""
        event(f"bad input {case}")
        reject_bad_input(self, case, pick, variant, self.key(key, min_pages=1))

    # ------------------------------------------------------------------ invariants
    @invariant()
    def refines_the_model(self) -> None:
        if self.cache is None:
            return
        audit_all(self.cache)
        pages, states = self.extract()
        if pages != self.model.pages:
            why = diff(pages, self.model.pages)
            raise violation("I-MODEL-TREE", f"the tree's cached prefixes differ from the model's: {why}")
        if states != self.model.states:
            why = diff(states, self.model.states)
            raise violation("I-MODEL-TREE", f"the tree's states differ from the model's: {why}")
        held = sum(r.own.numel() for r in self.reqs)
        free, cached = self.alloc.available_size(), self.cache.total_size()
        model_check(
            free + cached + held == self.alloc.size,
            "I-COUNT",
            lambda: f"KV: free {free} + cached {cached} + held by requests {held} != size {self.alloc.size}",
        )
        if self.mamba:
            slots = sum((r.working is not None) + len(r.tracking) for r in self.reqs)
            free_slots, cached_slots = self.pool.available_size(), self.cache.mamba_total_size()
            model_check(
                free_slots + cached_slots + slots == self.pool.size,
                "I-COUNT",
                lambda: f"state slots: free {free_slots} + cached {cached_slots} + held by requests {slots}"
                f" != size {self.pool.size}",
            )
            self.max_tombstones = max(self.max_tombstones, len(self.tombstones()))
        for r in self.reqs:
            if self.alloc.ledger.enabled:
                own = r.own  # whole pages in slot order: the ledger's ids are their pages
                pages_of_req = (own if self.alloc.page_size == 1 else self.alloc.pages_of(own)).tolist()
                owners = [self.alloc.ledger.owner_of(p) for p in pages_of_req]
                if not all(o is r.owner and o is not FREE_LIST for o in owners):
                    raise violation("I-HANDLE-OWNED", f"{r.owner!r}'s own KV ids {pages_of_req} are owned by {owners}")
        self.max_locks = max(self.max_locks, len(self.reqs) + len(self.extra))
        self.max_pressure = max(self.max_pressure, 1.0 - self.alloc.available_size() / self.alloc.size)

    def teardown(self) -> None:
        if self.cache is None or sys.exc_info()[1] is not None:
            return  # a check already fired mid-rule: what that rule held is untracked, the drain would only
            # report it as a second, later violation (an idle pool that is not empty)
        target(float(self.max_locks), label="locks held")
        target(float(self.max_tombstones), label="tombstones")
        target(self.max_pressure, label="KV pool pressure")
        for req in self.reqs:
            self.free_request_ids(req)
            self.cache.dec_lock_ref(req.lock)
        for lock, _ in self.extra:
            self.cache.dec_lock_ref(lock)
        audit_all(self.cache)
        model_check(
            self.cache.protected_size() == 0,
            "I-IDLE-IDENTITY",
            lambda: f"every lock released, yet {self.cache.protected_size()} tokens protected",
        )
        self.cache.evict(self.cache.evictable_size())
        model_check(
            self.cache.total_size() == 0 and self.alloc.available_size() == self.alloc.size,
            "I-IDLE-IDENTITY",
            lambda: f"evicted to empty, yet the tree holds {self.cache.total_size()} tokens and the pool has"
            f" {self.alloc.available_size()} of {self.alloc.size} free",
        )
        if self.mamba:
            model_check(
                self.pool.available_size() == self.pool.size,
                "I-IDLE-IDENTITY",
                lambda: f"evicted to empty, yet {self.pool.available_size()} of {self.pool.size} state slots free",
            )
        audit_all(self.cache)
