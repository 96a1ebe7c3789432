"""``SchedulerStats``: what a scheduler counts while it runs (batches, tokens, outcomes, checks).

Plain counters: the simulation's report and the benchmarks read them; no decision is taken from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SchedulerStats:
    steps: int = 0
    prefill_batches: int = 0
    decode_batches: int = 0
    idle_steps: int = 0
    prompt_tokens: int = 0  # every admitted request's whole prompt, counted once
    cached_prompt_tokens: int = 0  # of those, the tokens served from the cache at first admission
    generated_tokens: int = 0
    retractions: int = 0
    aborts: int = 0
    rejections: int = 0
    rollbacks: int = 0
    busy_checks: int = 0
    idle_checks: int = 0
    count_checks: int = 0  # contracts off: steps after which the count identities were checked
    finished: int = 0  # requests that ended with FINISHED (aborts and rejections are counted above)
    discarded_tokens: int = 0  # overlap: tokens sampled for requests that had already finished
    reject_reasons: dict[str, int] = field(default_factory=dict)
