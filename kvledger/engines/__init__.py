"""Real serving engines, checked by kvledger's contracts: each engine is an optional extra.

``kvledger.engines.sglang`` builds SGLang's own memory components (allocators, pools, radix caches) on
CPU tensors and attaches kvledger's ledgers to the live objects (spec/sglang-attach.md).
"""
