"""A built-in workload after SGLang's ``bench_serving --dataset generated-shared-prefix``.

``num_groups`` groups share a system prompt of ``system_prompt_len`` tokens; each group has
``prompts_per_group`` questions of ``question_len`` tokens; every request asks for ``output_len`` new
tokens. Requests are shuffled (as bench_serving does) and arrive ``arrivals_per_step`` per scheduler
step, so admission, chunking, prefix hits, eviction and retraction all happen while others run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class GSPWorkload:
    num_groups: int = 8
    prompts_per_group: int = 16
    system_prompt_len: int = 512
    question_len: int = 128
    output_len: int = 96
    vocab_size: int = 32000
    arrivals_per_step: int = 4
    seed: int = 0

    def requests(self) -> list[tuple[int, list[int], int]]:
        """``(rid, prompt, max_new_tokens)`` in arrival order."""
        rng = random.Random(self.seed)
        out: list[tuple[list[int], int]] = []
        for _ in range(self.num_groups):
            system = [rng.randrange(self.vocab_size) for _ in range(self.system_prompt_len)]
            for _ in range(self.prompts_per_group):
                question = [rng.randrange(self.vocab_size) for _ in range(self.question_len)]
                out.append((system + question, self.output_len))
        rng.shuffle(out)
        return [(rid, prompt, max_new) for rid, (prompt, max_new) in enumerate(out)]
