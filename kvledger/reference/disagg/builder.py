"""Assemble a PD pair: two engines from ``kvledger.reference.engine`` (reused, not copied) and a channel.

The prefill instance is an ordinary engine (any cache; the Mamba radix cache by default). The decode
instance has no radix cache by default (SGLang's ``ChunkCache``); ``PDSpec.decode_radix_cache`` gives it
one (SGLang's ``--disaggregation-decode-enable-radix-cache``, off by default there too): the plain
``RadixCache``, or for a hybrid model the ``MambaRadixCache`` without tracking, matched on KV only
(spec/pd.md §"The decode radix cache"). The decode instance has SGLang's sizing (I-SIZING,
``kvledger.contracts.sizing``): ``max_running + pre_alloc`` rows after a reserved row 0, and a Mamba
pool raised to cover every row. Both sides share the model (the same weights) and the page size.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvledger.contracts.errors import InvalidArgument, SizeOutOfRange
from kvledger.contracts.mamba_track import ping_pong_size
from kvledger.contracts.protocols import KVAllocator, MambaStatePool
from kvledger.contracts.sizing import decode_mamba_slots, decode_rows, default_pre_alloc_size
from kvledger.reference.config_fields import MAX_SIZE, Count, Size, check_fields
from kvledger.reference.disagg.channel import ChannelConfig, InstanceData, TransferChannel
from kvledger.reference.disagg.decode import DecodeScheduler
from kvledger.reference.disagg.prefill import PrefillScheduler
from kvledger.reference.disagg.system import PDSystem
from kvledger.reference.engine import EngineSpec, build_parts
from kvledger.reference.pools import MetadataBufferPool
from kvledger.reference.radix import MambaRadixCache, RadixCache

_SHARED = ("page_size", "hybrid", "mamba_layers", "model", "vocab_size", "eos_token_id", "max_context_len")


@dataclass(frozen=True)
class PDSpec:
    """``prefill`` and ``decode`` engine specs; the decode's ``rows`` and ``mamba_slots`` are the sizes
    asked for (SGLang's ``max_num_reqs`` is the decode's ``max_running``): the builder applies I-SIZING."""

    prefill: EngineSpec = field(default_factory=EngineSpec)
    decode: EngineSpec = field(default_factory=lambda: EngineSpec(tree="none"))
    pre_alloc_size: Count | None = None  # None: SGLang's default (2 x max_running when <= 32)
    prefill_metadata_slots: Size | None = None  # None: 2 x the prefill's max_running
    decode_metadata_slots: Size | None = None  # None: one per decode row
    reserved_decode_tokens: Count = 4
    channel: ChannelConfig = field(default_factory=ChannelConfig)
    # A radix cache on the decode instance (SGLang PR #19746; for hybrids #32732): pre-allocation matches
    # the prompt's KV there and only the rest is transferred. Off by default, as in SGLang.
    decode_radix_cache: bool = False

    def __post_init__(self) -> None:
        check_fields(self)  # engine specs, channel config, sizes (ints within their bounds) by annotation
        for name in _SHARED:
            if getattr(self.prefill, name) != getattr(self.decode, name):
                raise InvalidArgument(
                    f"PD: prefill and decode must agree on {name}:"
                    f" {getattr(self.prefill, name)!r} != {getattr(self.decode, name)!r}"
                )
        if self.decode.tree != "none":
            raise InvalidArgument(
                "PD: the decode engine spec takes no tree (tree='none'): its radix cache is"
                " PDSpec.decode_radix_cache"
            )
        if self.decode_radix_cache and self.decode.hybrid and self.decode.page_size != 1:
            # The decode captures no state, so its Mamba tree caches a finished request's working slot, at
            # token granularity (V1's rule); above page 1 that would need V2's tracked states on decode.
            raise InvalidArgument(
                f"PD: the decode radix cache of a hybrid model needs page_size 1, got {self.decode.page_size}"
            )
        sizes = self.derived_sizes()
        for name, value in sizes.items():
            if value > MAX_SIZE:
                raise SizeOutOfRange(f"PD: the {name} ({value}) would exceed MAX_SIZE {MAX_SIZE}")

    def decode_tracking_slots(self) -> int:
        """Mamba V2 on the decode side: the ping-pong tracking slots each decode request holds besides its
        working slot (SGLang's ``HybridMambaDecodeReqToTokenPool`` with ``enable_mamba_extra_buffer``:
        2 with the overlap scheduler, 1 without; none in V1 or without a Mamba pool)."""
        d = self.decode
        return ping_pong_size(d.hybrid and d.mamba_strategy == "extra_buffer", d.overlap)

    def derived_sizes(self) -> dict[str, int]:
        """The sizes the builder derives (I-SIZING): decode rows, decode Mamba slots, metadata slots."""
        d = self.decode
        pre_alloc = (
            default_pre_alloc_size(d.max_running) if self.pre_alloc_size is None else self.pre_alloc_size
        )
        rows = decode_rows(d.max_running, pre_alloc)
        return {
            "decode rows (max_running + pre_alloc_size)": rows,
            "decode Mamba slots": (
                decode_mamba_slots(d.mamba_slots, rows, 1 + self.decode_tracking_slots())
                if d.hybrid
                else d.mamba_slots
            ),
            "prefill metadata slots": self.prefill_metadata_slots or 2 * self.prefill.max_running,
            "decode metadata slots": self.decode_metadata_slots or rows,
        }


def build_pd(spec: PDSpec) -> PDSystem:
    """Both instances, their metadata pools and the channel for ``spec`` (a :class:`PDSpec`, checked when it
    was made)."""
    if not isinstance(spec, PDSpec):
        raise InvalidArgument(f"build_pd: expected a PDSpec, got {type(spec).__name__}")
    channel = TransferChannel(spec.channel)
    rows, mamba, p_slots, d_slots = spec.derived_sizes().values()
    p = build_parts(replace(spec.prefill, name_prefix="prefill."))
    d = build_parts(replace(spec.decode, rows=rows, mamba_slots=mamba, reserved_rows=1, name_prefix="decode."))
    p_meta = MetadataBufferPool(p_slots, name="prefill.metadata", checks=spec.prefill.checks)
    d_meta = MetadataBufferPool(d_slots, name="decode.metadata", checks=spec.decode.checks)
    if spec.decode_radix_cache:
        d.tree = decode_tree(d.kv_allocator, d.mamba_pool)
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
        mamba_slots_per_req=1 + spec.decode_tracking_slots(),
        tracking_slots=spec.decode_tracking_slots(),
        note_kv_written=note,
        **d.scheduler_kwargs(),
    )
    channel.attach(
        InstanceData(p.kv_buffer, p.mamba_pool, p_meta),
        InstanceData(d.kv_buffer, d.mamba_pool, d_meta, note),
    )
    return PDSystem(prefill, decode, channel)


def decode_tree(kv_allocator: KVAllocator, mamba_pool: MambaStatePool | None) -> RadixCache | MambaRadixCache:
    """The decode instance's radix cache: the plain one, or for a hybrid model the Mamba one without
    tracking (no ``mamba_cache_chunk_size``: the decode captures no state; a finished request's working
    slot is what it caches, as #32732's ``cache_finished_req`` does; page size 1, as V1's)."""
    if mamba_pool is None:
        return RadixCache(kv_allocator, name="decode.radix")
    return MambaRadixCache(kv_allocator, mamba_pool, name="decode.mamba_radix")
