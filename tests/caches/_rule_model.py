"""A small, obviously-correct model of the radix caches' rules, for the differential test.

Plain Python, no tensors, no linked lists: a node is named by the token prefix it ends at, so the tree
is just the set of node ends (a node's parent is the longest other end that is a prefix of it). Recency
is a stamp from one clock per refresh; "least recently used" is the minimum stamp, found by scanning.
Eviction is "repeatedly take the oldest candidate", as the rules say, with no cursor to get wrong.

The rules, each stated once (spec/mamba-cache-vs-sglang.md names them):

* match: the longest cached page-aligned prefix; a match ending inside a node splits it (the new upper
  node copies the full lock count; stamps: upper, then the lower node). The Mamba tree returns the
  deepest node on the path with a state. The KV stamps of root..returned node are refreshed, parents
  first; in the Mamba tree only the returned node's state stamp is refreshed (R2). A split moves no
  state stamp (R1).
* insert: the walk refreshes the KV stamp of every node it passes (then splits where the key ends inside
  a node); it refreshes no state stamp (R3). New tokens become a new leaf; a state is adopted by a new
  leaf or a tombstone at the key's end, with one fresh stamp for its KV and its state. The caller's ids
  for tokens already cached (beyond ``protected_len``) go back to the pool.
* lock: the full lock counts every node from the locked one to the root; the state lock only the locked
  node, and only if it has a state then (the handle records it).
* unlock: undoes exactly that; a Mamba-tree tombstone leaf left with no lock is deleted, and so are
  tombstone parents that become unlocked leaves.
* evict KV: the oldest (KV stamp) unlocked leaf goes, with its state; in the Mamba tree tombstone parents
  that become unlocked leaves go with it (and count).
* evict states: the oldest (state stamp) state without a state lock goes; a node with children or a
  full lock keeps its KV (becomes a tombstone), an unlocked leaf goes whole (plus tombstone parents).
* copy-on-write: the returned node's state is copied into the caller's slot, or a new one; with the
  pool empty, one state is evicted with the source locked, and the copy is given up if that frees none.
* Mamba V2 (``chunk`` set): a match whose cached prefix goes past the returned node reports the branching
  point, that prefix's length rounded down to ``chunk``, if it is at least one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Prefix = tuple[int, ...]


@dataclass
class ModelNode:
    kv_time: int
    state: int | None = None  # the tag the test wrote into the state slot; None: a tombstone
    state_time: int = 0
    locks: int = 0  # full locks: holders locked here or below
    state_locks: int = 0


@dataclass(frozen=True)
class ModelLock:
    end: Prefix
    took_state: bool


@dataclass(frozen=True)
class ModelMatch:
    ids: list[int]
    end: Prefix  # where the returned node ends (() for the root)
    cow: int | None = None  # the tag copied into the caller's slot, None when no copy was made
    branching: int | None = None  # Mamba V2: the branching point


@dataclass
class RuleModel:
    page: int
    mamba: bool
    kv_free: int  # tokens
    slots_free: int
    ids: dict[Prefix, list[int]] = field(default_factory=dict)  # cached page prefix -> its page's ids
    nodes: dict[Prefix, ModelNode] = field(default_factory=dict)  # node end -> node (root excluded)
    clock: int = 0
    chunk: int | None = None  # Mamba V2: the branching grid (None: V1)

    # ------------------------------------------------------------------ structure
    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def parent(self, end: Prefix) -> Prefix:
        ends = [e for e in self.nodes if len(e) < len(end) and end[: len(e)] == e]
        return max(ends, key=len, default=())

    def children(self, end: Prefix) -> list[Prefix]:
        return [e for e in self.nodes if e != end and self.parent(e) == end]

    def is_leaf(self, end: Prefix) -> bool:
        return not self.children(end)

    def size(self, end: Prefix) -> int:
        return len(end) - len(self.parent(end))

    def path(self, end: Prefix) -> list[Prefix]:
        """The node ends from the root down to ``end`` (root excluded)."""
        return sorted((e for e in self.nodes if end[: len(e)] == e), key=len)

    def cached_len(self, key: Prefix) -> int:
        n = 0
        while n + self.page <= len(key) and key[: n + self.page] in self.ids:
            n += self.page
        return n

    def containing(self, prefix: Prefix) -> Prefix:
        """The end of the node whose tokens contain the (cached, not node-ending) ``prefix``."""
        return min((e for e in self.nodes if len(e) > len(prefix) and e[: len(prefix)] == prefix), key=len)

    def split(self, at: Prefix) -> None:
        lower = self.containing(at)
        self.nodes[at] = ModelNode(kv_time=self.tick(), locks=self.nodes[lower].locks)
        self.nodes[lower].kv_time = self.tick()  # the unmatched suffix is refreshed; its state is not (R1)

    # ------------------------------------------------------------------ sizes
    def evictable(self) -> int:
        return sum(self.size(e) for e, n in self.nodes.items() if n.locks == 0)

    def protected(self) -> int:
        return sum(self.size(e) for e, n in self.nodes.items() if n.locks > 0)

    def states_evictable(self) -> int:
        return sum(1 for n in self.nodes.values() if n.state is not None and n.state_locks == 0)

    def states_protected(self) -> int:
        return sum(1 for n in self.nodes.values() if n.state is not None and n.state_locks > 0)

    def states(self) -> dict[Prefix, int]:
        return {e: n.state for e, n in self.nodes.items() if n.state is not None}

    # ------------------------------------------------------------------ match
    def match(self, key: Prefix, *, cow: bool = False, into_held: bool = False) -> ModelMatch:
        k = key[: len(key) - len(key) % self.page]
        m = k[: self.cached_len(k)]
        if m and m not in self.nodes:
            self.split(m)
        path = self.path(m) if m else []
        if self.mamba:
            while path and self.nodes[path[-1]].state is None:
                path.pop()
        for end in path:
            self.nodes[end].kv_time = self.tick()
        end = path[-1] if path else ()
        ids = [i for n in range(self.page, len(end) + 1, self.page) for i in self.ids[end[:n]]]
        branching = None
        if self.chunk is not None and len(m) > len(end) and len(m) >= self.chunk:
            branching = len(m) // self.chunk * self.chunk
        if not (self.mamba and end and self.nodes[end].state is not None):
            return ModelMatch(ids, end, None, branching)
        node = self.nodes[end]
        node.state_time = self.tick()  # R2: only the state this match hands out
        if not cow:
            return ModelMatch(ids, end, None, branching)
        if into_held:
            return ModelMatch(ids, end, node.state, branching)
        if self.slots_free:
            self.slots_free -= 1
            return ModelMatch(ids, end, node.state, branching)
        pin = self.lock(end)  # the pool is empty: evict one state with the source pinned, retry once
        self.evict_states(1)
        copied = None
        if self.slots_free:
            self.slots_free -= 1
            copied = node.state
        self.unlock(pin)
        return ModelMatch(ids, end, copied, branching)

    # ------------------------------------------------------------------ locks
    def lock(self, end: Prefix) -> ModelLock:
        took = bool(end) and self.mamba and self.nodes[end].state is not None
        if took:
            self.nodes[end].state_locks += 1
        for e in self.path(end) if end else []:
            self.nodes[e].locks += 1
        return ModelLock(end, took)

    def unlock(self, lock: ModelLock) -> int:
        """Release ``lock``; returns the KV tokens freed by deleting tombstone leaves it left unlocked."""
        if lock.took_state:
            self.nodes[lock.end].state_locks -= 1
        for e in self.path(lock.end) if lock.end else []:
            self.nodes[e].locks -= 1
        return self.prune(lock.end) if self.mamba else 0

    # ------------------------------------------------------------------ deletion and eviction
    def delete_leaf(self, end: Prefix) -> int:
        node = self.nodes.pop(end)
        if node.state is not None:
            self.slots_free += 1
        for n in range(len(self.parent(end)) + self.page, len(end) + 1, self.page):
            del self.ids[end[:n]]
        freed = len(end) - len(self.parent(end))
        self.kv_free += freed
        return freed

    def prune(self, end: Prefix) -> int:
        """Delete ``end`` and its ancestors while each is an unlocked tombstone leaf (Mamba tree)."""
        freed = 0
        while end and self.nodes[end].state is None and self.nodes[end].locks == 0 and self.is_leaf(end):
            parent = self.parent(end)
            freed += self.delete_leaf(end)
            end = parent
        return freed

    def evict_kv(self, tokens: int) -> int:
        freed = 0
        while freed < tokens:
            leaves = [e for e, n in self.nodes.items() if n.locks == 0 and self.is_leaf(e)]
            if not leaves:
                break
            oldest = min(leaves, key=lambda e: self.nodes[e].kv_time)
            parent = self.parent(oldest)
            freed += self.delete_leaf(oldest)
            if self.mamba:
                freed += self.prune(parent)
        return freed

    def evict_states(self, count: int) -> int:
        freed = 0
        while freed < count:
            held = [e for e, n in self.nodes.items() if n.state is not None and n.state_locks == 0]
            if not held:
                break
            oldest = min(held, key=lambda e: self.nodes[e].state_time)
            node = self.nodes[oldest]
            if node.locks > 0 or not self.is_leaf(oldest):
                node.state = None  # a tombstone keeps its KV
                self.slots_free += 1
            else:
                parent = self.parent(oldest)
                self.delete_leaf(oldest)
                self.prune(parent)
            freed += 1
        return freed

    # ------------------------------------------------------------------ insert
    def insert(self, key: Prefix, ids: list[int], protected: int, state: int | None) -> tuple[int, bool]:
        """Returns ``(prefix_len, state adopted)``; raises ValueError where the cache must refuse."""
        cached = self.cached_len(key)
        if self.mamba and state is None and cached < len(key):
            raise ValueError("a new leaf needs a state")
        if not key:
            return 0, False
        for end in self.path(key[:cached]) if cached else []:
            self.nodes[end].kv_time = self.tick()  # the walk: KV recency only (R3)
        if cached and key[:cached] not in self.nodes:
            self.nodes[self.containing(key[:cached])].kv_time = self.tick()
            self.split(key[:cached])
        self.kv_free += cached - protected  # the caller's duplicates of cached tokens
        if cached < len(key):
            self.nodes[key] = ModelNode(kv_time=self.tick())
            for n in range(cached + self.page, len(key) + 1, self.page):
                self.ids[key[:n]] = list(ids[n - self.page : n])
        node = self.nodes[key]
        if not self.mamba or state is None or node.state is not None:
            return cached, False
        node.state = state
        node.kv_time = node.state_time = self.tick()  # the slot was the caller's: no pool change
        return cached, True

    # ------------------------------------------------------------------ the caller's allocations
    def take_kv(self, tokens: int) -> bool:
        """An allocation of ``tokens`` KV slots: all or nothing."""
        if tokens > self.kv_free:
            return False
        self.kv_free -= tokens
        return True

    def take_slot(self) -> bool:
        if not self.slots_free:
            return False
        self.slots_free -= 1
        return True
