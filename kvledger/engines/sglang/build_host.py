"""Build SGLang 0.5.23's HiCache host tier on CPU: host pools and the ``HiCacheController`` over them.

Every object is SGLang's own class through its public constructor, ``pin_memory=False`` (pinning needs
CUDA). ``MHATokenToKVPoolHost`` takes the buffer info of the device pool's ``get_device_pool_infos()`` (what
SGLang's own pool assembler passes it); ``MambaPoolHost`` the Mamba pool's ``get_device_pool_infos()`` entry, layout
``page_first`` (the Mamba host pool accepts ``page_first`` and ``page_first_direct`` only).

What does not run on CPU, measured on 0.5.23: the controller's data copies. ``HiCacheController.write``
and ``start_loading`` submit through ``L2TransferEngine``, whose copies call ``sgl_kernel``'s
``transfer_kv_*`` ops (not importable without CUDA: ``NameError: transfer_kv_direct``), on
``torch.cpu.Stream``, which has no ``synchronize`` (the engine's error path raises ``AttributeError``).
:class:`SyncTransferEngine` stands in for the engine on the controller *instance* (``l2_transfer_engine``
is an instance attribute the controller builds): it copies the K/V rows with torch indexing at once and
returns a ``TransferCompletion`` of recorded CPU events, so the controller's own bookkeeping (host
allocation, write / load queues, acks, ``evict_host``) runs as released.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any
from unittest import mock

from kvledger.engines.sglang.loader import SGLangUnavailable

HOST_RATIO = 2.0  # host slots per device slot (SGLang's --hicache-ratio default is 2.0)


def _require_host_tier() -> None:
    try:
        import sglang.srt.mem_cache.pool_host.mha  # noqa: F401
    except ImportError as exc:  # releases before the pool_host package
        raise SGLangUnavailable(f"this SGLang has no mem_cache.pool_host package: {exc}") from exc


def kv_host_pool(allocator: Any, ratio: float = HOST_RATIO, layout: str = "layer_first") -> Any:
    """``MHATokenToKVPoolHost`` over ``allocator``'s device ``MHATokenToKVPool`` (its page size)."""
    _require_host_tier()
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    kv = allocator.get_kvcache()
    (info,) = kv.get_device_pool_infos()  # the public description SGLang's pool assembler reads
    return MHATokenToKVPoolHost(
        info.buffer_info,
        ratio,
        0,
        allocator.page_size,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=int(allocator.size),
        start_layer=0,
        end_layer=kv.layer_num,
    )


def mamba_host_pool(hybrid_rows: Any, ratio: float = HOST_RATIO) -> Any:
    """``MambaPoolHost`` over a ``HybridReqToTokenPool``'s ``MambaPool`` (one state per slot)."""
    _require_host_tier()
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

    states = hybrid_rows.mamba_pool
    (info,) = states.get_device_pool_infos()
    return MambaPoolHost(
        info.buffer_info, ratio, 0, device_capacity=int(states.size), pin_memory=False, layout="page_first"
    )


