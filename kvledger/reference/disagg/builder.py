"""Assemble a PD pair: two engines from ``kvledger.reference.engine`` (reused, not copied) and a channel.

The prefill instance is an ordinary engine (any cache; the Mamba radix cache by default). The decode
instance has no radix cache (SGLang's default ``ChunkCache``) and SGLang's sizing (I-SIZING,
``kvledger.contracts.sizing``): ``max_running + pre_alloc`` rows after a reserved row 0, and a Mamba
pool raised to cover every row. Both sides share the model (the same weights) and the page size.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.sizing import decode_mamba_slots, decode_rows, default_pre_alloc_size
from kvledger.reference.config_fields import check_fields
from kvledger.reference.disagg.channel import ChannelConfig, InstanceData, TransferChannel
from kvledger.reference.disagg.decode import DecodeScheduler
from kvledger.reference.disagg.prefill import PrefillScheduler
from kvledger.reference.disagg.system import PDSystem
from kvledger.reference.engine import EngineSpec, build_parts
from kvledger.reference.pools import MetadataBufferPool

_SHARED = ("page_size", "hybrid", "mamba_layers", "model", "vocab_size", "eos_token_id", "max_context_len")


@dataclass(frozen=True)
class PDSpec:
    """``prefill`` and ``decode`` engine specs; the decode's ``rows`` and ``mamba_slots`` are the sizes
    asked for (SGLang's ``max_num_reqs`` is the decode's ``max_running``): the builder applies I-SIZING."""

    prefill: EngineSpec = field(default_factory=EngineSpec)
    decode: EngineSpec = field(default_factory=lambda: EngineSpec(tree="none"))
    pre_alloc_size: int | None = None  # None: SGLang's default (2 x max_running when <= 32)
    prefill_metadata_slots: int | None = None  # None: 2 x the prefill's max_running
    decode_metadata_slots: int | None = None  # None: one per decode row
    reserved_decode_tokens: int = 4
    channel: ChannelConfig = field(default_factory=ChannelConfig)

    def __post_init__(self) -> None:
        check_fields(self)  # engine specs, channel config, ints (not bools or floats) by their annotations
        for name in _SHARED:
            if getattr(self.prefill, name) != getattr(self.decode, name):
                raise InvalidArgument(
                    f"PD: prefill and decode must agree on {name}:"
                    f" {getattr(self.prefill, name)!r} != {getattr(self.decode, name)!r}"
                )
        if self.decode.tree != "none":
            raise InvalidArgument("PD: the decode instance has no radix cache (tree='none')")
        for name in ("pre_alloc_size", "prefill_metadata_slots", "decode_metadata_slots"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "pre_alloc_size" else 1):
                raise InvalidArgument(f"PD: {name} must be positive, got {value}")
        if self.reserved_decode_tokens < 0:
            raise InvalidArgument("PD: reserved_decode_tokens must be >= 0")


def build_pd(spec: PDSpec) -> PDSystem:
    """Both instances, their metadata pools and the channel for ``spec`` (a :class:`PDSpec`, checked when it
    was made)."""
    if not isinstance(spec, PDSpec):
        raise InvalidArgument(f"build_pd: expected a PDSpec, got {type(spec).__name__}")
    channel = TransferChannel(spec.channel)
    p = build_parts(replace(spec.prefill, name_prefix="prefill."))
    d_in = spec.decode
    pre_alloc = default_pre_alloc_size(d_in.max_running) if spec.pre_alloc_size is None else spec.pre_alloc_size
    rows = decode_rows(d_in.max_running, pre_alloc)
    mamba = decode_mamba_slots(d_in.mamba_slots, rows, 1) if d_in.hybrid else d_in.mamba_slots
    d = build_parts(replace(d_in, rows=rows, mamba_slots=mamba, reserved_rows=1, name_prefix="decode."))
    p_meta = MetadataBufferPool(spec.prefill_metadata_slots or 2 * spec.prefill.max_running, name="prefill.metadata")
    d_meta = MetadataBufferPool(spec.decode_metadata_slots or rows, name="decode.metadata")
    note = getattr(d.runner, "note_external_writes", None)
    prefill = PrefillScheduler(
        p.config, metadata_pool=p_meta, channel=channel, kv_buffer=p.kv_buffer, **p.scheduler_kwargs()
    )
    decode = DecodeScheduler(
        d.config,
        metadata_pool=d_meta,
        channel=channel,
        kv_buffer=d.kv_buffer,
        reserved_decode_tokens=spec.reserved_decode_tokens,
        note_kv_written=note,
        **d.scheduler_kwargs(),
    )
    channel.attach(
        InstanceData(p.kv_buffer, p.mamba_pool, p_meta),
        InstanceData(d.kv_buffer, d.mamba_pool, d_meta, note),
    )
    return PDSystem(prefill, decode, channel)
