"""Every PD exhibit of the museum (``kvledger.museum``): caught by its check when put back, fine without.

Each test runs one scenario twice: inside the exhibit's ``installed()`` block the named invariant fires at the
first bad step with a message naming the ids and holders; outside it the same scenario runs to
quiescence with the identities, the leases and the oracle holding. (Taking a fix out of the reference by
hand makes the "fixed" half fail the same way: the re-enactment is exactly that fix reverted.)
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvledger.contracts import switch
from kvledger.contracts.errors import ContractViolation
from kvledger.museum import EXHIBITS, exhibit
from kvledger.reference.disagg import DECODE, PREFILL, Component, Fault, PDSystem
from kvledger.reference.scheduler import ReqState
from tests.disagg import seed_12432
from tests.disagg.harness import build, expected, pd_spec

ROOT = Path(__file__).resolve().parents[2]
needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")


def _reenacted(bug_id: str, on: bool) -> contextlib.AbstractContextManager[None]:
    return exhibit(bug_id).installed() if on else contextlib.nullcontext()


def _finish_and_check(system: PDSystem, max_steps: int = 500) -> None:
    system.run_until_idle(max_steps)
    system.check_quiescent()
    for p, d in system.pairs.values():
        assert p.state.is_done and d.state.is_done
        if d.state is ReqState.FINISHED:
            assert d.output_ids == expected(system, d.origin_input_ids, d.max_new_tokens)


def _step_until(system: PDSystem, cond: Callable[[], bool], limit: int = 100) -> None:
    for _ in range(limit):
        if cond():
            return
        system.step()
    raise AssertionError(f"condition not reached in {limit} steps: {system.describe()}")


def test_the_museum_entries_are_self_describing() -> None:
    pd = {e.id: e for e in EXHIBITS if e.machine == "pd"}
    assert set(pd) >= {"B4", "B10", "B11", "N4", "N4-reader", "N6a", "N9", "N5"}
    for bug_id, bug in pd.items():
        assert bug.upstream and bug.title and bug.mechanism and bug.replaces and bug.breaks[0].startswith("I-")
        doc = (bug.reenact.__doc__ if bug.reenact is not None else "") or ""
        assert bug_id.split("-")[0] in doc and "#" in doc, f"{bug_id}: docstring must name the id and thread"


# ------------------------------------------------------------------ B4: the seed (#12432 / #12994)
@needs_contracts
@pytest.mark.fires("I-HANDLE-OWNED")
def test_b4_seed_caught_at_the_first_chunk_boundary_naming_slot_holder_and_moves() -> None:
    out = seed_12432.run("kvledger")
    msg = out["caught"]
    assert msg is not None and "I-HANDLE-OWNED" in msg, out
    assert "prefill.req#2" in msg and ".mamba_pool_idx names mamba id" in msg, msg
    assert "owned by free_list[free]" in msg
    assert (
        "alloc: free_list[free] -> prefill.req#2" in msg and "free: prefill.req#2" in msg
    )  # the slot's moves
    # The first chunk boundary: the step that schedules the second (and last) chunk of request 2.
    assert out["finished"] == 2  # both warm-ups went through; nothing of request 2 got past its boundary


def _run_without_contracts(mode: str) -> dict[str, object]:
    env = dict(os.environ, KVLEDGER_CONTRACTS="0", PYTHONPATH=str(ROOT))
    line = subprocess.run(
        [sys.executable, "-m", "tests.disagg.seed_12432", mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.strip().splitlines()[-1]
    out: dict[str, object] = json.loads(line)
    return out


def test_b4_seed_legacy_check_sees_only_the_later_over_free_of_the_log() -> None:
    """SGLang's late-2025 idle check, in a process with kvledger's contracts off and SGLang's pool semantics:
    it fires only after the request left the inflight queue, with the log's numbers."""
    legacy = _run_without_contracts("legacy")
    assert legacy["caught"] is None  # nothing of kvledger's ran
    assert legacy["mamba"] == [seed_12432.LOG_MAMBA_AVAILABLE, seed_12432.LOG_MAMBA_EVICTABLE, 476]
    assert "mamba_available_size=473, mamba_evictable_size=4" in legacy["legacy"]
    assert "mamba_protected_size()=0" in legacy["legacy"]
    if switch.ENABLED:
        assert seed_12432.run("kvledger")["caught_step"] < legacy["legacy_step"]


def test_b4_seed_release_build_count_identities_catch_it_before_the_legacy_check() -> None:
    """The same process with kvledger's count identities on (what every contracts-off build keeps): the
    over-free is an identity failure naming the slot's two holders, before SGLang's idle check fires."""
    counted = _run_without_contracts("counted")
    legacy = _run_without_contracts("legacy")
    msg = counted["caught"]
    assert isinstance(msg, str) and "I-COUNT" in msg and "over-free" in msg and "[mamba]" in msg, counted
    assert "prefill.req#2" in msg and "count identities of a build with contracts off" in msg
    assert counted["legacy"] is None
    assert isinstance(counted["caught_step"], int) and isinstance(legacy["legacy_step"], int)
    assert counted["caught_step"] < legacy["legacy_step"]


