"""Tensor-backed pools with SGLang's names and semantics, each shadowed by an ownership ledger."""

from kvledger.reference.pools.kv_buffer import KVBufferPool
from kvledger.reference.pools.mamba_pool import MambaPool
from kvledger.reference.pools.metadata_pool import MetadataBufferPool
from kvledger.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvledger.reference.pools.req_to_token import ReqToTokenPool
from kvledger.reference.pools.token_allocator import TokenToKVPoolAllocator

__all__ = [
    "KVBufferPool",
    "MambaPool",
    "MetadataBufferPool",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "TokenToKVPoolAllocator",
]
