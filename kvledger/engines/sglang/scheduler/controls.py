"""Controls for :func:`.ledgers.attach_scheduler` on a real scheduler: faults planted OUTSIDE SGLang (calls
on its live pools, as a buggy caller would make them) that the attach must name, and a clean run whose
identity must add up. Run per release in one process by ``python -m kvledger.engines.sglang.scheduler ci``.
"""

from __future__ import annotations

from typing import Any

from kvledger.contracts.errors import ContractViolation
from kvledger.engines.sglang.scheduler.ledgers import req_memory


def _running_pair(release: str) -> tuple[Any, Any]:
    from kvledger.engines.sglang.scheduler.build import build_attached
    from kvledger.engines.sglang.scheduler.loop import arrive, step

    scheduler = build_attached(release)
    a = arrive(scheduler, "a", list(range(1, 11)), 6)
    while not (req_memory(a).req_pool_idx is not None and len(a.output_ids)):
        step(scheduler)  # until a is prefilled and decoding
    return scheduler, a


def mamba_slots(req_pool: Any) -> Any:
    """What hands out and takes back Mamba slots: the ``MambaPool`` itself until 0.5.2x, its
    ``mamba_allocator`` in 0.5.23 (the pool there is a pure state store)."""
    return req_pool.mamba_pool if hasattr(req_pool.mamba_pool, "free") else req_pool.mamba_allocator


def attach_controls(release: str) -> dict[str, Any]:
    """{"identity": per-pool accounts after a run, "leak": ..., "foreign_free": ..., "detach": ...}."""
    from kvledger.engines.sglang.scheduler.loop import step

    out: dict[str, Any] = {}
    scheduler, a = _running_pair(release)
    sw = scheduler.kvledger_watch
    sizes = {"kv": sw.watch.kv.size, "req": sw.watch.rows.size, "mamba": sw.watch.slots.size}
    out["identity"] = {"accounts": sw.accounts(), "sizes": sizes, "steps": sw.steps}
    # a foreign free: a slot request a holds, freed between steps by a caller that does not hold it
    try:
        mamba_slots(scheduler.req_to_token_pool).free(req_memory(a).mamba_pool_idx.reshape(1))
        out["foreign_free"] = {"caught": False}
    except ContractViolation as error:
        out["foreign_free"] = {"caught": True, "message": str(error)[:1500]}
    out["stale_free_group"] = _stale_free_group(scheduler)
    # a leak: a Mamba slot taken off SGLang's free list for nobody (no request names it)
    scheduler, a = _running_pair(release)
    taken = mamba_slots(scheduler.req_to_token_pool).alloc(1)
    try:
        while not a.finished():
            step(scheduler)
        out["leak"] = {"caught": False}
    except ContractViolation as error:
        out["leak"] = {"caught": True, "slot": int(taken[0]), "message": str(error)[:1500]}
    scheduler.kvledger_watch.detach()
    out["detach"] = {
        "left": sorted(k for k in vars(scheduler) if k in ("get_next_batch_to_run", "kvledger_watch"))
    }
    return out


def _stale_free_group(scheduler: Any) -> dict[str, Any]:
    """SGLang's allocator keeps ``free_group`` filled after ``free_group_end`` (pages freed, list left):
    neither the scheduler attach's audit nor the watch's may read the stale list as pending pages."""
    sw = scheduler.kvledger_watch
    alloc = scheduler.token_to_kv_pool_allocator
    page = alloc.alloc(1)
    alloc.free_group_begin()
    alloc.free(page)
    alloc.free_group_end()
    out: dict[str, Any] = {
        "stale": [int(x) for x in alloc.free_group[0].tolist()] if alloc.free_group else []
    }
    try:
        sw.audit()
        out["attach_audit"] = "passed"
    except ContractViolation as error:
        out["attach_audit"] = str(error)[:600]
    try:
        sw.watch.audit()
        out["watch_audit"] = "passed"
    except ContractViolation as error:
        out["watch_audit"] = str(error)[:300]
    return out


def _chunked(release: str) -> tuple[Any, Any]:
    """A PD prefill scheduler (0.5.5.x) whose request ``a`` is mid-prefill: the chunked request, holding
    a row, a Mamba slot and KV (a 40-token prompt, chunks of 16)."""
    from kvledger.engines.sglang.scheduler.build import build_attached
    from kvledger.engines.sglang.scheduler.loop import arrive, step

    scheduler = build_attached(release)
    a = arrive(scheduler, "a", list(range(1, 41)), 4)
    step(scheduler)
    assert scheduler.chunked_req is a, "the first chunk leaves a as the chunked request"
    return scheduler, a


