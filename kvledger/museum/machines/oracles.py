"""What a request generates when run alone with no cache: the machines' output oracle (I-OUTPUT-ORACLE)."""

from __future__ import annotations

from kvledger.reference.engine import model_weights
from kvledger.reference.model import generate_alone
from kvledger.reference.scheduler import hash_next_token


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
