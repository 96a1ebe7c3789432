"""PD runs recorded and audited (issue 27 item 2): one event log per instance, with the metadata-slot pool
and the PD queues and leases as request states; a recorded run audits clean, and a bug planted in either
log stops the audit at its event, naming the request, the pool and the ids.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvledger.audit import PDRecorder, audit_lines
from kvledger.contracts.errors import InvalidArgument
from kvledger.reference.disagg import DECODE, PREFILL, Component, Fault
from tests.audit._logs import events, first
from tests.disagg.harness import build, pd_spec
from tests.levels import ledgers

PROMPTS = {rid: [5, 5, 5, 5, 5, 5, 5, 5, rid % 3, rid, rid + 1, *range(rid)] for rid in range(8)}
V1 = {"page_size": 1}
V2 = {"page_size": 4, "mamba_strategy": "extra_buffer", "mamba_chunk_size": 4, "mamba_track_interval": 8}
CACHE = {"page_size": 1, "decode_radix_cache": True}  # the decode radix cache (issue 27 item 4)


def record_pd(setup: dict[str, object], *, faults: bool = True) -> dict[str, list[str]]:
    """Both instances' logs of a small PD run with a hung KV message, a decode abort mid-transfer (a
    lease), a prefill abort and a dropped state message, run to quiescence."""
    system = build(ledgers(pd_spec(chunk=16, decode_running=2, **setup)))  # type: ignore[arg-type]
    outs = {PREFILL: io.StringIO(), DECODE: io.StringIO()}
    with PDRecorder(system, outs, source="tests"):
        for rid, prompt in PROMPTS.items():
            system.add_request(rid, prompt, 4)
        if faults:
            system.channel.inject(Component.KV, Fault.TIMEOUT)
            system.channel.inject(Component.MAMBA, Fault.DROP)
        for _ in range(4):
            system.step()
        system.abort(1, DECODE)
        system.abort(5, PREFILL)
        system.run_until_idle(3000)
    return {side: out.getvalue().splitlines() for side, out in outs.items()}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(V1, id="v1-page1"),
        pytest.param(V2, id="v2-page4"),
        pytest.param(CACHE, id="v1-decode-cache"),
    ],
)
def logs(request: pytest.FixtureRequest) -> dict[str, list[str]]:
    return record_pd(request.param)


def _states(lines: list[str]) -> set[str]:
    return {ev["state"] for ev in events(lines) if ev["ev"] == "req"}


def test_both_instance_logs_audit_clean_with_the_pd_queues_and_the_metadata_pool(
    logs: dict[str, list[str]],
) -> None:
    for side, lines in logs.items():
        report = audit_lines(lines)
        assert report.verdict == "clean", (side, report.violation)
        pools = {ev["pool"] for ev in events(lines) if ev["ev"] == "pool"}
        assert pools == {"kv", "req", "mamba", "metadata"}
        assert json.loads(lines[-1]) == {"ev": "end", "events": len(lines) - 1, "outcome": "completed"}
    assert {"pd.prefill.bootstrap", "pd.prefill.inflight", "released"} <= _states(logs[PREFILL])
    assert {"pd.decode.prealloc", "pd.decode.transfer", "pd.decode.waiting", "pd.decode.lease"} <= _states(
        logs[DECODE]
    )
    assert all(ev["pool"] != "metadata" or ev["ids"] for ev in events(logs[DECODE]) if ev["ev"] == "alloc")


def _leased_rid(lines: list[str]) -> int:
    return int(events(lines)[first(lines, ev="req", state="pd.decode.lease")]["rid"])


@pytest.mark.fires("I-LEDGER-AGREES")
def test_a_planted_metadata_slot_kept_after_the_commit_is_named_at_the_next_step(
    logs: dict[str, list[str]],
) -> None:
    """The decode gives the metadata slot back when it commits the transfer; drop that free and the
    instance's own terms (the slot is free) disagree with the events (the request still holds it)."""
    lines = logs[DECODE]
    i = first(lines, ev="free", pool="metadata")
    ev = json.loads(lines[i])
    planted = lines[:i] + lines[i + 1 :]
    step = next(j for j, e in enumerate(events(planted)) if j >= i and e["ev"] == "step")
    report = audit_lines(planted)
    assert report.violation_event == step + 1, report.violation
    assert "I-LEDGER-AGREES: [metadata]" in report.violation
    assert re.search(rf"{re.escape(ev['from'])}\[[\w.]+\] holds {re.escape(str(ev['ids']))}", report.violation)


@pytest.mark.fires("I-OWNER-RELEASE")
def test_a_planted_leak_under_a_decode_lease_names_the_leased_request(logs: dict[str, list[str]]) -> None:
    """Deferred release (#35049): the leased request frees its KV only when the sender acknowledged;
    drop that free and the audit stops at its release, the lease account in its history."""
    lines = logs[DECODE]
    rid = _leased_rid(lines)
    lease = first(lines, ev="req", rid=rid, state="pd.decode.lease")
    i = next(
        j
        for j, ev in enumerate(events(lines))
        if j > lease and ev["ev"] == "free" and ev["pool"] == "kv" and ev["from"] == f"req#{rid}"
    )
    planted = lines[:i] + lines[i + 1 :]
    report = audit_lines(planted)
    assert report.violation_event == first(planted, ev="req", rid=rid, state="released") + 1
    assert "I-OWNER-RELEASE" in report.violation and f"req#{rid}" in report.violation
    assert "pd.decode.lease" in report.violation, report.violation


