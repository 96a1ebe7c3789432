"""SGLang's real Scheduler (0.5.9, 0.5.10) on CPU: the #16067 repro, a budgeted hunt, a tag control.

Each release runs in its own subprocess (one SGLang per process; the import is most of the cost).
The full hunts are ``deep``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _release_or_skip(release: str) -> None:
    if not (Path(sys.prefix) / f"sglang-{release}" / "sglang").is_dir():
        reason = f"SGLang {release} is not installed beside the venv (bash scripts/setup_sglang.sh)"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def _run(*args: str) -> dict[str, Any]:
    return _run_with_log(*args)[0]


def _run_with_log(*args: str) -> tuple[dict[str, Any], str]:
    """``python -m kvledger.engines.sglang.scheduler ARGS`` in a subprocess: its ``KVLEDGER-JSON`` document
    and its standard error (the scheduler processes' log lines)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "kvledger.engines.sglang.scheduler", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("KVLEDGER-JSON ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].split(" ", 1)[1]), proc.stderr


@pytest.fixture(scope="module")
def ci_0_5_9() -> dict[str, Any]:
    _release_or_skip("0.5.9")
    return _run("ci", "--release", "0.5.9", "--seeds", "2", "--ops", "120")


@pytest.fixture(scope="module")
def ci_0_5_10() -> dict[str, Any]:
    _release_or_skip("0.5.10")
    return _run("ci", "--release", "0.5.10", "--seeds", "2", "--ops", "120")


def test_16067_repro_names_the_waiting_request_in_0_5_9(ci_0_5_9: dict[str, Any]) -> None:
    found = ci_0_5_9["replay"]["finding"]
    assert found is not None and found["kind"] == "sglang-check-wrong"
    assert found["message"] == "SGLang's check is wrong: slot 6 is held by waiting request r17"


def test_16067_repro_is_clean_in_0_5_10(ci_0_5_10: dict[str, Any]) -> None:
    assert ci_0_5_10["replay"]["finding"] is None


def test_budgeted_hunt_finds_16067_in_0_5_9(ci_0_5_9: dict[str, Any]) -> None:
    found = ci_0_5_9["hunt"]["finding"]
    assert found is not None and found["kind"] == "sglang-check-wrong", ci_0_5_9["hunt"]
    assert "held by waiting request" in found["message"]


def test_budgeted_hunt_is_clean_in_0_5_10(ci_0_5_10: dict[str, Any]) -> None:
    hunt = ci_0_5_10["hunt"]
    assert hunt["finding"] is None and hunt["ops"] == 2 * 120, hunt


@pytest.mark.parametrize("release", ["0.5.9", "0.5.10"])
def test_tags_catch_a_slot_shared_by_two_requests(
    release: str, ci_0_5_9: dict[str, Any], ci_0_5_10: dict[str, Any]
) -> None:
    alias = {"0.5.9": ci_0_5_9, "0.5.10": ci_0_5_10}[release]["alias"]
    assert alias["caught"], alias
    assert "Mamba slot" in alias["message"] and "shared" in alias["message"]


@pytest.mark.deep
def test_full_hunt_finds_16067_in_0_5_9() -> None:
    _release_or_skip("0.5.9")
    out = _run("hunt", "--release", "0.5.9", "--seeds", "40", "--ops", "400")
    assert out["finding"] is not None and out["finding"]["kind"] == "sglang-check-wrong", out


@pytest.mark.deep
def test_full_hunt_is_clean_in_0_5_10() -> None:
    # with SGLang's own pool sizing (3 Mamba slots per row); at 1:1 seed 9 ends in SGLang's "Can not alloc
    # mamba cache" (test_undersized_mamba_pool_is_classified_by_the_ledger)
    _release_or_skip("0.5.10")
    out = _run("hunt", "--release", "0.5.10", "--seeds", "40", "--ops", "400")
    assert out["finding"] is None and out["ops"] == 40 * 400, out


@pytest.mark.parametrize("release", ["0.5.9", "0.5.10"])
def test_undersized_mamba_pool_is_classified_by_the_ledger(
    release: str, ci_0_5_9: dict[str, Any], ci_0_5_10: dict[str, Any]
) -> None:
    found = {"0.5.9": ci_0_5_9, "0.5.10": ci_0_5_10}[release]["undersized"]["finding"]
    assert found is not None and found["kind"] == "pool-undersized", found
    assert "0 free, of 8" in found["message"] and "held by requests" in found["message"]
    assert all("running request" in who for who in found["owners"].values())


@pytest.mark.parametrize("release", ["0.5.9", "0.5.10"])
def test_attach_identity_adds_up_to_each_pool_size(
    release: str, ci_0_5_9: dict[str, Any], ci_0_5_10: dict[str, Any]
) -> None:
    identity = {"0.5.9": ci_0_5_9, "0.5.10": ci_0_5_10}[release]["attach"]["identity"]
    assert identity["steps"] >= 1
    for pool, terms in identity["accounts"].items():
        assert sum(terms.values()) == identity["sizes"][pool], (pool, terms)
    assert any(k.startswith("sched.") for k in identity["accounts"]["mamba"]), identity


@pytest.mark.parametrize("release", ["0.5.9", "0.5.10"])
def test_attach_names_a_foreign_free_and_a_leak_and_detaches(
    release: str, ci_0_5_9: dict[str, Any], ci_0_5_10: dict[str, Any]
) -> None:
    attach = {"0.5.9": ci_0_5_9, "0.5.10": ci_0_5_10}[release]["attach"]
    assert attach["foreign_free"]["caught"] and "owner req#a" in attach["foreign_free"]["message"], attach
    leak = attach["leak"]
    assert leak["caught"] and f"mamba [{leak['slot']}]" in leak["message"], leak
    assert "no live request names them" in leak["message"]
    assert attach["detach"]["left"] == []


def test_attach_audit_reads_no_stale_free_group(ci_0_5_10: dict[str, Any]) -> None:
    stale = ci_0_5_10["attach"]["stale_free_group"]
    assert stale["stale"], stale  # SGLang left the list filled after free_group_end
    assert stale["attach_audit"] == "passed", stale
    assert stale["watch_audit"] == "passed", stale  # the watch reads a group's list only while it is open
