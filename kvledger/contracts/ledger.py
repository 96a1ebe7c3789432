"""The ownership ledger of one pool: the owner of every id, the accounts, and the history of moves.

A ledger shadows a pool (KV tokens, KV pages, request rows, Mamba slots). It is the executable form of
I-PARTITION: every id of the pool's domain has exactly one owner (I-EXCLUSIVE by construction: one
entry per id), the owners' holdings are disjoint and cover the domain, and the per-account counts sum
to the domain size (I-COUNT). Ids change owner only through :meth:`Ledger.transfer`, which first
checks that every id is held by the claimed source (no double free: I-NODUP-FREE; no foreign free) and
raises :class:`ContractViolation` naming the id, its real owner and its last moves otherwise.

The ledger never looks at tensors' contents; it is told about moves by the pool and recounts the pool's
own structures only in :meth:`Ledger.audit`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvledger.contracts.errors import ContractViolation, ForeignSlot
from kvledger.contracts.owners import FREE, FREE_LIST, PENDING_FREE, Account, Owner
from kvledger.contracts.switch import ensure, invariant, ledgers_enabled

DEFAULT_HISTORY = 65536
"""Moves kept in the ring log. Violations report the last moves of a slot found in this window."""

MOVES_PER_SLOT_IN_REPORT = 6


@dataclass(frozen=True)
class Move:
    """One ledger event. ``ids`` is None for a retag (the owner changed account, its ids did not move)."""

    step: int
    op: str
    ids: Sequence[int] | None
    src: Owner
    dst: Owner
    src_account: Account
    dst_account: Account

    def describe(self) -> str:
        if self.ids is None:
            return f"step {self.step}: {self.op}: {self.src.name} {self.src_account.name} -> {self.dst_account.name}"
        return (
            f"step {self.step}: {self.op}: {self.src.name}[{self.src_account.name}]"
            f" -> {self.dst.name}[{self.dst_account.name}]"
        )


def as_id_list(ids: Any) -> list[int]:
    """Ids as a list of Python ints, from a tensor, a sequence or a single int."""
    if isinstance(ids, int):
        return [ids]
    tolist = getattr(ids, "tolist", None)
    if tolist is not None:
        out = tolist()
        return [out] if isinstance(out, int) else list(out)
    return [int(i) for i in ids]


@invariant(lambda self: sum(self._count.values()) == self.size, "I-COUNT: the accounts sum to the pool size")
class Ledger:
    """Ownership of the ids ``domain`` of one pool. ``unit`` converts ids to tokens (page size)."""

    enabled = True

    def __init__(self, pool: str, domain: range, *, unit: int = 1, history: int = DEFAULT_HISTORY) -> None:
        if domain.step != 1 or domain.start < 0 or len(domain) == 0:
            raise ValueError(f"ledger domain must be a non-empty contiguous range of ids >= 0, got {domain}")
        self.pool = pool
        self.domain = domain
        self.size = len(domain)
        self.unit = unit
        self.step = 0
        self.pending_owner = Owner("free_group", pool, PENDING_FREE)
        # Index by id; ids outside the domain (reserved padding ids) hold None.
        self._owner: list[Owner | None] = [None] * domain.stop
        for i in domain:
            self._owner[i] = FREE_LIST
        self._holdings: dict[Owner, set[int]] = {FREE_LIST: set(domain)}
        self._count: Counter[Account] = Counter({FREE: self.size})
        self._log: deque[Move] = deque(maxlen=history)

    # ------------------------------------------------------------------ queries
    def owner_of(self, slot: int) -> Owner | None:
        """The owner of ``slot``; None for ids outside the domain (reserved ids)."""
        if 0 <= slot < len(self._owner):
            return self._owner[slot]
        return None

    def holdings(self, owner: Owner) -> frozenset[int]:
        return frozenset(self._holdings.get(owner, ()))

    def held_count(self, owner: Owner) -> int:
        return len(self._holdings.get(owner, ()))

    def count(self, account: Account) -> int:
        """Ids in ``account`` (multiply by ``unit`` for tokens)."""
        return self._count.get(account, 0)

    def account_sizes(self) -> dict[str, int]:
        """Every non-empty account with its size in ids."""
        return {acct.name: n for acct, n in self._count.items() if n}

    def owners(self) -> list[Owner]:
        return [o for o, ids in self._holdings.items() if ids]

    def history_of(self, slot: int, limit: int = MOVES_PER_SLOT_IN_REPORT) -> list[Move]:
        """The last ``limit`` moves that touched ``slot``: its transfers, and retags of whoever held it.

        Walks the log backwards from the present, tracking the holder at each point in time: before a
        transfer of ``slot`` the holder was that transfer's source.
        """
        found: list[Move] = []
        holder = self.owner_of(slot)
        for move in reversed(self._log):
            if move.ids is None:
                if move.src is holder:
                    found.append(move)
            elif slot in move.ids:
                found.append(move)
                holder = move.src
            if len(found) >= limit:
                break
        found.reverse()
        return found

    def describe(self, slots: Iterable[int], headline: str) -> str:
        """A violation report: the headline, then each slot's current owner and last moves."""
        lines = [f"[{self.pool}] {headline}"]
        for slot in list(slots)[:8]:
            lines.append(f"  slot {slot}: owner {self.owner_of(slot)!r}")
            moves = self.history_of(slot)
            if not moves:
                lines.append("    (no recorded moves: held since construction or older than the log)")
            lines.extend(f"    {m.describe()}" for m in moves)
        return "\n".join(lines)

    # ------------------------------------------------------------------ checks that raise typed errors
    def require_held_by(self, ids: Any, owner: Owner, op: str) -> None:
        """Input validation: every id is held by ``owner``; else :class:`ForeignSlot` and no change."""
        id_list = as_id_list(ids)
        wrong = [i for i in id_list if self.owner_of(i) is not owner]
        if wrong:
            raise ForeignSlot(self.describe(wrong, f"{op}: ids not held by {owner!r}: {wrong[:8]}"))

    # ------------------------------------------------------------------ moves
    @ensure(lambda self, ids, dst: all(self._owner[i] is dst for i in as_id_list(ids)))
    def transfer(self, ids: Any, src: Owner, dst: Owner, op: str) -> None:
        """Move ``ids`` from ``src`` to ``dst``. Checks everything before changing anything.

        A mismatch is a bug in the caller (input validation happened upstream), hence
        :class:`ContractViolation` with the evidence, and the ledger is unchanged.
        """
        id_list = as_id_list(ids)
        if not id_list:
            return
        owner = self._owner
        try:
            wrong = [i for i in id_list if i < 0 or owner[i] is not src]  # owner[-1] aliases the last id
        except IndexError:
            wrong = [i for i in id_list if self.owner_of(i) is not src]
        if wrong:
            raise ContractViolation(
                self.describe(
                    wrong,
                    f"{op}: {len(wrong)} id(s) expected to be held by {src!r} on their way to {dst!r}"
                    f" are not (I-NODUP-FREE / I-EXCLUSIVE): {wrong[:8]}",
                )
            )
        if len(set(id_list)) != len(id_list):
            dups = sorted(i for i, c in Counter(id_list).items() if c > 1)
            raise ContractViolation(
                self.describe(dups, f"{op}: ids repeated within one transfer: {dups[:8]}")
            )
        for i in id_list:
            owner[i] = dst
        src_set = self._holdings[src]
        src_set.difference_update(id_list)
        dst_set = self._holdings.get(dst)
        if dst_set is None:
            dst_set = self._holdings[dst] = set()
            if dst is not FREE_LIST:
                dst._attach(self)
        dst_set.update(id_list)
        if not src_set and src is not FREE_LIST and src is not self.pending_owner:
            del self._holdings[src]
        n = len(id_list)
        self._count[src.account] -= n
        self._count[dst.account] += n
        self._log.append(Move(self.step, op, id_list, src, dst, src.account, dst.account))
        self.step += 1

    def _on_retag(self, owner: Owner, old: Account, new: Account, op: str) -> None:
        """Called by :meth:`Owner.set_account`: the owner's ids change account, not owner."""
        n = len(self._holdings.get(owner, ()))
        if n:
            self._count[old] -= n
            self._count[new] += n
        self._log.append(Move(self.step, op, None, owner, owner, old, new))
        self.step += 1

    # ------------------------------------------------------------------ audit
    def audit(self, free_ids: Iterable[int], pending_ids: Iterable[int] = ()) -> None:
        """Full recount (O(size)) against the pool's own free structure. Raises ContractViolation.

        Checks I-PARTITION: the pool's free list has no duplicates (I-NODUP-FREE) and equals the
        ledger's FREE holdings; pending ids equal the pending owner's holdings; the owner table, the
        holdings sets and the account counts agree with each other; ids outside the domain are unowned.
        """
        free_list = list(free_ids)
        dup_free = sorted(i for i, c in Counter(free_list).items() if c > 1)
        if dup_free:
            raise ContractViolation(
                self.describe(dup_free, f"free list holds ids twice (I-NODUP-FREE): {dup_free[:8]}")
            )
        self._compare("free list", set(free_list), FREE_LIST)
        self._compare("free group", set(pending_ids), self.pending_owner)
        recount: Counter[Account] = Counter()
        for i, o in enumerate(self._owner):
            if i not in self.domain:
                if o is not None:
                    raise ContractViolation(self.describe([i], f"reserved id {i} has an owner {o!r}"))
                continue
            if o is None or i not in self._holdings.get(o, ()):
                raise ContractViolation(self.describe([i], f"id {i}: owner table and holdings disagree"))
            recount[o.account] += 1
        held_total = sum(len(s) for s in self._holdings.values())
        if held_total != self.size:
            raise ContractViolation(
                f"[{self.pool}] holdings cover {held_total} ids, domain has {self.size} (I-PARTITION)"
            )
        if +recount != +self._count:
            raise ContractViolation(
                f"[{self.pool}] account counts {dict(+self._count)} != recount {dict(+recount)}"
            )

    def _compare(self, what: str, actual: set[int], owner: Owner) -> None:
        expected = self._holdings.get(owner, set())
        if actual != expected:
            extra = sorted(actual - expected)
            missing = sorted(expected - actual)
            raise ContractViolation(
                self.describe(
                    extra[:4] + missing[:4],
                    f"{what} disagrees with the ledger (I-PARTITION): in pool but not in ledger {extra[:8]},"
                    f" in ledger but not in pool {missing[:8]}",
                )
            )

    def __repr__(self) -> str:
        return f"Ledger({self.pool}, size={self.size}, {self.account_sizes()})"


