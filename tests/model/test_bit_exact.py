"""A token's arithmetic is the same bits whatever the batch, the chunking, the slots or the padding.

The end-to-end tests compare generated tokens, and an argmax hides small differences; these compare
the model's hidden state bit for bit. A small pool of scattered KV slots drives the same two
functions the pooled runner and ``generate_alone`` call (``project``, ``extend_after_store``): every
request is extended by random chunks, in batches of random companions, and its Mamba states (the
conv state holds the last residual-stream rows, the temporal state depends on every token) and next
token must equal those of the request computed alone in one extend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvledger.contracts.errors import InvalidArgument
from kvledger.reference.engine import model_weights
from kvledger.reference.model import generate_alone, tiny_hybrid
from kvledger.reference.model.tiny_hybrid import (
    Extend,
    TinyHybridConfig,
    TinyHybridWeights,
    extend_after_store,
    project,
)

VOCAB = 128
WEIGHTS = model_weights(VOCAB)


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


class ScatteredPool:
    """K/V rows handed out in a shuffled order (slot 0: padding, filled with NaN), Mamba states per request."""

    def __init__(self, weights: TinyHybridWeights, capacity: int, seed: int) -> None:
        c = weights.config
        self.weights = weights
        self.k = torch.zeros((capacity + 1, c.num_heads, c.head_dim))
        self.v = torch.zeros_like(self.k)
        self.k[0] = self.v[0] = float("nan")  # never a live position: must never reach a result
        self.free = (torch.randperm(capacity, generator=torch.Generator().manual_seed(seed)) + 1).tolist()
        self.slots: dict[int, list[int]] = {}
        self.conv: dict[int, torch.Tensor] = {}
        self.ssm: dict[int, torch.Tensor] = {}

    def forward(self, batch: list[tuple[int, list[int]]]) -> list[int]:
        """Extend each ``(rid, new tokens)`` of the batch; the next token of each."""
        c = self.weights.config
        starts, lens, tokens, new_slots = [], [], [], []
        for rid, new in batch:
            held = self.slots.setdefault(rid, [])
            starts.append(len(held))
            lens.append(len(new))
            taken = [self.free.pop() for _ in new]
            held.extend(taken)
            new_slots.extend(taken)
            tokens.extend(new)
            self.conv.setdefault(rid, torch.zeros((1, *c.conv_state_shape)))
            self.ssm.setdefault(rid, torch.zeros((1, *c.temporal_state_shape)))
        ext = Extend.build(starts, lens)
        x, q, k, v = project(self.weights, torch.tensor(tokens, dtype=torch.int64))
        self.k[new_slots] = k
        self.v[new_slots] = v
        width = max(len(self.slots[rid]) for rid, _ in batch)
        table = torch.zeros((len(batch), width), dtype=torch.int64)  # padding: slot 0, all NaN
        for b, (rid, _) in enumerate(batch):
            table[b, : len(self.slots[rid])] = torch.tensor(self.slots[rid])
        out, conv, ssm = extend_after_store(
            self.weights,
            x,
            q,
            ext,
            table,
            self.k,
            self.v,
            torch.cat([self.conv[rid] for rid, _ in batch]),
            torch.cat([self.ssm[rid] for rid, _ in batch]),
        )
        for b, (rid, _) in enumerate(batch):
            self.conv[rid], self.ssm[rid] = conv[b : b + 1], ssm[b : b + 1]
        return out


@contextlib.contextmanager
def attention_block_budget(elements: int) -> Iterator[None]:
    saved = tiny_hybrid._ATTENTION_BLOCK_ELEMENTS
    tiny_hybrid._ATTENTION_BLOCK_ELEMENTS = elements
    try:
        yield
    finally:
        tiny_hybrid._ATTENTION_BLOCK_ELEMENTS = saved


sequences = st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40), min_size=1, max_size=4)


@given(seqs=sequences, data=st.data(), budget=st.sampled_from([1, 200, 1 << 20]))
def test_hidden_state_is_the_same_bits_in_any_batch_and_chunking(
    seqs: list[list[int]], data: st.DataObject, budget: int
) -> None:
    alone = ScatteredPool(WEIGHTS, 4 * 40, seed=0)
    expected = {rid: alone.forward([(rid, seq)])[0] for rid, seq in enumerate(seqs)}

    pooled = ScatteredPool(WEIGHTS, 4 * 40, seed=data.draw(st.integers(0, 1000)))
    done = dict.fromkeys(range(len(seqs)), 0)
    last: dict[int, int] = {}
    with attention_block_budget(budget):  # 1: one request per attention block; 1 << 20: all together
        while any(done[rid] < len(seq) for rid, seq in enumerate(seqs)):
            pending = [rid for rid, seq in enumerate(seqs) if done[rid] < len(seq)]
            chosen = data.draw(st.lists(st.sampled_from(pending), min_size=1, unique=True))
            batch = []
            for rid in data.draw(st.permutations(chosen)):
                n = data.draw(st.integers(1, len(seqs[rid]) - done[rid]))
                batch.append((rid, seqs[rid][done[rid] : done[rid] + n]))
                done[rid] += n
            for (rid, _), tok in zip(batch, pooled.forward(batch), strict=True):
                last[rid] = tok
    for rid in range(len(seqs)):
        assert last[rid] == expected[rid]
        assert torch.equal(bits(pooled.conv[rid]), bits(alone.conv[rid])), rid
        assert torch.equal(bits(pooled.ssm[rid]), bits(alone.ssm[rid])), rid


def test_a_request_with_no_new_token_keeps_its_states() -> None:
    pool = ScatteredPool(WEIGHTS, 64, seed=1)
    pool.forward([(0, [1, 2, 3])])
    conv, ssm = pool.conv[0].clone(), pool.ssm[0].clone()
    out = pool.forward([(0, []), (1, [4, 5])])
    assert out[0] == -1 and out[1] >= 0
    assert torch.equal(bits(pool.conv[0]), bits(conv)) and torch.equal(bits(pool.ssm[0]), bits(ssm))


@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30), chunk=st.integers(1, 8))
def test_generate_alone_does_not_depend_on_the_prefill_chunk(prompt: list[int], chunk: int) -> None:
    assert generate_alone(WEIGHTS, prompt, 4, prefill_chunk=chunk) == generate_alone(WEIGHTS, prompt, 4)


def test_the_model_reacts_to_a_changed_token_or_changed_kv_bytes() -> None:
    """The oracle's power: a changed prompt token, or another token's K/V in an old position's slot
    (what every later read of a row pointing at the wrong slot sees), changes the next token in a
    good share of cases (an argmax over the vocabulary can hide a change; the old per-token model
    reacted to 10 of these 19 K/V changes, as this one does)."""
    prompt = list(range(3, 23))
    base = ScatteredPool(WEIGHTS, 64, seed=2).forward([(0, prompt)])[0]
    token_changes = 0
    for i in range(len(prompt)):
        edited = [*prompt[:i], 99, *prompt[i + 1 :]]
        token_changes += ScatteredPool(WEIGHTS, 64, seed=2).forward([(0, edited)])[0] != base
    kv_changes = 0
    for i in range(len(prompt) - 1):
        pool = ScatteredPool(WEIGHTS, 64, seed=2)
        pool.forward([(0, prompt[: i + 1])])
        slot = pool.slots[0][i]
        pool.k[slot], pool.v[slot] = WEIGHTS.k_table[99], WEIGHTS.v_table[99]
        kv_changes += pool.forward([(0, prompt[i + 1 :])])[0] != base
    assert token_changes >= len(prompt) // 2, token_changes
    assert kv_changes >= (len(prompt) - 1) // 3, kv_changes


@pytest.mark.parametrize("config", [TinyHybridConfig(head_dim=17), TinyHybridConfig(d_model=17)])
def test_a_model_too_wide_for_exact_grid_products_is_refused(config: TinyHybridConfig) -> None:
    with pytest.raises(InvalidArgument, match="too large for exact"):
        TinyHybridWeights(config)
