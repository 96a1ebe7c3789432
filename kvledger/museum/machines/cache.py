"""The cache machine of ``kvledger hunt``: the plain radix tree, the Mamba tree (V1) and Mamba V2 in one.

:class:`MambaCacheMachine` adds to the rules every cache has (:class:`.cache_base.RadixCacheMachine`) the
Mamba tree's: explicit state eviction, chunk checkpoints with the lock hand-over, locks taken on
tombstones, revival of tombstones (so a lock is taken and released in every state of its node: with a
state, tombstone, tombstone revived, state evicted meanwhile) and copy-on-write into a slot the request
already holds. :class:`CacheMachine` adds Mamba V2's (``extra_buffer``) checkpoint: a request captures at
its branching point or on the chunk grid, donates that tracking slot and takes a replacement; its
initialize rule draws the cache kind (Mamba V1, Mamba V2, plain) and the page size per example. The
machine knows no exhibit.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvledger.contracts.mamba_track import extend_track_seqlen
from kvledger.museum.machines.cache_base import (
    KINDS,
    CacheKind,
    KeyDraw,
    RadixCacheMachine,
    Req,
    key_draws,
    next_tag,
    picks,
)
from kvledger.museum.machines.cache_support import new_owner, path_tokens, read_tag, write_tag
from kvledger.museum.machines.checks import model_check
from kvledger.museum.machines.notes import event


class MambaCacheMachine(RadixCacheMachine):
    """The Mamba radix cache (V1 semantics unless the kind is ``mamba_v2``)."""

    KINDS: tuple[CacheKind, ...] = ("mamba",)
    PAGE_SIZES: tuple[int, ...] = (1, 2)

    @precondition(lambda self: self.mamba)
    @rule(n=st.integers(0, 4))
    def evict_mamba(self, n: int) -> None:
        self.evict_states(n)

    def checkpointable(self) -> list[Req]:
        return [r for r in self.reqs if len(r.key) - r.protected >= 2 * self.ps]

    @precondition(lambda self: self.mamba and self.checkpointable())
    @rule(pick=picks, cut=picks)
    def checkpoint(self, pick: int, cut: int) -> None:
        """cache_unfinished_req after a chunk: fork the state, insert the chunk, re-match, hand over."""
        ps = self.ps
        candidates = self.checkpointable()
        req = candidates[pick % len(candidates)]
        low, high = req.protected // ps + 1, len(req.key) // ps - 1
        end = (low + cut % (high - low + 1)) * ps
        assert req.working is not None
        fork = self.pool.fork_from(req.working, req.owner)
        if fork is None:
            self.evict_states(1)
            fork = self.pool.fork_from(req.working, req.owner)
            if fork is None:
                event("checkpoint: no slot")
                return
        write_tag(self.pool, fork, next_tag())
        value = torch.cat((req.prefix_ids, req.own))
        self.insert(req.owner, req.key[:end], value[:end], req.protected, fork)
        m = self.cache.match_prefix(req.key[:end])
        matched = self.check_match(req.key[:end], m)
        model_check(
            matched == end,
            "I-MODEL-MATCH",
            lambda: f"the chunk just cached ({end} tokens) matches only {matched} with its state",
        )
        model_check(
            torch.equal(m.device_indices[: req.protected], req.prefix_ids),
            "I-MODEL-MATCH",
            lambda: f"the locked prefix moved: {req.prefix_ids.tolist()} ->"
            f" {m.device_indices[: req.protected].tolist()}",
        )
        self.hand_over(req, m, end)
        event("checkpoint")

    def hand_over(self, req: Req, m: Any, end: int) -> None:
        """The request's lock moves to the node just cached; its own KV shrinks to what is past ``end``."""
        new_lock = self.acquire(m.last_node)
        self.release(req.lock)
        req.lock, req.lock_path = new_lock, req.key[:end]
        req.own = req.own[end - req.protected :]
        req.prefix_ids, req.protected = m.device_indices, end

    @precondition(lambda self: self.mamba and self.tombstones())
    @rule(pick=picks)
    def lock_tombstone(self, pick: int) -> None:
        """A holder locks a node while it is a tombstone (no state lock taken)."""
        candidates = self.tombstones()
        node = candidates[pick % len(candidates)]
        lock = self.acquire(node)
        model_check(not lock.took_mamba, "I-MAMBA-LOCK", "a lock on a tombstone took a state lock")
        self.extra.append((lock, path_tokens(node)))
        event("tombstone locked")

    @precondition(lambda self: self.mamba and self.tombstones())
    @rule(pick=picks)
    def revive(self, pick: int) -> None:
        """A request finishing exactly at a tombstone: the node takes its state (revival)."""
        candidates = self.tombstones()
        key = path_tokens(candidates[pick % len(candidates)])
        owner = new_owner()
        slot = self.alloc_slot(owner)
        if slot is None:
            return
        kv = self.alloc_kv(len(key), owner)
        if kv is None:
            self.pool.free(slot, owner)
            return
        write_tag(self.pool, slot, next_tag())
        if self.insert(owner, key, kv, 0, slot).mamba_adopted and key in self.model.pages:
            event("revived")

    @precondition(lambda self: self.mamba)
    @rule(key=key_draws)
    def cow_into_held_slot(self, key: KeyDraw) -> None:
        """A waiting request that kept its COW slot from an earlier round re-matches into the same slot."""
        owner = new_owner()
        slot = self.alloc_slot(owner)
        if slot is None:
            return
        tokens = self.key(key)
        expect_len = self.model.longest_state(tokens)
        expect_tag = self.model.states.get(tokens[:expect_len])
        m = self.cache.match_prefix(tokens, cow_owner=owner, cow_slot=slot)
        self.check_match(tokens, m)
        if expect_len:
            model_check(m.cow_slot is not None, "I-MODEL-COW", lambda: f"a match of {expect_len} tokens made no COW")
            got_tag = read_tag(self.pool, slot)
            model_check(
                got_tag == expect_tag,
                "I-COPY",
                lambda: f"COW into the held slot {int(slot)} copied state {got_tag},"
                f" the matched node's is {expect_tag}",
            )
        else:
            model_check(m.cow_slot is None, "I-MODEL-COW", lambda: f"an empty match returned COW slot {m.cow_slot}")
        self.pool.free(slot, owner)


