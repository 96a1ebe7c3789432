"""SGLang 0.5.23's HiCache host tier driven under the ledgers: the controller's write, load and host eviction.

:class:`SGLangHiCacheMachine` plays the radix tree's host-tier bookkeeping (which node has a device copy, a
host copy, a write in flight) over SGLang's own objects: a token or paged KV allocator (page 1 or 4), the
``MHATokenToKVPoolHost`` over its device pool, the ``HiCacheController`` over both (write policy
``write_through`` or ``write_back``), and a ``MambaPoolHost`` for each node's Mamba state. Every call that
moves a slot is SGLang's:

* insert: device KV for a node (``alloc``; the shortfall made by evicting backed-up device copies), its
  K/V rows tagged with the node's data tag; write-through: ``HiCacheController.write`` at once;
* backup: ``write(device_indices, node_id=N)`` (its host allocation; a full host pool evicts other nodes'
  host copies first), the Mamba state's host slot (``MambaPoolHost.alloc``); the ack taken from
  ``ack_write_queue`` (its ``finish_event`` queried) makes them node N's host copy;
* device eviction: write-back backs the node up first; its device pages freed (``free``), the host copy
  kept; a node with no host copy is dropped;
* load-back on a hit: ``load(host_indices, node_id=N)`` (its device allocation), ``start_loading()``, the
  ack from ``ack_load_queue``; the loaded rows must hold the node's tags (I-DATA-KV); a failed transfer
  (``SyncTransferEngine.fail_next``) leaves the node host-only and its device slots are given back;
* host eviction: ``evict_host(host_indices)`` and ``MambaPoolHost.free``; the node's host copy dropped.

Oracles: the device watch (:func:`.attach.watch`, node N's device pages held by ``node:N``, a load's by
``load:N``, each retired when it must hold nothing: I-OWNER-RELEASE), the host watches
(:func:`.attach_host.watch_host`, audited after every step), and at the end everything came back on all
three pools (I-IDLE-IDENTITY).

Not driven here (0.5.23 on CPU): the tree's own host paths (``UnifiedRadixCache.init_hicache``,
``write_backup``, ``load_back``, ``evict_host``, ``check_hicache_events``) keep their node bookkeeping in
the tree core and move slots through the ``HybridCacheController``; they run on CPU
(:func:`.build_host.hicache_tree`) in a deterministic scenario (tests/engines/test_sglang_hicache_tree.py),
and this machine plays the tree's part against ``HiCacheController`` instead. The data copies themselves
(``sgl_kernel``'s ``transfer_kv_*``, CUDA streams) are :class:`.build_host.SyncTransferEngine`'s torch
copies; storage prefetch (L3) runs on background threads against a storage backend and is not driven.

    python -m kvledger.engines.sglang.drive_hicache [EXAMPLES] [STEPS]   # one JSON line: found or null
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.contracts.errors import ContractViolation
from kvledger.engines.sglang import build, build_host
from kvledger.engines.sglang.attach import Watch, watch
from kvledger.engines.sglang.attach_host import HostWatch, watch_host
from kvledger.engines.sglang.attach_pools import page_ids
from kvledger.engines.sglang.hunting import driver_main, hunt_machine
from kvledger.engines.sglang.loader import load

DEVICE_TOKENS = 32
HOST_RATIO = 1.0  # host no larger than the device (plus SGLang's padding page): host eviction under pressure
MAMBA_SLOTS = 8
picks = st.integers(0, 63)

STATS: Counter[str] = Counter()
"""What the machine drove in this process (call kinds): the closing note's figures."""


@dataclass(eq=False)
class Node:
    nid: int
    tokens: int
    dev: torch.Tensor | None = None  # device KV indices (a device copy)
    host: torch.Tensor | None = None  # host KV indices (a host copy, its write acknowledged)
    pending: torch.Tensor | None = None  # host KV indices of a write still in flight
    state: torch.Tensor | None = None  # the Mamba state's host slot (with the host copy)
    state_pending: torch.Tensor | None = None

    def tags(self) -> torch.Tensor:
        return float(self.nid * 1000) + torch.arange(self.tokens, dtype=torch.float32)


