"""SGLang's real components build on CPU and do their own bookkeeping (0.5.23 here, 0.5.20 in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from kvledger.engines.sglang import build

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_DIR = ROOT / ".venv" / "sglang-0.5.20"


def test_release_and_standins(sgl: Any) -> None:
    assert sgl.version == "0.5.23"
    assert sgl.has_unified_radix_cache and not sgl.has_mamba_radix_cache
    # only the documented stand-ins were synthesised; triton is the real package kvledger depends on
    assert set(sgl.standins) <= {"IPython", "tvm_ffi", "torchvision", "xgrammar", "triton"}
    import triton

    assert not getattr(triton, "__standin__", False)


@pytest.mark.parametrize("page", [1, 4])
def test_allocators(sgl: Any, page: int) -> None:
    alloc = build.token_allocator(16 * page, page)
    assert type(alloc).__name__ == ("TokenToKVPoolAllocator" if page == 1 else "PagedTokenToKVPoolAllocator")
    ids = alloc.alloc(3 * page)
    assert ids is not None and ids.numel() == 3 * page and int(ids.min()) >= page  # slot/page 0 reserved
    assert alloc.available_size() == 13 * page
    alloc.free(ids)
    assert alloc.available_size() == 16 * page


def test_request_and_mamba_pools(sgl: Any) -> None:
    rows = build.req_pool(4)
    got = rows.alloc_rows(2)
    assert got is not None and 0 not in got and rows.available_size() == 2
    hybrid = build.hybrid_req_pool(4, 6)
    assert type(hybrid.mamba_pool).__name__ == "MambaPool"
    slots = hybrid.mamba_allocator.alloc(2)
    assert slots is not None and hybrid.mamba_allocator.available_size() == 4
    hybrid.mamba_pool.copy_from(slots[:1], slots[1:])


def test_radix_cache(sgl: Any) -> None:
    alloc = build.token_allocator(32)
    tree = build.radix_cache(alloc, build.req_pool(4))
    ids = alloc.alloc(4)
    assert tree.insert(sgl.InsertParams(key=build.radix_key([1, 2, 3, 4]), value=ids)).prefix_len == 0
    m = tree.match_prefix(sgl.MatchPrefixParams(key=build.radix_key([1, 2, 9])))
    assert m.device_prefix_len == 2
    assert tree.evict(sgl.EvictParams(num_tokens=4)).num_tokens_evicted == 4
    assert alloc.available_size() == 32


@pytest.mark.parametrize("mamba", [False, True])
def test_unified_radix_cache(sgl: Any, mamba: bool) -> None:
    alloc = build.token_allocator(32)
    rows = build.hybrid_req_pool(4, 6) if mamba else build.req_pool(4)
    tree = build.unified_radix_cache(alloc, rows, mamba=mamba)
    ids = alloc.alloc(4)
    extra = {"mamba_value": rows.mamba_allocator.alloc(1)} if mamba else {}
    tree.insert(sgl.InsertParams(key=build.radix_key([1, 2, 3, 4]), value=ids, **extra))
    m = tree.match_prefix(sgl.MatchPrefixParams(key=build.radix_key([1, 2, 3, 4, 5])))
    assert m.device_prefix_len == 4
    tree.evict(sgl.EvictParams(num_tokens=4, mamba_num=1 if mamba else 0))
    assert alloc.available_size() == 32
    if mamba:
        assert rows.mamba_allocator.available_size() == 6


def test_bad_geometry_is_rejected(sgl: Any) -> None:
    from kvledger.contracts.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        build.token_allocator(10, 4)


@pytest.mark.slow
def test_previous_release_builds_mamba_radix_cache_and_the_attach_finds_its_lock_asymmetry() -> None:
    """0.5.20's MambaRadixCache, in its own process (one SGLang release per process)."""
    if not (PREVIOUS_DIR / "sglang").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"SGLang 0.5.20 missing in CI ({PREVIOUS_DIR})", pytrace=False)
        pytest.skip(f"SGLang 0.5.20 not installed in {PREVIOUS_DIR}: bash scripts/setup_sglang.sh")
    env = {**os.environ, "KVLEDGER_SGLANG_RELEASE_DIR": str(PREVIOUS_DIR), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "kvledger.engines.sglang.selfcheck"], env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["version"] == "0.5.20"
    assert report["mamba_radix_cache"] == {
        "matched": 4,
        "cow_copied": True,
        "evicted_tokens": 4,
        "free_after": 32,
    }


def test_tensors_are_on_cpu(sgl: Any) -> None:
    alloc = build.token_allocator(8)
    assert alloc.free_pages.device == torch.device("cpu")
