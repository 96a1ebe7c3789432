"""A Hypothesis state machine driving vLLM's hybrid KV cache manager through the attach.

Arrivals draw prompts from three shared prefixes (so prefix-cache hits, shared blocks and evictions
happen in a pool of 10 to 24 blocks), then prefill in chunks, decode, preempt, re-admit, finish and
abort, with the scheduler synchronous or one or two steps asynchronous, the attach auditing the whole
pool after every call or every fifth (incremental read-back in between). The oracle is the attach
(every shared-ownership invariant after every vLLM call) plus the driver's count model; nothing in it
names a particular vLLM bug. :func:`machine_for` binds it to one installed release.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.engines.vllm.attach import WatchedHybrid
from kvledger.engines.vllm.build import HybridLayout, build_hybrid
from kvledger.engines.vllm.drive import HybridDriver
from kvledger.engines.vllm.loader import DEFAULT_RELEASE

PREFIXES = tuple(list(range(1000 * k, 1000 * k + 40)) for k in range(3))


class HybridMachine(RuleBasedStateMachine):
    """Scheduler-shaped calls on one watched manager. ``release`` is the vLLM release it builds."""

    release = DEFAULT_RELEASE
    examples = 0  # built managers, over the class's lifetime (a hunt's budget figure)
    driver: HybridDriver

    @initialize(
        num_blocks=st.integers(10, 48),
        block_size=st.sampled_from([2, 4]),
        chunk=st.sampled_from([None, 4, 8]),
        async_depth=st.integers(0, 2),
        audit_every=st.sampled_from([1, 5]),
    )
    def build(
        self, num_blocks: int, block_size: int, chunk: int | None, async_depth: int, audit_every: int
    ) -> None:
        layout = HybridLayout(num_blocks=num_blocks, block_size=block_size, max_model_len=64)
        watched = WatchedHybrid(build_hybrid(layout, self.release), audit_every=audit_every)
        self.driver = HybridDriver(watched, chunk=chunk, async_depth=async_depth)
        type(self).examples += 1

    # block-aligned cuts make the Mamba group's cached states line up, so prefix hits (shared blocks) happen
    @rule(
        prefix=st.integers(0, 2),
        cut=st.sampled_from([4, 8, 16, 24, 40]) | st.integers(1, 40),
        tail=st.lists(st.integers(0, 9), max_size=6),
    )
    def arrive(self, prefix: int, cut: int, tail: list[int]) -> None:
        rid = self.driver.arrive(PREFIXES[prefix][:cut] + tail)
        self.driver.admit(rid)

    @precondition(lambda self: bool(self.driver.waiting))
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        self.driver.admit(data.draw(st.sampled_from(sorted(self.driver.waiting))))

    # a scheduler step continues every running prefill by one chunk (running requests come first)
    @precondition(lambda self: bool(self.driver.prefilling()))
    @rule()
    def prefill(self) -> None:
        for rid in self.driver.prefilling():
            if rid in self.driver.running:
                self.driver.prefill(rid)

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


def machine_for(release: str) -> type[HybridMachine]:
    """The machine building ``release``'s manager (one release per process: see the loader)."""
    return type(f"HybridMachine_{release.replace('.', '_')}", (HybridMachine,), {"release": release})