def test_b4_fix_12994_passes_and_the_legacy_check_agrees() -> None:
    out = seed_12432.run("fixed")
    assert out["caught"] is None and out["legacy"] is None and out["finished"] == 3 and out["outputs_ok"], out


# ------------------------------------------------------------------ B10: #9817
def _prebuilt_behind_a_running_request(system: PDSystem) -> int:
    """Decode runs one request at a time: the second one is transferred and waits, prebuilt."""
    system.add_request(0, [1, 2, 3, 4], 20)
    _step_until(system, lambda: bool(system.decode.running))
    system.add_request(1, [5, 6, 7, 8], 4)
    _step_until(system, lambda: system.pairs[1][1].state is ReqState.PREBUILT)
    return 1


@needs_contracts
@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(True, marks=pytest.mark.fires("I-OWNER-RELEASE"), id="reenacted"),
        pytest.param(False, id="fixed"),
    ],
)
def test_b10_decode_abort_of_a_prebuilt_request(bug: bool) -> None:
    with _reenacted("B10", bug):
        system = build(decode_running=1)
        rid = _prebuilt_behind_a_running_request(system)
        d = system.pairs[rid][1]
        row = d.req_pool_idx
        if bug:
            with pytest.raises(
                ContractViolation, match=r"I-OWNER-RELEASE: decode.req#1\[pd.decode.waiting\] ended"
            ):
                system.abort(rid, DECODE)
            return
        assert system.abort(rid, DECODE)
        assert d.released and system.decode.req_to_token_pool.ledger.owner_of(row).kind == "free_list"
        _finish_and_check(system)


# ------------------------------------------------------------------ B11: #19002
@needs_contracts
@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(True, marks=pytest.mark.fires("I-SIZING"), id="reenacted"),
        pytest.param(False, id="fixed"),
    ],
)
def test_b11_decode_mamba_pool_must_cover_every_row(bug: bool) -> None:
    with _reenacted("B11", bug):
        spec = pd_spec(decode_running=4, decode_mamba=4)  # 4 running + 8 pre-allocated rows
        if bug:
            with pytest.raises(
                ContractViolation, match=r"I-SIZING: the decode Mamba pool has 4 slots for 12 rows"
            ):
                build(spec)
            return
        system = build(spec)
        assert system.decode.mamba_pool.size == 12 == system.decode.req_to_token_pool.size


# ------------------------------------------------------------------ N4: #24527, #38961
@needs_contracts
@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(True, marks=pytest.mark.fires("I-WRITER-LEASE"), id="reenacted"),
        pytest.param(False, id="fixed"),
    ],
)
def test_n4_decode_abort_mid_transfer_pages_reused_while_the_write_lands(bug: bool) -> None:
    with _reenacted("N4", bug):
        system = build(tree="none", page_size=4, hybrid=False, prefill_kv=128, decode_kv=32, decode_running=2)
        # Every message of request 0 (two KV chunks, the metadata) stays in flight for a while.
        system.channel.inject(Component.KV, Fault.DELAY, times=2)
        system.channel.inject(Component.META, Fault.DELAY)
        system.add_request(0, list(range(10, 22)), 3)
        _step_until(system, lambda: system.pairs[0][0].state is ReqState.INFLIGHT)
        assert system.pairs[0][1].state is ReqState.TRANSFER
        pages = set(system.decode.kv_allocator.ledger.holdings(system.pairs[0][1].owner))
        system.abort(0, DECODE)
        system.add_request(1, list(range(40, 52)), 3)  # the paged pool hands back the freed pages first
        if bug:
            with pytest.raises(ContractViolation, match=r"I-WRITER-LEASE: Message#\d+\(room 1, kv") as exc:
                _step_until(system, lambda: False, limit=10)
            assert "decode.req#1" in str(exc.value)  # the pages went to the next request
            assert any(f"id {p}," in str(exc.value) for p in pages)
            return
        lease = system.pairs[0][1]
        assert lease.owner.account.name == "pd.decode.lease"
        assert set(system.decode.kv_allocator.ledger.holdings(lease.owner)) == pages  # not reusable yet
        _finish_and_check(system)
        assert system.pairs[1][1].state is ReqState.FINISHED and system.decode.pd_stats.leases == 1


