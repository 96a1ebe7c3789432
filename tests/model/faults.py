"""Deliberate data-plane faults, and a schedule that exposes them to the oracle.

Run as a script (``python -m tests.model.faults FAULT``) it prints one JSON line: which requests'
outputs differ from the same request run alone, and which contract (if any) fired first. The tests
run it in-process with contracts on and in a subprocess with ``KVLEDGER_CONTRACTS=0``, so the oracle is
shown to catch each fault on its own, not only the contracts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvledger.contracts.errors import ContractViolation, KVLedgerError
from kvledger.contracts.oracle import check_output_oracle
from kvledger.reference.radix import MambaRadixCache
from kvledger.reference.scheduler import ReqState, Scheduler
from tests.scheduler.harness import Setup, build, ledgers, model_expected_output

FAULTS = ("none", "skip_cow_copy", "stale_tombstone_state", "read_poisoned_slot")
PREFIX = list(range(10, 30))


@contextmanager
def injected(fault: str) -> Iterator[None]:
    """Patch the fault in for the duration of the block."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, name: str, value: Any) -> None:
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    if fault == "skip_cow_copy":  # match_prefix hands out a slot but never copies the state into it
        patch(MambaRadixCache, "_copy_state", lambda self, src, dst: None)
    elif fault == "stale_tombstone_state":  # a match through a tombstone tail, as if it had a state
        patch(MambaRadixCache, "_best_prefix", lambda self, nodes: len(nodes))
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def _free_a_running_slot_early(sched: Scheduler) -> None:
    """The request keeps pointing at a KV slot that was freed (and poisoned) under it."""
    req = next(r for r in sched.running if r.kv_allocated_len > r.cache_protected_len)
    slot = sched.req_to_token_pool.read(req.req_pool_idx, req.kv_allocated_len - 1, req.kv_allocated_len)
    sched.kv_allocator._free_unchecked(slot, req.owner, "fault: early free")


def _matches_alone(req: Any) -> bool:
    """The output oracle (I-OUTPUT-ORACLE) on one finished request."""
    try:
        check_output_oracle(
            req, req.output_ids, model_expected_output(req.origin_input_ids, req.max_new_tokens)
        )
    except ContractViolation:
        return False
    return True


def run_fault(fault: str, *, check_integrity: bool = True) -> dict[str, Any]:
    with injected(fault):  # ledgers on: debug builds poison freed slots
        sched = build(
            ledgers(
                Setup(
                    tree="mamba_radix",
                    hybrid=True,
                    model="tiny-hybrid",
                    kv_tokens=160,
                    rows=4,
                    mamba_slots=6,
                    chunk=8,
                    max_prefill=32,
                    max_context_len=96,
                    mamba_strategy="no_buffer",  # Mamba V1 (EngineSpec's default is V2)
                )
            )
        )
        sched.runner.check_integrity = check_integrity  # type: ignore[attr-defined]
        caught: str | None = None
        try:
            sched.add_request(0, PREFIX, 3)
            sched.run_until_idle(100)
            if fault == "stale_tombstone_state":
                sched.tree.evict_mamba(sched.tree.mamba_evictable_size())  # states gone, KV kept: tombstones
            sched.add_request(1, [*PREFIX, 5, 6], 4)
            sched.add_request(2, [*PREFIX[:12], 7], 4)
            if fault == "read_poisoned_slot":
                sched.step()
                sched.step()
                _free_a_running_slot_early(sched)
                # The identity would name the lie (so would a contracts-off build's count identities); let the
                # data show it.
                sched.accounting.enabled = sched.accounting.counting = False
            sched.run_until_idle(200)
        except (ContractViolation, KVLedgerError) as exc:
            caught = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        mismatched = [
            r.rid for r in sched.requests.values() if r.state is ReqState.FINISHED and not _matches_alone(r)
        ]
        return {"fault": fault, "mismatched": mismatched, "caught": caught}


if __name__ == "__main__":
    print(json.dumps(run_fault(sys.argv[1], check_integrity=sys.argv[2:] != ["--no-integrity"])))
