"""Build SGLang's real memory components on CPU tensors, as small as their constructors allow.

Every object returned here is SGLang's own class, constructed through its public constructor; nothing is
subclassed or patched. The KV pool under an allocator is a real ``MHATokenToKVPool`` with one layer,
one head and head dim 1 (the allocators need one; the memory bookkeeping never reads its contents). The
Mamba pool holds one layer with a tiny conv and temporal state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from array import array
from collections.abc import Sequence
from typing import Any
from unittest import mock

import torch

from kvledger.contracts.errors import InvalidArgument
from kvledger.engines.sglang.loader import SGLangModules, SGLangUnavailable, load

DEVICE = "cpu"


def _sgl(modules: SGLangModules | None) -> SGLangModules:
    return modules if modules is not None else load()


def kv_pool(size: int, page_size: int = 1, modules: SGLangModules | None = None) -> Any:
    """SGLang's ``MHATokenToKVPool``: one layer, one head, head dim 1, float32, on CPU."""
    sgl = _sgl(modules)
    return sgl.MHATokenToKVPool(size, page_size, torch.float32, 1, 1, 1, DEVICE, False)


def token_allocator(size: int, page_size: int = 1, modules: SGLangModules | None = None) -> Any:
    """``TokenToKVPoolAllocator`` (page 1) or ``PagedTokenToKVPoolAllocator`` over ``size`` token slots."""
    if size <= 0 or page_size <= 0 or size % page_size:
        raise InvalidArgument(f"token_allocator: size {size} must be a positive multiple of page {page_size}")
    sgl = _sgl(modules)
    kv = kv_pool(size, page_size, sgl)
    if page_size == 1:
        return sgl.TokenToKVPoolAllocator(size, torch.float32, DEVICE, kv, False)
    return sgl.PagedTokenToKVPoolAllocator(size, page_size, torch.float32, DEVICE, kv, False)


def req_pool(size: int, max_context_len: int = 256, modules: SGLangModules | None = None) -> Any:
    """``ReqToTokenPool`` with ``size`` rows (row 0 is SGLang's padding row)."""
    return _sgl(modules).ReqToTokenPool(size, max_context_len, DEVICE, False)


MAMBA_CACHE_CHUNK_SIZE = 64
"""The Mamba checkpoint grid the stand-in server args report (SGLang's FLA chunk size)."""


def ensure_server_args(page_size: int = 1, modules: SGLangModules | None = None) -> None:
    """Publish SGLang server arguments for a CPU process when no server has published any.

    The Mamba tree (0.5.20's ``MambaRadixCache``, 0.5.23's ``MAMBA`` component) reads its checkpoint
    grid (``runtime_context.mamba_cache_chunk_size()``) and a few execution settings from the
    process-wide ``ServerArgs`` at construction, which only a launched server publishes. This does what
    SGLang's own test fixtures do: ``ServerArgs(model_path="dummy", device="cpu")`` (construction does
    not resolve the model), the chunk size pre-seeded (``_mamba_cache_chunk_size``, which SGLang's
    accessor honours as-is, so no Hugging Face config is looked up), then
    ``set_global_server_args_for_scheduler``. Arguments the caller has already set are left alone.
    """
    _sgl(modules)
    import sglang.srt.server_args as server_args
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    try:
        import sglang.srt.runtime_context as runtime_context

        published = getattr(runtime_context._CONTEXT, "_server_args", None)
    except ModuleNotFoundError:  # 0.5.11 and 0.5.12 keep them in the server_args module itself
        published = getattr(server_args, "_global_server_args", None)
    if published is not None:
        return
    args = ServerArgs(model_path="dummy", device="cpu", page_size=page_size)
    preseed_mamba_cache_chunk_size(args, max(MAMBA_CACHE_CHUNK_SIZE, page_size))
    set_global_server_args_for_scheduler(args)


def preseed_mamba_cache_chunk_size(args: Any, size: int) -> None:
    """Give ``ServerArgs`` its Mamba checkpoint grid without a model config: SGLang's accessor honours a
    pre-seeded ``_mamba_cache_chunk_size`` as-is (its own test fixtures seed it the same way; no public
    argument sets it). The one place kvledger writes that private field."""
    args._mamba_cache_chunk_size = size


def mamba_cache_params(modules: SGLangModules | None = None) -> Any:
    """``Mamba2CacheParams`` of one layer with a tiny state (conv (8, 1), temporal (1, 2, 2))."""
    sgl = _sgl(modules)
    shape = sgl.Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=4, n_groups=1, num_heads=1, head_dim=2, state_size=2, conv_kernel=2
    )
    return sgl.Mamba2CacheParams(shape=shape, layers=[0])