def pd_attach_controls(release: str) -> dict[str, Any]:
    """Faults planted outside SGLang on 0.5.5.x's PD prefill loop (the row-API watch): a foreign free of
    the chunked request's Mamba slot, a foreign free of its row, a slot taken for nobody; then detach."""
    from kvledger.engines.sglang.scheduler.loop import step

    out: dict[str, Any] = {}
    scheduler, a = _chunked(release)
    sw = scheduler.kvledger_watch
    out["identity"] = {"accounts": sw.accounts(), "steps": sw.steps}
    pool = scheduler.req_to_token_pool
    for name, fault in (
        ("foreign_mamba_free", lambda: pool.mamba_pool.free(a.mamba_pool_idx.reshape(1))),
        ("foreign_row_free", lambda: pool.free(int(a.req_pool_idx), free_mamba_cache=False)),
    ):
        try:
            fault()
            out[name] = {"caught": False}
        except ContractViolation as error:
            out[name] = {"caught": True, "message": str(error)[:1500]}
    scheduler, a = _chunked(release)
    taken = mamba_slots(scheduler.req_to_token_pool).alloc(1)
    try:
        step(scheduler)
        out["leak"] = {"caught": False}
    except ContractViolation as error:
        out["leak"] = {"caught": True, "slot": int(taken[0]), "message": str(error)[:1500]}
    scheduler.kvledger_watch.detach()
    out["detach"] = {
        "left": sorted(k for k in vars(scheduler) if k in ("get_next_batch_to_run", "kvledger_watch")),
        "pool_wrapped": sorted(k for k in vars(scheduler.req_to_token_pool) if k in ("alloc", "free")),
    }
    return out


def _pd_prefill_attached() -> Any:
    from kvledger.engines.sglang.scheduler.build23 import build_scheduler_23
    from kvledger.engines.sglang.scheduler.ledgers import attach_scheduler

    scheduler = build_scheduler_23(pd="prefill")
    attach_scheduler(scheduler)
    return scheduler


def _drain(scheduler: Any, reqs: list[Any], limit: int = 40) -> int:
    from kvledger.engines.sglang.scheduler.loop import step

    steps = 0
    while not all(r.finished() for r in reqs) and steps < limit:
        step(scheduler)
        steps += 1
    step(scheduler)  # one idle step more: the last transfers are polled and released
    return steps


def _outcome(req: Any) -> dict[str, Any]:
    reason = req.finished_reason
    message = getattr(reason, "message", None)  # FINISH_ABORT carries SGLang's error message
    return {"finished": bool(req.finished()), "reason": type(reason).__name__, "message": str(message)[:300]}


def pd_failure_controls() -> dict[str, Any]:
    """PD prefill (0.5.23, fake backend) under the attach, with the failures of :mod:`.pd_faults`: a
    transfer failing in the bootstrap queue, a chunked request's transfer failing mid-prefill, a waiting
    request's sender timing out (the clock moved past SGLang's waiting timeout); every step's identity
    holds and the failed requests end aborted. Then a failure path made to forget its release (a scoped
    patch of the name SGLang's prefill module calls, outside SGLang) must be named as a leak."""
    from kvledger.engines.sglang.scheduler.loop import arrive, step
    from kvledger.engines.sglang.scheduler.pd_faults import fail_transfer, transfer_clock, waiting_timeout

    out: dict[str, Any] = {}
    scheduler = _pd_prefill_attached()
    a = arrive(scheduler, "boot.", list(range(1, 9)), 2)
    out["bootstrap_failed"] = fail_transfer(scheduler, "boot.")
    long_, waiter = (
        arrive(scheduler, "long.", list(range(1, 41)), 2),
        arrive(scheduler, "wait.", [7, 8, 9], 2),
    )
    step(scheduler)  # boot. fails at its bootstrap poll; long.'s first chunk runs; wait. waits
    step(scheduler)  # wait.'s sender is polled in the waiting queue: its deadline clock starts
    out["chunked_is_long"] = scheduler.chunked_req is long_
    out["mid_prefill_failed"] = fail_transfer(scheduler, "long.")
    transfer_clock().advance(2 * waiting_timeout())
    out["steps"] = _drain(scheduler, [a, long_, waiter]) + 2
    out["outcomes"] = {r.rid: _outcome(r) for r in (a, long_, waiter)}
    sw = scheduler.kvledger_watch
    out["accounts"] = sw.accounts()
    out["checked_steps"] = sw.steps
    sw.detach()
    out["forgotten_release"] = _forgotten_release()
    return out


def _forgotten_release() -> dict[str, Any]:
    """The chunked request's transfer fails with SGLang's prefill module calling a ``release_kv_cache``
    that does nothing (a scoped patch of the module name, restored after): its KV, row and Mamba slot
    are left to nobody, which the attach must name at that step's end."""
    from unittest import mock

    from kvledger.engines.sglang.scheduler.loop import arrive, step
    from kvledger.engines.sglang.scheduler.pd_faults import fail_transfer

    scheduler = _pd_prefill_attached()
    long_ = arrive(scheduler, "long.", list(range(1, 41)), 2)
    step(scheduler)
    fail_transfer(scheduler, "long.")
    try:
        with mock.patch("sglang.srt.disaggregation.prefill.release_kv_cache", lambda *_, **__: None):
            _drain(scheduler, [long_])
        return {"caught": False}
    except ContractViolation as error:
        return {"caught": True, "kind": type(error).__name__, "message": str(error)[:1500]}
    finally:
        scheduler.kvledger_watch.detach()
