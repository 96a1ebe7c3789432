"""A built-in workload after SGLang's ``bench_serving --dataset generated-shared-prefix``.

``num_groups`` groups share a system prompt of ``system_prompt_len`` tokens; each group has
``prompts_per_group`` questions of ``question_len`` tokens; every request asks for ``output_len`` new
tokens. Requests are shuffled (as bench_serving does) and arrive ``arrivals_per_step`` per scheduler
step, so admission, chunking, prefix hits, eviction and retraction all happen while others run.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


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

    @property
    def total(self) -> int:
        return self.num_groups * self.prompts_per_group

    def stream(self) -> Iterator[tuple[int, list[int], int]]:
        """The same requests as :meth:`requests`, in the same order, built one at a time.

        Only the system prompts and the questions are stored (as int32 arrays, about 4 bytes a token),
        so a run of a hundred thousand requests does not hold every prompt as a list of Python ints.
        The random draws and the shuffle are the ones :meth:`requests` makes (a shuffle's permutation
        depends only on the length and the generator), so both yield identical requests.
        """
        rng = random.Random(self.seed)
        systems: list[np.ndarray] = []
        questions = np.empty((self.total, self.question_len), dtype=np.int32)
        for g in range(self.num_groups):
            systems.append(np.array([rng.randrange(self.vocab_size) for _ in range(self.system_prompt_len)], np.int32))
            for q in range(self.prompts_per_group):
                questions[g * self.prompts_per_group + q] = [
                    rng.randrange(self.vocab_size) for _ in range(self.question_len)
                ]
        order = list(range(self.total))
        rng.shuffle(order)
        for rid, idx in enumerate(order):
            system = systems[idx // self.prompts_per_group]
            yield rid, system.tolist() + questions[idx].tolist(), self.output_len
