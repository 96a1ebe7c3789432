"""The host tier under random operations: every policy, device and host pressure, loads that land, fail
or are aborted; the tree's audit (with the host recounts: residency, identity, data) after every rule."""

from __future__ import annotations

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvledger import kernels
from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.reference.hicache import WRITE_POLICIES, match_with_host
from kvledger.reference.hicache.load_back import LANDED, PendingLoad
from kvledger.reference.radix.results import LockRef
from tests.hicache._tier import Tier, tier

PROMPTS = st.lists(st.integers(1, 3), min_size=1, max_size=10)  # few tokens: shared prefixes are common


class HostTierMachine(RuleBasedStateMachine):
    t: Tier

    @initialize(policy=st.sampled_from(WRITE_POLICIES), host=st.integers(4, 24), fail=st.booleans())
    def build(self, policy: str, host: int, fail: bool) -> None:
        self.t = tier(host, policy, kv_size=32, delay=1, fails=(lambda ld: ld.id % 3 == 0) if fail else None)
        self.loads: list[tuple[PendingLoad, torch.Tensor, Owner, LockRef]] = []
        self.seen: set[str] = set()
        self.rid = 0

    @rule(prompt=PROMPTS)
    def cache(self, prompt: list[int]) -> None:
        t = self.t
        need = len(prompt) - t.tree.match_prefix(prompt).device_indices.numel()
        if need > t.kv.available_size():
            t.tree.evict(need - t.kv.available_size())
        if need <= t.kv.available_size():
            self.rid += 1
            t.cache(prompt, self.rid)

    @rule(tokens=st.integers(1, 12))
    def evict_device(self, tokens: int) -> None:
        self.t.tree.evict(tokens)

    @rule(tokens=st.integers(1, 12))
    def evict_host(self, tokens: int) -> None:
        self.t.comp.evict_component(tokens)

    @rule(prompt=PROMPTS)
    def load_back(self, prompt: list[int]) -> None:
        t = self.t
        result, hit = match_with_host(t.tree, t.comp, prompt)
        if not hit.host_len or hit.host_len > t.kv.available_size():
            return
        self.rid += 1
        owner = Owner("req", self.rid, REQ_RUNNING)
        ids = t.kv.alloc(hit.host_len, owner)
        assert ids is not None
        lock = t.tree.inc_lock_ref(result.last_node)  # the request's prefix lock, held while it loads
        self.loads.append((t.loads.start(prompt, hit, ids, owner), result.device_indices, owner, lock))

    @rule()
    def poll(self) -> None:
        self.t.loads.poll()

    @rule(data=st.data(), abort=st.booleans())
    def finish_a_load(self, data: st.DataObject, abort: bool) -> None:
        if self.loads:
            self.finish_a_load_at(data.draw(st.integers(0, len(self.loads) - 1)), abort)

    def finish_a_load_at(self, index: int, abort: bool) -> None:
        if not self.loads:
            return
        t = self.t
        load, prefix, owner, lock = self.loads.pop(index)
        if load.state == LANDED and not abort:
            t.loads.commit(load, prefix, prefix.numel())  # the tree adopts the loaded slots
            self.seen.add("commit")
        elif load.state in ("pending", "landed"):
            t.loads.abort(load)
            t.kv.free(load.device_ids, owner)
            self.seen.add("abort")
        else:
            assert bool(kernels.any_poisoned(t.buffer, load.device_ids).all())  # failed: nothing landed
            t.kv.free(load.device_ids, owner)
            self.seen.add("failed")
        t.tree.dec_lock_ref(lock)

    @invariant()
    def audited(self) -> None:
        if hasattr(self, "t"):
            self.t.tree.audit()
            for load, *_ in self.loads:
                if load.state == "pending":
                    assert load.id in self.t.loads.loads


TestHostTierMachine = HostTierMachine.TestCase


def test_the_machine_reaches_every_ending_of_a_load() -> None:
    """The rules can commit, abort and fail a load (so the machine above exercises all three)."""
    m = HostTierMachine()
    m.build("write_back", 24, True)
    seen: set[str] = set()
    for n in range(6):
        m.cache([1, 2, 3, n % 3 + 1])
        m.evict_device(12)
        m.load_back([1, 2, 3, n % 3 + 1])
        m.poll()
        m.poll()
        m.finish_a_load_at(0, abort=n % 2 == 1)
        m.audited()
        seen |= m.seen
    assert seen == {"commit", "abort", "failed"}
