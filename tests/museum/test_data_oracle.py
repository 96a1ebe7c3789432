"""The data oracle (issue 25, item 1): state and KV slots carry tags of their prefix, and the checks see them.

The tags themselves (a fold over the tokens, exact in float32), the tagged hash runner's checks at a
forward's reads, the machine's checks of everything held (tree states and KV, working and tracking slots,
host copies), each made to fire by corrupting one slot; then bugs put back into the reference through a
scoped patch (a copy-on-write in the wrong direction, the wrong ping-pong half donated, a retraction
backup that loses a component) that move the right slots with the wrong contents: the counts and the
output oracle pass them, the hunt with the data oracle names I-DATA-STATE.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kvledger.contracts.data_tags import PrefixTags, decode, encode, fold
from kvledger.contracts.errors import ContractViolation
from kvledger.museum.hunt import hunt
from kvledger.museum.machines import pd as pd_machine
from kvledger.museum.machines import scheduler as scheduler_machine
from kvledger.museum.machines.data_oracle import check_host_copy, check_scheduler_data
from kvledger.reference.disagg import landing
from kvledger.reference.disagg.decode import DecodeScheduler
from kvledger.reference.disagg.request import HostCopy
from kvledger.reference.engine import EngineSpec, build_engine
from kvledger.reference.radix.mamba_radix_cache import MambaRadixCache
from kvledger.reference.scheduler import Scheduler
from kvledger.reference.scheduler.tagging_runner import TaggingHashRunner, flat_states
from kvledger.reference.scheduler.tracking import MambaTracking

SHARED = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]


# ---------------------------------------------------------------------- the tags
def test_a_prefix_tag_does_not_depend_on_how_the_tokens_were_chunked() -> None:
    tokens = [5, 9, 9, 2, 31999, 0, 7]
    whole = fold(tokens)
    for cut in range(len(tokens) + 1):
        head = fold(tokens[:cut])
        tail = fold(tokens[cut:], cut, head[-1] if head else 0)
        assert head + tail == whole
    assert fold([1, 2]) != fold([2, 1])  # order-sensitive
    assert fold([1, 2])[-1] != fold([1, 2, 0])[-1]  # length-sensitive


def test_a_tag_survives_float32_and_the_memo_extends_a_fold() -> None:
    tags = PrefixTags()
    got = tags.tags(SHARED)
    assert got[0] == 0 and got[1:] == fold(SHARED)
    assert tags.tags([*SHARED, 4]) == [*got, fold([*SHARED, 4])[-1]]
    for tag in got:
        lo, hi = encode(tag, 1)
        exact = torch.tensor([lo, hi], dtype=torch.float32).tolist()
        assert decode(exact[0], exact[1]) == tag


# ---------------------------------------------------------------------- the runner's read checks
def tagged_engine(**kw: Any) -> Scheduler:
    spec = EngineSpec(
        model="hash-tags", mamba_strategy="no_buffer", chunk=8, kv_tokens=96, mamba_slots=6, **kw
    )
    return build_engine(spec)


def run_some(sched: Scheduler, prompts: list[list[int]], max_new: int = 6) -> None:
    for i, prompt in enumerate(prompts):
        sched.add_request(100 + i, prompt, max_new)
    sched.run_until_idle(max_steps=500)


def test_the_tagged_runner_generates_the_hash_runners_tokens() -> None:
    plain = build_engine(EngineSpec(mamba_strategy="no_buffer", chunk=8, kv_tokens=96, mamba_slots=6))
    tagged = tagged_engine()
    prompts = [[*SHARED, 1, 2], [*SHARED, 3], [4, 5, 6]]
    run_some(plain, prompts)
    run_some(tagged, prompts)
    assert isinstance(tagged.runner, TaggingHashRunner)
    assert [r.output_ids for r in plain.requests.values()] == [r.output_ids for r in tagged.requests.values()]
    check_scheduler_data(tagged)  # the tree's states and KV hold their prefixes' tags


def started(prompt: list[int]) -> tuple[Scheduler, Any]:
    """An engine with one request past its first chunk (its working state holds 8 tokens' tag)."""
    sched = tagged_engine()
    req = sched.add_request(1, prompt, 4)
    sched.step()
    assert req.kv_committed_len == 8 and req.mamba_pool_idx is not None
    return sched, req


@pytest.mark.fires("I-DATA-STATE")
def test_a_forward_from_a_working_state_of_another_prefix_is_named() -> None:
    sched, req = started([*SHARED, 1, 2])
    conv, _ = flat_states(sched.mamba_pool)
    conv[0, int(req.mamba_pool_idx), 0, 0] += 1  # one element of one component
    with pytest.raises(ContractViolation, match=r"I-DATA-STATE: req#1.* starts a forward at 8 tokens"):
        sched.step()


@pytest.mark.fires("I-DATA-KV")
def test_a_forward_that_reads_a_kv_position_of_another_prefix_is_named() -> None:
    sched, req = started([*SHARED, 1, 2])
    slot = int(sched.req_to_token_pool.req_to_token[req.req_pool_idx, 3])
    runner: Any = sched.runner
    runner.kv_buffer.v_buffer[0, slot, 0, 0] = 0.0
    with pytest.raises(ContractViolation, match=r"I-DATA-KV: req#1.* reads position 3 from KV slot"):
        sched.step()


# ---------------------------------------------------------------------- the machine's checks of what is held
def cached() -> Scheduler:
    sched = tagged_engine()
    run_some(sched, [[*SHARED, 1, 2]])
    assert sched.tree is not None and sched.tree.mamba_total_size() > 0
    return sched


def a_state_node(sched: Scheduler) -> Any:
    assert sched.tree is not None
    stack = list(sched.tree.root.children.values())
    while stack:
        node = stack.pop()
        if node.mamba_value is not None:
            return node
        stack.extend(node.children.values())
    raise AssertionError("no node with a state")


@pytest.mark.fires("I-DATA-STATE")
def test_a_cached_state_that_lost_a_component_is_named() -> None:
    sched = cached()
    node = a_state_node(sched)
    _, temporal = flat_states(sched.mamba_pool)
    temporal[:, int(node.mamba_value)] = 0.0
    with pytest.raises(
        ContractViolation, match=r"I-DATA-STATE: tree Node#\d+.* should hold the state of its first"
    ):
        check_scheduler_data(sched)


@pytest.mark.fires("I-DATA-KV")
def test_a_cached_kv_position_of_another_prefix_is_named() -> None:
    sched = cached()
    node = a_state_node(sched)
    runner: Any = sched.runner
    a, b = node.value[0], node.value[1]
    k = runner.kv_buffer.k_buffer
    k[0, a], k[0, b] = k[0, b].clone(), k[0, a].clone()  # two positions' K swapped
    with pytest.raises(ContractViolation, match=r"I-DATA-KV: tree Node#\d+.* names KV slot"):
        check_scheduler_data(sched)


@pytest.mark.fires("I-DATA-STATE", "I-DATA-KV")
def test_a_host_copy_that_lost_a_component_is_named() -> None:
    runner = TaggingHashRunner()
    prompt = [3, 1, 4, 1, 5]
    tags = runner.prefix_tags.tags(prompt)
    lo, hi = encode(tags[5], 5)
    conv = torch.tensor([[[lo, 5.0]]])
    temporal = torch.tensor([[[hi, 5.0]]])
    k = torch.tensor([[[[encode(tags[p + 1], p + 1)[0], p + 1.0]] for p in range(5)]])
    v = torch.tensor([[[[encode(tags[p + 1], p + 1)[1], p + 1.0]] for p in range(5)]])

    class Retracted:
        owner = "decode.req#7"
        host_copy = HostCopy(5, k, v, conv, temporal)

        def context_ids(self) -> list[int]:
            return [*prompt, 9]

    req = Retracted()
    check_host_copy(req, runner)  # whole: passes
    req.host_copy = HostCopy(5, k, v, conv, torch.zeros_like(temporal))
    with pytest.raises(
        ContractViolation, match=r"I-DATA-STATE: .decode.req#7.+s host copy of its temporal state"
    ):
        check_host_copy(req, runner)
    req.host_copy = HostCopy(5, k, v.flip(1), conv, temporal)
    with pytest.raises(ContractViolation, match=r"I-DATA-KV: .decode.req#7.+s host copy of its K/V"):
        check_host_copy(req, runner)


# ---------------------------------------------------------------------- bugs the counts miss
def cow_in_the_wrong_direction(self: MambaRadixCache, src: Any, dst: torch.Tensor) -> None:
    self.mamba_pool._copy_unchecked(dst, src.mamba_value)  # the request's fresh slot over the node's state


def the_other_ping_pong_half(self: MambaTracking, req: Any) -> int:
    return req.mamba_next_track_idx  # the half the next capture writes, not the one holding the last


@contextlib.contextmanager
def without_the_data_oracle() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler_machine, "with_data_tags", lambda spec: spec)
        mp.setattr(pd_machine, "with_data_tags_pd", lambda spec: spec)
        yield


