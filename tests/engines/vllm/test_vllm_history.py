"""vLLM PR #55450, found by the generic machine: 0.29.0 keeps retired Mamba states, 0.30.0 does not.

In ``align`` mode vLLM 0.29.0's ``MambaManager`` retired old state blocks with the base remover, which
walks a request's blocks backwards and stops at the first null block; chunked prefill leaves null gaps
between states, so with an asynchronous scheduler (states of in-flight steps not yet retired) the older
states stayed allocated until the request ended. vLLM 0.30.0 (the PR) skips the nulls. The machine in
kvledger/engines/vllm/machine.py has no rule about this bug: the attach's I-SHARED-MAMBA-RETAINED bound
(live states only) is what fails. Each release runs in its own interpreter (one vLLM per process).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvledger.contracts.shared_owners import SharedOwnershipViolation
from kvledger.engines.vllm.attach import WatchedHybrid
from kvledger.engines.vllm.build import HybridLayout, build_hybrid
from kvledger.engines.vllm.drive import HybridDriver
from kvledger.engines.vllm.hunt import hunt_in_subprocesses

BUGGY, FIXED = "0.29.0", "0.30.0"
# the CI replay: a seed and budget where the buggy release fails early (see spec/vllm-attach.md)
SEED, EXAMPLES = 0, 200


def chunked_async_driver(audit_every: int = 1) -> HybridDriver:
    layout = HybridLayout(num_blocks=32, block_size=4, max_model_len=64)
    watched = WatchedHybrid(build_hybrid(layout), audit_every=audit_every)
    return HybridDriver(watched, chunk=4, async_depth=1)


def test_chunked_async_prefill_keeps_only_live_states() -> None:
    driver = chunked_async_driver()
    rid = driver.arrive(list(range(40)))
    assert driver.admit(rid)
    while driver.prefilling():
        assert driver.prefill(rid)
    mamba = driver.watched.built.single_type_managers[1]
    kept = [b for b in mamba.req_to_blocks[rid] if not b.is_null]
    assert 1 <= len(kept) <= 3, [b.block_id for b in kept]
    driver.check_model()


@pytest.mark.fires("I-SHARED-MAMBA-RETAINED")
@pytest.mark.parametrize("audit_every", [1, 1000], ids=["full", "incremental"])
def test_states_never_retired_are_named(monkeypatch: pytest.MonkeyPatch, audit_every: int) -> None:
    driver = chunked_async_driver(audit_every)
    mamba = driver.watched.built.single_type_managers[1]

    def keep_everything(*args: Any, **kwargs: Any) -> None:
        del args, kwargs  # the retirement pass does nothing: every old state stays allocated

    monkeypatch.setattr(mamba, "remove_skipped_blocks", keep_everything)
    rid = driver.arrive(list(range(40)))
    driver.admit(rid)
    with pytest.raises(SharedOwnershipViolation, match=r"I-SHARED-MAMBA-RETAINED .*r0 keeps 4 state blocks"):
        while driver.prefilling():
            driver.prefill(rid)


def test_pr55450_found_in_the_release_that_had_it_and_clean_in_its_fix() -> None:
    buggy, fixed = hunt_in_subprocesses([BUGGY, FIXED], EXAMPLES, seed=SEED)
    assert buggy.found == "I-SHARED-MAMBA-RETAINED", buggy
    assert "state blocks" in buggy.error and "at most" in buggy.error
    assert fixed.found is None, fixed
    assert fixed.managers_built >= EXAMPLES


@pytest.mark.deep
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pr55450_hunt_deep(seed: int) -> None:
    buggy, fixed = hunt_in_subprocesses([BUGGY, FIXED], 1000, seed=seed)
    assert buggy.found == "I-SHARED-MAMBA-RETAINED", buggy
    assert fixed.found is None, fixed
