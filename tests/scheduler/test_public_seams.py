"""Issue 36: the public seams the speculative step and the request side use instead of private names.

The speculative step calls the scheduler's public methods (``new_batch``, ``discards_result``,
``finishes``, ``finish``, ``settle_batch``); a match's copy-on-write slot is recorded by the request-side
holdings (``MambaSlotHoldings.set_cow``), not written by the cache path; a tree's KV ledger is read through
``RadixTreeBase.kv_ledger``; a PD decode refuses to retract to the host with a pool that has no state tensors.
"""

from __future__ import annotations

import ast
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvledger.contracts.errors import InvalidState
from kvledger.reference.disagg.decode import DecodeScheduler
from kvledger.reference.engine import EngineSpec, build_engine, build_parts
from kvledger.reference.scheduler import Scheduler
from kvledger.reference.scheduler.holdings import MambaSlotHoldings
from kvledger.reference.scheduler.spec_config import SpeculativeConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import house_counts  # noqa: E402


def _workload(s: Scheduler, n: int = 8, seed: int = 0) -> None:
    rng = random.Random(seed)
    base = [rng.randrange(100) for _ in range(24)]
    for i in range(n):
        s.add_request(i, [*base[: rng.randrange(8, 24)], rng.randrange(100)], rng.randrange(2, 12))


def test_the_speculative_step_names_no_private_member_of_another_object() -> None:
    tree = ast.parse((ROOT / "kvledger/reference/scheduler/speculative.py").read_text(encoding="utf-8"))
    assert house_counts.private_reach_through(tree) == 0


def test_the_speculative_results_go_through_the_museum_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    """B2 replaces ``Scheduler._discards_result``: the verify results must still ask it (via the public
    ``discards_result``), or the exhibit would not reach the speculative path."""
    asked: list[int] = []
    original = Scheduler._discards_result

    def counting(self: Scheduler, req: object) -> bool:
        asked.append(1)
        return bool(original(self, req))  # type: ignore[arg-type]

    monkeypatch.setattr(Scheduler, "_discards_result", counting)
    s = build_engine(EngineSpec(kv_tokens=1024, rows=8, mamba_slots=24, speculative=SpeculativeConfig(3, 1, 4)))
    _workload(s)
    s.run_until_idle()
    assert s.stats.finished == 8
    assert s.speculative is not None and s.speculative.stats.verify_batches > 0
    assert len(asked) >= s.speculative.stats.request_steps


def test_finishes_names_the_reason_and_finish_ends_the_request() -> None:
    s = build_engine(EngineSpec(eos_token_id=7))
    req = s.add_request(0, [1, 2, 3], 3)
    req.output_ids.append(5)
    assert not s.finishes(req, 5) and req.finish_reason is None
    req.output_ids.append(7)
    assert s.finishes(req, 7) and req.finish_reason == "stop"


def test_a_cow_slot_is_recorded_by_the_request_side(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded: list[tuple[int, torch.Tensor]] = []
    original = MambaSlotHoldings.set_cow

    def recording(self: MambaSlotHoldings, req: object, slot: torch.Tensor | None) -> None:
        assert slot is not None
        recorded.append((id(req), slot))
        original(self, req, slot)  # type: ignore[arg-type]

    monkeypatch.setattr(MambaSlotHoldings, "set_cow", recording)
    s = build_engine(EngineSpec(kv_tokens=1024, rows=8, mamba_slots=24, mamba_strategy="no_buffer"))
    prompt = list(range(10, 30))
    s.add_request(0, prompt, 1)  # finishes at once: the tree adopts its state at the prompt's end
    s.run_until_idle()
    assert not recorded
    later = s.add_request(1, [*prompt, 99], 2)  # its match ends at that node: the state is copied
    s.step()
    assert [r for r, _ in recorded] == [id(later)]
    assert later.mamba_pool_idx is recorded[0][1]
    s.run_until_idle()
    assert s.stats.finished == 2


def test_a_tree_names_its_kv_ledger() -> None:
    parts = build_parts(EngineSpec(tree="radix", hybrid=False))
    assert parts.tree is not None
    assert parts.tree.kv_ledger is parts.kv_allocator.ledger


def test_a_decode_without_state_tensors_refuses_to_retract_to_the_host() -> None:
    ids_only = SimpleNamespace(mamba_pool=object())
    with pytest.raises(InvalidState, match="exposes no state tensors"):
        DecodeScheduler._state_tensors(ids_only)  # type: ignore[arg-type]
