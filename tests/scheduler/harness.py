"""Scheduler set-ups for tests (``kvledger.reference.engine``), and the generation oracles."""

from __future__ import annotations

from hypothesis import settings

from kvledger.reference.engine import EngineSpec, build_engine, model_weights
from kvledger.reference.model import generate_alone
from kvledger.reference.scheduler import hash_next_token

Setup = EngineSpec
build = build_engine


def expected_output(
    prompt: list[int], max_new_tokens: int, eos: int | None = None, vocab_size: int = 32000
) -> list[int]:
    """What the hash runner generates for ``prompt`` when run alone with no cache."""
    ctx = list(prompt)
    out: list[int] = []
    while len(out) < max_new_tokens:
        tok = hash_next_token(ctx, vocab_size)
        out.append(tok)
        ctx.append(tok)
        if eos is not None and tok == eos:
            break
    return out


def model_expected_output(
    prompt: list[int], max_new_tokens: int, eos: int | None = None, vocab_size: int = 32000
) -> list[int]:
    """What the tiny hybrid model generates for ``prompt`` run alone with no cache."""
    return generate_alone(model_weights(vocab_size), prompt, max_new_tokens, eos)


def long_fuzz_settings(max_examples: int, stateful_step_count: int) -> settings:
    """Settings for the ``deep``-marked nightly fuzz runs: randomised, no database, blob printed."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=stateful_step_count,
        deadline=None,
        derandomize=False,
        database=None,
        print_blob=True,
    )
