"""SGLang's own memory pools for the fake worker: request rows with a real ``MambaPool``, a KV allocator."""

from __future__ import annotations

import inspect
from typing import Any

import torch

DEVICE = "cpu"


def build_pools(shape: Any) -> tuple[Any, Any]:
    """(``HybridReqToTokenPool``, ``TokenToKVPoolAllocator`` over an ``MHATokenToKVPool``), page 1.

    The KV pool has one layer, one head, head dim 1 (float32): the K cell holds the data tag, the V cell
    the token (see :mod:`.worker`). The Mamba state is one layer with a tiny conv state."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MHATokenToKVPool

    state = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=4, n_groups=1, num_heads=1, head_dim=2, state_size=2, conv_kernel=2
    )
    later = {
        # 0.5.10 names the Mamba layers explicitly; 0.5.9 reads the params; 0.5.5.x has neither the
        # speculative state size nor the extra buffer
        "mamba_layer_ids": [0],
        "mamba_spec_state_size": shape.rows,
        "enable_mamba_extra_buffer": False,
    }
    accepted = inspect.signature(HybridReqToTokenPool.__init__).parameters
    req_pool = HybridReqToTokenPool(
        size=shape.rows,
        mamba_size=shape.mamba_slots,
        max_context_len=shape.context_len + 4,
        device=DEVICE,
        enable_memory_saver=False,
        cache_params=Mamba2CacheParams(shape=state, layers=[0]),
        **{k: v for k, v in later.items() if k in accepted},
    )
    kv = MHATokenToKVPool(shape.kv_tokens, 1, torch.float32, 1, 1, 1, DEVICE, False)
    allocator = TokenToKVPoolAllocator(shape.kv_tokens, torch.float32, DEVICE, kv, False)
    return req_pool, allocator
