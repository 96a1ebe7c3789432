"""Shared ownership: a block held by a *set* of holders, free only when the set is empty.

kvledger's :mod:`ledger` gives each slot one owner. Engines with block-level prefix sharing (vLLM v1's
``BlockPool``: one physical block in the page tables of every request that hit it, a reference count
on the block) need a different bookkeeping: ``holders[block]`` is a set, the engine's reference count
must equal its size, and a block is in the free queue exactly when nobody holds it.

:class:`SharedLedger` mirrors the engine from snapshots: after each engine call the attach passes the
new holder map (block -> request ids, read from the engine's own per-request block lists), the blocks
the call was allowed to share (prefix-cache hits), the engine's reference counts and its free queue.
The ledger derives the moves (acquire, release, ref-count change, eviction), keeps the last ones per
block, and raises :class:`SharedOwnershipViolation` naming the invariant, the block, its holders and
its last moves when an identity breaks. Invariant statements: the registry area ``shared``.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kvledger.contracts.errors import ContractViolation

HISTORY_PER_BLOCK = 8


class SharedOwnershipViolation(ContractViolation):
    """A shared-ownership identity failed: the message names the invariant, block, holders, last moves."""


@dataclass(frozen=True)
class Move:
    """One derived change of a block: ``kind`` is acquire, release, ref, evict or hash."""

    step: int
    op: str
    kind: str
    block: int
    holder: str = ""
    detail: str = ""

    def __str__(self) -> str:
        who = f" {self.holder}" if self.holder else ""
        more = f" ({self.detail})" if self.detail else ""
        return f"#{self.step} {self.op}: {self.kind}{who}{more}"


@dataclass(frozen=True)
class EngineView:
    """What the engine says after one call. ``holders`` leaves the null block out (see ``null_holds``);
    ``hashed`` maps each block to its prefix-cache key, None when it has none."""

    holders: Mapping[int, frozenset[str]]
    ref_cnt: Mapping[int, int]
    free_queue: tuple[int, ...]
    hashed: Mapping[int, object]
    null_block: int
    null_holds: Mapping[str, int] = field(default_factory=dict)
    duplicates: tuple[tuple[str, int], ...] = ()
    # request -> (most state blocks it may keep, the real blocks it keeps) for state groups that
    # retire old states (Mamba "align" mode); the engine's adapter computes the bound
    retained: Mapping[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    # None: the whole pool was read. Otherwise only these blocks (the ones the call could touch):
    # ``holders``, ``ref_cnt``, ``hashed`` and ``free_queue`` then cover ``scope`` alone, and
    # ``free_count`` (the engine's own count of free blocks) stands for the rest of the queue.
    scope: frozenset[int] | None = None
    free_count: int | None = None


@dataclass
class SharedLedger:
    """Holder sets of one block pool, derived from engine snapshots, with per-block history.

    Invariant (after every :meth:`observe`): for every block but the null block, the engine's
    reference count equals ``len(holders)``; the free queue holds exactly the blocks nobody holds,
    each once; the null block is never in the free queue and never held where a real block is due;
    no request keeps more retiring state blocks than ``view.retained`` allows.
    """

    name: str
    num_blocks: int
    step: int = 0
    holders: dict[int, frozenset[str]] = field(default_factory=dict)
    hashed: dict[int, object] = field(default_factory=dict)
    history: dict[int, deque[Move]] = field(default_factory=lambda: defaultdict(_new_history))
    held: dict[str, set[int]] = field(default_factory=dict)  # request -> its blocks (holders inverted)

    def observe(
        self,
        op: str,
        view: EngineView,
        may_share: Mapping[str, Iterable[int]] | None = None,
        released_by: Iterable[str] = (),
    ) -> list[Move]:
        """Mirror one engine call and check the identities.

        Pre: ``view`` describes the pool right after ``op`` (all of it, or every block the call could
        have changed: ``view.scope``). ``may_share[r]`` are the blocks request ``r`` was allowed to take
        while others held them (its prefix-cache hit); ``released_by`` are requests the call freed.
        Post: ``self.holders`` equals ``view.holders`` (on ``view.scope`` when given); the moves are
        returned and kept in the history; a broken identity raises :class:`SharedOwnershipViolation`.
        """
        self.step += 1
        # what the scoped blocks were held by (the whole map for a full view): _merge updates in place
        scope = view.scope
        before = self.holders if scope is None else {b: self.holders[b] for b in scope if b in self.holders}
        moves = self._diff(op, before, view)
        for move in moves:
            self.history[move.block].append(move)
        self._merge(view, moves)
        self._check_handouts(before, view, may_share or {})
        self._check_released(view, released_by)
        self._check_null(view)
        self._check_counts(view)
        self._check_retained(view)
        return moves

    def _merge(self, view: EngineView, moves: list[Move]) -> None:
        """Take the engine's holders and hashes (all of them, or those of ``view.scope`` only); the
        per-request index follows the call's acquire and release moves."""
        if view.scope is None:
            self.holders = {b: h for b, h in view.holders.items() if h}
            self.hashed = dict(view.hashed)
        else:
            for block in view.scope:
                now = view.holders.get(block, frozenset())
                if now:
                    self.holders[block] = now
                else:
                    self.holders.pop(block, None)
            self.hashed.update(view.hashed)
        for move in moves:
            if move.kind == "acquire":
                self.held.setdefault(move.holder, set()).add(move.block)
            elif move.kind == "release":
                blocks = self.held.get(move.holder, set())
                blocks.discard(move.block)
                if not blocks:
                    self.held.pop(move.holder, None)

    def _diff(self, op: str, before: Mapping[int, frozenset[str]], view: EngineView) -> list[Move]:
        moves: list[Move] = []
        blocks = set(before) | set(view.holders) if view.scope is None else view.scope
        empty: frozenset[str] = frozenset()
        for block in sorted(blocks):
            old, new = before.get(block, empty), view.holders.get(block, empty)
            if old == new:
                continue
            moves += [Move(self.step, op, "acquire", block, r) for r in sorted(new - old)]
            moves += [Move(self.step, op, "release", block, r) for r in sorted(old - new)]
        # hashes are compared by value: a block evicted and re-filled within one call changes hash
        for block, key in view.hashed.items():
            was = self.hashed.get(block)
            if was is not None and key != was:
                moves.append(Move(self.step, op, "evict", block))
            if key is not None and key != was:
                moves.append(Move(self.step, op, "hash", block))
        return moves

    def _check_handouts(
        self, before: Mapping[int, frozenset[str]], view: EngineView, may_share: Mapping[str, Iterable[int]]
    ) -> None:
        allowed = {r: set(blocks) for r, blocks in may_share.items()}
        for block, new in view.holders.items():
            old = before.get(block, frozenset())
            for holder in sorted(new - old):
                if old and block not in allowed.get(holder, set()):
                    self.fail(
                        "I-SHARED-HANDOUT",
                        block,
                        f"handed to {holder} while held by {sorted(old)}, not a prefix-cache hit",
                    )
        for holder, block in view.duplicates:
            self.fail("I-SHARED-HANDOUT", block, f"{holder} holds block {block} twice in one group")

    def _check_released(self, view: EngineView, released_by: Iterable[str]) -> None:
        for request in released_by:
            kept = sorted(b for b, h in view.holders.items() if request in h)
            if kept or request in view.null_holds:
                self.fail(
                    "I-SHARED-RELEASED",
                    kept[0] if kept else view.null_block,
                    f"{request} was freed but still holds blocks {kept}",
                )

    def _check_null(self, view: EngineView) -> None:
        if view.null_block in view.free_queue:
            self.fail("I-SHARED-NULL", view.null_block, "the null block is in the free queue")
        if view.null_block in view.holders:
            self.fail(
                "I-SHARED-NULL",
                view.null_block,
                f"the null block is held as a real block by {sorted(view.holders[view.null_block])}",
            )

    def _check_counts(self, view: EngineView) -> None:
        queue = view.free_queue
        if len(set(queue)) != len(queue):
            twice = sorted({b for b in queue if queue.count(b) > 1})
            self.fail("I-SHARED-FREE-QUEUE", twice[0], f"blocks {twice} are in the free queue twice")
        queued = set(queue)
        for block in range(self.num_blocks) if view.scope is None else sorted(view.scope):
            if block == view.null_block:
                continue
            held = view.holders.get(block, frozenset())
            count = view.ref_cnt.get(block, 0)
            if count != len(held):
                self.fail(
                    "I-SHARED-REFCOUNT", block, f"ref_cnt={count} but {len(held)} holder(s) {sorted(held)}"
                )
            if held and block in queued:
                self.fail("I-SHARED-FREE-QUEUE", block, f"in the free queue while held by {sorted(held)}")
            if not held and block not in queued:
                self.fail("I-SHARED-FREE-QUEUE", block, "held by nobody but not in the free queue (leaked)")
        self._check_free_count(view)  # after the per-block checks, which name the block when they can

    def _check_free_count(self, view: EngineView) -> None:
        """The engine's free count is every block but the null block and the held ones: a block
        queued twice, or one lost outside the scope read, shows here before the next full audit."""
        if view.free_count is None:
            return
        unheld = self.num_blocks - 1 - len(self.holders) + (view.null_block in self.holders)
        if view.free_count != unheld:
            touched = sorted(view.scope or ()) or [view.null_block]
            self.fail(
                "I-SHARED-FREE-QUEUE",
                touched[-1],
                f"the engine counts {view.free_count} free blocks but {unheld} are held by nobody"
                f" (blocks read this call: {touched})",
            )

    def _check_retained(self, view: EngineView) -> None:
        for request, (bound, kept) in sorted(view.retained.items()):
            if len(kept) > bound:
                self.fail(
                    "I-SHARED-MAMBA-RETAINED",
                    kept[0],
                    f"{request} keeps {len(kept)} state blocks {list(kept)}, at most {bound} are live",
                )

    def fail(self, invariant: str, block: int, what: str) -> None:
        """Raise the violation with the block's holders and last moves as evidence."""
        holders = sorted(self.holders.get(block, frozenset()))
        last = "; ".join(str(m) for m in self.history.get(block, ())) or "none recorded"
        raise SharedOwnershipViolation(
            f"{invariant} [{self.name}] block {block}: {what}. holders now: {holders}. last moves: {last}"
        )


def _new_history() -> deque[Move]:
    return deque(maxlen=HISTORY_PER_BLOCK)