@needs_contracts
@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(True, marks=pytest.mark.fires("I-WRITER-LEASE"), id="reenacted"),
        pytest.param(False, id="fixed"),
    ],
)
def test_n4_prefill_abort_while_a_send_still_reads(bug: bool) -> None:
    with _reenacted("N4-reader", bug):
        system = build()
        system.channel.inject(Component.MAMBA, Fault.DELAY)  # the state's send reads the working slot late
        system.add_request(0, list(range(10, 20)), 3)
        _step_until(system, lambda: system.pairs[0][0].state is ReqState.INFLIGHT)
        p = system.pairs[0][0]
        assert p.mamba_pool_idx is not None
        slot = int(p.mamba_pool_idx[0])
        system.abort(0, PREFILL)
        if bug:
            with pytest.raises(ContractViolation, match=r"I-WRITER-LEASE: .* may still read prefill") as exc:
                _step_until(system, lambda: False, limit=3)
            assert "no live request (already released)" in str(exc.value)
            return
        assert p.owner.account.name == "pd.prefill.lease"
        assert system.prefill.mamba_pool.ledger.owner_of(slot) is p.owner
        _finish_and_check(system)
        assert system.prefill.pd_stats.leases == 1


# ------------------------------------------------------------------ N5: sglang-omni #2080
@needs_contracts
@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(True, marks=pytest.mark.fires("I-IDLE-IDENTITY"), id="reenacted"),
        pytest.param(False, id="fixed"),
    ],
)
def test_n5_idle_work_must_wait_for_leases(bug: bool) -> None:
    with _reenacted("N5", bug):
        system = build()
        system.channel.inject(Component.KV, Fault.DELAY)
        system.add_request(0, list(range(10, 22)), 3)
        _step_until(system, lambda: any(True for _ in system.channel.in_flight()))
        if bug:  # the blind predicate lets idle-only work (here the scheduler's own idle checks) through
            with pytest.raises(
                ContractViolation, match=r"I-IDLE-IDENTITY: quiescent but held=\{'pd.decode.lease'"
            ):
                system.abort(0, DECODE)
            return
        system.abort(0, DECODE)  # decode holds its pages under a lease until the write drains
        assert system.decode.lease_queue
        assert not system.decode.is_quiescent() and not system.is_quiescent()
        with pytest.raises(ContractViolation, match="outside quiescence"):
            system.decode.accounting.check_quiescent()
        _finish_and_check(system)


# ------------------------------------------------------------------ N6a: #28236
@needs_contracts
@pytest.mark.parametrize(
    "bug",
    [pytest.param(True, marks=pytest.mark.fires("I-DRAIN"), id="reenacted"), pytest.param(False, id="fixed")],
)
def test_n6a_decode_abort_must_free_the_prefill_waiting_entry(bug: bool) -> None:
    with _reenacted("N6a", bug):
        system = build(
            tree="none",
            prefill_rows=1,
            chunk=4,
            prefill_kv=400,
            decode_kv=400,
            max_context_len=200,
            vocab_size=256,
        )
        system.add_request(0, list(range(100, 220)), 2)  # 30 chunks: holds the only prefill row
        system.add_request(1, [1, 2, 3], 2)
        _step_until(system, lambda: system.pairs[1][0].state is ReqState.WAITING)
        waiting = system.pairs[1][0]
        meta = waiting.metadata_idx
        system.abort(1, DECODE)
        if bug:
            with pytest.raises(ContractViolation, match=r"I-DRAIN: request 1 was aborted") as exc:
                _step_until(system, lambda: False, limit=40)
            assert "prefill.req#1[req.waiting] in the prefill waiting queue" in str(exc.value)
            assert f"'metadata': [{meta}]" in str(exc.value)
            return
        _step_until(system, lambda: 1 not in system.undrained, limit=system.channel.config.drain_bound)
        assert waiting.state is ReqState.ABORTED and waiting.metadata_idx is None
        _finish_and_check(system)


# ------------------------------------------------------------------ N9: #30890
@needs_contracts
@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(True, marks=pytest.mark.fires("I-TRANSFER-ATOMIC"), id="reenacted"),
        pytest.param(False, id="fixed"),
    ],
)
def test_n9_a_transfer_missing_its_state_never_commits(bug: bool) -> None:
    with _reenacted("N9", bug):
        system = build()
        system.channel.inject(Component.MAMBA, Fault.DROP)  # the state is lost; the metadata lands
        system.add_request(0, list(range(10, 20)), 3)
        if bug:
            with pytest.raises(
                ContractViolation, match=r"I-TRANSFER-ATOMIC: decode.req#0.*\['mamba state'\]"
            ):
                system.run_until_idle(100)
            return
        _finish_and_check(system)
        p, d = system.pairs[0]
        assert d.state is ReqState.ABORTED and d.finish_reason == "transfer timeout"  # failed closed
        assert p.state is ReqState.FINISHED  # the sender never knew
