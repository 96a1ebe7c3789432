"""The cache paths (see :mod:`.base`) and the choice of one for a scheduler."""

from __future__ import annotations

from typing import cast

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.protocols import AnyPrefixCache, PrefixCache, mamba_cache_of
from kvledger.reference.scheduler.cache_paths.base import CachePath, Matched, MemoryPools, NoTracking
from kvledger.reference.scheduler.cache_paths.mamba_v1 import MambaV1Path
from kvledger.reference.scheduler.cache_paths.mamba_v2 import MambaV2Path
from kvledger.reference.scheduler.cache_paths.plain import NoCachePath, RadixPath
from kvledger.reference.scheduler.tracking import MambaTracking

__all__ = [
    "CachePath",
    "MambaV1Path",
    "MambaV2Path",
    "Matched",
    "MemoryPools",
    "NoCachePath",
    "NoTracking",
    "RadixPath",
    "cache_path_for",
]


def cache_path_for(pools: MemoryPools, tree: AnyPrefixCache | None, tracking: MambaTracking | None) -> CachePath:
    """The path for this combination: no cache, the plain tree, the Mamba tree without (V1) or with (V2)
    tracking. The scheduler has already validated the combination; what is left is a programming error."""
    if tree is None:
        if tracking is not None:
            raise InvalidArgument("Mamba V2 tracking needs the Mamba radix cache")
        return NoCachePath(pools)
    mamba_tree = mamba_cache_of(tree)  # the cached kinds say which path: Mamba states, or KV only
    if mamba_tree is None:
        if tracking is not None:
            raise InvalidArgument("Mamba V2 tracking needs the Mamba radix cache, not the plain one")
        return RadixPath(pools, cast(PrefixCache, tree))
    if pools.mamba_pool is None:
        raise InvalidArgument("a Mamba radix cache needs the mamba_pool it caches states of")
    if tracking is None:
        return MambaV1Path(pools, mamba_tree, pools.mamba_pool)
    return MambaV2Path(pools, mamba_tree, pools.mamba_pool, tracking)
