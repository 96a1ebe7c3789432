"""The debug build of SGLang's memory components: kvledger's ledgers attached to the live objects.

:func:`watch` wraps methods of the given SGLang objects *on the instances* (an instance attribute
shadows the class's method; SGLang's classes and source stay untouched; :meth:`Watch.detach` removes
the wrappers). Every call that moves an id is mirrored into a :class:`~kvledger.contracts.ledger.Ledger`
per pool before SGLang's own code runs, so a move the registry calls wrong raises
:class:`~kvledger.contracts.errors.ContractViolation` naming the invariant, the id, its owner and its
last moves, and SGLang's state is left as it was before the bad call:

* KV allocator (``alloc``, ``alloc_extend``, ``alloc_decode``; ``free``, ``free_segment``,
  ``free_page_ids``, ``free_full``; ``free_group_begin``/``end``): pages leave the free list to the
  current holder and come back from the owner the context names (below). I-NODUP-FREE, I-EXCLUSIVE,
  I-PENDING (free groups), I-COUNT (an allocation takes exactly the pages it hands out).
* Request pool (``alloc_rows``, ``free_rows``): rows, the same checks.
* Mamba slot allocator (``alloc``, ``free``) and ``MambaPool.copy_from``: slots; a copy reads a source
  someone holds and writes a slot its holder owns (I-COW-SOURCE, I-EXCLUSIVE).
* Radix tree (``match_prefix``, ``insert``, ``evict``, ``inc_lock_ref``, ``dec_lock_ref``): the pages
  (and Mamba slots) an insert adopts move from the holder to the tree; frees inside ``evict`` and
  ``match_prefix`` (its copy-on-write eviction retry) must come from the tree, frees anywhere else
  from the holder (a free of tree-owned ids outside the tree is a foreign free, I-EXCLUSIVE); an
  unlock needs a live lock (I-LOCK-TREE); a Mamba unlock releases the state lock its lock took
  (I-LOCK-SYMMETRY, for trees whose nodes expose ``mamba_lock_ref``).

Holders: SGLang's allocators do not know requests. Ids handed out go to the holder named by
:meth:`Watch.holder` (a request's owner) or, outside such a block, to one ``caller`` owner. Per-request
owners make a free of another request's ids a foreign free.

:meth:`Watch.audit` recounts everything (O(pool + tree)): each ledger against SGLang's own free lists
(I-PARTITION), the tree's values against the tree's holdings (I-PARTITION), the tree's size counters
(I-PROTECTED-DEF), and, for trees with Python nodes, lock counts against the live locks (I-LOCK-TREE).
With ``audit_each=True`` it runs after every watched tree call. What the attach cannot observe is
listed in spec/sglang-attach.md.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.contracts.ledger import as_id_array
from kvledger.engines.sglang import shapes
from kvledger.engines.sglang.attach_pools import CALLER as CALLER
from kvledger.engines.sglang.attach_pools import PoolWatch, page_ids


class Watch(PoolWatch):
    """Ledgers attached to live SGLang components. Build with :func:`watch`."""

    def attach_components(
        self, *, allocator: Any = None, req_pool: Any = None, mamba_pool: Any = None, tree: Any = None
    ) -> None:
        """Watch the given SGLang components (any subset; see :func:`watch`): the pools first, so the tree's
        frees are attributed to pools already mirrored. Bad arguments, or a kind of component this watch
        already watches, raise InvalidArgument before anything is wrapped."""
        shapes.check_arguments(allocator, req_pool, mamba_pool, tree, self.audit_each)
        held = {
            "allocator": self.allocator,
            "req_pool": self.req_pool,
            "mamba_pool": self.mamba_allocator,
            "tree": self.tree,
        }
        given = {"allocator": allocator, "req_pool": req_pool, "mamba_pool": mamba_pool, "tree": tree}
        again = [name for name, obj in given.items() if obj is not None and held[name] is not None]
        if again:
            raise InvalidArgument(f"watch: this watch already watches a {again[0]}; use a second watch for another")
        if allocator is not None:
            self._attach_allocator(allocator)
        if req_pool is not None:
            self._attach_req_pool(req_pool)
        if mamba_pool is not None:
            states = getattr(mamba_pool, "mamba_pool", None)
            # before 0.5.13 the MambaPool hands out its own slots (no MambaSlotAllocator)
            self._attach_mamba(getattr(mamba_pool, "mamba_allocator", None) or states, states)
        if tree is not None:
            self._attach_tree(tree)

    # ------------------------------------------------------------------ radix tree
    def _attach_tree(self, tree: Any) -> None:
        self.tree = tree
        w = self._wrapper(tree)
        w.wrap("match_prefix", self._tree_op("match_prefix", frees_from_tree=True))
        w.wrap("evict", self._guarded_evict(self._tree_op("evict", frees_from_tree=True, lock_asserts=True)))
        if hasattr(tree, "evict_for_alloc"):  # 0.5.23: the allocators' capacity checks evict through it
            guarded = self._guarded_evict(
                self._tree_op("evict_for_alloc", frees_from_tree=True, lock_asserts=True)
            )
            w.wrap("evict_for_alloc", guarded)
        w.wrap("insert", self._insert)
        w.wrap("inc_lock_ref", self._inc_lock)
        w.wrap("dec_lock_ref", self._dec_lock)
        for name in ("cache_finished_req", "cache_unfinished_req"):
            if hasattr(tree, name):
                w.wrap(name, self._request_level(name))
        self._rebind_captured(tree)

    def _rebind_captured(self, tree: Any) -> None:
        """Point bound methods of a watched pool that the tree's components took at construction at
        the watch's wrappers (0.5.11's FULL component keeps ``allocator.free`` as ``_free_full``; a call
        through that reference would bypass an instance wrapper)."""
        components = getattr(tree, "components", None)
        watched = [self.allocator, self.mamba_allocator]
        for comp in components.values() if isinstance(components, dict) else ():
            for name, value in list(vars(comp).items()):
                owner = getattr(value, "__self__", None)
                func = getattr(value, "__func__", None)
                if owner is None or func is None or not any(owner is o for o in watched if o is not None):
                    continue
                wrapped = vars(owner).get(func.__name__)
                if wrapped is None:
                    continue  # a method the watch does not wrap
                w = self._wrapper(comp)
                w.restore[name] = value
                setattr(comp, name, wrapped)
                w.names.append(name)

    def _tree_op(
        self, op: str, *, frees_from_tree: bool, lock_asserts: bool = False
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                self.calls += 1
                if frees_from_tree:
                    self._tree_frees += 1
                try:
                    out = original(*args, **kwargs)
                except AssertionError as exc:
                    # SGLang's own check, inside eviction, that the node it took is unlocked: the attach
                    # cannot see the choice before SGLang makes it, so it reports the assertion under the
                    # invariant it protects, with the live locks it recorded.
                    if not lock_asserts or isinstance(exc, ContractViolation) or not shapes.asserts_lock(exc):
                        raise
                    raise ContractViolation(
                        f"{op}: SGLang's eviction took a locked node: {shapes.assertion_text(exc)} (I-EVICT-LOCKED);"
                        f" live locks: {dict(self.locks)}"
                    ) from exc
                finally:
                    if frees_from_tree:
                        self._tree_frees -= 1
                self._after_tree_call()
                return out

            return call

        return make

    def _guarded_evict(
        self, make: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Inside ``evict``, a free of a page on a locked path is refused before SGLang's free runs
        (I-EVICT-LOCKED), from the attach's own lock records: SGLang's ``RadixCache.evict`` has no
        assertion of its own, and a later double free or wrong counter would be all that shows."""

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            inner = make(original)

            def call(*args: Any, **kwargs: Any) -> Any:
                if self.kv is None or not self._locked_nodes:
                    return inner(*args, **kwargs)
                self._evicting = (
                    True  # the locked paths are read at the first free (most evicts free nothing)
                )
                try:
                    return inner(*args, **kwargs)
                finally:
                    self._evicting, self._evict_guard = False, None

            return call

        return wrap

    def _refuse_locked_eviction(self, pages: np.ndarray, op: str) -> None:
        assert self.kv is not None
        guard = self._evict_guard
        if guard is None:
            # one flag per page of the pool (a gather per free, no sort): set on the locked paths' pages
            guard = np.zeros(len(self.kv.owner_codes), dtype=bool)
            guard[page_ids(shapes.locked_path_values(self._locked_nodes.values()), self.page_size)] = True
            self._evict_guard = guard
        # One gather per free; an id off the pool is clipped onto page 0 (never a tree's) or the last page
        # and kept out of the hits below (the ledger's move then names it).
        flagged = pages[guard.take(pages, mode="clip")]
        if not flagged.size:
            return
        hit = np.unique(flagged[(flagged >= 0) & (flagged < guard.size)])
        if not hit.size:
            return
        page = int(hit[0])
        key, node = next(
            (k, n)
            for k, n in self._locked_nodes.items()
            if page in set(page_ids(shapes.locked_path_values([n]), self.page_size).tolist())
        )
        holders = sorted({repr(h) for (k, h), took in self._lock_took_state.items() if k == key and took})
        raise ContractViolation(
            self.kv.describe(
                hit.tolist()[:4],
                f"evict: {op} of page(s) {hit.tolist()[:8]} on the path of locked node {key}"
                f" (key path {shapes.key_path(node)}), locked by {holders or 'a holder'}:"
                f" a locked node was evicted (I-EVICT-LOCKED); live locks: {dict(+self.locks)}"
                f"{self.lock_evidence(key)}",
            )
        )

    def _insert(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(params: Any) -> Any:
            self.calls += 1
            result = original(params)
            aligned = len(params.key) - len(params.key) % self.page_size
            if self.kv is not None and params.value is not None:
                adopted = as_id_array(params.value[result.prefix_len : aligned])
                if adopted.size:
                    self.kv.transfer(
                        page_ids(adopted, self.page_size), self._holder, self.tree_kv, "insert (adopted)"
                    )
            state = getattr(params, "mamba_value", None)
            if self.slots is not None and state is not None and not getattr(result, "mamba_exist", False):
                self.slots.transfer(
                    as_id_array(state), self._holder, self.tree_state, "insert (state adopted)"
                )
            self._after_tree_call()
            return result

        return call

    def _after_tree_call(self) -> None:
        if self._request_calls:
            return  # inside a scheduler-level call: checked once when it returns
        if self.audit_each:
            self.audit()
        if self._requests:
            self.check_handles()

    @staticmethod
    def _node_key(node: Any) -> Any:
        return node if isinstance(node, int) else getattr(node, "id", id(node))

    def _inc_lock(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(node: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            before = shapes.state_lock_ref(node)
            out = original(node, *args, **kwargs)
            key = self._node_key(node)
            self.locks[key] += 1
            self._locked_nodes[key] = node
            self._note_lock_call(key, ("inc_lock_ref", self._holder, node))
            after = shapes.state_lock_ref(node)
            took = before is not None and after != before
            self._lock_took_state.setdefault((key, self._holder), []).append(took)
            return out

        return call

    def _dec_lock(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(node: Any, *args: Any, **kwargs: Any) -> Any:
            key = self._node_key(node)
            if self.locks[key] <= 0:
                self.locks.pop(key, None)
                raise ContractViolation(
                    f"dec_lock_ref on node {key} (key path {shapes.key_path(node)}) by {self._holder!r}: no"
                    f" live lock taken through inc_lock_ref (I-LOCK-TREE); live locks: {dict(+self.locks)}"
                    f"{self.lock_evidence(key)}"
                )
            self.calls += 1
            took = self._took_state(key)
            before = shapes.state_lock_ref(node)
            out = original(node, *args, **kwargs)
            self.locks[key] -= 1
            self._note_lock_call(key, ("dec_lock_ref", self._holder, None))
            if not self.locks[key]:
                del self.locks[key]
                self._locked_nodes.pop(key, None)
            after = shapes.state_lock_ref(node)
            released = before is not None and after != before
            if before is not None and released != took:
                raise ContractViolation(
                    f"dec_lock_ref on node {key}: the lock {'took' if took else 'did not take'} the Mamba state"
                    f" lock but the release {'released' if released else 'did not release'} one"
                    f" (mamba_lock_ref {before} -> {after}) (I-LOCK-SYMMETRY)"
                )
            return out

        return call

    LOCK_CALLS_KEPT = 8  # per node
    LOCK_CALL_NODES_KEPT = 4096  # nodes whose calls are remembered (the least recently locked forgotten)

    def _note_lock_call(self, key: Any, call: tuple[str, Any, Any]) -> None:
        """Remember (call, holder, node) for node ``key``: the text (with the key path of a lock) is
        written only when a message needs it (per-call cost, issue 38)."""
        calls = self._lock_calls.pop(key, None) or deque(maxlen=self.LOCK_CALLS_KEPT)
        calls.append(call)
        self._lock_calls[key] = calls  # most recent last
        if len(self._lock_calls) > self.LOCK_CALL_NODES_KEPT:
            self._lock_calls.popitem(last=False)

    def lock_evidence(self, key: Any) -> str:
        """The holders of node ``key``'s live locks and its last lock and unlock calls, for a message."""
        holders = sorted({repr(h) for (k, h), took in self._lock_took_state.items() if k == key and took})
        calls = [
            f"{op} by {holder!r}" + (f" at {shapes.key_path(node)}" if node is not None else "")
            for op, holder, node in self._lock_calls.get(key, ())
        ]
        return f"; live lock holders {holders or 'none'}; its last lock calls {calls or 'none'}"

    def _took_state(self, key: Any) -> bool:
        """Whether the lock being released took the node's state lock: the current holder's latest lock on
        the node (a release by a holder that took no lock there releases some other holder's, the latest)."""
        entry = (key, self._holder)
        mine = self._lock_took_state.get(entry)
        if not mine:
            entry, mine = next(
                (e, v) for e, v in reversed(self._lock_took_state.items()) if e[0] == key and v
            )
        took = mine.pop()
        if not mine:  # the only list this call emptied (a lock's list is never left empty)
            del self._lock_took_state[entry]
        return took

    # ------------------------------------------------------------------ audit
    def audit(self) -> None:
        """Recount every watched structure against its ledger (O(pool + tree)); raises ContractViolation."""
        super().audit()
        if self.tree is not None:
            self._audit_tree()

    def _audit_tree(self) -> None:
        tree = self.tree
        if self.kv is not None:
            values = shapes.tree_values(tree)
            pages = page_ids(values, self.page_size)
            held = self.kv.holdings(self.tree_kv)
            if set(pages.tolist()) != held:
                extra = sorted(set(pages.tolist()) - held)
                missing = sorted(held - set(pages.tolist()))
                raise ContractViolation(
                    self.kv.describe(
                        extra[:4] + missing[:4],
                        f"the tree's values disagree with its ledger holdings (I-PARTITION): in the tree but not"
                        f" the tree's {extra[:8]}, the tree's but not in the tree {missing[:8]}",
                    )
                )
            if values.size != np.unique(values).size:
                raise ContractViolation("a KV id appears in two tree nodes (I-PARTITION)")
            evictable, protected = shapes.full_counters(tree)
            if evictable + protected != values.size:
                raise ContractViolation(
                    f"tree counters: evictable {evictable} + protected {protected} != {values.size} tokens held"
                    f" (I-PROTECTED-DEF)"
                )
        if self.slots is not None and hasattr(tree, "all_mamba_values_flatten"):
            states = set(as_id_array(tree.all_mamba_values_flatten()).tolist())
            held = self.slots.holdings(self.tree_state)
            if states != held:
                diff = sorted(states ^ held)
                raise ContractViolation(
                    self.slots.describe(
                        diff[:4],
                        f"the tree's Mamba states disagree with its ledger holdings (I-PARTITION): {diff[:8]}",
                    )
                )
        root = shapes.python_root(tree)
        if root is not None:
            self._audit_python_nodes(root)

    def _audit_python_nodes(self, root: Any) -> None:
        """Trees whose nodes are Python objects: protected = locked nodes' tokens, and lock counts =
        live locks on the node + its children's counts (the root excluded)."""
        evictable = protected = 0
        order: list[Any] = []
        stack = list(root.children.values())
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        for node in reversed(order):  # children before parents
            ref = shapes.lock_ref(node)
            below = sum(shapes.lock_ref(c) for c in node.children.values())
            own = self.locks.get(self._node_key(node), 0)
            if ref != own + below:
                key = self._node_key(node)
                raise ContractViolation(
                    f"node {key} (key path {shapes.key_path(node)}): lock_ref {ref} != {own} live lock(s) +"
                    f" {below} from its children (I-LOCK-TREE){self.lock_evidence(key)}"
                )
            if ref > 0:
                protected += shapes.kv_len(node)
            else:
                evictable += shapes.kv_len(node)
        counted = shapes.full_counters(self.tree)
        if counted != (evictable, protected):
            raise ContractViolation(
                f"tree counters (evictable, protected) = {counted}, a recount gives {(evictable, protected)}"
                f" (I-PROTECTED-DEF)"
            )


def watch(
    *,
    allocator: Any = None,
    req_pool: Any = None,
    mamba_pool: Any = None,
    tree: Any = None,
    audit_each: bool = False,
) -> Watch:
    """Attach kvledger's ledgers to live SGLang components (any subset) and return the :class:`Watch`.

    ``mamba_pool``: a ``HybridReqToTokenPool`` (its ``mamba_allocator`` and ``mamba_pool`` are watched;
    pass it as ``req_pool`` too to watch its rows). ``tree``: a ``RadixCache``, ``UnifiedRadixCache``
    or ``MambaRadixCache``; give its allocator (and Mamba pool) too, so its frees are attributed.
    """
    w = Watch(audit_each=audit_each)
    w.attach_components(allocator=allocator, req_pool=req_pool, mamba_pool=mamba_pool, tree=tree)
    return w
