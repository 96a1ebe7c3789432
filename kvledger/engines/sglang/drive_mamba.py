"""The cache machine's Mamba rules on SGLang 0.5.20's ``MambaRadixCache``, with the attach as the oracle.

kvledger's Mamba cache differs from 0.5.20's on purpose (spec/mamba-cache-vs-sglang.md), so this machine
compares no results with a model: the oracle is the attach (:func:`.attach.watch`, an audit after every
tree call), whose ledgers and lock records check every move SGLang's tree and pools make. The rules are
the museum Mamba machine's (:mod:`kvledger.museum.machines.cache`): admit with copy-on-write (the copy
SGLang defers to the forward pass is made here with ``MambaPool.copy_from``), finish (the working slot
donated to the tree), abort, extra locks, locks taken on tombstones, revival of tombstones by an insert
that ends there, KV and state evictions, matches. Each holder (request or extra lock) is its own owner.

Run it with :mod:`.drive_run` in a process that loads the release (``KVLEDGER_SGLANG_RELEASE_DIR``):
``python -m kvledger.engines.sglang.drive_run [EXAMPLES] [STEPS] [--tree=mamba|unified|requests]``.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any, cast

import torch
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
)

from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import Watch, watch
from kvledger.engines.sglang.drive import matched_ids, matched_len
from kvledger.engines.sglang.loader import load
from kvledger.museum.machines.cache_base import KeyDraw, RadixCacheMachine, key_draws, picks


@dataclass
class Held:
    rid: str
    node: Any
    own: torch.Tensor
    prefix: torch.Tensor
    slot: torch.Tensor | None
    key: tuple[int, ...]
    lock: Any  # what inc_lock_ref returned (the Unified tree's unlock takes its receipt)


def state_of(node: Any) -> Any:
    """The node's Mamba state: ``mamba_value`` (MambaRadixCache) or the MAMBA component's value
    (UnifiedRadixCache's Python nodes)."""
    data = getattr(node, "component_data", None)
    return data[_MAMBA].value if data is not None else node.mamba_value


_MAMBA = 2  # SGLang's ComponentType.MAMBA (an int enum, the same in every release that has it)


def receipt(lock: Any) -> Any:
    """The unlock receipt of a lock (``to_dec_params()``; releases without one unlock with none)."""
    return lock.to_dec_params() if hasattr(lock, "to_dec_params") else None


def request_stub() -> Any:
    """What a copy-on-write match reads and writes on a request: 0.5.13 on, its ``kv`` fields (the copy
    deferred to the forward: ``mamba_cow_src_index``); before, ``mamba_pool_idx`` (the copy made inside)."""
    kv = types.SimpleNamespace(holds_mamba=False, mamba_pool_idx=None, mamba_cow_src_index=None)
    # session: None, not a streaming-session request (0.5.11's Unified tree asks first)
    return types.SimpleNamespace(
        kv=kv, mamba_pool_idx=None, mamba_cow_src_index=None, mamba_needs_clear=False, session=None
    )


def path_tokens(node: Any) -> tuple[int, ...]:
    parts: list[list[int]] = []
    while node is not None and node.parent is not None:
        parts.append(list(node.key.token_ids))
        node = node.parent
    return tuple(t for part in reversed(parts) for t in part)


class SGLangMambaMachine(RuleBasedStateMachine):
    """A Mamba radix tree of the loaded release (V1, page 1), watched: 0.5.20's ``MambaRadixCache``
    (``TREE = "mamba"``) or ``UnifiedRadixCache`` with FULL + MAMBA on its Python core (``"unified"``)."""

    TREE = "mamba"

    def __init__(self) -> None:
        super().__init__()
        self.tree: Any = None

    @initialize(pool_pages=st.integers(6, 12), slots=st.integers(3, 6))
    def setup(self, pool_pages: int, slots: int) -> None:
        self.sgl = load()
        self.ps = 1
        self.alloc = build.token_allocator(pool_pages)
        self.rows = build.hybrid_req_pool(4, slots)
        # before 0.5.13 the MambaPool hands out its own slots (no MambaSlotAllocator)
        self.slots = getattr(self.rows, "mamba_allocator", None) or self.rows.mamba_pool
        if self.TREE == "unified":
            self.tree = build.unified_radix_cache(self.alloc, self.rows, mamba=True, core="python")
        else:
            self.tree = build.mamba_radix_cache(self.alloc, self.rows)
        self.w: Watch = watch(
            allocator=self.alloc, req_pool=self.rows, mamba_pool=self.rows, tree=self.tree, audit_each=True
        )
        self.reqs: list[Held] = []
        self.extra: list[tuple[str, Any, Any]] = []
        self.seen: list[tuple[int, ...]] = []
        self.n = 0

    def key(self, draw: KeyDraw, *, min_pages: int = 0, tail: int = 0) -> tuple[int, ...]:
        return RadixCacheMachine.key(cast(Any, self), draw, min_pages=min_pages, tail=tail)

    def handle(self, node: Any) -> Any:
        """What the tree's calls take for a node found by walking it: 0.5.23's Unified tree takes node ids
        (its tree core keeps the nodes in an arena), earlier trees the node objects."""
        core = getattr(self.tree, "tree_core", None)
        return node.id if core is not None and hasattr(core, "node_by_id") else node

    def rid(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def tombstones(self) -> list[Any]:
        out, stack = [], list(self.tree.root_node.children.values())
        while stack:
            node = stack.pop()
            if state_of(node) is None:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def slot_or_evict(self) -> torch.Tensor | None:
        slot = self.slots.alloc(1)
        if slot is None:
            self.tree.evict(self.sgl.EvictParams(num_tokens=0, mamba_num=1))
            slot = self.slots.alloc(1)
        return slot

    # ------------------------------------------------------------------ request life cycle
    @rule(draw=key_draws, keep=st.booleans())
    def admit(self, draw: KeyDraw, keep: bool) -> None:
        key = self.key(draw, min_pages=1)
        self.seen.append(key)
        rid = self.rid("req")
        with self.w.holder(rid):
            # SGLang's scheduler budgets state slots before it matches (alloc_req_slots evicts first, PR
            # #38151): the copy-on-write inside match_prefix asserts when no slot can be had.
            if self.slots.available_size() == 0:
                self.tree.evict(self.sgl.EvictParams(num_tokens=0, mamba_num=1))
                if self.slots.available_size() == 0:
                    return
            req = request_stub()
            m = self.tree.match_prefix(
                self.sgl.MatchPrefixParams(key=build.radix_key(key), cow_mamba=True, req=req)
            )
            node, matched = m.last_device_node, matched_len(m)
            lock = self.tree.inc_lock_ref(node)
            slot = req.kv.mamba_pool_idx if req.kv.mamba_pool_idx is not None else req.mamba_pool_idx
            src = (
                req.kv.mamba_cow_src_index
                if req.kv.mamba_cow_src_index is not None
                else req.mamba_cow_src_index
            )
            if slot is not None:
                slot = slot.reshape(-1)
                if src is not None:  # SGLang defers the copy to the forward pass (0.5.13 on)
                    self.rows.mamba_pool.copy_from(src.reshape(-1), slot)
            else:
                slot = self.slot_or_evict()
            need = len(key) - matched
            if self.alloc.available_size() < need:
                self.tree.evict(self.sgl.EvictParams(num_tokens=need - self.alloc.available_size()))
            own = self.alloc.alloc(need)
            if own is None or slot is None:
                if own is not None:
                    self.alloc.free(own)
                if slot is not None:
                    self.slots.free(slot)
                self.tree.dec_lock_ref(node, receipt(lock))
                return
            held = Held(rid, node, own, matched_ids(self.tree, m), slot, key, lock)
        if keep:
            self.reqs.append(held)
        else:
            self.finish_one(held)

    def finish_one(self, r: Held) -> None:
        with self.w.holder(r.rid):
            params = self.sgl.InsertParams(
                key=build.radix_key(r.key), value=torch.cat((r.prefix, r.own)), mamba_value=r.slot,
                prev_prefix_len=r.prefix.numel(),
            )  # fmt: skip
            if self.tree.insert(params).mamba_exist and r.slot is not None:
                self.slots.free(r.slot)
            self.tree.dec_lock_ref(r.node, receipt(r.lock))
        self.w.retire(r.rid)  # it left the engine: it holds nothing (I-OWNER-RELEASE)

    @precondition(lambda self: self.reqs)
    @rule(pick=picks)
    def finish(self, pick: int) -> None:
        self.finish_one(self.reqs.pop(pick % len(self.reqs)))

    @precondition(lambda self: self.reqs)
    @rule(pick=picks)
    def abort(self, pick: int) -> None:
        r = self.reqs.pop(pick % len(self.reqs))
        with self.w.holder(r.rid):
            if r.own.numel():
                self.alloc.free(r.own)
            if r.slot is not None:
                self.slots.free(r.slot)
            self.tree.dec_lock_ref(r.node, receipt(r.lock))
        self.w.retire(r.rid)

    # ------------------------------------------------------------------ the Mamba rules
    @rule(draw=key_draws, tail=st.integers(0, 3))
    def match_only(self, draw: KeyDraw, tail: int) -> None:
        self.tree.match_prefix(self.sgl.MatchPrefixParams(key=build.radix_key(self.key(draw, tail=tail))))

    @rule(draw=key_draws)
    def lock_extra(self, draw: KeyDraw) -> None:
        m = self.tree.match_prefix(self.sgl.MatchPrefixParams(key=build.radix_key(self.key(draw))))
        rid = self.rid("lock")
        with self.w.holder(rid):
            lock = self.tree.inc_lock_ref(m.last_device_node)
        self.extra.append((rid, m.last_device_node, lock))

    @precondition(lambda self: self.tree is not None and self.tombstones())
    @rule(pick=picks)
    def lock_tombstone(self, pick: int) -> None:
        """A holder locks a node while it is a tombstone (HiCache load-back and PD paths do)."""
        candidates = self.tombstones()
        node = self.handle(candidates[pick % len(candidates)])
        rid = self.rid("lock")
        with self.w.holder(rid):
            lock = self.tree.inc_lock_ref(node)
        self.extra.append((rid, node, lock))

    @precondition(lambda self: self.extra)
    @rule(pick=picks)
    def unlock_extra(self, pick: int) -> None:
        rid, node, lock = self.extra.pop(pick % len(self.extra))
        with self.w.holder(rid):
            self.tree.dec_lock_ref(node, receipt(lock))

    @precondition(lambda self: self.tree is not None and self.tombstones())
    @rule(pick=picks)
    def revive(self, pick: int) -> None:
        """A request ending exactly at a tombstone caches its state there."""
        candidates = self.tombstones()
        key = path_tokens(candidates[pick % len(candidates)])
        rid = self.rid("reviver")
        with self.w.holder(rid):
            slot = self.slot_or_evict()
            if slot is None:
                return
            if self.alloc.available_size() < len(key):
                self.tree.evict(self.sgl.EvictParams(num_tokens=len(key) - self.alloc.available_size()))
            kv = self.alloc.alloc(len(key))
            if kv is None:
                self.slots.free(slot)
                return
            res = self.tree.insert(
                self.sgl.InsertParams(key=build.radix_key(key), value=kv, mamba_value=slot)
            )
            if res.mamba_exist:
                self.slots.free(slot)
        self.w.retire(rid)

    @rule(n=st.integers(0, 12))
    def evict_tokens(self, n: int) -> None:
        self.tree.evict(self.sgl.EvictParams(num_tokens=n))

    @rule(n=st.integers(0, 3))
    def evict_states(self, n: int) -> None:
        self.tree.evict(self.sgl.EvictParams(num_tokens=0, mamba_num=n))

    def teardown(self) -> None:
        if getattr(self, "w", None) is None:
            return
        try:
            if sys.exc_info()[0] is None:  # the run passed (Hypothesis calls teardown in a finally)
                self.release_everything()
                self.w.check_idle()  # everything came back: free or the tree's, no lock (I-IDLE-IDENTITY)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Let the SGLang objects go without the end-of-run checks (after a failure)."""
        if getattr(self, "w", None) is not None:
            self.w.detach()

    def release_everything(self) -> None:
        """End of a run: every live request aborted, every extra lock released."""
        while self.reqs:
            self.abort(0)
        while self.extra:
            self.unlock_extra(0)


class SGLangUnifiedMambaMachine(SGLangMambaMachine):
    """The same rules on ``UnifiedRadixCache`` (FULL + MAMBA, Python core)."""

    TREE = "unified"


FOUND_0520: tuple[str, ...] = (
    "state.setup(pool_pages=6, slots=3)",
    "state.admit(draw=([0, 0], None, 0), keep=False)",
    "state.lock_extra(draw=([], None, 0))",
    "state.lock_extra(draw=([0], None, 0))",
    "state.lock_tombstone(pick=0)",
    "state.admit(draw=([], None, 0), keep=False)",
    "state.evict_states(n=2)",
)
"""What ``hunt(1500, 30)`` found on 0.5.20 (shrunk; spec/sglang-attach.md, F2): a lock taken on the
tombstone ``[0]`` (the upper half of a split), the tombstone revived by a request ending there, then
``evict_mamba`` takes the revived leaf although its KV is locked."""

FOUND_0511: tuple[str, ...] = (
    "state.setup(pool_pages=6, slots=3)",
    "state.lock_extra(draw=([], None, 0))",
    "state.admit(draw=([0, 0], None, 0), keep=False)",
    "state.lock_extra(draw=([0], None, 0))",
    "state.lock_tombstone(pick=0)",
    "state.evict_states(n=1)",
    "state.revive(pick=0)",
    "state.evict_states(n=1)",
)
"""What ``hunt(1500, 30, "unified")`` found on 0.5.11's ``UnifiedRadixCache`` (FULL + MAMBA; shrunk, six
no-op ``evict_states(n=0)`` calls left out; spec/sglang-attach.md, "Historical bugs"): the same
precondition as B14 (a lock taken on the tombstone ``[0]``, then a revival), and the state eviction
cascades into the revived leaf's locked KV; SGLang's own ``assert ... lock_ref == 0`` in
``_cascade_evict`` stops it, which the attach reports as I-EVICT-LOCKED. 0.5.12 leaves the locked leaf
a tombstone and runs the same budget clean."""

B14_UNLOCK: tuple[str, ...] = (
    "state.setup(pool_pages=6, slots=3)",
    "state.admit(draw=([0, 0], None, 0), keep=False)",
    "state.lock_extra(draw=([0], None, 0))",
    "state.lock_tombstone(pick=0)",
    "state.revive(pick=0)",
    "state.lock_extra(draw=([0], None, 0))",
    "state.unlock_extra(pick=1)",
)
"""B14's own path, arranged from the machine's rules (not found by a hunt: the hunt's shortest failure is
:data:`FOUND_0511`): holder A locks the tombstone ``[0]``, a revival gives it a state, holder B locks it
(taking the state lock), A unlocks. 0.5.11's release re-reads the node's state and releases B's state
lock (I-LOCK-SYMMETRY, at the unlock); 0.5.12 honours the lock's skip record (``skip_lock_node_ids``)."""
