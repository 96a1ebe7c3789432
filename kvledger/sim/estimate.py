"""A rough prediction of how long ``kvledger simulate`` will run, so a long run is announced up front.

The cost of a run is roughly proportional to the tokens that pass through the model (prompts plus
outputs); seconds per token were measured on a 2-core CI-class machine (``kvledger simulate --json``,
default workload scaled down, under a load of about 4). They are deliberately on the slow side: the
prediction is for a warning, never a promise.
"""

from __future__ import annotations

from kvledger.sim.workload import GSPWorkload

SECONDS_PER_TOKEN = {
    ("hash", True): 6e-5,  # the hash runner, contracts on: the busy identity and audits dominate
    ("hash", False): 1.5e-5,
    ("tiny-hybrid", True): 2.5e-3,  # the tiny hybrid model: attention over the whole context per token
    ("tiny-hybrid", False): 2.5e-3,
}

LONG_RUN_S = 60.0
"""Runs predicted to take longer than this get a warning before they start."""


def total_tokens(workload: GSPWorkload) -> int:
    """Prompt plus output tokens over the whole workload."""
    per_request = workload.system_prompt_len + workload.question_len + workload.output_len
    return workload.num_groups * workload.prompts_per_group * per_request


def predicted_seconds(workload: GSPWorkload, model: str, contracts: bool) -> float:
    return total_tokens(workload) * SECONDS_PER_TOKEN[(model, contracts)]


def describe_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
