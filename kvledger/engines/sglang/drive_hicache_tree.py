"""SGLang 0.5.23's radix tree driving its own HiCache host tier, under a generated workload.

:class:`SGLangHiCacheTreeMachine` calls the ``UnifiedRadixCache`` that :func:`.build_host.hicache_tree` builds
(SGLang's own ``init_hicache``: ``HostPoolGroup``, ``HybridCacheController``; Rust or Python tree core,
page 1 or 4, write-through), in any order: insert a prompt (device KV for its new part, ``insert`` with
``prev_prefix_len``, the tree's write-through), take the events (``check_hicache_events``: write and load
acks), evict from the device (``evict``: nodes with a host copy keep it), a hit (``match_prefix``, and on
a host hit ``load_back`` + ``ready_to_load_host_cache``), and evict from the host (``evict_host``).
Prompts share prefixes (a three-token alphabet), so nodes split on the device and on the host.

Oracles: the device allocator's watch (every free is of an id handed out and not yet freed) and the KV
host pool's (:func:`.attach_host.watch_host`, audited after every step: the pool's free list against the
ledger); the loaded rows hold what was written (I-DATA-KV); at the end, after a full device and host
eviction, everything came back on both pools (I-IDLE-IDENTITY). The tree keeps its node bookkeeping in its
core, so host pages are attributed to one owner (the caller), not per node.

    python -m kvledger.engines.sglang.drive_hicache_tree [EXAMPLES] [STEPS]   # one JSON line
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.contracts.errors import ContractViolation
from kvledger.engines.sglang import build, build_host
from kvledger.engines.sglang.attach import Watch, watch
from kvledger.engines.sglang.attach_host import HostWatch, watch_host
from kvledger.engines.sglang.hunting import driver_main, hunt_machine
from kvledger.engines.sglang.loader import load

DEVICE_TOKENS = 64
TOKENS = st.lists(st.integers(1, 3), min_size=10, max_size=32)  # SGLang loads back 10 tokens or more
picks = st.integers(0, 63)

STATS: Counter[str] = Counter()
"""What the machine drove in this process: the closing note's figures."""


