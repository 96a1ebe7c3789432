"""One place that assembles pools, cache, model runner and scheduler from a flat description.

``kvledger simulate``, the tests and the benchmarks all build their engines here, so a configuration
means the same thing everywhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, TypedDict

from kvledger.contracts import switch
from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.mamba_track import FLA_CHUNK_SIZE
from kvledger.reference.config_fields import Count, Size, allocating, check_fields, check_fits_memory
from kvledger.reference.model import TinyHybridConfig, TinyHybridRunner, TinyHybridWeights
from kvledger.reference.model.speculative import SpeculativeTinyRunner
from kvledger.reference.pools import (
    KVBufferPool,
    MambaPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from kvledger.reference.radix import MambaRadixCache, RadixCache
from kvledger.reference.scheduler import HashTokenRunner, Scheduler, SchedulerConfig
from kvledger.reference.scheduler.config import CowReleasePolicy, MambaSchedulerStrategy
from kvledger.reference.scheduler.runner import ModelRunner
from kvledger.reference.scheduler.spec_config import SpeculativeConfig
from kvledger.reference.scheduler.tagging_runner import TaggingHashRunner

TreeKind = Literal["mamba_radix", "radix", "none"]
ModelKind = Literal["hash", "tiny-hybrid", "hash-tags"]  # hash-tags: the hash runner with data tags


@dataclass(frozen=True)
class EngineSpec:
    """Pool sizes, cache, model and scheduler knobs of one engine (CPU tensors).

    The defaults are a small engine with the Mamba radix cache in SGLang's ``extra_buffer`` mode (Mamba
    V2), as ``kvledger simulate`` runs by default: the kernel's chunk of 64 tokens (the capture grid) and
    a chunked prefill of one grid. ``mamba_strategy="no_buffer"`` selects V1 (page size 1). The strategy
    is the Mamba radix cache's: with another tree (or none) there is nothing to track, and the engine runs
    as with ``no_buffer``. Every size is an int in ``[1, MAX_SIZE]`` (``reserved_rows`` may be 0), checked
    here, before anything is allocated (``kvledger.reference.config_fields``).
    """

    page_size: Size = 1
    tree: TreeKind = "mamba_radix"
    hybrid: bool = True  # a Mamba pool; required by the Mamba radix cache and the tiny hybrid model
    kv_tokens: Size = 128
    rows: Size = 4
    mamba_slots: Size = 4
    mamba_layers: Size = 1
    max_running: Size = 4
    chunk: Size | None = FLA_CHUNK_SIZE  # V2 needs at least one capture grid per chunk
    max_prefill: Size = 64
    overlap: bool = False
    cow_release_policy: CowReleasePolicy = "if_not_appended"
    max_context_len: Size = 256
    eos_token_id: int | None = None
    model: ModelKind = "hash"
    vocab_size: Size = 32000
    reserved_rows: Count = 0  # padding rows before the usable ones (1 on a PD decode instance)
    name_prefix: str = ""  # prefixes the pools' names (``prefill.kv``): ledger reports name the instance
    mamba_strategy: MambaSchedulerStrategy = "extra_buffer"  # the Mamba radix cache: V2, or V1 "no_buffer"
    mamba_track_interval: Size = 256
    mamba_chunk_size: Size | None = None  # V2's kernel chunk (None: 64); the capture grid is max(it, page)
    speculative: SpeculativeConfig | None = None  # EAGLE/MTP (spec/speculative.md); rows widened to fit
    # The checking level the pools are built at (spec/checking-levels.md); None: the process's level
    # (``KVLEDGER_CHECKS``, read once at import). ``full`` only in a process started at full.
    checks: CheckLevel | None = None

    def __post_init__(self) -> None:
        check_fields(self)  # every field of its annotated type and within its bounds (MAX_SIZE)
        switch.building_level(self.checks, "EngineSpec.checks")  # full only in a process started at full
        if self.kv_tokens < self.page_size:
            raise InvalidArgument(
                f"EngineSpec: kv_tokens {self.kv_tokens} is less than one page of {self.page_size}"
            )
        if self.kv_tokens % self.page_size:  # the paged allocator would drop the partial page, silently
            raise InvalidArgument(
                f"EngineSpec: kv_tokens {self.kv_tokens} is not a multiple of page_size {self.page_size}"
                f" (whole pages only: {self.kv_tokens - self.kv_tokens % self.page_size} or"
                f" {self.kv_tokens - self.kv_tokens % self.page_size + self.page_size})"
            )
        if self.chunk is not None and self.chunk < self.page_size:
            raise InvalidArgument(
                f"EngineSpec.chunk {self.chunk} must be None or >= page_size {self.page_size}"
            )
        if self.eos_token_id is not None and not 0 <= self.eos_token_id < self.vocab_size:
            raise InvalidArgument(
                f"EngineSpec.eos_token_id {self.eos_token_id} outside [0, {self.vocab_size})"
            )
        if self.tree == "mamba_radix" and self.page_size != 1 and self.mamba_strategy != "extra_buffer":
            raise InvalidArgument(
                "the Mamba radix cache in V1 (no_buffer) caches states at token granularity: page_size must be 1"
            )
        v1_tree = self.tree == "mamba_radix" and self.mamba_strategy == "no_buffer"
        if self.speculative is not None and self.overlap and v1_tree:
            # A verify launched before the previous batch's results moves the working state to its accepted
            # prefix while kv_committed_len waits for those results; V1 caches the working state itself (a
            # chunk's fork, a finish's adoption), so it would cache a state of more tokens than its node
            # (found by the data tags, spec/speculative.md). SGLang runs V1 without the overlap scheduler
            # and speculative decoding on extra_buffer only.
            raise InvalidArgument(
                "EngineSpec: speculative decoding with the overlap scheduler needs the Mamba radix cache in"
                " extra_buffer (V2) mode: V1 (no_buffer) would cache a working state an in-flight verify moved"
            )
        if self.tree == "mamba_radix" and not self.hybrid:
            raise InvalidArgument("the Mamba radix cache needs a Mamba pool (hybrid=True)")
        if self.model == "tiny-hybrid" and not self.hybrid:
            raise InvalidArgument("the tiny hybrid model needs a Mamba pool (hybrid=True)")
        _scheduler_config(self)  # the scheduler's own rules (V2's capture grid), before anything is built


def _scheduler_config(spec: EngineSpec) -> SchedulerConfig:
    """The scheduler's configuration for ``spec``. The strategy is the Mamba radix cache's: with another
    tree (or none) no state is tracked, so the engine runs as with ``no_buffer`` and V2's rules (a chunk of
    at least one capture grid) do not apply."""
    return SchedulerConfig(
        page_size=spec.page_size,
        max_running_requests=spec.max_running,
        max_prefill_tokens=spec.max_prefill,
        chunked_prefill_size=spec.chunk,
        max_context_len=spec.max_context_len,
        overlap=spec.overlap,
        cow_release_policy=spec.cow_release_policy,
        eos_token_id=spec.eos_token_id,
        mamba_scheduler_strategy=spec.mamba_strategy if spec.tree == "mamba_radix" else "no_buffer",
        mamba_track_interval=spec.mamba_track_interval,
        mamba_chunk_size=spec.mamba_chunk_size,
        speculative=spec.speculative,
    )


def model_weights(vocab_size: int) -> TinyHybridWeights:
    """The tiny hybrid model's weights for a vocabulary (seeded, so every caller gets the same model)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise InvalidArgument(f"model_weights: vocab_size must be an int >= 1, got {vocab_size!r}")
    return _model_weights(vocab_size)


