"""PD set-ups for the machines and tests: small pools on both sides, a channel with short timeouts, and
the output oracle."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvledger.museum.machines.oracles import expected_output, model_expected_output
from kvledger.reference.disagg import ChannelConfig, PDSpec, PDSystem, build_pd
from kvledger.reference.engine import EngineSpec, ModelKind, TreeKind
from kvledger.reference.scheduler.config import MambaSchedulerStrategy

FAST_CHANNEL = ChannelConfig(latency=1, delay_steps=2, bootstrap_timeout=8, transfer_timeout=16, message_timeout=4)


def pd_spec(
    *,
    tree: TreeKind = "mamba_radix",
    model: ModelKind = "hash",
    page_size: int = 1,
    hybrid: bool = True,
    prefill_kv: int = 200,
    prefill_rows: int = 4,
    prefill_mamba: int = 8,
    chunk: int | None = 8,
    decode_kv: int = 200,
    decode_running: int = 4,
    decode_mamba: int = 4,
    overlap: bool = False,
    decode_overlap: bool | None = None,
    eos: int | None = None,
    channel: ChannelConfig = FAST_CHANNEL,
    vocab_size: int = 128,
    max_context_len: int = 96,
    mamba_strategy: MambaSchedulerStrategy = "no_buffer",
    mamba_chunk_size: int | None = None,
    mamba_track_interval: int = 256,
    **extra: Any,
) -> PDSpec:
    """Small PD pools, Mamba V1 (``no_buffer``, page size 1) on both sides unless asked for V2 (these
    set-ups were written for V1; ``EngineSpec``'s own default is V2). The strategy is the pair's: under V2
    the prefill's Mamba radix cache tracks with ping-pong slots and each decode request holds its
    tracking slots too (``PDSpec.decode_tracking_slots``)."""
    shared = dict(
        mamba_strategy=mamba_strategy,
        mamba_chunk_size=mamba_chunk_size,
        mamba_track_interval=mamba_track_interval,
        page_size=page_size,
        hybrid=hybrid,
        model=model,
        vocab_size=vocab_size,
        eos_token_id=eos,
        max_context_len=max_context_len,
    )
    prefill = EngineSpec(
        tree=tree,
        kv_tokens=prefill_kv,
        rows=prefill_rows,
        mamba_slots=prefill_mamba,
        max_running=prefill_rows,
        chunk=chunk,
        max_prefill=64,
        overlap=overlap,
        **shared,  # type: ignore[arg-type]
    )
    decode = EngineSpec(
        tree="none",
        kv_tokens=decode_kv,
        rows=decode_running,
        mamba_slots=decode_mamba,
        max_running=decode_running,
        chunk=None,
        overlap=overlap if decode_overlap is None else decode_overlap,
        **shared,  # type: ignore[arg-type]
    )
    return PDSpec(prefill=prefill, decode=decode, channel=channel, **extra)


def build(spec: PDSpec | None = None, **kwargs: Any) -> PDSystem:
    return build_pd(spec if spec is not None else pd_spec(**kwargs))


def expected(system: PDSystem, prompt: list[int], max_new_tokens: int) -> list[int]:
    """What the request generates run alone, with the system's model."""
    d = system.decode.config
    vocab = system.decode.runner.weights.config.vocab_size if hasattr(system.decode.runner, "weights") else None
    if vocab is not None:
        return model_expected_output(prompt, max_new_tokens, d.eos_token_id, vocab_size=vocab)
    runner: Any = system.decode.runner  # the hash runner (the tiny model's case is above)
    return expected_output(prompt, max_new_tokens, d.eos_token_id, vocab_size=runner.vocab_size)


def with_channel(spec: PDSpec, **changes: Any) -> PDSpec:
    return replace(spec, channel=replace(spec.channel, **changes))
