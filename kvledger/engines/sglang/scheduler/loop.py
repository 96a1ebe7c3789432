"""Driving a built scheduler: requests in, one loop iteration at a time (the body of ``event_loop_normal``).

The loop body is called step by step rather than ``event_loop_normal`` itself (which never returns and
polls zmq): receive is replaced by :func:`arrive`, the rest is SGLang's own methods in SGLang's order
(``get_next_batch_to_run``, ``run_batch``, ``process_batch_result``, or the idle self-check).
"""

from __future__ import annotations

from typing import Any

STRICT_IDLE_CHECK = "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"
"""SGLang's switch that makes its idle memory check raise instead of warn (set by the hunts)."""


def arrive(scheduler: Any, rid: str, tokens: list[int], max_new_tokens: int) -> Any:
    """A generate request, as ``handle_generate_request`` would queue it (greedy, EOS ignored)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    params.normalize(None)  # the tokenizer manager normally does it
    req = Req(rid, "", list(tokens), params, vocab_size=scheduler.model_config.vocab_size)
    scheduler.init_req_max_new_tokens(req)
    scheduler._add_request_to_queue(req)
    return req


def step(scheduler: Any) -> Any:
    """One iteration of SGLang's normal loop; returns the batch run (None when idle: the self-check ran)."""
    batch = scheduler.get_next_batch_to_run()
    scheduler.cur_batch = batch
    if batch:
        result = scheduler.run_batch(batch)
        scheduler.process_batch_result(batch, result)
    else:
        scheduler.self_check_during_idle()
    scheduler.last_batch = batch
    return batch
