"""Radix prefix caches: ``RadixCache`` (KV only) and ``MambaRadixCache`` (KV + Mamba state per node).

Both shadow every id they hold in the pools' ledgers (``node.kv_owner`` / ``node.mamba_owner``), check
cheap identities around every public call and the O(tree) recounts of §5.2-5.3 in ``audit()``.
"""

from kvledger.reference.radix.mamba_radix_cache import MambaRadixCache
from kvledger.reference.radix.radix_cache import RadixCache
from kvledger.reference.radix.results import InsertResult, LockRef, MatchResult
from kvledger.reference.radix.tree_node import TreeNode

__all__ = ["InsertResult", "LockRef", "MambaRadixCache", "MatchResult", "RadixCache", "TreeNode"]
