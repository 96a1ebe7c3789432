"""#12432 in SGLang 0.5.5.post1's real PD prefill loop (fake transfer backend), under attach_scheduler.

Each release runs in its own subprocess (one SGLang per process). post1: the saved shrunk repro and a
budgeted hunt of the generic workload must fail naming the invariant (a request of the batch about to
run names a free Mamba slot: its slot was freed with its row by ``process_prefill_chunk``). post2 (the
fix): the same repro and budget run clean, and the repro fails again when the bug is put back by a
scoped patch (:mod:`kvledger.engines.sglang.scheduler.reenact`). The long hunts are ``deep``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.engines.sglang_scheduler.test_scheduler_seeds import _release_or_skip, _run

REPROS = Path(__file__).resolve().parents[3] / "kvledger/engines/sglang/scheduler/repros"
REPRO = REPROS / "issue12432.json"
MACHINE_REPRO = REPROS / "issue12432_machine.json"  # the Hypothesis machine's shrunk failure
NAMED = "names mamba [0] in its mamba_pool_idx, which are free (used after its free) (I-HANDLE-OWNED)"
ANY_SLOT = re.compile(r"names mamba \[\d+\] in its mamba_pool_idx, which are free \(used after its free\)")


@pytest.fixture(scope="module")
def ci_post1() -> dict[str, Any]:
    _release_or_skip("0.5.5.post1")
    return _run("ci", "--release", "0.5.5.post1", "--seeds", "2", "--ops", "120")


@pytest.fixture(scope="module")
def ci_post2() -> dict[str, Any]:
    _release_or_skip("0.5.5.post2")
    return _run("ci", "--release", "0.5.5.post2", "--seeds", "2", "--ops", "120")


def test_repro_file_is_the_shrunk_hunt() -> None:
    saved = json.loads(REPRO.read_text())
    assert saved["issue"] == "#12432" and saved["release_with_bug"] == "0.5.5.post1"
    assert saved["fixed_in"] == "0.5.5.post2"
    assert saved["ops"][0][0] == "arrive" and len(saved["ops"]) <= 5, saved["ops"]
    assert len(saved["ops"][0][2]) > 16  # longer than one chunk (chunked_prefill_size 16): two chunks


def test_12432_repro_fails_in_post1_naming_the_invariant(ci_post1: dict[str, Any]) -> None:
    found = ci_post1["replay"]["finding"]
    saved = json.loads(REPRO.read_text())
    assert found is not None and found["kind"] == saved["expected_kind"] == "ledger-identity", found
    assert found["message"].splitlines()[0] == saved["expected"]
    assert NAMED in found["message"]
    # the evidence: the slot's history ends with the scheduler freeing it while the request names it
    assert found["message"].rstrip().endswith("mamba free: caller[req.running] -> free_list[free]")


def test_machine_repro_fails_in_post1_and_is_clean_in_post2(
    ci_post1: dict[str, Any], ci_post2: dict[str, Any]
) -> None:
    saved = json.loads(MACHINE_REPRO.read_text())
    found = ci_post1["replay_machine"]["finding"]
    assert found is not None and found["message"].splitlines()[0] == saved["expected"], found
    assert ANY_SLOT.search(found["message"])
    assert ci_post2["replay_machine"]["finding"] is None, ci_post2["replay_machine"]


def test_budgeted_hunt_finds_12432_in_post1(ci_post1: dict[str, Any]) -> None:
    hunt = ci_post1["hunt"]
    assert hunt["finding"] is not None and ANY_SLOT.search(hunt["finding"]["message"]), hunt
    assert hunt["repro_ops"] <= hunt["ops"] and ANY_SLOT.search(hunt["repro_finding"]["message"])


def test_12432_repro_and_budget_are_clean_in_post2(ci_post2: dict[str, Any]) -> None:
    assert ci_post2["replay"]["finding"] is None, ci_post2["replay"]
    hunt = ci_post2["hunt"]
    assert hunt["finding"] is None, hunt
    assert hunt["ops"] == 240 and hunt["requests"] > 50, hunt


def test_putting_the_bug_back_into_post2_is_named(ci_post2: dict[str, Any]) -> None:
    found = ci_post2["put_back"]["finding"]
    assert found is not None and NAMED in found["message"], found


@pytest.mark.deep
def test_deep_hunt_finds_12432_in_post1_and_post2_is_clean_at_the_same_budget() -> None:
    _release_or_skip("0.5.5.post1")
    _release_or_skip("0.5.5.post2")
    bad = _run("hunt", "--release", "0.5.5.post1", "--seeds", "8", "--ops", "200")
    assert bad["finding"] is not None and ANY_SLOT.search(bad["finding"]["message"]), bad
    good = _run("hunt", "--release", "0.5.5.post2", "--seeds", "40", "--ops", "400")
    assert good["finding"] is None and good["ops"] == 16_000, good


@pytest.mark.deep
def test_deep_machine_finds_12432_in_post1_and_post2_is_clean_at_the_same_budget() -> None:
    _release_or_skip("0.5.5.post1")
    _release_or_skip("0.5.5.post2")
    bad = _run("machine", "--release", "0.5.5.post1", "--examples", "50", "--ops", "40")
    assert bad["finding"] is not None and ANY_SLOT.search(bad["finding"]["message"]), bad
    good = _run("machine", "--release", "0.5.5.post2", "--examples", "50", "--ops", "40")
    assert good["finding"] is None, good


@pytest.mark.parametrize("release", ["post1", "post2"])
def test_pd_attach_controls_name_planted_faults(
    release: str, ci_post1: dict[str, Any], ci_post2: dict[str, Any]
) -> None:
    controls = (ci_post1 if release == "post1" else ci_post2)["attach"]
    accounts = controls["identity"]["accounts"]
    for pool in ("kv", "req", "mamba"):  # the chunked request's ids sit in its queue's account
        assert accounts[pool].get("sched.chunked", 0) >= 1, accounts
    for name in ("foreign_mamba_free", "foreign_row_free"):
        fault = controls[name]
        assert fault["caught"] and "owner req#a[sched.chunked]" in fault["message"], fault
        assert "(I-NODUP-FREE / I-EXCLUSIVE)" in fault["message"]
    leak = controls["leak"]
    if release == "post1":  # the next step continues the chunked request: #12432 fires before the step ends
        assert leak["caught"] and ANY_SLOT.search(leak["message"]), leak
    else:
        assert (
            leak["caught"]
            and f"mamba [{leak['slot']}] were handed out and no live request" in leak["message"]
        )
    assert controls["detach"] == {"left": [], "pool_wrapped": []}