class SGLangHiCacheMachine(RuleBasedStateMachine):
    """The host tier's calls on SGLang 0.5.23's controller and host pools, the tree's part played here."""

    dw: Watch  # the device allocator's watch (set up by ``setup``)

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[int, Node] = {}
        self.next_id = 1
        self.ready = False  # set up (Hypothesis evaluates preconditions before the initialize rule)

    @initialize(page=st.sampled_from((1, 4)), policy=st.sampled_from(("write_through", "write_back")))
    def setup(self, page: int, policy: str) -> None:
        sgl = load()
        self.page, self.policy = page, policy
        self.alloc = build.token_allocator(DEVICE_TOKENS, page, sgl)
        self.host = build_host.kv_host_pool(self.alloc, HOST_RATIO)
        self.ctl = build_host.controller(self.alloc, self.host, policy)
        self.engine: build_host.SyncTransferEngine = self.ctl.l2_transfer_engine
        self.mamba = build_host.mamba_host_pool(build.hybrid_req_pool(4, MAMBA_SLOTS, modules=sgl), 1.0)
        self.dw = watch(allocator=self.alloc)
        self.hw: HostWatch = watch_host(self.host, controller=self.ctl, device=self.dw, label="kv_host")
        self.mw: HostWatch = watch_host(self.mamba, label="mamba_host")
        self.k_device = self.alloc.get_kvcache().k_buffer[0]
        self.ready = True
        STATS[f"page {page}, {policy}"] += 1

    # ------------------------------------------------------------------ the tree's part
    def _pick(self, pick: int, want: Any) -> Node | None:
        found = [n for n in self.nodes.values() if want(n)]
        return found[pick % len(found)] if found else None

    def _device(self, key: str, tokens: int, keep: Node | None = None) -> torch.Tensor | None:
        """``tokens`` device slots for holder ``key``, evicting backed-up device copies for the shortfall."""
        with self.dw.holder(key):
            got = self.alloc.alloc(tokens)
        while got is None:
            victim = self._pick(0, lambda n: n.dev is not None and n.host is not None and n is not keep)
            if victim is None:
                return None
            self._free_device(victim)
            with self.dw.holder(key):
                got = self.alloc.alloc(tokens)
        return got

    def _free_device(self, node: Node) -> None:
        assert node.dev is not None
        with self.dw.holder(f"node:{node.nid}"):
            self.alloc.free(node.dev)
        node.dev = None
        self.dw.retire(f"node:{node.nid}")
        STATS["device eviction"] += 1
        if node.host is None and node.pending is None:
            del self.nodes[node.nid]

    def _drop_host(self, node: Node) -> None:
        assert node.host is not None and node.state is not None
        self.ctl.evict_host(node.host)
        with self.mw.acting_for(self.mw.node_host(node.nid)):
            self.mamba.free(node.state)
        node.host = node.state = None
        self.hw.node_dropped(node.nid)
        self.mw.node_dropped(node.nid)
        STATS["host eviction"] += 1
        if node.dev is None:
            del self.nodes[node.nid]

    def _backup(self, node: Node) -> bool:
        """``write`` the node's device copy to host (host room made by dropping other host copies)."""
        assert node.dev is not None
        with self.mw.acting_for(self.mw.writing(node.nid)):
            state = self.mamba.alloc(1)
        host = self.ctl.write(node.dev, node_id=node.nid)
        while host is None or state is None:
            victim = self._pick(0, lambda n: n.host is not None and n is not node)
            if victim is None:
                break
            self._drop_host(victim)
            if state is None:
                with self.mw.acting_for(self.mw.writing(node.nid)):
                    state = self.mamba.alloc(1)
            if host is None:
                host = self.ctl.write(node.dev, node_id=node.nid)
        if host is None or state is None:  # nothing left to evict: the node stays device-only
            self._abandon_write(node, host, state)
            return False
        node.pending, node.state_pending = host, state
        STATS["write"] += 1
        return True

    def _abandon_write(self, node: Node, host: Any, state: Any) -> None:
        if host is not None:  # its copy already landed in the queue: wait for it, then give the slots back
            self._take_write_acks()
            with self.hw.acting_for(self.hw.writing(node.nid)):
                self.host.free(host)
        if state is not None:
            with self.mw.acting_for(self.mw.writing(node.nid)):
                self.mamba.free(state)
        self.hw.node_dropped(node.nid)
        self.mw.node_dropped(node.nid)
        STATS["write abandoned (host full)"] += 1

    def _take_write_acks(self) -> None:
        """The tree's ack handling: every finished write commits its node's host copy."""
        while self.ctl.ack_write_queue:
            ack = self.ctl.ack_write_queue.pop(0)
            assert ack.finish_event.query()
            for nid in ack.node_ids:
                node = self.nodes.get(nid)
                if node is None or node.pending is None:
                    continue  # an abandoned write: its slots went back above
                self._check_tags(
                    node, self.host.k_data_refs[0][node.pending].reshape(-1), "host copy after write"
                )
                self.hw.commit_backup(nid, node.pending)
                self.mw.commit_backup(nid, node.state_pending)
                node.host, node.state, node.pending, node.state_pending = (
                    node.pending,
                    node.state_pending,
                    None,
                    None,
                )
                STATS["write ack"] += 1

    def _check_tags(self, node: Node, rows: torch.Tensor, where: str) -> None:
        if not torch.equal(rows, node.tags()):
            raise ContractViolation(
                f"node {node.nid}: its {where} does not hold the node's data (I-DATA-KV): expected"
                f" {node.tags().tolist()[:8]}, found {rows.tolist()[:8]}"
            )

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: self.ready and len(self.nodes) < 24)
    @rule(pages=st.integers(1, 3))
    def insert(self, pages: int) -> None:
        node = Node(self.next_id, pages * self.page)
        dev = self._device(f"node:{node.nid}", node.tokens)
        if dev is None:
            self.dw.retire(f"node:{node.nid}")
            return
        self.next_id += 1
        node.dev = dev
        self.nodes[node.nid] = node
        self.k_device[dev] = node.tags().reshape(-1, 1, 1)
        STATS["insert"] += 1
        if self.policy == "write_through":
            self._backup(node)

    @precondition(lambda self: self.ready and bool(self.ctl.ack_write_queue))
    @rule()
    def take_acks(self) -> None:
        self._take_write_acks()

    @precondition(lambda self: any(n.dev is not None for n in self.nodes.values()))
    @rule(pick=picks)
    def evict_device(self, pick: int) -> None:
        self._take_write_acks()  # the scheduler's per-step event check runs before the tree evicts
        node = self._pick(pick, lambda n: n.dev is not None and n.pending is None)
        if node is None:
            return
        if node.host is None and self.policy == "write_back" and self._backup(node):
            self._take_write_acks()  # write-back: the copy lands before the device pages go
        self._free_device(node)

    @precondition(lambda self: any(n.dev is None and n.host is not None for n in self.nodes.values()))
    @rule(pick=picks, fail=st.booleans())
    def load_back(self, pick: int, fail: bool) -> None:
        node = self._pick(pick, lambda n: n.dev is None and n.host is not None)
        if node is not None:
            self._load_back(node, fail)

    @precondition(lambda self: any(n.dev is not None and n.host is not None for n in self.nodes.values()))
    @rule(pick=picks, fail=st.booleans())
    def evict_then_hit(self, pick: int, fail: bool) -> None:
        """A backed-up node evicted from the device, then hit: the common way into a load-back."""
        self._take_write_acks()
        node = self._pick(pick, lambda n: n.dev is not None and n.host is not None)
        assert node is not None
        self._free_device(node)
        self._load_back(node, fail)

    def _load_back(self, node: Node, fail: bool) -> None:
        assert node.host is not None
        key = f"load:{node.nid}"
        self.engine.fail_next = int(fail)  # the transfer this load submits fails
        loaded = self.ctl.load(node.host, node_id=node.nid)
        if (
            loaded is None and fail and self.engine.fail_next == 0
        ):  # a load that gave up on its failing transfer
            self.dw.retire(key)  # it must not keep the device slots it took
            STATS["load-back refused"] += 1
            return
        if loaded is None:  # device full: evict, then try once more
            room = self._device(key, node.tokens, keep=node)
            if room is None:
                self.dw.retire(key)
                return
            with self.dw.holder(key):
                self.alloc.free(room)
            loaded = self.ctl.load(node.host, node_id=node.nid)
            if loaded is None:
                self.engine.fail_next = 0
                self.dw.retire(key)
                return
        try:
            self.ctl.start_loading()
        except RuntimeError:
            with self.dw.holder(key):  # the transfer failed: the node stays host-only
                self.alloc.free(loaded)
            self.dw.retire(key)
            STATS["load-back failed"] += 1
            return
        ack = self.ctl.ack_load_queue.pop(0)
        assert ack.finish_event.query() and ack.node_ids == [node.nid]
        self._check_tags(node, self.k_device[loaded].reshape(-1), "device copy after load-back")
        assert self.dw.kv is not None
        self.dw.kv.transfer(
            page_ids(loaded, self.page), self.dw.owner_of_request(key), self.dw.owner_of_request(f"node:{node.nid}"),
            "load-back commit",
        )  # fmt: skip
        self.dw.retire(key)
        node.dev = loaded
        STATS["load-back"] += 1

    @precondition(lambda self: any(n.host is not None for n in self.nodes.values()))
    @rule(pick=picks)
    def evict_host(self, pick: int) -> None:
        node = self._pick(pick, lambda n: n.host is not None)
        if node is not None:
            self._drop_host(node)

    @precondition(lambda self: any(n.pending is None for n in self.nodes.values()))
    @rule(pick=picks)
    def delete(self, pick: int) -> None:
        node = self._pick(pick, lambda n: n.pending is None)
        if node is None:
            return
        if node.host is not None:
            self._drop_host(node)
        if node.dev is not None:
            self._free_device(node)

    @invariant()
    def audited(self) -> None:
        if self.ready:
            self.dw.audit()
            self.hw.audit()
            self.mw.audit()

    def teardown(self) -> None:
        if not self.ready:
            return
        try:
            if sys.exc_info()[0] is None:
                self._take_write_acks()
                while self.nodes:
                    self.delete(0)
                self.dw.check_idle()
                self.hw.check_idle()
                self.mw.check_idle()  # free + cached == size on all three pools
                STATS["runs clean"] += 1
        finally:
            self.dw.detach()
            self.hw.detach()
            self.mw.detach()


def hunt(examples: int, steps: int = 30, *, shrink: bool = True) -> dict[str, Any]:
    """Run the machine; the first violation (shrunk unless ``shrink`` is False) and the rule calls
    Hypothesis printed, or None."""
    return hunt_machine(SGLangHiCacheMachine, examples, steps, shrink=shrink)


def main(argv: list[str] | None = None) -> int:
    return driver_main(hunt, STATS, load().version, 100, argv)


if __name__ == "__main__":
    raise SystemExit(main())