@pytest.mark.fires("I-NODUP-FREE")
def test_a_planted_double_free_of_a_prefill_metadata_slot_stops_at_the_second_free(
    logs: dict[str, list[str]],
) -> None:
    lines = logs[PREFILL]
    i = first(lines, ev="free", pool="metadata")
    planted = [*lines[: i + 1], lines[i], *lines[i + 1 :]]
    report = audit_lines(planted)
    assert report.violation_event == i + 2, report.violation
    assert "I-NODUP-FREE" in report.violation and "[metadata]" in report.violation


@pytest.mark.fires("I-EXCLUSIVE")
def test_a_planted_foreign_free_on_the_decode_side_names_the_real_owner(logs: dict[str, list[str]]) -> None:
    lines = logs[DECODE]
    i = first(lines, ev="free", pool="kv")
    ev = json.loads(lines[i])
    real = ev["from"]
    ev["from"] = "req#7" if real != "req#7" else "req#6"
    report = audit_lines([*lines[:i], json.dumps(ev), *lines[i + 1 :]])
    assert report.violation_event == i + 1, report.violation
    assert "I-EXCLUSIVE" in report.violation and "(a foreign free)" in report.violation
    assert re.search(rf"owner {re.escape(real)}\[[\w.]+\]; the log says {ev['from']} holds it", report.violation)


@pytest.mark.fires("I-LEDGER-AGREES")
def test_prefill_terms_that_hide_the_inflight_queue_are_named(logs: dict[str, list[str]]) -> None:
    """SGLang's busy check counts only the running batch: terms that move the inflight queue's KV into
    the free list still sum to the size, and the audit names the account the events put it in."""
    lines = logs[PREFILL]
    i = next(
        j for j, ev in enumerate(events(lines)) if ev["ev"] == "step" and "pd.prefill.inflight" in ev["terms"]["kv"]
    )
    ev = json.loads(lines[i])
    kv = ev["terms"]["kv"]
    kv["free"] = kv.get("free", 0) + kv.pop("pd.prefill.inflight")
    report = audit_lines([*lines[:i], json.dumps(ev), *lines[i + 1 :]])
    assert report.violation_event == i + 1
    assert "I-LEDGER-AGREES: [kv]" in report.violation and "pd.prefill.inflight" in report.violation


@pytest.mark.fires("I-OWNER-RELEASE")
def test_a_planted_tracking_slot_leak_on_the_v2_decode_side_is_named() -> None:
    lines = record_pd(V2, faults=False)[DECODE]
    allocs = [
        (j, ev) for j, ev in enumerate(events(lines)) if ev["ev"] == "alloc" and ev["pool"] == "mamba"
    ]
    owner = allocs[1][1]["to"]  # the request's second Mamba slot: its tracking slot (V2)
    assert allocs[0][1]["to"] == owner
    slot = allocs[0][1]["ids"]  # the tracking slots are allocated first (decode _allocate)
    i = next(
        j
        for j, ev in enumerate(events(lines))
        if ev["ev"] == "free" and ev["pool"] == "mamba" and ev["from"] == owner and ev["ids"] == slot
    )
    planted = lines[:i] + lines[i + 1 :]
    report = audit_lines(planted)
    assert "I-OWNER-RELEASE" in report.violation and f"leaked {slot}" in report.violation, report.violation


def test_pd_recorder_refuses_bad_outputs_and_installs_nothing() -> None:
    system = build(ledgers(pd_spec()))
    with pytest.raises(InvalidArgument):
        PDRecorder(system, {PREFILL: io.StringIO()})
    with pytest.raises(InvalidArgument):
        PDRecorder(system, {PREFILL: io.StringIO(), DECODE: object()})  # type: ignore[dict-item]
    assert all(pool.ledger.observer is None for pool in system.prefill.accounting.pools_by_name().values())
    assert all(pool.ledger.observer is None for pool in system.decode.accounting.pools_by_name().values())


def test_simulate_pd_record_writes_one_log_per_instance_that_audits_clean(tmp_path: Path) -> None:
    """The process's behaviour: files written, exit codes (a subprocess)."""
    log = tmp_path / "run.jsonl"
    cli = [sys.executable, "-m", "kvledger"]
    small = ["--gsp-num-groups", "2", "--gsp-prompts-per-group", "3", "--no-plot", "--no-progress"]
    faults = ["--pd-fault-rate", "0.1", "--pd-abort-rate", "0.1"]
    done = subprocess.run([*cli, "simulate", *small, *faults, "--pd", "--record", str(log)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert not log.exists()
    for side in (PREFILL, DECODE):
        path = tmp_path / f"run.{side}.jsonl"
        assert f"event log written to {path}" in done.stdout.decode()
        audit = subprocess.run([*cli, "audit", str(path)], capture_output=True)
        assert audit.returncode == 0 and b"clean" in audit.stdout, audit.stdout.decode()


def test_a_decode_radix_cache_run_logs_the_decode_tree_and_its_adoptions() -> None:
    """With the decode radix cache the decode log has a tree: finished requests' KV adopted by nodes, and
    later requests of the same prefix matching it (their prefix never appears among their own ids)."""
    logs = record_pd(CACHE, faults=False)
    decode = events(logs[DECODE])
    assert any(ev["ev"] == "tree" for ev in decode)
    for side in (PREFILL, DECODE):
        report = audit_lines(logs[side])
        assert report.verdict == "clean", (side, report.violation)
    adopted = [ev for ev in decode if ev["ev"] == "move" and str(ev["to"]).startswith("node") and ev["pool"] == "kv"]
    assert adopted, "no KV of a finished decode request was adopted by the decode tree"
    assert {"insert", "lock", "unlock"} <= {ev["ev"] for ev in decode}  # a later request locked a prefix