@functools.lru_cache(maxsize=4)
def _model_weights(vocab_size: int) -> TinyHybridWeights:
    return TinyHybridWeights(TinyHybridConfig(vocab_size=vocab_size))


KVAllocatorClass = TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator
"""The reference's KV allocators (page size 1, paged)."""


class SchedulerParts(TypedDict):
    """The collaborators a :class:`Scheduler` is built from, as keyword arguments."""

    kv_allocator: KVAllocatorClass
    req_to_token_pool: ReqToTokenPool
    mamba_pool: MambaPool | None
    tree: RadixCache | MambaRadixCache | None
    runner: ModelRunner


@dataclass
class EngineParts:
    """Everything a scheduler is built from; ``kv_buffer`` is None with the plain hash runner (no KV data)."""

    config: SchedulerConfig
    kv_allocator: KVAllocatorClass
    req_to_token_pool: ReqToTokenPool
    mamba_pool: MambaPool | None
    tree: RadixCache | MambaRadixCache | None
    runner: ModelRunner
    kv_buffer: KVBufferPool | None

    def scheduler_kwargs(self) -> SchedulerParts:
        return {
            "kv_allocator": self.kv_allocator,
            "req_to_token_pool": self.req_to_token_pool,
            "mamba_pool": self.mamba_pool,
            "tree": self.tree,
            "runner": self.runner,
        }


ID_BYTES = 25
"""Host bytes per id of a pool's free list (ring, positions, scratch: int64; state: one byte), ledger aside."""

MAMBA_STATE_BYTES = 16
"""Host bytes per Mamba slot and layer, at least (conv and temporal state, the hash runner's shapes)."""


def _estimated_bytes(spec: EngineSpec) -> int:
    """A lower estimate of the host memory ``spec``'s pools take: the free lists, the request-to-token
    table and the Mamba states (the ledgers, the KV buffer and the cache come on top)."""
    ids = spec.kv_tokens // spec.page_size + spec.rows + (spec.mamba_slots if spec.hybrid else 0)
    table = (spec.reserved_rows + spec.rows) * spec.max_context_len * 4  # int32
    states = (spec.mamba_slots + 1) * spec.mamba_layers * MAMBA_STATE_BYTES if spec.hybrid else 0
    return ids * ID_BYTES + table + states


