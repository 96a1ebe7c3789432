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


def forget_the_batch_being_run() -> None:
    """The attach's gap the first served run showed, put back in the child (a scoped change of the
    attach's queue list, outside SGLang): ``cur_batch_for_debug``, where a launched ``event_loop_normal``
    keeps the batch it runs, is not read as a queue."""
    from kvledger.engines.sglang.scheduler import ledgers

    ledgers.QUEUES = tuple(q for q in ledgers.QUEUES if q[0] != "cur_batch_for_debug")
