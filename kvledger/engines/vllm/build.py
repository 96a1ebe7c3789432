"""Build vLLM's real ``KVCacheManager`` for a hybrid model (full attention + Mamba) on CPU.

The layout is the one vLLM gives a hybrid model such as a Mamba2/attention mix: one
``FullAttentionSpec`` group and one ``MambaSpec`` group with ``mamba_cache_mode="align"`` (Mamba
prefix caching), both drawing from one ``BlockPool``. No KV tensor is allocated: the manager only
keeps block ids, reference counts and the prefix-cache hash map, which is what kvledger checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvledger.contracts.errors import KVLedgerError
from kvledger.engines.vllm.loader import DEFAULT_RELEASE, VLLMModules, load


class BadHybridLayout(KVLedgerError, ValueError):
    """A pool or block size the builder cannot give vLLM (typed, nothing built)."""

    invariant = "I-TYPED-INPUT"


@dataclass(frozen=True)
class HybridLayout:
    """Sizes of the built manager. ``num_blocks`` counts the null block vLLM reserves (id 0)."""

    num_blocks: int = 16
    block_size: int = 4
    max_model_len: int = 64
    enable_caching: bool = True

    def check(self) -> None:
        """Pre: at least two blocks (null + one), positive block size, a model length of a block."""
        if self.num_blocks < 2 or self.block_size < 1 or self.max_model_len < self.block_size:
            raise BadHybridLayout(f"unusable hybrid layout {self}")


@dataclass
class BuiltHybrid:
    """The manager with what drives it: a request factory hashing blocks as the scheduler does."""

    modules: VLLMModules
    layout: HybridLayout
    manager: Any
    hasher: Any

    @property
    def block_pool(self) -> Any:
        return self.manager.block_pool

    @property
    def single_type_managers(self) -> tuple[Any, ...]:
        return tuple(self.manager.coordinator.single_type_managers)

    def new_request(self, request_id: str, prompt: list[int], max_tokens: int = 8) -> Any:
        """A vLLM ``Request`` with its prompt's block hashes (as EngineCore makes them)."""
        params = self.modules.SamplingParams(max_tokens=max_tokens)
        return self.modules.Request(request_id, list(prompt), params, None, block_hasher=self.hasher)


def build_hybrid(layout: HybridLayout | None = None, release: str = DEFAULT_RELEASE) -> BuiltHybrid:
    """vLLM's ``KVCacheManager`` over a full-attention group and a Mamba ("align") group.

    Pre: ``layout`` passes :meth:`HybridLayout.check`. Post: the manager's coordinator is vLLM's
    ``HybridKVCacheCoordinator`` with a ``FullAttentionManager`` and a ``MambaManager``; every
    block but the null block is free.
    """
    layout = layout or HybridLayout()
    layout.check()
    mods = load(release)
    full = mods.FullAttentionSpec(
        block_size=layout.block_size, num_kv_heads=1, head_size=8, dtype=torch.float32
    )
    mamba = mods.MambaSpec(
        block_size=layout.block_size,
        shapes=((4,),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
    )
    groups = [mods.KVCacheGroupSpec(["attn.0"], full), mods.KVCacheGroupSpec(["mamba.0"], mamba)]
    config = mods.KVCacheConfig(num_blocks=layout.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    mods.init_none_hash(mods.sha256)
    manager = mods.KVCacheManager(
        config,
        max_model_len=layout.max_model_len,
        scheduler_block_size=layout.block_size,
        hash_block_size=layout.block_size,
        enable_caching=layout.enable_caching,
    )
    hasher = mods.get_request_block_hasher(layout.block_size, mods.sha256)
    return BuiltHybrid(mods, layout, manager, hasher)
