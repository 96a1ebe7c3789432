"""The cache machine's life cycle on SGLang's real radix caches, kvledger's reference as the model."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvledger.engines.sglang.drive import SGLangCacheMachine


def drive(examples: int, steps: int) -> None:
    run_state_machine_as_test(
        SGLangCacheMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_sglang_caches_agree_with_kvledger_budgeted(sgl: Any) -> None:
    """CI's budget (a few seconds): RadixCache and UnifiedRadixCache (FULL), pages 1 and 4, watched."""
    drive(examples=25, steps=30)


@pytest.mark.deep
def test_sglang_caches_agree_with_kvledger_deep(sgl: Any) -> None:
    drive(examples=2000, steps=60)
