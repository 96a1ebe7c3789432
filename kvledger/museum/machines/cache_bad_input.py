"""The cache machine's bad input: each case a call the caches must reject with their typed error, leaving
the tree, the pools and the ledgers exactly as they were (:func:`.cache_support.assert_rejected`).

``case`` selects the kind of bad input; ``pick`` and ``variant`` are taken modulo what the case chooses
from (plain ints, so a hunt's repro script replays the call). A case whose material does not exist yet
(no released lock, no dead node, page size 1 for an unaligned key) does nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from kvledger.contracts.errors import ForeignNode, InvalidArgument, InvalidKey, LockNotHeld, PrefixMismatch
from kvledger.museum.machines.cache_support import assert_rejected, make_allocator, make_mamba_pool, new_owner
from kvledger.reference.radix import MambaRadixCache, RadixCache

BAD_INPUT_CASES = 10


def reject_bad_input(machine: Any, case: int, pick: int, variant: int, key: tuple[int, ...]) -> None:
    """``machine`` is a :class:`.cache.CacheMachine` after its setup; ``key`` is a well-formed key of it."""
    cache, ps, owner = machine.cache, machine.ps, new_owner()
    ids = torch.arange(ps, 2 * ps, dtype=torch.int64)
    kw = {"mamba_slot": None} if machine.mamba else {}
    if case == 0:  # ids shorter than the key
        assert_rejected(cache, InvalidKey, lambda: cache.insert(key, ids[:0], owner, **kw))
    elif case == 1 and ps > 1:  # an unaligned key
        assert_rejected(cache, InvalidKey, lambda: cache.insert((7,) * (ps + 1), ids[:1].repeat(ps + 1), owner, **kw))
    elif case == 2:
        assert_rejected(cache, InvalidArgument, lambda: cache.evict(-(1 + variant % 5)))
    elif case == 3 and machine.released:  # a second release of a lock already released
        lock = machine.released[pick % len(machine.released)]
        assert_rejected(cache, LockNotHeld, lambda: cache.dec_lock_ref(lock))
    elif case == 4 and any(r.protected for r in machine.reqs):  # ids that are not the tree's on the path
        reqs = [r for r in machine.reqs if r.protected]
        req = reqs[pick % len(reqs)]
        wrong = torch.cat((req.own, req.prefix_ids))[: len(req.key)]
        if not torch.equal(wrong[: req.protected], req.prefix_ids):
            assert_rejected(
                cache,
                PrefixMismatch,
                lambda: cache.insert(req.key, wrong, req.owner, protected_len=req.protected, **kw),
            )
    elif case == 5:  # wrong types, whatever the tree holds
        bad = ("nested", "float", "negative", "owner")[variant % 4]
        if bad == "owner":
            assert_rejected(cache, InvalidArgument, lambda: cache.insert(key, ids[: len(key)], "req-1", **kw))
        else:
            token = {"nested": [0], "float": 0.5, "negative": -1}[bad]
            assert_rejected(cache, InvalidKey, lambda: cache.match_prefix([*key[:-1], token]))
    elif case == 6:
        bad_count = (1.5, None, True)[variant % 3]
        assert_rejected(cache, InvalidArgument, lambda: cache.evict(bad_count))
    elif case == 7:
        handle = (None, "node", 3)[variant % 3]
        assert_rejected(cache, InvalidArgument, lambda: cache.inc_lock_ref(handle))
        assert_rejected(cache, InvalidArgument, lambda: cache.dec_lock_ref(handle))
    elif case == 8:  # a handle of another cache of the same kind
        other = _foreign(machine)
        node = other.match_prefix([]).last_node
        assert_rejected(cache, ForeignNode, lambda: cache.inc_lock_ref(node))
        lock = other.inc_lock_ref(node)
        assert_rejected(cache, ForeignNode, lambda: cache.dec_lock_ref(lock))
        other.dec_lock_ref(lock)
    elif case == 9 and machine.dead_nodes:  # a node that an eviction or a split took out of the tree
        node = machine.dead_nodes[pick % len(machine.dead_nodes)]
        assert_rejected(cache, ForeignNode, lambda: cache.inc_lock_ref(node))


def _foreign(machine: Any) -> Any:
    alloc = make_allocator(machine.ps, 4)
    return MambaRadixCache(alloc, make_mamba_pool(2)) if machine.mamba else RadixCache(alloc)