class SyncTransferEngine:
    """Stands in for ``L2TransferEngine`` on CPU: each copy done at once, in torch, before it returns,
    through the host pool's per-layer views (``k_data_refs`` / ``v_data_refs``: any host layout).

    ``fail_next``: the next ``fail_next`` submissions raise ``RuntimeError`` before copying anything (a
    transfer that failed), for the drivers' failure paths."""

    def __init__(self, io_backend: str = "direct") -> None:
        self.io_backend = io_backend
        self.fail_next = 0
        self.copies = 0

    def _completion(self) -> Any:
        from sglang.srt.mem_cache.l2_transfer import TransferCompletion, make_timing_event_pair

        start, finish, timing = make_timing_event_pair()
        start.record()
        finish.record()
        return TransferCompletion(start, finish, timing)

    def _maybe_fail(self, what: str) -> None:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise RuntimeError(f"injected {what} transfer failure")

    def submit_device_to_host(self, transfers: list[Any]) -> Any:
        self._maybe_fail("device-to-host")
        for t in transfers:
            for layer in range(t.device_pool.layer_num):
                t.host_pool.k_data_refs[layer][t.host_indices] = t.device_pool.k_buffer[layer][
                    t.device_indices
                ]
                t.host_pool.v_data_refs[layer][t.host_indices] = t.device_pool.v_buffer[layer][
                    t.device_indices
                ]
            self.copies += 1
        return self._completion()

    def submit_host_to_device(
        self,
        transfers: list[Any],
        *,
        transfer_layer_id_max: int,
        start_event: Any = None,
        on_layer_done: Any = None,
    ) -> Any:
        self._maybe_fail("host-to-device")
        for layer in range(transfer_layer_id_max):
            for t in transfers:
                t.device_pool.k_buffer[layer][t.device_indices] = t.host_pool.k_data_refs[layer][
                    t.host_indices
                ]
                t.device_pool.v_buffer[layer][t.device_indices] = t.host_pool.v_data_refs[layer][
                    t.host_indices
                ]
            if on_layer_done is not None:
                on_layer_done(layer)
        self.copies += len(transfers)
        return self._completion()


def controller(allocator: Any, host_pool: Any, write_policy: str = "write_through") -> Any:
    """SGLang's ``HiCacheController`` over ``allocator`` and ``host_pool`` (io backend ``direct``, no
    storage tier, no process groups), its transfer engine replaced by a :class:`SyncTransferEngine`."""
    _require_host_tier()
    from sglang.srt.managers.cache_controller import HiCacheController

    ctl = HiCacheController(
        allocator,
        host_pool,
        allocator.page_size,
        None,
        threading.Event(),
        write_policy=write_policy,
        io_backend="direct",
    )
    ctl.l2_transfer_engine = SyncTransferEngine()
    return ctl


@contextlib.contextmanager
def _host_pools_unpinned() -> Iterator[None]:
    """Inside the block SGLang's KV host pools are built with ``pin_memory=False``. SGLang's pool
    assembler (``build_kv_host_pool``) passes no ``pin_memory``, so the pool's default (True) registers
    the buffer with CUDA (``cudaHostRegister``: "Torch not compiled with CUDA enabled" on CPU). The class
    attribute is restored on exit; SGLang's source is untouched."""
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    release_init = MHATokenToKVPoolHost.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["pin_memory"] = False
        release_init(self, *args, **kwargs)

    with mock.patch.object(MHATokenToKVPoolHost, "__init__", init):
        yield


def hicache_tree(allocator: Any, rows: Any, core: str = "rust") -> Any:
    """0.5.23's ``UnifiedRadixCache`` (FULL component; ``core``: ``"rust"``, SGLang's default, or ``"python"``)
    with HiCache: SGLang's own
    ``init_hicache`` builds its ``HostPoolGroup`` (an ``MHATokenToKVPoolHost`` anchor) and its
    ``HybridCacheController`` from the published server arguments (write policy, ratio and layout at
    their defaults), the host pools unpinned; the controller's transfer engine is a
    :class:`SyncTransferEngine`. The KV host pool is ``tree.cache_controller.mem_pool_host.anchor_entry.host_pool``."""
    _require_host_tier()
    from kvledger.engines.sglang import build

    sgl = build.load()
    if not sgl.has_unified_radix_cache:
        raise SGLangUnavailable(f"SGLang {sgl.version} has no UnifiedRadixCache")
    build.ensure_server_args(allocator.page_size, sgl)
    from sglang.srt.runtime_context import get_server_args

    params = sgl.CacheInitParams(
        disable=False,
        req_to_token_pool=rows,
        token_to_kv_pool_allocator=allocator,
        page_size=allocator.page_size,
        tree_components=(sgl.ComponentType.FULL,),
        tree_core_backend=core,
    )
    tree = sgl.UnifiedRadixCache(params)
    with _host_pools_unpinned():
        tree.init_hicache(get_server_args(), params)
    tree.cache_controller.l2_transfer_engine = SyncTransferEngine()
    return tree
