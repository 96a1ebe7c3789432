"""The data plane of a transfer: what a landing message writes on the decode side, through the kernels.

A transfer moves bytes between two instances' tensors: K/V of token slots (prefill buffer to decode
buffer), a Mamba state slot (every layer's conv and temporal state) and a metadata slot. Each is a
store of rows at slots (``kernels.store_kv``, which writes two slot-indexed buffers at once: K and V,
conv and temporal state, room and first token), reading the source rows at the moment of landing, as
an RDMA write reads its source while it runs. That is why a source id must not be reallocated before
its message resolves (the reader lease).
"""

from __future__ import annotations

import torch

from kvledger import kernels
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.protocols import MambaStateTensors
from kvledger.contracts.switch import ensure
from kvledger.reference.disagg.request import HostCopy
from kvledger.reference.pools.kv_buffer import KVBufferPool
from kvledger.reference.pools.mamba_pool import MambaPool
from kvledger.reference.pools.metadata_pool import MetadataBufferPool


def _index(ids: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64, device=device)


def copy_kv(src_buffer: KVBufferPool, src_slots: list[int], dst_buffer: KVBufferPool, dst_slots: list[int]) -> None:
    """K/V of ``src_slots`` (every attention layer) into ``dst_slots`` of another buffer: the raw rows, as
    an RDMA write copies them (poison included: a source freed too early shows in the data it lands)."""
    if len(src_slots) != len(dst_slots):
        raise ContractViolation(f"KV landing: {len(src_slots)} source slots for {len(dst_slots)} destinations")
    src = _index(src_slots, src_buffer.device)
    dst = _index(dst_slots, dst_buffer.device)
    for layer in range(dst_buffer.num_layers):
        k = src_buffer.k_buffer[layer, src].to(dst_buffer.device)
        v = src_buffer.v_buffer[layer, src].to(dst_buffer.device)
        kernels.store_kv(dst_buffer.k_buffer, dst_buffer.v_buffer, layer, dst, k, v)


def _fingerprints(pool: MambaPool, slot: int) -> list[int]:
    idx = _index([slot], pool.device)
    return [int(kernels.fingerprint_slots(state, idx)[0]) for state in pool.states]


@ensure(
    lambda src_pool, src_slot, dst_pool, dst_slot: _fingerprints(src_pool, src_slot)
    == _fingerprints(dst_pool, dst_slot),
    "I-COPY: the landed state equals its source bit for bit",
)
def copy_state(src_pool: MambaPool, src_slot: int, dst_pool: MambaPool, dst_slot: int) -> None:
    """The Mamba state of ``src_slot`` (conv and temporal, every layer) into ``dst_slot`` of another pool."""
    src = _index([src_slot], src_pool.device)
    dst = _index([dst_slot], dst_pool.device)
    for layer in range(dst_pool.num_layers):
        conv = src_pool.conv_state[layer, src].to(dst_pool.device)
        temporal = src_pool.temporal_state[layer, src].to(dst_pool.device)
        kernels.store_kv(dst_pool.conv_state, dst_pool.temporal_state, layer, dst, conv, temporal)


def copy_metadata(src_pool: MetadataBufferPool, src_slot: int, dst_pool: MetadataBufferPool, dst_slot: int) -> None:
    """Room and first output token of ``src_slot`` into ``dst_slot`` of the other side's metadata pool: the
    raw contents (room 0 when the prefill wrote nothing, poison when its slot was freed); the decode's
    commit reads the room and refuses one that is not its own."""
    rooms, tokens = src_pool.gather(_index([src_slot], src_pool.device))
    dst = _index([dst_slot], dst_pool.device)
    kernels.store_kv(
        dst_pool.bootstrap_room,
        dst_pool.output_id,
        0,
        dst,
        rooms.to(dst_pool.device),
        tokens.to(dst_pool.device),
    )


def restore(
    kv_buffer: KVBufferPool | None,
    slots: torch.Tensor,
    copy: HostCopy,
    mamba_pool: MambaStateTensors | None,
    mamba_slot: torch.Tensor | None,
) -> None:
    """Write a retracted request's host copy back: K/V into ``slots``, the state into ``mamba_slot`` (the
    raw bytes, as they were copied out; a copy of poisoned rows shows when the model reads them)."""
    if kv_buffer is not None and copy.k is not None:
        assert copy.v is not None, "a host copy holds K and V together"
        for layer in range(kv_buffer.num_layers):
            k, v = copy.k[layer].to(kv_buffer.device), copy.v[layer].to(kv_buffer.device)
            kernels.store_kv(kv_buffer.k_buffer, kv_buffer.v_buffer, layer, slots, k, v)
    if mamba_pool is not None and copy.conv is not None:
        assert copy.temporal is not None and mamba_slot is not None, "a state copy lands in the request's slot"
        for layer in range(mamba_pool.num_layers):
            kernels.store_kv(
                mamba_pool.conv_state,
                mamba_pool.temporal_state,
                layer,
                mamba_slot,
                copy.conv[layer].to(mamba_pool.device),
                copy.temporal[layer].to(mamba_pool.device),
            )
