"""A Hypothesis state machine driving vLLM 0.34.0's hybrid KV cache manager through the attach.

Arrivals draw prompts from three shared prefixes (so prefix-cache hits, shared blocks and evictions
happen in a pool of 10 to 24 blocks), then decode, preempt, re-admit, finish and abort. The oracle is the
attach (every shared-ownership invariant after every vLLM call) plus the driver's count model.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.engines.vllm.attach import WatchedHybrid
from kvledger.engines.vllm.build import HybridLayout, build_hybrid
from kvledger.engines.vllm.drive import HybridDriver

PREFIXES = tuple(list(range(1000 * k, 1000 * k + 16)) for k in range(3))


class HybridMachine(RuleBasedStateMachine):
    driver: HybridDriver

    @initialize(num_blocks=st.integers(10, 24), block_size=st.sampled_from([2, 4]))
    def build(self, num_blocks: int, block_size: int) -> None:
        layout = HybridLayout(num_blocks=num_blocks, block_size=block_size, max_model_len=48)
        self.driver = HybridDriver(WatchedHybrid(build_hybrid(layout)))

    # block-aligned cuts make the Mamba group's cached states line up, so prefix hits (shared blocks) happen
    @rule(
        prefix=st.integers(0, 2),
        cut=st.sampled_from([4, 8, 16]) | st.integers(1, 16),
        tail=st.lists(st.integers(0, 9), max_size=6),
    )
    def arrive(self, prefix: int, cut: int, tail: list[int]) -> None:
        rid = self.driver.arrive(PREFIXES[prefix][:cut] + tail)
        self.driver.admit(rid)

    @precondition(lambda self: bool(self.driver.waiting))
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        self.driver.admit(data.draw(st.sampled_from(sorted(self.driver.waiting))))

    @precondition(lambda self: bool(self.driver.running))
    @rule(data=st.data(), token=st.integers(0, 9))
    def decode(self, data: st.DataObject, token: int) -> None:
        self.driver.decode(data.draw(st.sampled_from(sorted(self.driver.running))), token)

    @precondition(lambda self: bool(self.driver.running))
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        self.driver.preempt(data.draw(st.sampled_from(sorted(self.driver.running))))

    @precondition(lambda self: bool(self.driver.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self.driver.finish(data.draw(st.sampled_from(sorted(self.driver.running))))

    @precondition(lambda self: bool(self.driver.running or self.driver.waiting))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        self.driver.abort(data.draw(st.sampled_from(sorted([*self.driver.running, *self.driver.waiting]))))

    @rule()
    def reset_prefix_cache(self) -> None:
        self.driver.watched.reset_prefix_cache()

    @invariant()
    def model_agrees(self) -> None:
        if hasattr(self, "driver"):
            self.driver.check_model()


TestHybridMachine = HybridMachine.TestCase
