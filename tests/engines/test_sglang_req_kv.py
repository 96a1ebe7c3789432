"""SGLang 0.5.23's request path (``req.kv``, ``alloc_rows`` / ``free_rows``, the tree's ``checkpoint``,
``release_kv_cache``) driven by a generic machine under the attach (``drive_req_kv``): clean on the
installed release, and bugs planted into that path (scoped monkeypatches of SGLang's classes, the
install untouched) found by the same machine at the same budget, each under its invariant (issue 37:
the request machine drove only 0.5.11-0.5.13's ``cache_finished_req`` / ``free(req)``)."""

from __future__ import annotations

from typing import Any

import pytest

from kvledger.engines.sglang.drive_req_kv import STATS, hunt, req_kv_path

BUDGET = 40  # examples of 30 steps each (about 8 CPU s clean); each planted bug fires in the first few


@pytest.fixture
def base(sgl: Any) -> Any:
    """SGLang's ``BasePrefixCache`` (``free_kv_row``, the release's row free), on a release with ``req.kv``."""
    if req_kv_path() is None:
        pytest.skip(f"SGLang {sgl.version}: requests have no req.kv record (0.5.14 on)")
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache

    return BasePrefixCache


def test_the_req_kv_machine_runs_clean_on_sglangs_own_request_path(base: Any) -> None:
    STATS.clear()
    assert hunt(BUDGET) == {"found": None, "steps": []}
    # what it reached: partial pages on both sides, chunk checkpoints, both release kinds, free groups
    for kind in (
        "alloc_extend ending on a partial page",
        "alloc_decode opening a page",
        "checkpoint (chunk)",
        "release_kv_cache (finish)",
        "release_kv_cache (retract/abort)",
        "released with a partial last page",
        "admitted on a matched prefix",
        "free group",
        "alloc_rows",
    ):
        assert STATS[kind] > 0, (kind, dict(STATS))
    assert STATS["runs clean"] == BUDGET


def _free_kv_row_dropping_the_partial_last_page(original: Any) -> Any:
    """The planted leak: the release gives back its row's ranges less an unaligned tail (its last page)."""

    def free_kv_row(self: Any, kv: Any, ranges: list[tuple[int, int]]) -> None:
        ps = self.token_to_kv_pool_allocator.page_size
        cut = [(s, e - e % ps if e % ps and e - e % ps > s else e) for s, e in ranges]
        return original(self, kv, cut)

    return free_kv_row


@pytest.mark.fires("I-OWNER-RELEASE")
def test_a_release_that_keeps_the_partial_last_page_is_named_when_the_request_leaves(
    base: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "free_kv_row", _free_kv_row_dropping_the_partial_last_page(base.free_kv_row))
    result = hunt(BUDGET)
    assert result["found"] is not None and "I-OWNER-RELEASE" in result["found"], result
    assert "left the engine still holding" in result["found"]
    assert any(step.startswith("state.admit(") for step in result["steps"]), result["steps"]


def _free_kv_row_twice(original: Any) -> Any:
    """The planted double free: the release gives its row's ranges back twice."""

    def free_kv_row(self: Any, kv: Any, ranges: list[tuple[int, int]]) -> None:
        original(self, kv, ranges)
        original(self, kv, ranges)

    return free_kv_row


@pytest.mark.fires("I-NODUP-FREE")
def test_a_release_that_frees_its_row_twice_is_refused_before_sglangs_free_runs(
    base: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "free_kv_row", _free_kv_row_twice(base.free_kv_row))
    result = hunt(BUDGET)
    assert result["found"] is not None and "I-NODUP-FREE" in result["found"], result
    assert "free_segment" in result["found"]  # the row's range freed a second time, named at that call
