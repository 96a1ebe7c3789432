"""The second seed (sglang#12432, catalogue B4) as a deterministic PD scenario, at the log's sizes.

A prefill instance with the Mamba radix cache and a Mamba pool of 476 slots (the log's
``req_to_token_pool.mamba_pool.size=476``) serves two short warm-up requests (each leaves one cached
state) and then a request whose prompt takes two chunks (its chunk boundary and its prompt end leave
two more): four cached states, the log's ``mamba_evictable_size=4``.

* ``run("kvledger")`` (contracts on, the late-2025 chunk path re-enacted): the step at which kvledger's
  checks fire, and their message.
* ``run("legacy")`` (run in a process with ``KVLEDGER_CONTRACTS=0``; the late-2025 chunk path and the
  pool's free without duplicate detection, as SGLang had them): SGLang's late-2025 idle check, called
  as its event loop did (no batch this step, inflight queue empty), and the step at which it fires:
  ``mamba_available_size=473 + mamba_evictable_size=4 = 477 > 476``. kvledger's release-build count
  identities are turned off for this mode: only SGLang's own check runs.
* ``run("counted")``: the same as ``legacy`` with the count identities every contracts-off build keeps:
  the over-free is an ``IdentityFailure`` (its ``caught`` message) before the legacy check fires.
* ``run("fixed")``: the 2026 path (#12994 / #17850); nothing fires and the legacy check passes too.

Run as a script (``python -m tests.disagg.seed_12432 MODE``) it prints one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

from kvledger.contracts import tree_checks
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.identity import LegacyCounters, LegacyLeakDetected, legacy_check_memory
from kvledger.museum.pd_bugs import b4_chunk_frees_mamba_slot, sglang_2025_mamba_pool
from kvledger.reference.disagg import PDSystem
from kvledger.reference.disagg.prefill import PrefillScheduler
from tests.disagg.harness import build, expected, pd_spec

LOG_MAMBA_SIZE = 476
LOG_MAMBA_AVAILABLE = 473
LOG_MAMBA_EVICTABLE = 4
WARMUPS = {0: list(range(100, 106)), 1: list(range(200, 206))}
CHUNKED = (2, list(range(300, 312)))  # 12 tokens with chunk 8: two chunks, one boundary


def build_system() -> PDSystem:
    return build(
        pd_spec(
            tree="mamba_radix",
            prefill_kv=4096,
            prefill_rows=2,
            prefill_mamba=LOG_MAMBA_SIZE,
            chunk=8,
            decode_kv=512,
            decode_running=4,
            vocab_size=512,  # the log's token ids run to 311: inside the vocabulary (I-TYPED-INPUT)
        )
    )


def legacy_counters(prefill: PrefillScheduler) -> LegacyCounters:
    """What SGLang's late-2025 ``_check_mamba_memory`` read (the tree's slots come from the tree itself)."""
    tree, mamba, kv = prefill.tree, prefill.mamba_pool, prefill.kv_allocator
    tree_slots = {int(n.mamba_value[0]) for n in tree_checks.collect_nodes(tree.root) if n.mamba_value is not None}
    return LegacyCounters(
        full_available_size=kv.available_size(),
        full_evictable_size=tree.full_evictable_size(),
        full_size=kv.size,
        full_protected_size=tree.full_protected_size(),
        mamba_available_size=mamba.available_size(),
        mamba_evictable_size=tree.mamba_evictable_size(),
        mamba_size=mamba.size,
        mamba_protected_size=tree.mamba_protected_size(),
        free_mamba_slots=frozenset(mamba.free_slots()),
        tree_mamba_slots=frozenset(tree_slots),
    )


def _legacy_idle_check(system: PDSystem) -> None:
    """Late-2025 PD prefill loop: the idle check runs when no batch was produced, unless requests are in
    flight (``self_check_during_idle`` returned early on a non-empty inflight queue)."""
    if system.last_prefill_batch is None and not system.prefill.inflight_queue:
        legacy_check_memory(legacy_counters(system.prefill))


def run(mode: str, max_steps: int = 200) -> dict[str, Any]:
    sglang_pool = mode in ("legacy", "counted")
    bug = b4_chunk_frees_mamba_slot() if mode != "fixed" else contextlib.nullcontext()
    pool = sglang_2025_mamba_pool() if sglang_pool else contextlib.nullcontext()
    out: dict[str, Any] = {"mode": mode, "caught_step": None, "caught": None, "legacy_step": None, "legacy": None}
    with bug, pool:
        system = build_system()
        if mode == "legacy":  # SGLang's build: only its own idle check, not kvledger's release-build counts
            system.prefill.accounting.counting = system.decode.accounting.counting = False
        try:
            for rid, prompt in [*WARMUPS.items(), CHUNKED]:  # one at a time: no batch shares a chunk budget
                system.add_request(rid, prompt, 3)
                _run(system, max_steps, legacy=mode != "kvledger")
        except ContractViolation as exc:
            out["caught_step"], out["caught"] = system.step_no, str(exc)
        except LegacyLeakDetected as exc:
            c = legacy_counters(system.prefill)
            out["legacy_step"], out["legacy"] = system.step_no, str(exc)
            out["mamba"] = [c.mamba_available_size, c.mamba_evictable_size, c.mamba_size]
        out["outputs_ok"] = all(
            d.output_ids == expected(system, d.origin_input_ids, d.max_new_tokens)
            for _, d in system.pairs.values()
            if d.state.value == "finished"
        )
        out["finished"] = sum(d.state.value == "finished" for _, d in system.pairs.values())
    return out


def _run(system: PDSystem, max_steps: int, *, legacy: bool) -> None:
    for _ in range(max_steps):
        if system.is_quiescent():
            return
        system.step()
        if legacy:
            _legacy_idle_check(system)
    raise AssertionError(f"not drained in {max_steps} steps: {system.describe()}")


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))
