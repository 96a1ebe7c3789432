"""SGLang 0.5.23's real ``Scheduler`` built on CPU (:mod:`kvledger.engines.sglang.scheduler.build23`) and
stepped under ``attach_scheduler`` in its own subprocess (one SGLang per process).

One process: the build (import and construction timed), a short clean workload replayed under the
ledger (two arrivals, one chunked, prefill and decode steps), and the alias control: two running requests
made to share one Mamba slot by a scoped write outside SGLang must fail the fake worker's data tags.
The long hunt on 0.5.23 is ``deep``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.engines.sglang_scheduler.test_scheduler_seeds import _run

RELEASE = "0.5.23"


def _installed_or_skip() -> None:
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        reason = "SGLang 0.5.23 is not installed in the venv (bash scripts/setup_sglang.sh)"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def ci_23() -> dict[str, Any]:
    _installed_or_skip()
    return _run("ci", "--release", RELEASE, "--seeds", "2", "--ops", "60")


def test_0_5_23_scheduler_builds_and_replays_a_clean_workload(ci_23: dict[str, Any]) -> None:
    assert ci_23["build_s"]["build_s"] >= 0 and ci_23["build_s"]["import_s"] > 0
    replay = ci_23["replay"]
    assert replay["release"] == RELEASE and replay["ops"] == 7
    assert replay["finding"] is None, replay["finding"]


def test_0_5_23_decode_eviction_is_the_trees_free(ci_23: dict[str, Any]) -> None:
    """The hunt's first 0.5.23 report (one request finishing, a second one's decode evicting it through
    ``evict_for_alloc``) was the attach's gap: the tree's frees read as the caller's. Fails when the
    attach does not wrap ``evict_for_alloc``."""
    replay = ci_23["evict_for_alloc"]
    assert replay["ops"] == 19 and replay["finding"] is None, replay["finding"]


def test_0_5_23_matched_prefix_state_is_copied_at_the_forward(ci_23: dict[str, Any]) -> None:
    """The hunt's second 0.5.23 report (a request matching a chunked request's cached 29 tokens starts
    from a blank Mamba slot) was the fake worker's gap: 0.5.23 defers the copy-on-write to the model
    runner's forward. Fails when the fake worker does not do it."""
    replay = ci_23["deferred_cow"]
    assert replay["ops"] == 5 and replay["finding"] is None, replay["finding"]


def test_0_5_23_alias_control_is_caught_by_the_tags(ci_23: dict[str, Any]) -> None:
    alias = ci_23["alias"]
    assert alias["caught"], alias
    assert "Mamba slot" in alias["message"] and "shared with, or was copied from, another" in alias["message"]


def test_0_5_23_pd_prefill_hunt_runs_clean(ci_23: dict[str, Any]) -> None:
    """0.5.23's PD prefill loop with the fake transfer backend (SGLang's own FakeKVManager/Sender):
    a budgeted seeded hunt under the attach, the bootstrap and inflight queues as accounts."""
    hunt = ci_23["pd_prefill_hunt"]
    assert hunt["finding"] is None, hunt["finding"]
    assert hunt["examples"] == 2 and hunt["ops"] == 120 and hunt["requests"] > 10, hunt


def test_0_5_23_pd_decode_hunt_runs_clean_and_its_tags_are_live(ci_23: dict[str, Any]) -> None:
    """0.5.23's PD decode loop with the fake backend (prealloc -> transfer -> decode), aborts included,
    transfers delivering the prompt's tags; without that delivery the first decode fails the tags."""
    hunt = ci_23["pd_decode_hunt"]
    assert hunt["finding"] is None, hunt["finding"]
    assert hunt["ops"] == 120 and hunt["requests"] > 10 and hunt["aborted"] > 0, hunt
    undelivered = ci_23["pd_decode_undelivered"]
    assert undelivered["caught"] and "holds tag 0" in undelivered["message"], undelivered


def test_0_5_23_pd_decode_runs_without_the_radix_cache(ci_23: dict[str, Any]) -> None:
    """The decode hunt's first report (23 KV cells neither free nor the tree's after two requests, which
    SGLang's own idle check also called a pool leak) came from running the decode side with its radix
    cache on, a configuration ServerArgs' PD step turns off; with it off (as the build now sets) the
    shrunk ops replay clean. Fails when the decode build leaves the radix cache on."""
    replay = ci_23["pd_decode_radix_on"]
    assert replay["ops"] == 10 and replay["finding"] is None, replay["finding"]


def test_0_5_23_seeded_hunt_with_aborts_runs_clean(ci_23: dict[str, Any]) -> None:
    """The seeded walk with SGLang's own aborts (waiting, chunked and running requests) on 0.5.23."""
    hunt = ci_23["abort_hunt"]
    assert hunt["finding"] is None, hunt["finding"]
    assert hunt["ops"] == 120 and hunt["aborted"] > 0, hunt


def test_0_5_23_attach_controls(ci_23: dict[str, Any]) -> None:
    """Faults planted outside SGLang on 0.5.23's live pools (through its ``mamba_allocator``): a foreign
    free of a running request's slot is refused naming the holder, a slot taken for nobody is a leak at
    the next step boundary; the identity adds up; detach leaves nothing behind."""
    attach = ci_23["attach"]
    identity = attach["identity"]
    for pool, size in identity["sizes"].items():
        assert sum(identity["accounts"][pool].values()) == size, (pool, identity)
    foreign = attach["foreign_free"]
    assert foreign["caught"] and "(I-NODUP-FREE / I-EXCLUSIVE)" in foreign["message"], foreign
    assert "owner req#a[" in foreign["message"], foreign
    leak = attach["leak"]
    assert (
        leak["caught"]
        and f"mamba [{leak['slot']}] were handed out and no live request names them" in leak["message"]
    ), leak
    assert attach["detach"]["left"] == []
    assert attach["stale_free_group"]["attach_audit"] == "passed"


def test_0_5_23_machine_runs_clean(ci_23: dict[str, Any]) -> None:
    """The Hypothesis machine's generic rules (shared prefixes, follow-up turns, aborts from every queue,
    chunk sizes) over 0.5.23's real loop, at a CI budget."""
    machine = ci_23["machine"]
    assert machine["finding"] is None, machine["finding"]
    assert machine["examples"] >= 12 and machine["operations"] > 100, machine


@pytest.mark.deep
def test_0_5_23_hunt_deep() -> None:
    """The seeded hunt on 0.5.23 (reports its finding; see spec/sglang-scheduler.md for dispositions)."""
    _installed_or_skip()
    out = _run("hunt", "--release", RELEASE, "--seeds", "8", "--ops", "200")
    pd = _run("hunt", "--release", RELEASE, "--pd", "prefill", "--seeds", "8", "--ops", "200")
    assert pd["release"] == RELEASE and pd["ops"] > 0 and pd["finding"] is None, pd["finding"]
    decode = _run(
        "hunt", "--release", RELEASE, "--pd", "decode", "--aborts", "0.15", "--seeds", "8", "--ops", "200"
    )
    assert decode["ops"] > 0
    if decode["finding"] is not None:  # the open decode-side finding (or another): it must replay shrunk
        assert decode["repro_finding"] is not None, decode
    machine = _run("machine", "--release", RELEASE, "--examples", "200", "--ops", "80")
    assert machine["finding"] is None and machine["examples"] >= 200, machine
    assert out["release"] == RELEASE and out["ops"] > 0
    if out["finding"] is not None:  # every finding must replay from its shrunk ops on a fresh build
        assert out["repro_finding"] is not None, out