class NullLedger:
    """The ledger when contracts are off: every method is a no-op, every query answers 'unknown'."""

    enabled = False

    def __init__(self, pool: str, domain: range, *, unit: int = 1) -> None:
        self.pool = pool
        self.domain = domain
        self.size = len(domain)
        self.unit = unit
        self.pending_owner = Owner("free_group", pool, PENDING_FREE)

    def transfer(self, ids: Any, src: Owner, dst: Owner, op: str) -> None:
        return None

    def require_held_by(self, ids: Any, owner: Owner, op: str) -> None:
        return None

    def audit(self, free_ids: Iterable[int], pending_ids: Iterable[int] = ()) -> None:
        return None

    def owner_of(self, slot: int) -> Owner | None:
        return None

    # Queries answer "nothing recorded": callers check ``enabled`` before trusting them.
    def count(self, account: Account) -> int:
        return 0

    def account_sizes(self) -> dict[str, int]:
        return {}

    def holdings(self, owner: Owner) -> frozenset[int]:
        return frozenset()

    def held_count(self, owner: Owner) -> int:
        return 0

    def describe(self, slots: Iterable[int], headline: str) -> str:
        return f"[{self.pool}] {headline} (no ledger: contracts are off)"

    def __repr__(self) -> str:
        return f"NullLedger({self.pool})"


AnyLedger = Ledger | NullLedger


def make_ledger(pool: str, domain: range, *, unit: int = 1) -> AnyLedger:
    """A real ledger when ledgers are enabled (the switch), else the no-op one."""
    if ledgers_enabled():
        return Ledger(pool, domain, unit=unit)
    return NullLedger(pool, domain, unit=unit)
