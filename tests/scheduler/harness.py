"""Scheduler set-ups for tests (``kvledger.reference.engine``), and the generation oracles."""

from __future__ import annotations

from hypothesis import settings

from kvledger.museum.machines.oracles import expected_output, model_expected_output
from kvledger.reference.engine import EngineSpec, build_engine
from tests.levels import ledgers

Setup = EngineSpec
build = build_engine

__all__ = ["Setup", "build", "expected_output", "ledgers", "long_fuzz_settings", "model_expected_output"]


def long_fuzz_settings(max_examples: int, stateful_step_count: int) -> settings:
    """Settings for the ``deep``-marked nightly fuzz runs: randomised, no database, blob printed."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=stateful_step_count,
        deadline=None,
        derandomize=False,
        database=None,
        print_blob=True,
    )