def hunt_with(bug: tuple[type, str, Any], machine: str, batches: int, oracle: bool = True) -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(*bug)
        with without_the_data_oracle() if not oracle else contextlib.nullcontext():
            return hunt(
                None,
                machine=machine,
                max_batches=batches,
                seed=0,
                shrink_seconds=0,
                minimize_seconds=0,
                verify=False,
                budget=600,
            )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bug", "batches"),
    [
        pytest.param((MambaRadixCache, "_copy_state", cow_in_the_wrong_direction), 3, id="cow-backwards"),
        # 6 batches since the follow-up arrivals joined the draws (found at 43 examples, seed 0)
        pytest.param((MambaTracking, "keep_idx", the_other_ping_pong_half), 6, id="wrong-ping-pong-half"),
    ],
)
def test_the_scheduler_hunt_finds_a_content_bug_the_counts_miss(bug: tuple[type, str, Any], batches: int) -> None:
    found = hunt_with(bug, "scheduler", batches=batches)
    assert found.found and found.invariant == "I-DATA-STATE", found.message
    missed = hunt_with(bug, "scheduler", batches=batches, oracle=False)
    assert not missed.found, missed.message  # the same examples, without tags: nothing to see


def lossy_host_copy(self: DecodeScheduler, req: Any) -> HostCopy:
    copy = ORIGINAL_HOST_COPY(self, req)
    temporal = None if copy.temporal is None else torch.zeros_like(copy.temporal)
    return HostCopy(copy.length, copy.k, copy.v, copy.conv, temporal)  # the temporal state never backed up


ORIGINAL_HOST_COPY = DecodeScheduler._host_copy


@pytest.mark.slow
def test_the_pd_hunt_finds_a_backup_that_misses_a_component() -> None:
    bug = (DecodeScheduler, "_host_copy", lossy_host_copy)
    # 4 batches: the PD machine's decode-queue aborts (issue 27) moved the first find to example 26 at seed 0.
    found = hunt_with(bug, "pd", batches=4)
    assert found.found and found.invariant == "I-DATA-STATE", found.message
    missed = hunt_with(bug, "pd", batches=4, oracle=False)
    assert not missed.found, missed.message


def lands_nothing(*args: Any) -> None:
    """A landing whose bytes never arrive, while the channel records it as landed."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("component", "invariant"),
    [pytest.param("copy_state", "I-DATA-STATE", id="state"), pytest.param("copy_kv", "I-DATA-KV", id="kv")],
)
def test_a_transfer_committed_without_a_components_bytes_is_found(component: str, invariant: str) -> None:
    """I-TRANSFER-ATOMIC trusts the channel's record of what landed; the tags check the bytes themselves."""
    found = hunt_with((landing, component, lands_nothing), "pd", batches=2)
    assert found.found and found.invariant == invariant, found.message
