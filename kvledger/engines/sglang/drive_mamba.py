"""The cache machine's Mamba rules on SGLang 0.5.20's ``MambaRadixCache``, with the attach as the oracle.

kvledger's Mamba cache differs from 0.5.20's on purpose (spec/mamba-cache-vs-sglang.md), so this machine
compares no results with a model: the oracle is the attach (:func:`.attach.watch`, an audit after every
tree call), whose ledgers and lock records check every move SGLang's tree and pools make. The rules are
the museum Mamba machine's (:mod:`kvledger.museum.machines.cache`): admit with copy-on-write (the copy
SGLang defers to the forward pass is made here with ``MambaPool.copy_from``), finish (the working slot
donated to the tree), abort, extra locks, locks taken on tombstones, revival of tombstones by an insert
that ends there, KV and state evictions, matches. Each holder (request or extra lock) is its own owner.

Run it in a process that loads 0.5.20 (``KVLEDGER_SGLANG_RELEASE_DIR``):
``python -m kvledger.engines.sglang.drive_mamba [EXAMPLES]`` prints one JSON line: the first violation
Hypothesis found (after shrinking) and the steps that lead to it, or ``null``.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from typing import Any, cast

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import Watch, watch
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


def path_tokens(node: Any) -> tuple[int, ...]:
    parts: list[list[int]] = []
    while node is not None and node.parent is not None:
        parts.append(list(node.key.token_ids))
        node = node.parent
    return tuple(t for part in reversed(parts) for t in part)


class SGLangMambaMachine(RuleBasedStateMachine):
    """0.5.20's MambaRadixCache (V1, page 1), watched."""

    def __init__(self) -> None:
        super().__init__()
        self.tree: Any = None

    @initialize(pool_pages=st.integers(6, 12), slots=st.integers(3, 6))
    def setup(self, pool_pages: int, slots: int) -> None:
        self.sgl = load()
        self.ps = 1
        self.alloc = build.token_allocator(pool_pages)
        self.rows = build.hybrid_req_pool(4, slots)
        self.slots = self.rows.mamba_allocator
        self.tree = build.mamba_radix_cache(self.alloc, self.rows)
        self.w: Watch = watch(
            allocator=self.alloc, req_pool=self.rows, mamba_pool=self.rows, tree=self.tree, audit_each=True
        )
        self.reqs: list[Held] = []
        self.extra: list[tuple[str, Any]] = []
        self.seen: list[tuple[int, ...]] = []
        self.n = 0

    def key(self, draw: KeyDraw, *, min_pages: int = 0, tail: int = 0) -> tuple[int, ...]:
        return RadixCacheMachine.key(cast(Any, self), draw, min_pages=min_pages, tail=tail)

    def rid(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def tombstones(self) -> list[Any]:
        out, stack = [], list(self.tree.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.mamba_value is None:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def slot_or_evict(self) -> torch.Tensor | None:
        slot = self.slots.alloc(1)
        if slot is None:
            self.tree.evict(self.sgl.EvictParams(mamba_num=1))
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
                self.tree.evict(self.sgl.EvictParams(mamba_num=1))
                if self.slots.available_size() == 0:
                    return
            req = types.SimpleNamespace(
                kv=types.SimpleNamespace(holds_mamba=False, mamba_pool_idx=None, mamba_cow_src_index=None)
            )
            m = self.tree.match_prefix(
                self.sgl.MatchPrefixParams(key=build.radix_key(key), cow_mamba=True, req=req)
            )
            node, matched = m.last_device_node, int(m.device_indices.numel())
            self.tree.inc_lock_ref(node)
            slot = req.kv.mamba_pool_idx
            if slot is not None:
                slot = slot.reshape(-1)
                self.rows.mamba_pool.copy_from(req.kv.mamba_cow_src_index.reshape(-1), slot)
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
                self.tree.dec_lock_ref(node)
                return
            held = Held(rid, node, own, m.device_indices.to(torch.int64), slot, key)
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
            self.tree.dec_lock_ref(r.node)

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
            self.tree.dec_lock_ref(r.node)

    # ------------------------------------------------------------------ the Mamba rules
    @rule(draw=key_draws, tail=st.integers(0, 3))
    def match_only(self, draw: KeyDraw, tail: int) -> None:
        self.tree.match_prefix(self.sgl.MatchPrefixParams(key=build.radix_key(self.key(draw, tail=tail))))

    @rule(draw=key_draws)
    def lock_extra(self, draw: KeyDraw) -> None:
        m = self.tree.match_prefix(self.sgl.MatchPrefixParams(key=build.radix_key(self.key(draw))))
        rid = self.rid("lock")
        with self.w.holder(rid):
            self.tree.inc_lock_ref(m.last_device_node)
        self.extra.append((rid, m.last_device_node))

    @precondition(lambda self: self.tree is not None and self.tombstones())
    @rule(pick=picks)
    def lock_tombstone(self, pick: int) -> None:
        """A holder locks a node while it is a tombstone (HiCache load-back and PD paths do)."""
        candidates = self.tombstones()
        node = candidates[pick % len(candidates)]
        rid = self.rid("lock")
        with self.w.holder(rid):
            self.tree.inc_lock_ref(node)
        self.extra.append((rid, node))

    @precondition(lambda self: self.extra)
    @rule(pick=picks)
    def unlock_extra(self, pick: int) -> None:
        rid, node = self.extra.pop(pick % len(self.extra))
        with self.w.holder(rid):
            self.tree.dec_lock_ref(node)

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

    @rule(n=st.integers(0, 12))
    def evict_tokens(self, n: int) -> None:
        self.tree.evict(self.sgl.EvictParams(num_tokens=n))

    @rule(n=st.integers(0, 3))
    def evict_states(self, n: int) -> None:
        self.tree.evict(self.sgl.EvictParams(mamba_num=n))

    def teardown(self) -> None:
        if getattr(self, "w", None) is not None:
            self.w.detach()


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


def replay(calls: tuple[str, ...] = FOUND_0520) -> str | None:
    """Run the rule calls Hypothesis printed; the first line of the violation they hit, or None."""
    from kvledger.contracts.errors import ContractViolation

    state = SGLangMambaMachine()
    try:
        for call in calls:
            eval(call, {"state": state})  # the machine's own rule calls, as Hypothesis printed them
    except ContractViolation as exc:
        return str(exc).splitlines()[0]
    finally:
        state.teardown()
    return None


def hunt(examples: int, steps: int = 40) -> dict[str, Any]:
    """Run the machine; the first violation found (shrunk) and the steps Hypothesis printed, or None."""
    import io
    from contextlib import redirect_stdout

    load()
    buf = io.StringIO()
    try:
        with redirect_stdout(buf):
            run_state_machine_as_test(
                SGLangMambaMachine,
                settings=settings(
                    max_examples=examples, stateful_step_count=steps, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False,
                ),
            )  # fmt: skip
    except Exception as exc:  # the violation (or a crash of SGLang's own assertions): report it
        text = buf.getvalue().splitlines() + list(getattr(exc, "__notes__", []))
        calls = [line.strip() for line in text if line.strip().startswith("state.")]
        return {"found": f"{type(exc).__name__}: {str(exc).splitlines()[0]}", "steps": calls}
    return {"found": None, "steps": []}


def main() -> None:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    print(
        json.dumps(
            {
                "version": load().version,
                "examples": examples,
                "steps_per_example": steps,
                **hunt(examples, steps),
            }
        )
    )


if __name__ == "__main__":
    main()
