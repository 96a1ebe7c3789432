"""A plain-Python model of a free-list pool: an ordered free list, a set per owner, a free-group buffer.

Written from the documented semantics (sglang-memory-model §1.1-1.5), not from the implementation:

* ``alloc(n)`` takes the first ``n`` ids of the free list, all or nothing;
* a free puts the ids back at the tail (``fifo``: token allocator, request rows, Mamba slots) or at the
  head (``lifo``: the paged allocator), in the order given;
* inside a free group freed ids are owned by nobody (pending) until ``free_group_end`` puts the whole
  buffer back as one batch;
* ``restore`` rolls the free list back to a backup; ids handed out since return to the free list, and
  a backup is stale if an id was freed after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvledger.contracts.owners import (
    BATCH_INFLIGHT,
    CACHE_EVICTABLE,
    CACHE_PROTECTED,
    REQ_CHUNKED,
    REQ_RUNNING,
    REQ_WAITING,
    Account,
    Owner,
)

HOLDER_ACCOUNTS: tuple[Account, ...] = (
    REQ_WAITING,
    REQ_RUNNING,
    REQ_CHUNKED,
    CACHE_EVICTABLE,
    CACHE_PROTECTED,
    BATCH_INFLIGHT,
)


def make_owners(n: int, first_account: Account = REQ_RUNNING) -> list[Owner]:
    """``n`` fresh request owners ``req#0..``; fresh per example, since owners remember their ledgers."""
    return [Owner("req", i, first_account) for i in range(n)]


class FreeListModel:
    def __init__(self, domain: Iterable[int], owners: Sequence[Owner], reuse: str) -> None:
        assert reuse in ("fifo", "lifo")
        self.domain = frozenset(domain)
        self.free: list[int] = sorted(self.domain)
        self.held: dict[Owner, set[int]] = {o: set() for o in owners}
        self.pending: list[int] | None = None
        self.reuse = reuse

    # ---------------------------------------------------------------- queries
    def holder(self, i: int) -> Owner | None:
        for owner, ids in self.held.items():
            if i in ids:
                return owner
        return None

    def held_ids(self) -> list[int]:
        return sorted(i for ids in self.held.values() for i in ids)

    def in_group(self) -> bool:
        return self.pending is not None

    # ---------------------------------------------------------------- moves
    def take(self, n: int, owner: Owner) -> list[int] | None:
        if n > len(self.free):
            return None
        out, self.free = self.free[:n], self.free[n:]
        self.held[owner].update(out)
        return out

    def release(self, ids: Sequence[int], owner: Owner) -> None:
        ids = list(ids)
        assert len(set(ids)) == len(ids) and set(ids) <= self.held[owner], "the test built an invalid free"
        self.held[owner].difference_update(ids)
        if self.pending is not None:
            self.pending.extend(ids)
        else:
            self._push(ids)

    def _push(self, ids: list[int]) -> None:
        self.free = self.free + ids if self.reuse == "fifo" else ids + self.free

    def group_begin(self) -> None:
        assert self.pending is None
        self.pending = []

    def group_end(self) -> None:
        assert self.pending is not None
        buffered, self.pending = self.pending, None
        self._push(buffered)

    def backup(self) -> tuple[int, ...]:
        return tuple(self.free)

    def is_stale(self, snap: tuple[int, ...]) -> bool:
        """An id free now but not free at backup time was freed since: the backup is stale."""
        return bool(set(self.free) - set(snap))

    def restore(self, snap: tuple[int, ...]) -> None:
        assert not self.is_stale(snap) and self.pending is None
        back = set(snap)
        for ids in self.held.values():
            ids.difference_update(back)
        self.free = list(snap)

    def check_partition(self) -> None:
        """The model's own I-PARTITION, so that a bug in the model is not blamed on the pool."""
        parts = [set(self.free), set(self.pending or ()), *self.held.values()]
        assert sum(len(p) for p in parts) == len(self.domain) == len(set().union(*parts))
        assert len(self.free) == len(set(self.free))
