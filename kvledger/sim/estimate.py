"""A rough prediction of how long ``kvledger simulate`` will run, so a long run is announced up front.

The cost of a run is roughly proportional to the tokens the model computes: each group's shared system
prompt once (later requests find it in the prefix cache), each request's own question and its output.
Counting every prompt token instead (the first estimate) predicted 4 minutes for the default tiny-hybrid
run, which takes 8 s. Seconds per computed token, measured with ``kvledger simulate --json`` on the
2-core development machine at a load of about 3 (the default workload and one of 2,048-token system
prompts, whose longer contexts cost the tiny model's attention more per token), then doubled: the
prediction is for a warning, never a promise.
"""

from __future__ import annotations

from kvledger.sim.workload import GSPWorkload

SECONDS_PER_TOKEN = {
    # the hash runner: the busy identity and audits dominate with contracts on (0.74 s of CPU for the
    # default workload's 32,768 computed tokens at full; 0.26 s at release)
    ("hash", True): 5e-5,
    ("hash", False): 1.6e-5,
    # the tiny hybrid model (attention over the whole context per token): 8.2 s / 5.3 s for the default
    # workload, 5.8 s / 3.1 s for 2 groups of 2,048-token system prompts (11,264 computed tokens)
    ("tiny-hybrid", True): 1e-3,
    ("tiny-hybrid", False): 6e-4,
}

LONG_RUN_S = 60.0
"""Runs predicted to take longer than this get a warning before they start."""


def total_tokens(workload: GSPWorkload) -> int:
    """Prompt plus output tokens over the whole workload."""
    per_request = workload.system_prompt_len + workload.question_len + workload.output_len
    return workload.num_groups * workload.prompts_per_group * per_request


def computed_tokens(workload: GSPWorkload) -> int:
    """Tokens the model computes, the prefix cache doing its work: each system prompt once per group, each
    request's question and output."""
    requests = workload.num_groups * workload.prompts_per_group
    return workload.num_groups * workload.system_prompt_len + requests * (workload.question_len + workload.output_len)


def predicted_seconds(workload: GSPWorkload, model: str, contracts: bool) -> float:
    return computed_tokens(workload) * SECONDS_PER_TOKEN[(model, contracts)]


def describe_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
