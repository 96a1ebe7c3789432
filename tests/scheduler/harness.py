"""Building scheduler set-ups for tests, and the generation oracle for the hash runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvledger.reference.model import TinyHybridConfig, TinyHybridRunner, TinyHybridWeights, generate_alone
from kvledger.reference.pools import (
    KVBufferPool,
    MambaPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from kvledger.reference.radix import MambaRadixCache, RadixCache
from kvledger.reference.scheduler import HashTokenRunner, Scheduler, SchedulerConfig, hash_next_token


@dataclass(frozen=True)
class Setup:
    """One configuration of pools, cache and scheduler knobs."""

    page_size: int = 1
    tree: str = "mamba_radix"  # "mamba_radix" | "radix" | "none"
    hybrid: bool = True  # a Mamba pool
    kv_tokens: int = 128
    rows: int = 4
    mamba_slots: int = 4
    max_running: int = 4
    chunk: int | None = 16
    max_prefill: int = 64
    overlap: bool = False
    cow_release_policy: str = "if_not_appended"
    max_context_len: int = 256
    eos_token_id: int | None = None
    model: bool = False  # the tiny hybrid model instead of the hash runner (needs hybrid=True)


def build(setup: Setup, runner: Any = None) -> Scheduler:
    if setup.page_size == 1:
        kv: Any = TokenToKVPoolAllocator(setup.kv_tokens)
    else:
        kv = PagedTokenToKVPoolAllocator(setup.kv_tokens, setup.page_size)
    rows = ReqToTokenPool(setup.rows, setup.max_context_len)
    mamba = None
    if setup.hybrid:
        conv, temporal = (
            (MODEL_CONFIG.conv_state_shape, MODEL_CONFIG.temporal_state_shape)
            if setup.model
            else ((2,), (2,))
        )
        mamba = MambaPool(
            setup.mamba_slots, num_layers=1, conv_state_shape=conv, temporal_state_shape=temporal
        )
    tree: Any = None
    if setup.tree == "mamba_radix":
        assert mamba is not None
        tree = MambaRadixCache(kv, mamba)
    elif setup.tree == "radix":
        tree = RadixCache(kv)
    if setup.model:
        runner = model_runner(kv, rows, mamba)
    config = SchedulerConfig(
        page_size=setup.page_size,
        max_running_requests=setup.max_running,
        max_prefill_tokens=setup.max_prefill,
        chunked_prefill_size=setup.chunk,
        max_context_len=setup.max_context_len,
        overlap=setup.overlap,
        cow_release_policy=setup.cow_release_policy,  # type: ignore[arg-type]
        eos_token_id=setup.eos_token_id,
    )
    return Scheduler(
        config,
        kv_allocator=kv,
        req_to_token_pool=rows,
        mamba_pool=mamba,
        tree=tree,
        runner=runner if runner is not None else HashTokenRunner(),
    )


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


MODEL_CONFIG = TinyHybridConfig()
MODEL_WEIGHTS = TinyHybridWeights(MODEL_CONFIG)


def model_runner(kv: Any, rows: Any, mamba: Any, *, check_integrity: bool = True) -> TinyHybridRunner:
    """The tiny hybrid model over these pools; the KV allocator zeroes/poisons slots in debug builds."""
    c = MODEL_CONFIG
    kv_buffer = KVBufferPool.for_allocator(kv, num_layers=1, num_kv_heads=c.num_heads, head_dim=c.head_dim)
    kv.attach_kv_buffer(kv_buffer)
    return TinyHybridRunner(
        MODEL_WEIGHTS,
        kv_buffer=kv_buffer,
        req_to_token_pool=rows,
        mamba_pool=mamba,
        check_integrity=check_integrity,
    )


def model_expected_output(prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    """What the tiny hybrid model generates for ``prompt`` run alone with no cache."""
    return generate_alone(MODEL_WEIGHTS, prompt, max_new_tokens, eos)
