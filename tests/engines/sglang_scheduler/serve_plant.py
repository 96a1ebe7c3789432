"""A bug planted in the served scheduler process by a test (an SGLang plugin, loaded in the child only).

Outside SGLang and outside kvledger's reference code: an AFTER hook, registered through SGLang's own
``HookRegistry``, on ``Scheduler.process_batch_result``. When a batch holding a request whose rid starts
with ``planted`` has been processed, it takes one KV slot off SGLang's allocator for nobody, once: the
leak a buggy caller would leave. The attach must name it at that step's end.
"""

from __future__ import annotations

from typing import Any


def leak_one_kv_slot() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler.process_batch_result", _leak, HookType.AFTER
    )


def _leak(result: Any, scheduler: Any, batch: Any, *_: Any, **__: Any) -> None:
    if vars(scheduler).get("planted_leak") is not None:
        return None
    if any(str(req.rid).startswith("planted") for req in batch.reqs):
        vars(scheduler)["planted_leak"] = scheduler.token_to_kv_pool_allocator.alloc(1)
    return None