def _check_memory(spec: EngineSpec) -> None:
    need = _estimated_bytes(spec)
    check_fits_memory(
        need,
        f"EngineSpec: the pools (kv_tokens={spec.kv_tokens}, rows={spec.rows} x max_context_len="
        f"{spec.max_context_len}, mamba_slots={spec.mamba_slots} x mamba_layers={spec.mamba_layers})",
    )


def build_parts(spec: EngineSpec) -> EngineParts:
    """Pools, cache, runner and scheduler config for ``spec`` (the PD builder reuses this per instance); an
    :class:`EngineSpec` was checked when it was made."""
    if not isinstance(spec, EngineSpec):
        raise InvalidArgument(f"build_parts: expected an EngineSpec, got {type(spec).__name__}")
    config = _scheduler_config(spec)
    _check_memory(spec)
    with allocating(
        f"engine {spec.name_prefix or ''}(kv_tokens={spec.kv_tokens}, rows={spec.rows},"
        f" max_context_len={spec.max_context_len}, mamba_slots={spec.mamba_slots})"
    ):
        return _build_parts(spec, config)


def _build_parts(spec: EngineSpec, config: SchedulerConfig) -> EngineParts:
    kv: KVAllocatorClass
    prefix = spec.name_prefix
    if spec.page_size == 1:
        kv = TokenToKVPoolAllocator(spec.kv_tokens, name=f"{prefix}kv", checks=spec.checks)
    else:
        kv = PagedTokenToKVPoolAllocator(
            spec.kv_tokens, spec.page_size, name=f"{prefix}kv", checks=spec.checks
        )
    rows = ReqToTokenPool(  # as wide as the context plus the speculative over-allocation (I-SPEC-ROW)
        spec.rows, config.max_allocated_len, name=f"{prefix}req", reserved_rows=spec.reserved_rows,
        checks=spec.checks,
    )
    rows.attach_kv_owners(kv)  # debug builds: I-ROW-WRITE on every row write
    model = model_weights(spec.vocab_size) if spec.model == "tiny-hybrid" else None
    mamba = None
    if spec.hybrid:
        conv, temporal = (
            (model.config.conv_state_shape, model.config.temporal_state_shape) if model else ((2,), (2,))
        )
        mamba = MambaPool(
            spec.mamba_slots,
            num_layers=1 if model else spec.mamba_layers,
            conv_state_shape=conv,
            temporal_state_shape=temporal,
            name=f"{prefix}mamba",
            checks=spec.checks,
        )
    tree: RadixCache | MambaRadixCache | None = None
    if spec.tree == "mamba_radix":
        assert mamba is not None  # EngineSpec refuses the Mamba radix cache without a Mamba pool
        chunk = config.mamba_cache_chunk_size if config.extra_buffer else None
        tree = MambaRadixCache(kv, mamba, mamba_cache_chunk_size=chunk)
    elif spec.tree == "radix":
        tree = RadixCache(kv)
    runner: ModelRunner = HashTokenRunner(spec.vocab_size)
    kv_buffer = None
    if model is not None:
        c = model.config
        kv_buffer = KVBufferPool.for_allocator(
            kv, num_layers=1, num_kv_heads=c.num_heads, head_dim=c.head_dim
        )
        kv.attach_kv_buffer(kv_buffer)  # debug builds: zero on alloc, poison on free
        assert mamba is not None  # EngineSpec refuses the tiny hybrid model without Mamba layers
        runner_class = TinyHybridRunner if spec.speculative is None else SpeculativeTinyRunner
        runner = runner_class(
            model,
            kv_buffer=kv_buffer,
            req_to_token_pool=rows,
            mamba_pool=mamba,
            check_integrity=kv.ledger.debug,  # debug builds check what the reads see; release builds don't
        )
    elif spec.model == "hash-tags":  # the hunt's: the hash tokens, and data tags in every state and KV slot
        # Not attached to the allocator (no zeroing on alloc, no poison on free): a stale slot already
        # holds another prefix's tag, which the checks see as such.
        kv_buffer = KVBufferPool.for_allocator(kv, num_layers=1, num_kv_heads=1, head_dim=2)
        runner = TaggingHashRunner(
            spec.vocab_size, mamba_pool=mamba, kv_buffer=kv_buffer, req_to_token_pool=rows
        )
    return EngineParts(config, kv, rows, mamba, tree, runner, kv_buffer)


def build_engine(spec: EngineSpec) -> Scheduler:
    """Pools, cache, runner and scheduler for ``spec`` (an :class:`EngineSpec`, checked when it was made)."""
    parts = build_parts(spec)
    return Scheduler(parts.config, **parts.scheduler_kwargs())
