"""``benchmarks/fault_soak.py``: the soak's configurations build and run clean, and a run that loses
requests or finds a violation makes the script exit 1 (it is the evidence behind issue 42's soak)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fault_soak.py"


def _load_script() -> object:
    # registered in sys.modules before it runs: its dataclasses look their module up there
    spec = importlib.util.spec_from_file_location("bench_fault_soak", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fault_soak: Any = _load_script()


def test_every_configuration_runs_clean_for_a_few_hundred_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert fault_soak.main(["--steps", "600", "--checks", "owners"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["lost"] == 0 and summary["violations"] == 0
    assert {row["config"] for row in summary["configs"]} == {c.name for c in fault_soak.CONFIGS}
    assert summary["alloc_faults"] > 0 and summary["rollbacks"] > 0


def test_a_violation_fails_the_soak(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def violating(config: object, seed: int, checks: object) -> dict[str, object]:
        return {
            "steps": 10,
            "requests": 2,
            "lost": 1,
            "violation": "I-DRAIN: planted",
            "alloc_faults": 0,
            "rollbacks": 0,
        }

    monkeypatch.setattr(fault_soak, "run_once", violating)
    assert fault_soak.main(["--steps", "10", "--configs", "page1-mamba-v1"]) == 1
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["lost"] == 1 and summary["configs"][0]["first_violations"] == ["seed 0: I-DRAIN: planted"]
