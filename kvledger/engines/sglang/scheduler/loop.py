"""Driving a built scheduler: requests in, one loop iteration at a time (the body of ``event_loop_normal``).

The loop body is called step by step rather than ``event_loop_normal`` itself (which never returns and
polls zmq): receive is replaced by :func:`arrive`, the rest is SGLang's own methods in SGLang's order
(``get_next_batch_to_run``, ``run_batch``, ``process_batch_result``, or the idle self-check).
"""

from __future__ import annotations

from array import array
from typing import Any

STRICT_IDLE_CHECK = "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"
"""SGLang's switch that makes its idle memory check raise instead of warn (set by the hunts)."""


def arrive(scheduler: Any, rid: str, tokens: list[int], max_new_tokens: int) -> Any:
    """A generate request, as ``handle_generate_request`` would queue it (greedy, EOS ignored)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    params.normalize(None)  # the tokenizer manager normally does it
    # 0.5.23's tokenized request carries its ids as array("q") (Req concatenates them with output_ids)
    ids = array("q", tokens) if is_release_23(scheduler) else list(tokens)
    req = Req(rid, "", ids, params, vocab_size=scheduler.model_config.vocab_size)
    if is_pd(scheduler):
        # SGLang's own fake-transfer marker (as its warm-up requests carry): the bootstrap queue gives the
        # request a FakeKVSender, whose handshake completes at the first poll and transfer at send
        from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

        req.bootstrap_host = FAKE_BOOTSTRAP_HOST
        req.bootstrap_room = abs(hash(rid)) % (1 << 62)
    scheduler.init_req_max_new_tokens(req)
    scheduler._add_request_to_queue(req)
    return req


def is_release_23(scheduler: Any) -> bool:
    """The 0.5.2x loop: idle housekeeping is ``on_idle``, the batch choice returns a plan."""
    return hasattr(scheduler, "on_idle")


def is_pd_decode(scheduler: Any) -> bool:
    """The scheduler is the decode side of PD disaggregation (it has the prealloc queue)."""
    return getattr(scheduler, "disagg_decode_prealloc_queue", None) is not None


def is_pd(scheduler: Any) -> bool:
    return is_pd_prefill(scheduler) or is_pd_decode(scheduler)


def is_pd_prefill(scheduler: Any) -> bool:
    """The scheduler is the prefill side of PD disaggregation (it has the bootstrap queue)."""
    return getattr(scheduler, "disagg_prefill_bootstrap_queue", None) is not None


def pd_prefill_step(scheduler: Any) -> Any:
    """One iteration of SGLang's PD prefill loop (``event_loop_normal_disagg_prefill`` minus receive)."""
    if is_release_23(scheduler):
        return pd_prefill_step_23(scheduler)
    scheduler.waiting_queue.extend(scheduler.disagg_prefill_bootstrap_queue.pop_bootstrapped())
    batch = scheduler.get_next_disagg_prefill_batch_to_run()
    scheduler.cur_batch = batch
    if batch:
        result = scheduler.run_batch(batch)
        scheduler.process_batch_result_disagg_prefill(batch, result)
    else:
        scheduler.self_check_during_idle()
    scheduler.process_disagg_prefill_inflight_queue()
    scheduler.last_batch = batch
    scheduler.running_batch.batch_is_full = False  # SGLang's loop resets it here too
    return batch


def pd_prefill_step_23(scheduler: Any) -> Any:
    """0.5.23's ``event_loop_normal_disagg_prefill`` minus receive: the batch choice returns a plan, the
    n-gram embedding step runs in the loop, results go through ``process_batch_result`` (which dispatches
    to the PD prefill processing), idle is ``on_idle``, then the inflight queue is polled."""
    scheduler.waiting_queue.extend(scheduler.disagg_prefill_bootstrap_queue.pop_bootstrapped())
    plan = scheduler.get_next_disagg_prefill_batch_to_run(
        running_batch=scheduler.running_batch, last_batch=scheduler.last_batch
    )
    scheduler.running_batch = plan.running_batch
    batch = scheduler.ngram_embedding_manager.prepare_for_forward(
        plan.batch_to_run, chunked_req=scheduler.chunked_req
    )
    scheduler.cur_batch_for_debug = batch
    scheduler.cur_batch = batch  # the attach's queue scan looks here for the batch
    if batch:
        result = scheduler.run_batch(batch)
        scheduler.process_batch_result(batch, result)
    else:  # (SGLang's loop also marks the scheduler idled; only its MLX back end reads that)
        scheduler.on_idle()
    scheduler.process_disagg_prefill_inflight_queue()
    scheduler.last_batch = batch
    return batch


def pd_decode_step_23(scheduler: Any) -> Any:
    """0.5.23's ``event_loop_normal_disagg_decode`` minus receive: the prefill DP-rank queries, the
    decode queues advance (prealloc -> transfer -> waiting), then the batch choice, run and result, or
    idle."""
    s = scheduler
    s.disagg_decode_prealloc_queue.prefetch_prefill_dp_rank_queries()
    s.process_decode_queue()
    plan = s.get_next_disagg_decode_batch_to_run(running_batch=s.running_batch)
    s.running_batch = plan.running_batch
    batch = s.ngram_embedding_manager.prepare_for_forward(plan.batch_to_run, chunked_req=s.chunked_req)
    s.cur_batch_for_debug = batch
    s.cur_batch = batch  # the attach's queue scan looks here for the batch
    if batch:
        s.process_batch_result(batch, s.run_batch(batch))
    else:  # (SGLang's loop also marks the scheduler idled; only its MLX back end reads that)
        s.on_idle()
    s.last_batch = batch
    return batch


def step_23(scheduler: Any) -> Any:
    """One iteration of 0.5.23's ``event_loop_normal`` minus receive: the batch choice returns a plan
    (the batch to run and the running batch after the choice), idle housekeeping is ``on_idle``."""
    plan = scheduler.get_next_batch_to_run(
        running_batch=scheduler.running_batch, last_batch=scheduler.last_batch
    )
    scheduler.running_batch = plan.running_batch
    batch = plan.batch_to_run
    scheduler.cur_batch_for_debug = batch
    scheduler.cur_batch = batch  # not read by 0.5.23; the attach's queue scan looks here for the batch
    if batch:
        result = scheduler.run_batch(batch)
        scheduler.process_batch_result(batch, result)
    else:  # (SGLang's loop also marks the scheduler idled; only its MLX back end reads that)
        scheduler.on_idle()
    scheduler.last_batch = batch
    return batch


def step(scheduler: Any) -> Any:
    """One iteration of SGLang's normal loop (or of the PD prefill loop when the scheduler is the prefill
    side); returns the batch run (None when idle: the self-check ran)."""
    if is_pd_prefill(scheduler):
        return pd_prefill_step(scheduler)
    if is_pd_decode(scheduler):
        return pd_decode_step_23(scheduler)
    if is_release_23(scheduler):
        return step_23(scheduler)
    batch = scheduler.get_next_batch_to_run()
    scheduler.cur_batch = batch
    if batch:
        result = scheduler.run_batch(batch)
        scheduler.process_batch_result(batch, result)
    else:
        scheduler.self_check_during_idle()
    scheduler.last_batch = batch
    return batch