def hybrid_req_pool(
    size: int,
    mamba_size: int,
    max_context_len: int = 256,
    *,
    extra_buffer: bool = False,
    modules: SGLangModules | None = None,
) -> Any:
    """``HybridReqToTokenPool``: request rows plus a real ``MambaPool`` and its slot allocator."""
    sgl = _sgl(modules)
    return sgl.HybridReqToTokenPool(
        size=size,
        mamba_size=mamba_size,
        mamba_spec_state_size=size,
        max_context_len=max_context_len,
        device=DEVICE,
        enable_memory_saver=False,
        cache_params=mamba_cache_params(sgl),
        mamba_layer_ids=[0],
        enable_mamba_extra_buffer=extra_buffer,
    )


def _params(allocator: Any, rows: Any, page_size: int, sgl: SGLangModules, **extra: Any) -> Any:
    return sgl.CacheInitParams(
        disable=False,
        req_to_token_pool=rows,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        **extra,
    )


def radix_cache(allocator: Any, rows: Any, modules: SGLangModules | None = None) -> Any:
    """SGLang's legacy ``RadixCache`` over ``allocator`` (its page size)."""
    sgl = _sgl(modules)
    return sgl.RadixCache(_params(allocator, rows, allocator.page_size, sgl))


COMPONENTS = ("full", "mamba")


def unified_radix_cache(
    allocator: Any,
    rows: Any,
    *,
    mamba: bool = False,
    core: str | None = None,
    extra_buffer: bool = False,
    modules: SGLangModules | None = None,
) -> Any:
    """``UnifiedRadixCache`` with the FULL component (and MAMBA when ``mamba``; ``rows`` must then be a
    ``HybridReqToTokenPool``, built with the same ``extra_buffer``). ``core``: the tree core backend
    (``"rust"``, SGLang's default, or ``"python"``). ``extra_buffer``: the Mamba extra-buffer strategy
    (the request's ping-pong tracking slots; ``CacheInitParams.enable_mamba_extra_buffer``)."""
    sgl = _sgl(modules)
    if not sgl.has_unified_radix_cache:
        raise SGLangUnavailable(f"SGLang {sgl.version} has no UnifiedRadixCache (0.5.23 has)")
    ct = sgl.ComponentType
    components = (ct.FULL, ct.MAMBA) if mamba else (ct.FULL,)
    if mamba:
        ensure_server_args(allocator.page_size, sgl)
    extra: dict[str, Any] = {"tree_components": components}
    if extra_buffer:
        extra["enable_mamba_extra_buffer"] = True
    fields = {f.name for f in dataclasses.fields(sgl.CacheInitParams)}
    if core is not None and "tree_core_backend" in fields:
        extra["tree_core_backend"] = core
    elif core is not None:
        # 0.5.19 and 0.5.20 choose the core by environment variable only (read at construction)
        with _environ(TREE_CORE_ENV, core):
            return sgl.UnifiedRadixCache(_params(allocator, rows, allocator.page_size, sgl, **extra))
    return sgl.UnifiedRadixCache(_params(allocator, rows, allocator.page_size, sgl, **extra))


TREE_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"


def _environ(name: str, value: str) -> contextlib.AbstractContextManager[Any]:
    """``name=value`` in this process's environment for the block (restored after)."""
    return mock.patch.dict(os.environ, {name: value})


def mamba_radix_cache(allocator: Any, rows: Any, modules: SGLangModules | None = None) -> Any:
    """0.5.20's ``MambaRadixCache`` (V1, ``no_buffer``: page size 1) over a ``HybridReqToTokenPool``."""
    sgl = _sgl(modules)
    if not sgl.has_mamba_radix_cache:
        raise SGLangUnavailable(
            f"SGLang {sgl.version} has no MambaRadixCache (deleted by PR #40313; 0.5.20 is the last release)"
        )
    ensure_server_args(allocator.page_size, sgl)
    return sgl.MambaRadixCache(_params(allocator, rows, allocator.page_size, sgl))


def radix_key(tokens: Sequence[int], modules: SGLangModules | None = None) -> Any:
    """SGLang's ``RadixKey`` for ``tokens`` (token ids as ``array('q')``, as the tree cores require)."""
    return _sgl(modules).RadixKey(array("q", [int(t) for t in tokens]), None)