class SGLangHiCacheTreeMachine(RuleBasedStateMachine):
    """SGLang's tree and its host tier, called as a scheduler would, under the device and host watches."""

    dw: Watch
    hw: HostWatch

    def __init__(self) -> None:
        super().__init__()
        self.ready = False
        self.data: dict[tuple[int, ...], torch.Tensor] = {}  # prompt prefix (aligned) -> its rows' tags
        self.prompts: list[list[int]] = []  # inserted, for hits (SGLang loads back 10 tokens or more)

    @initialize(page=st.sampled_from((1, 4)), core=st.sampled_from(("rust", "python")))
    def setup(self, page: int, core: str) -> None:
        self.sgl = load()
        self.page = page
        self.alloc = build.token_allocator(DEVICE_TOKENS, page, self.sgl)
        self.tree = build_host.hicache_tree(self.alloc, build.req_pool(8, 64, self.sgl), core)
        self.host = self.tree.cache_controller.mem_pool_host.anchor_entry.host_pool
        self.dw = watch(allocator=self.alloc)
        self.hw = watch_host(self.host, label="kv_host")
        self.k = self.alloc.get_kvcache().k_buffer[0]
        self.serial = 0
        self.ready = True
        STATS[f"page {page}, {core} core"] += 1

    def _match(self, tokens: list[int]) -> tuple[Any, torch.Tensor]:
        hit = self.tree.match_prefix(self.sgl.MatchPrefixParams(key=build.radix_key(tokens, self.sgl)))
        return hit, self.tree.path_device_indices(hit.last_device_node)[: hit.device_prefix_len]

    def _check_rows(self, tokens: list[int], rows: torch.Tensor, where: str) -> None:
        """Each device row of a matched prefix holds the tag written when its token was first inserted."""
        for i in range(len(rows)):
            want = self.data.get(tuple(tokens[: i + 1]))
            if want is not None and float(self.k[rows[i]].reshape(-1)[0]) != float(want):
                raise ContractViolation(
                    f"{where}: position {i} of {tokens[: i + 1]} reads {float(self.k[rows[i]].reshape(-1)[0])},"
                    f" written as {float(want)} (I-DATA-KV)"
                )

    @precondition(lambda self: self.ready)
    @rule(tokens=TOKENS)
    def insert(self, tokens: list[int]) -> None:
        aligned = len(tokens) - len(tokens) % self.page
        if not aligned:
            return
        tokens = tokens[:aligned]
        _, prefix = self._match(tokens)
        done = len(prefix)
        if done == aligned:
            return
        new = self.alloc.alloc(aligned - done)
        if new is None:
            self.tree.evict(self.sgl.EvictParams(num_tokens=aligned - done))
            new = self.alloc.alloc(aligned - done)
            if new is None:
                return
        for i in range(done, aligned):  # a tag per position: the prefix up to it names its row's data
            self.serial += 1
            self.data.setdefault(tuple(tokens[: i + 1]), torch.tensor(float(self.serial)))
            self.k[new[i - done]] = self.data[tuple(tokens[: i + 1])]
        self.prompts.append(tokens)
        value = torch.cat([prefix, new])
        result = self.tree.insert(
            self.sgl.InsertParams(key=build.radix_key(tokens, self.sgl), value=value, prev_prefix_len=done)
        )
        STATS["insert"] += 1
        STATS["insert over a prefix the tree already had"] += int(result.prefix_len > done)

    @precondition(lambda self: self.ready)
    @rule()
    def events(self) -> None:
        self.tree.check_hicache_events()

    @precondition(lambda self: self.ready)
    @rule(n=st.integers(1, DEVICE_TOKENS))
    def evict(self, n: int) -> None:
        self.tree.check_hicache_events()
        STATS["device tokens evicted"] += self.tree.evict(
            self.sgl.EvictParams(num_tokens=n)
        ).num_tokens_evicted

    @precondition(lambda self: self.ready and bool(self.prompts))
    @rule(pick=picks, evict_first=st.booleans())
    def hit(self, pick: int, evict_first: bool) -> None:
        """A prompt seen before comes back (after a full device eviction, when ``evict_first``)."""
        tokens = self.prompts[pick % len(self.prompts)]
        if evict_first:
            self.evict(DEVICE_TOKENS)
        hit, _ = self._match(tokens)
        if hit.host_hit_length <= 0:
            return
        STATS["host hit"] += 1
        if not self.tree.load_back(hit.best_match_node, None, req=None):
            return
        self.tree.ready_to_load_host_cache()
        self.tree.check_hicache_events()
        _, rows = self._match(tokens)
        self._check_rows(tokens, rows, "after load_back")
        STATS["load_back"] += 1

    @precondition(lambda self: self.ready)
    @rule(n=st.integers(1, 2 * DEVICE_TOKENS))
    def evict_host(self, n: int) -> None:
        self.tree.check_hicache_events()
        STATS["host tokens evicted"] += self.tree.evict_host(n)

    @invariant()
    def audited(self) -> None:
        if self.ready:
            self.dw.audit()
            self.hw.audit()

    def teardown(self) -> None:
        if not self.ready:
            return
        try:
            if sys.exc_info()[0] is None:
                self.tree.check_hicache_events()
                self.tree.evict(self.sgl.EvictParams(num_tokens=DEVICE_TOKENS))
                self.tree.evict_host(self.host.size)
                self.dw.check_idle()
                self.hw.check_idle()  # free + cached == size: the tree holds nothing after a full eviction
                STATS["runs clean"] += 1
        finally:
            self.dw.detach()
            self.hw.detach()


def hunt(examples: int, steps: int = 30, *, shrink: bool = True) -> dict[str, Any]:
    """Run the machine; the first violation and the rule calls Hypothesis printed, or None."""
    return hunt_machine(SGLangHiCacheTreeMachine, examples, steps, shrink=shrink)


def main(argv: list[str] | None = None) -> int:
    return driver_main(hunt, STATS, load().version, 50, argv)


if __name__ == "__main__":
    raise SystemExit(main())
