"""vLLM v1's KV cache manager (block pool, per-type managers, hybrid coordinator) under kvledger.

See spec/vllm-attach.md. :mod:`.loader` imports an installed release, :mod:`.build` builds a real
``KVCacheManager`` for a full-attention group plus a Mamba group (``mamba_cache_mode="align"``) on CPU,
:mod:`.attach` mirrors its block moves into a shared-ownership ledger and checks them.
"""
