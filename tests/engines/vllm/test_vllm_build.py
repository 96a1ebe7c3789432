"""The builder gives vLLM 0.34.0's real hybrid manager, and it serves a request on CPU."""

from __future__ import annotations

import sys

import pytest

from kvledger.engines.vllm.build import BadHybridLayout, HybridLayout, build_hybrid
from kvledger.engines.vllm.loader import STANDIN_MODULES, VLLMUnavailable, load


def test_the_hybrid_manager_is_vllms_own_classes() -> None:
    built = build_hybrid(HybridLayout(num_blocks=12, block_size=4))
    assert built.modules.version == "0.34.0"
    assert type(built.manager.coordinator).__name__ == "HybridKVCacheCoordinator"
    kinds = [type(m).__name__ for m in built.single_type_managers]
    assert kinds == ["FullAttentionManager", "MambaManager"]
    assert built.single_type_managers[1].mamba_cache_mode == "align"
    # every block but the null block (id 0) starts free
    assert built.block_pool.get_num_free_blocks() == 11
    assert built.block_pool.null_block.block_id == 0


def test_a_request_gets_blocks_and_gives_them_back() -> None:
    built = build_hybrid(HybridLayout(num_blocks=12, block_size=4))
    req = built.new_request("r0", list(range(10)))
    hit, n_hit, _ = built.manager.get_computed_blocks(req)
    assert n_hit == 0
    out = built.manager.allocate_slots(req, 10, n_hit, hit)
    assert out is not None
    full_ids, mamba_ids = built.manager.get_block_ids("r0")
    assert len(full_ids) == 3 and 0 not in full_ids
    assert mamba_ids[-1] != 0  # "align" mode: only the last Mamba block is real, earlier ones null
    assert built.block_pool.get_num_free_blocks() < 11
    built.manager.free(req)
    assert built.block_pool.get_num_free_blocks() == 11


def test_no_stand_in_is_left_in_sys_modules() -> None:
    load()
    from kvledger.engines.vllm.loader import _StandinModule

    left = [n for n, m in sys.modules.items() if isinstance(m, _StandinModule)]
    assert left == [] and STANDIN_MODULES
    assert not any(type(f).__name__ == "_StandinFinder" for f in sys.meta_path)


def test_bad_layout_and_other_release_are_typed_errors() -> None:
    with pytest.raises(BadHybridLayout):
        build_hybrid(HybridLayout(num_blocks=1))
    load()
    with pytest.raises(VLLMUnavailable):
        load("0.33.0")
