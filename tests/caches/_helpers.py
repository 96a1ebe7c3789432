"""Shared helpers for the cache tests: construction, tree extraction, full-state snapshots, state tags.

The helpers the cache machine needs too live in ``kvledger/museum/machines/cache_support.py`` (the
machine is in the package so ``kvledger hunt`` can run it); they are re-exported here. What stays here
uses pytest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvledger.contracts.errors import KVLedgerError
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.switch import ENABLED
from kvledger.museum.machines.cache_support import (  # noqa: F401 (re-exported for the cache tests)
    audit_all,
    extract,
    make_allocator,
    make_mamba_pool,
    new_owner,
    nodes_of,
    path_ids,
    path_tokens,
    read_tag,
    snapshot,
    snapshots_equal,
    write_tag,
)
from kvledger.reference.radix import MambaRadixCache, RadixCache

needs_contracts = pytest.mark.skipif(
    not ENABLED, reason="needs KVLEDGER_CONTRACTS=1 (contracts are decorated at import)"
)


def make_plain(page_size: int = 1, pages: int = 64, checks: CheckLevel | None = None) -> RadixCache:
    return RadixCache(make_allocator(page_size, pages, checks))


def make_mamba(
    page_size: int = 1, pages: int = 64, slots: int = 16, checks: CheckLevel | None = None
) -> MambaRadixCache:
    return MambaRadixCache(make_allocator(page_size, pages, checks), make_mamba_pool(slots, checks))


def assert_rejected(
    cache: Any, error: type[KVLedgerError], call: Callable[[], Any], match: str | None = None
) -> None:
    """``call`` raises ``error`` and leaves the tree, the pools and the ledgers exactly as they were."""
    before = snapshot(cache)
    with pytest.raises(error, match=match):
        call()
    assert snapshots_equal(before, snapshot(cache)), "a rejected call changed the cache, a pool or a ledger"
    cache.audit()


def insert_fresh(cache: Any, tokens: list[int], *, tag: int | None = None) -> Any:
    """A request that matched nothing: allocate all, insert (duplicates freed), free the state if refused."""
    owner = new_owner()
    kv = cache.token_to_kv_pool_allocator.alloc(len(tokens), owner)
    assert kv is not None, "test pool too small"
    if isinstance(cache, MambaRadixCache):
        slot = cache.mamba_pool.alloc(1, owner)
        assert slot is not None, "test Mamba pool too small"
        if tag is not None:
            write_tag(cache.mamba_pool, slot, tag)
        res = cache.insert(tokens, kv, owner, mamba_slot=slot)
        if not res.mamba_adopted:
            cache.mamba_pool.free(slot, owner)
        return res
    return cache.insert(tokens, kv, owner)
