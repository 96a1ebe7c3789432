"""Issue 17: what a finished request leaves behind is released, counted by live objects (never by time).

A long contract-enabled run must not keep per-request state: after a request ends, no ledger keeps its
owner registered, the accounting stops following it, its move-log entries do not reference it, and the
scheduler keeps it in full only within ``finished_window``. Weak references to every request and owner
count what is still alive; serving twice as many requests must not leave more alive.
"""

from __future__ import annotations

import dataclasses
import gc
import weakref
from typing import Any

import pytest

from kvledger.contracts import ledger as ledger_module
from kvledger.contracts import switch
from kvledger.contracts.owners import Owner
from kvledger.reference.engine import EngineSpec, build_engine
from tests.scheduler.harness import ledgers

pytestmark = pytest.mark.skipif(not switch.ENABLED, reason="the accounting follows requests with contracts on")

WINDOW = 4
HISTORY = 64


def _serve(n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[tuple[Any, int]]]:
    """Serve ``n`` requests sharing a prefix (cache hits, evictions, copy-on-write) to quiescence."""
    monkeypatch.setattr(ledger_module, "DEFAULT_HISTORY", HISTORY)
    spec = EngineSpec(
        kv_tokens=96, rows=4, mamba_slots=6, max_running=3, chunk=8, max_prefill=32, mamba_strategy="no_buffer"
    )  # Mamba V1
    sched = build_engine(ledgers(spec))
    sched.config = dataclasses.replace(sched.config, finished_window=WINDOW)
    refs: list[tuple[Any, int]] = []  # a weak reference to each request, and its owner's serial
    for rid in range(n):
        req = sched.add_request(rid, [1, 2, 3, 4, 5, 6, rid % 7, rid], max_new_tokens=3)
        refs.append((weakref.ref(req), req.owner.serial))
        del req
        if rid % 2:
            sched.step()
    sched.run_until_idle()
    sched.accounting.check_quiescent()
    return sched, refs


def _owners_alive(serials: set[int]) -> set[int]:
    """Serials of the live owners among ``serials`` (owners are GC-tracked, so the collector sees them)."""
    gc.collect()
    return {o.serial for o in gc.get_objects() if type(o) is Owner and o.serial in serials}


def _alive(refs: list[tuple[Any, int]]) -> tuple[int, int]:
    gc.collect()
    return sum(r() is not None for r, _ in refs), len(_owners_alive({s for _, s in refs}))


@pytest.mark.parametrize("n", [40, 80])
def test_finished_requests_and_their_owners_are_released(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    sched, refs = _serve(n, monkeypatch)
    assert sched.stats.finished == n and sched.ended_count() == n
    pools = [sched.kv_allocator, sched.req_to_token_pool, sched.mamba_pool]
    for pool in pools:
        ledger = pool.ledger
        registered = ledger.registered()
        assert not [o for o in registered if o.kind == "req"], f"{ledger!r} keeps request owners registered"
        assert ledger.logged_moves() <= HISTORY, "the move log outgrew its ring"
        leaked = [x for entry in ledger._log._entries for x in entry if isinstance(x, Owner)]
        assert not leaked, "the move log keeps owners alive"
    assert sched.accounting.tracked_requests() == 0
    assert len(sched.requests) == WINDOW and len(sched.done) == WINDOW
    held_by_batch = len(sched.last_prefill.reqs) if sched.last_prefill is not None else 0
    reqs_alive, owners_alive = _alive(refs)
    assert reqs_alive <= WINDOW + held_by_batch, f"{reqs_alive} of {n} finished requests still alive"
    assert owners_alive <= WINDOW + held_by_batch, f"{owners_alive} of {n} request owners still alive"
    # The oldest requests are gone whatever else is kept.
    oldest = refs[: n // 4]
    assert all(r() is None for r, _ in oldest)
    assert not _owners_alive({s for _, s in oldest})


def test_the_window_keeps_the_last_requests_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    sched, _ = _serve(12, monkeypatch)
    kept = list(sched.done)
    assert len(kept) == WINDOW
    assert [r.finish_step for r in kept] == sorted(r.finish_step for r in kept)  # the last ones to end
    assert all(len(r.output_ids) == 3 and r.state.is_done for r in kept)
    assert set(sched.requests) == {r.rid for r in kept}
