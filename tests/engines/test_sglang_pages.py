"""SGLang's paged KV path driven with unaligned lengths (``drive_pages``): clean on SGLang's own code, and a
bug planted into SGLang's paged ``free`` (a scoped monkeypatch: the partial last page dropped) is found by
the same generic machine at the same budget, named at the call (issue 37: the drivers used to allocate and
free whole pages only, so a partial page was never reached)."""

from __future__ import annotations

from typing import Any

import pytest

from kvledger.engines.sglang import build
from kvledger.engines.sglang.drive_pages import hunt

BUDGET = 40  # examples of 30 steps each; found in the first few (the planted bug fires on any partial free)


def _free_dropping_the_partial_last_page(original: Any) -> Any:
    def free(self: Any, free_index: Any, *args: Any, **kwargs: Any) -> Any:
        n = free_index.numel()
        return original(self, free_index[: n - n % self.page_size], *args, **kwargs)

    return free


def test_the_paged_request_machine_runs_clean_on_sglangs_own_code(sgl: Any) -> None:
    assert hunt(BUDGET) == {"found": None, "steps": []}


@pytest.mark.fires("I-COUNT")
def test_a_paged_free_that_drops_the_partial_last_page_is_found(
    sgl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = type(build.token_allocator(8, 2))  # SGLang's PagedTokenToKVPoolAllocator
    monkeypatch.setattr(cls, "free", _free_dropping_the_partial_last_page(cls.free))
    result = hunt(BUDGET)
    assert result["found"] is not None and "I-COUNT" in result["found"], result
    assert "SGLang's free list grew by" in result["found"]
    assert any(step.startswith("state.admit(") for step in result["steps"]), result["steps"]


@pytest.mark.deep
@pytest.mark.timeout(3600)
def test_the_paged_request_machine_runs_clean_at_a_long_budget(sgl: Any) -> None:
    assert hunt(1000, 40) == {"found": None, "steps": []}
