"""What the cache machine needs around the caches: construction, state tags, tree extraction, snapshots.

A snapshot captures everything a rejected call could have disturbed: the tree (structure, keys, ids,
lock counts, states, access times, both LRU orders), the cache's counters and live-lock registry, the
pools' free lists and state masks, the ledgers (owner of every id, account sizes, step) and the Mamba
state contents. Two snapshots are equal only if nothing changed. ``tests/caches`` uses the same helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvledger.contracts.errors import KVLedgerError
from kvledger.contracts.levels import CheckLevel
from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.museum.machines.checks import violation
from kvledger.reference.pools import MambaPool, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvledger.reference.radix import MambaRadixCache, TreeNode


def make_allocator(page_size: int, pages: int, checks: CheckLevel | None = None) -> Any:
    if page_size == 1:
        return TokenToKVPoolAllocator(pages, checks=checks)
    return PagedTokenToKVPoolAllocator(pages * page_size, page_size, checks=checks)


def cut_for_finish(protected: int, key_len: int, page: int, draw: int) -> int:
    """Where a finishing request's cached prefix ends, from a drawn int: a page boundary between its locked
    prefix (``protected``) and its whole key, both included (the cache machines' ``finish`` rule)."""
    low, high = protected // page, key_len // page
    return (low + draw % (high - low + 1)) * page


def make_mamba_pool(size: int, checks: CheckLevel | None = None) -> MambaPool:
    return MambaPool(size, num_layers=2, conv_state_shape=(3,), temporal_state_shape=(2, 2), checks=checks)


_owner_seq = iter(range(10**9))


def new_owner(kind: str = "req") -> Owner:
    return Owner(kind, next(_owner_seq), REQ_RUNNING)


# ---------------------------------------------------------------------- state tags (machine data only)
def write_tag(pool: MambaPool, slot: torch.Tensor, tag: int) -> None:
    """Give a slot a recognisable state (machines and tests only; caches never touch state tensors)."""
    for state in pool.states:
        state[:, slot] = float(tag)


def read_tag(pool: MambaPool, slot: Any) -> int:
    idx = int(slot) if not isinstance(slot, torch.Tensor) else int(slot.reshape(-1)[0])
    values = {float(v) for s in pool.states for v in s[:, idx].reshape(-1).tolist()}
    if len(values) != 1:
        raise violation("I-COPY", f"slot {idx} holds no one whole state but a mix {sorted(values)[:4]}")
    return int(values.pop())


# ---------------------------------------------------------------------- tree extraction
def nodes_of(cache: Any) -> list[TreeNode]:
    out: list[TreeNode] = []
    stack = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def path_tokens(node: TreeNode) -> tuple[int, ...]:
    parts = []
    x: TreeNode | None = node
    while x is not None:
        parts.append(x.key)
        x = x.parent
    return tuple(t for part in reversed(parts) for t in part)


def path_ids(node: TreeNode) -> list[int]:
    parts = []
    x: TreeNode | None = node
    while x is not None and x.parent is not None:
        parts.append(x.value.tolist())
        x = x.parent
    return [i for part in reversed(parts) for i in part]


def extract(cache: Any, tag_pool: MambaPool | None = None) -> tuple[dict[tuple[int, ...], list[int]], dict]:
    """The abstract state: cached page-aligned prefixes -> ids of their last page; state prefixes -> tag."""
    ps = cache.page_size
    pages: dict[tuple[int, ...], list[int]] = {}
    states: dict[tuple[int, ...], int] = {}
    stack: list[tuple[TreeNode, tuple[int, ...]]] = [(c, ()) for c in cache.root.children.values()]
    while stack:
        node, before = stack.pop()
        full = before + tuple(node.key)
        ids = node.value.tolist()
        for i in range(0, len(node.key), ps):
            pages[before + tuple(node.key[: i + ps])] = ids[i : i + ps]
        if node.mamba_value is not None:
            states[full] = (
                read_tag(tag_pool, node.mamba_value) if tag_pool is not None else int(node.mamba_value)
            )
        stack.extend((c, full) for c in node.children.values())
    return pages, states


# ---------------------------------------------------------------------- snapshots
def _ledger_state(ledger: Any) -> Any:
    if not ledger.enabled:
        return None
    return (tuple(map(id, ledger.owner_table())), tuple(sorted(ledger.account_sizes().items())), ledger.step)


def _pool_state(pool: Any) -> Any:
    ids = pool.free_list  # kvledger's pools (pools.base.IdPool)
    return (tuple(ids.free.tolist()), tuple(ids.state.tolist()), _ledger_state(ids.ledger))


def snapshot(cache: Any) -> Any:
    """Everything a rejected call must leave as it was (tree, counters, LRU, locks, pools, ledgers)."""

    def node_state(n: TreeNode) -> Any:
        return (
            n.id,
            n.key,
            tuple(n.value.tolist()),
            n.lock_ref,
            n.mamba_lock_ref,
            None if n.mamba_value is None else int(n.mamba_value),
            n.last_access_time,
            n.mamba_access_time,
            n.live,
            None if n.parent is None else n.parent.id,
            tuple(sorted((k, c.id) for k, c in n.children.items())),
            n.kv_owner.account,
            None if n.mamba_owner is None else n.mamba_owner.account,
        )

    tree = tuple(sorted(node_state(n) for n in [cache.root, *nodes_of(cache)]))
    lists = [tuple(n.id for n in cache.lru_order())]
    c = cache.counts
    counters = [c.evictable, c.protected, cache.clock, len(cache.live_locks())]
    pools = [_pool_state(cache.token_to_kv_pool_allocator)]
    if isinstance(cache, MambaRadixCache):
        lists.append(tuple(n.id for n in cache.mamba_lru_order()))
        counters += [c.mamba_evictable, c.mamba_protected]
        mamba_pool: Any = cache.mamba_pool  # a MambaPool: its state tensors are what a rejected call must keep
        pools.append(_pool_state(mamba_pool))
        # raw bits: freed slots may hold NaN poison, and NaN != NaN
        pools.append(tuple(s.contiguous().reshape(-1).view(torch.uint8).clone() for s in mamba_pool.states))
    return tree, tuple(lists), tuple(counters), pools


def snapshots_equal(a: Any, b: Any) -> bool:
    if a[:3] != b[:3]:
        return False
    for x, y in zip(a[3], b[3], strict=True):
        if isinstance(x, tuple) and x and isinstance(x[0], torch.Tensor):
            if not all(torch.equal(p, q) for p, q in zip(x, y, strict=True)):
                return False
        elif x != y:
            return False
    return True


def assert_rejected(cache: Any, error: type[KVLedgerError], call: Callable[[], Any]) -> None:
    """``call`` raises ``error`` and leaves the tree, the pools and the ledgers exactly as they were (plain
    Python, no pytest: the hunt replays the machine's rules as a script). Any other exception propagates."""
    before = snapshot(cache)
    try:
        call()
    except error:
        pass
    else:
        raise violation("I-TYPED-INPUT", f"bad input was not rejected with {error.__name__}")
    if not snapshots_equal(before, snapshot(cache)):
        raise violation("I-NO-PARTIAL", "a rejected call changed the cache, a pool or a ledger")
    cache.audit()


def audit_all(cache: Any) -> None:
    cache.audit()
    cache.token_to_kv_pool_allocator.audit()
    if isinstance(cache, MambaRadixCache):
        cache.mamba_pool.audit()