class CacheMachine(MambaCacheMachine):
    """Every cache kind and page size: what ``kvledger hunt`` runs as the ``cache`` machine."""

    KINDS = KINDS
    PAGE_SIZES = (1, 2, 4, 16)

    def v2_cut(self, req: Req) -> int | None:
        assert self.chunk is not None
        return extend_track_seqlen(req.protected, len(req.key) - req.protected, self.chunk, req.branching)

    def donors(self) -> list[Req]:
        return [r for r in self.reqs if self.v2_cut(r)] if self.chunk is not None else []

    @precondition(lambda self: self.donors())
    @rule(pick=picks)
    def track_and_donate(self, pick: int) -> None:
        """cache_unfinished_req under V2: the state captured at the branching point (or the chunk grid)
        goes to the tree by donation, a replacement slot takes its place, the lock moves to the new node."""
        candidates = self.donors()
        req = candidates[pick % len(candidates)]
        cut = self.v2_cut(req)
        assert cut is not None
        model_check(
            cut % self.ps == 0, "I-TRACK-POINT", lambda: f"V2 capture at {cut}, not a page multiple of {self.ps}"
        )
        if cut == req.branching:
            event("captured at the branching point")
        tracked = self.alloc_slot(req.owner)  # the tracking slot the forward captured into
        if tracked is None:
            event("V2 checkpoint: no tracking slot")
            return
        replacement = self.alloc_slot(req.owner)
        if replacement is None:
            self.pool.free(tracked, req.owner)
            event("V2 checkpoint: no replacement, donation skipped")
            return
        write_tag(self.pool, tracked, next_tag())
        value = torch.cat((req.prefix_ids, req.own))
        res = self.cache.insert(
            req.key[:cut],
            value[:cut],
            req.owner,
            mamba_slot=tracked,
            protected_len=req.protected,
            state_op="donate",
        )
        expect_adopt = req.key[:cut] not in self.model.states
        model_check(
            res.mamba_adopted == expect_adopt and path_tokens(res.node) == req.key[:cut],
            "I-MODEL-INSERT",
            lambda: f"donating insert of {req.key[:cut]}: adopted={res.mamba_adopted} (the model's {expect_adopt}),"
            f" node {path_tokens(res.node)}",
        )
        self.model.insert(req.key[:cut], value[:cut].tolist(), res.prefix_len)
        if res.mamba_adopted:
            self.model.states[req.key[:cut]] = read_tag(self.pool, tracked)
            if self.pool.ledger.enabled:
                holder = self.pool.ledger.owner_of(int(tracked))
                model_check(
                    holder is res.node.mamba_owner,
                    "I-DONATION",
                    lambda: f"donated slot {int(tracked)} is held by {holder!r},"
                    f" not the node's {res.node.mamba_owner!r}",
                )
            event("V2 donation adopted")
        else:
            self.pool.free(tracked, req.owner)
        req.tracking.append(replacement)
        m = self.cache.match_prefix(req.key[:cut])
        matched = self.check_match(req.key[:cut], m)
        model_check(
            matched == cut, "I-MODEL-MATCH", lambda: f"the state just donated at {cut} matches only {matched}"
        )
        self.hand_over(req, m, cut)
