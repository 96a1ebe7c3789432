"""``kvledger audit``: replay a recorded event log through the ledger and the identities.

The auditor keeps kvledger's exact ownership model of the engine that wrote the log: one
:class:`~kvledger.contracts.ledger.Ledger` per declared pool, an :class:`Owner` per named holder, the
cache's tree (parents, children, lock counts) and each request's state. Every event is checked before it
is applied, and the first one that breaks an invariant stops the audit with the same diagnostic a
contract-enabled kvledger build gives (the ids, their owner, what the log claims, their last moves,
dated by event number):

* ``alloc`` takes free ids (I-EXCLUSIVE); ``free`` gives back ids its owner holds: an id already free is
  a double free (I-NODUP-FREE), someone else's a foreign free (I-EXCLUSIVE); a cache node's ids are
  freed only while it is unlocked (I-EVICT-LOCKED); ids lie in the pool's domain (I-DIAG-DOMAIN);
* free groups open and close in order (I-PENDING);
* ``unlock`` never takes a lock count below zero (I-LOCK-TREE, its state lock: I-MAMBA-LOCK); an evicted
  node is an unlocked leaf that holds nothing any more (I-EVICT-LOCKED, I-KEYS, I-OWNER-RELEASE);
* copy-on-write reads a node's own state slot (I-COW-SOURCE) into a slot the requester holds
  (I-MAMBA-VALUE);
* a released request holds nothing in any pool (I-OWNER-RELEASE: a leak);
* at every ``step`` the engine's own terms sum to the pool size (I-COUNT, I-CAP) and equal the replayed
  accounts (I-LEDGER-AGREES); at quiescence nothing is held, locked or pending (I-IDLE-IDENTITY);
* the log ends with its ``end`` marker: without it the run was cut off and the audit says so (an
  *incomplete* log, never clean); a ``completed`` end is checked like a quiescent step, a ``violation``
  end is the engine's own verdict and is not clean either.

Accounts are derived, not trusted: a cache node's KV is ``cache.protected`` exactly while its lock count
is positive, a request's account follows its ``req`` events. A malformed log (not JSON, an unknown
event, a missing or mistyped field, a number beyond the format's bounds, step numbers out of order, an
undeclared pool, a wrong end marker) is an :class:`~kvledger.contracts.errors.EventLogError`, raised before
anything is allocated for it.
The module knows no implementation: it imports only ``kvledger.contracts``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from kvledger.audit import events as E
from kvledger.audit.report import AuditReport as AuditReport  # re-exported: importable from here as before
from kvledger.audit.report import AuditViolation as AuditViolation
from kvledger.contracts.arith import MAX_TERMS
from kvledger.contracts.diagnosis import Census, Dispute, explain_disputes
from kvledger.contracts.errors import ContractViolation, EventLogError, KVLedgerError
from kvledger.contracts.identity import PoolTerms, check_busy_identity, check_idle_identity
from kvledger.contracts.ledger import Ledger
from kvledger.contracts.owners import (
    CACHE_EVICTABLE,
    CACHE_PROTECTED,
    FREE,
    FREE_LIST,
    PENDING_FREE,
    Account,
    Owner,
)

DERIVED_KINDS = (E.REQ_KIND, E.NODE_KIND, E.STATE_KIND)
STANDARD_TERMS = frozenset((FREE.name, PENDING_FREE.name, CACHE_EVICTABLE.name, CACHE_PROTECTED.name))
MAX_HELD_TERMS = MAX_TERMS - len(STANDARD_TERMS)
"""A step's row names at most this many accounts besides the standard four (the identity sums at most
:data:`~kvledger.contracts.arith.MAX_TERMS` terms)."""


LOCK_COUNT_NAMES = {E.STATE_KIND: "mamba_lock_ref"}
"""The name a tree gives the lock count of what a node holds of a kind, by the kind's owner name in the log
(the log records one such kind today: the Mamba state); messages use it."""


class _Node:
    __slots__ = ("children", "id", "kind_locks", "live", "lock_ref", "parent")

    def __init__(self, node_id: int, parent: _Node | None) -> None:
        self.id = node_id
        self.parent = parent
        self.children: set[int] = set()
        self.lock_ref = 0  # the path lock (the node's KV)
        self.kind_locks: dict[str, int] = {}  # per owner kind of the node's other holdings: its lock count
        self.live = True

    def locks_of(self, kind: str) -> int:
        return self.kind_locks.get(kind, 0)

    def locked(self) -> bool:
        return bool(self.lock_ref or any(self.kind_locks.values()))

    def describe_locks(self) -> str:
        counts = {**dict.fromkeys(LOCK_COUNT_NAMES, 0), **self.kind_locks}  # the named kinds even at zero
        return f"lock_ref {self.lock_ref}" + "".join(f", {LOCK_COUNT_NAMES.get(k, k)} {n}" for k, n in counts.items())


def _violation(message: str) -> ContractViolation:
    return ContractViolation(message)


class Auditor:
    """Feed events (:meth:`feed_line` or :meth:`feed`) in order; the first violation raises
    :class:`AuditViolation`. :func:`audit_lines` and :func:`audit_file` drive it and report."""

    def __init__(self) -> None:
        self.ledgers: dict[str, Ledger] = {}
        self.unit_names: dict[str, str] = {}
        self.owners: dict[str, Owner] = {}
        self.nodes: dict[int, _Node] = {}
        self.root: _Node | None = None
        self.groups_open: set[str] = set()
        self.released_at: dict[str, int] = {}  # request owner name -> the event that released it
        self.requests_seen: set[object] = set()
        self.by_kind: dict[str, int] = {}
        self.steps = 0
        self.last_step: int | None = None
        self.ended: int | None = None  # the end marker's event number
        self.outcome: str | None = None
        self.event = 0
        self.line = ""
        self._header = False
        self._ledger_ids = 0  # first + size summed over the pools: what the ledgers allocate
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            name: getattr(self, f"_on_{name}") for name in E.EVENTS[1:]
        }

    # ------------------------------------------------------------------ driving
    def feed_line(self, line: str, where: int) -> None:
        """Parse and check one line (``where``: its 1-based number, the event's number)."""
        if not isinstance(line, str):
            raise EventLogError(f"event {where}: a line must be a str, got {type(line).__name__}")
        self.feed(E.parse(line, where), where, line)

    def feed(self, ev: dict[str, Any], where: int, line: str = "") -> None:
        if isinstance(where, bool) or not isinstance(where, int) or where < 1:
            raise EventLogError(f"an event's number must be an int >= 1, got {where!r}")
        if not isinstance(ev, dict) or not isinstance(ev.get("ev"), str):
            raise EventLogError(
                f"event {where}: an event is a JSON object with a str 'ev', got {E.show(ev)}"
            )
        self.event, self.line = where, line
        kind = ev["ev"]
        if not self._header:
            E.check_header(ev, where)
            self._header = True
            self.by_kind["header"] = 1
            return
        if self.ended is not None:
            raise EventLogError(f"event {where}: {kind!r} after the end marker (event {self.ended})"[:200])
        handler = self._handlers.get(kind)
        if handler is None or kind == "header":
            raise EventLogError(
                f"event {where}: unknown event {E.show(kind)} (known: {', '.join(E.EVENTS[1:])})"
            )
        for ledger in self.ledgers.values():
            ledger.epoch = where
        try:
            handler(ev)
        except AuditViolation:
            raise
        except ContractViolation as exc:
            text = line.strip() or str(ev)
            raise AuditViolation(f"event {where}: {text[:300]}\n{exc}", where, line) from None
        except KVLedgerError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EventLogError(
                f"event {where}: {kind}: a missing or mistyped field ({type(exc).__name__}: {exc}): {line[:160]}"
            ) from None
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    # ------------------------------------------------------------------ lookups
    def _pool(self, ev: dict[str, Any]) -> Ledger:
        name = ev.get("pool")
        ledger = self.ledgers.get(name) if type(name) is str else None  # a declared name is a valid one
        if ledger is None:
            name = E.name(ev, "pool", self.event)
            raise EventLogError(f"event {self.event}: pool {name!r} was never declared by a pool event")
        return ledger

    def _ids(self, ev: dict[str, Any], ledger: Ledger, what: str) -> np.ndarray:
        raw = ev.get("ids")
        # Exactly ints: numpy would read [1, true] as [1, 1] and [1.0] as a float array.
        if not isinstance(raw, list) or not set(map(type, raw)) <= {int}:
            raise EventLogError(f"event {self.event}: ids must be a list of ints, got {E.show(raw)}")
        try:
            a = np.array(raw, dtype=np.int64)
        except OverflowError:
            raise EventLogError(
                f"event {self.event}: ids must be a list of ints in [0, {E.MAX_NUMBER}], got {E.show(raw)}"
            ) from None
        d = ledger.domain
        outside = a[(a < d.start) | (a >= d.stop)]
        if outside.size:
            raise _violation(
                f"I-DIAG-DOMAIN: [{ledger.pool}] {what}: ids {outside[:8].tolist()} outside the pool's ids"
                f" [{d.start}, {d.stop - 1}]"
            )
        return a

    def _owner(self, name: Any) -> Owner:
        """The holder called ``name``, created on first mention (requests wait, nodes are unlocked)."""
        owner = self.owners.get(name) if type(name) is str else None  # a known name is a valid one
        if owner is None:
            if not E.is_name(name):
                raise EventLogError(
                    f"event {self.event}: an owner is named by a string of 1 to {E.MAX_NAME} characters,"
                    f" got {E.show(name)}"
                )
            kind, key = E.split_owner_name(name)
            if kind in ("free_list", "free_group"):
                raise EventLogError(
                    f"event {self.event}: {name!r} is implicit: use alloc, free and free_group"
                )
            if kind == E.REQ_KIND:
                account = E.REQ_STATES["waiting"]
            elif kind in (E.NODE_KIND, E.STATE_KIND):
                account = CACHE_EVICTABLE
            else:
                raise EventLogError(
                    f"event {self.event}: owner {name!r} of kind {kind!r} has no account: declare it with an"
                    " account event first"
                )
            owner = self.owners[name] = Owner(kind, key, account)
        return owner

    def _node(self, node_id: Any, what: str, invariant: str = "I-KEYS") -> _Node:
        node = self.nodes.get(node_id) if type(node_id) is int else None
        if node is None or not node.live:
            state = "no longer in the tree" if node is not None else "not in the tree"
            raise _violation(f"{invariant}: {what}: node {node_id!r} is {state}")
        return node

    def _holdings(self, owner: Owner) -> list[tuple[Ledger, list[int]]]:
        return [(led, sorted(led.holdings(owner))) for led in self.ledgers.values() if led.held_count(owner)]

    def _describe_ids(self, ledger: Ledger, ids: Iterable[int], headline: str, claim: str) -> str:
        shown = list(ids)[:8]
        return ledger.describe(shown, headline, claims=dict.fromkeys(shown, claim))

    # ------------------------------------------------------------------ declarations
    def _on_pool(self, ev: dict[str, Any]) -> None:
        where = self.event
        name = E.name(ev, "pool", where)
        if name in self.ledgers:
            raise EventLogError(f"event {where}: pool {name!r} declared twice")
        first = E.number(ev, "first", where, high=E.MAX_LEDGER_IDS - 1)
        size = E.number(ev, "size", where, low=1, high=E.MAX_LEDGER_IDS)
        unit = E.number({"unit": 1, **ev}, "unit", where, low=1, high=E.MAX_UNIT)
        unit_name = E.name(ev, "unit_name", where, default="ids")
        # The ledger allocates per id from 0 to first + size: bound that before building it.
        spans = self._ledger_ids + first + size
        if spans > E.MAX_LEDGER_IDS:
            raise EventLogError(
                f"event {where}: pool {name!r}: the pools' ids would reach {spans} (first + size summed over"
                f" the pools), over the format's bound of {E.MAX_LEDGER_IDS}"
            )
        ledger = Ledger(name, range(first, first + size), unit=unit)
        ledger.clock, ledger.epoch = "event", where
        self.ledgers[name] = ledger
        self._ledger_ids = spans
        self.unit_names[name] = unit_name

    def _on_tree(self, ev: dict[str, Any]) -> None:
        root = E.number(ev, "root", self.event)
        if self.root is not None:
            raise EventLogError(f"event {self.event}: one tree per log")
        self.root = self.nodes[root] = _Node(root, None)
        self.root.lock_ref = 1  # the root is permanently locked and never counted

    def _on_account(self, ev: dict[str, Any]) -> None:
        name, account = E.name(ev, "owner", self.event), E.name(ev, "account", self.event)
        kind, key = E.split_owner_name(name)
        if kind in DERIVED_KINDS or kind in ("free_list", "free_group"):
            raise EventLogError(
                f"event {self.event}: the account of {name!r} is derived (req events, lock counts), not stated"
            )
        if account in (FREE.name, PENDING_FREE.name):
            raise EventLogError(f"event {self.event}: {account!r} is not an account a holder can be in")
        owner = self.owners.get(name)
        if owner is None:
            self.owners[name] = Owner(kind, key, Account(account))
        else:
            owner.set_account(Account(account), "account")

    # ------------------------------------------------------------------ moves
    def _check_held(self, ledger: Ledger, a: np.ndarray, src: Owner, what: str) -> None:
        """Every id of ``a`` held by ``src``, none repeated; else the precise violation."""
        if ledger.has_repeats(a):
            values, counts = np.unique(a, return_counts=True)
            raise _violation(
                f"I-NODUP-FREE: [{ledger.pool}] {what}: ids repeated in one event: {values[counts > 1][:8].tolist()}"
            )
        if ledger.all_held_by(a, src):
            return
        owners = [ledger.owner_of(i) for i in a.tolist()]
        pending = ledger.pending_owner
        free = [i for i, o in zip(a.tolist(), owners, strict=True) if o is FREE_LIST or o is pending]
        if free:
            raise _violation(
                self._describe_ids(
                    ledger,
                    free,
                    f"I-NODUP-FREE: {what} by {src!r}: ids {free[:8]} are already free (a double free)",
                    f"the log says {src.name} holds it",
                )
            )
        foreign = [i for i, o in zip(a.tolist(), owners, strict=True) if o is not src]
        raise _violation(
            self._describe_ids(
                ledger,
                foreign,
                f"I-EXCLUSIVE: {what} by {src!r}: ids {foreign[:8]} are held by another owner (a foreign free)",
                f"the log says {src.name} holds it",
            )
        )

    def _check_unlocked(self, owner: Owner, ledger: Ledger, ids: np.ndarray, what: str) -> None:
        """A cache node's KV (state) is freed only while its lock count (state lock count) is zero."""
        node = self.nodes.get(owner.key) if isinstance(owner.key, int) else None
        if node is None:
            return
        count = node.lock_ref if owner.kind == E.NODE_KIND else node.locks_of(owner.kind)
        if count > 0:
            raise _violation(
                self._describe_ids(
                    ledger,
                    ids.tolist(),
                    f"I-EVICT-LOCKED: {what} of {owner!r} while node {node.id} is locked"
                    f" ({'lock_ref' if owner.kind == E.NODE_KIND else LOCK_COUNT_NAMES.get(owner.kind, owner.kind)}"
                    f" {count})",
                    f"the log frees it from {owner.name}",
                )
            )

    def _on_alloc(self, ev: dict[str, Any]) -> None:
        ledger = self._pool(ev)
        a = self._ids(ev, ledger, "alloc")
        to = ev["to"]
        if isinstance(to, list):
            if len(to) != a.size:
                raise EventLogError(f"event {self.event}: alloc: {a.size} ids for {len(to)} owners")
            owners = [self._owner(n) for n in to]
        else:
            owners = [self._owner(to)]
        if ledger.has_repeats(a):
            raise _violation(f"I-EXCLUSIVE: [{ledger.pool}] alloc: ids handed out twice in one event")
        if not ledger.all_held_by(a, FREE_LIST):
            taken = [i for i in a.tolist() if ledger.owner_of(i) is not FREE_LIST]
            raise _violation(
                self._describe_ids(
                    ledger,
                    taken,
                    f"I-EXCLUSIVE: alloc to {to}: ids {taken[:8]} are not free",
                    "the log hands it out as free",
                )
            )
        if len(owners) == 1:
            ledger.transfer(a, FREE_LIST, owners[0], "alloc")
        else:
            ledger.transfer_each(a, FREE_LIST, owners, "alloc")

    def _on_free(self, ev: dict[str, Any]) -> None:
        ledger = self._pool(ev)
        a = self._ids(ev, ledger, "free")
        src = self._owner(ev["from"])
        self._check_held(ledger, a, src, "free")
        if src.kind in (E.NODE_KIND, E.STATE_KIND):
            self._check_unlocked(src, ledger, a, "free")
        dst = ledger.pending_owner if ledger.pool in self.groups_open else FREE_LIST
        ledger.transfer(a, src, dst, "free")

    def _on_move(self, ev: dict[str, Any]) -> None:
        ledger = self._pool(ev)
        a = self._ids(ev, ledger, "move")
        src, dst = self._owner(ev["from"]), self._owner(ev["to"])
        op = E.name(ev, "op", self.event, default="move")
        self._check_held(ledger, a, src, op)
        ledger.transfer(a, src, dst, op)

    def _on_free_group(self, ev: dict[str, Any]) -> None:
        ledger = self._pool(ev)
        opening = E.flag(ev, "open", self.event)
        name = ledger.pool
        if opening:
            if name in self.groups_open:
                raise _violation(f"I-PENDING: [{name}] free_group_begin inside an open free group")
            self.groups_open.add(name)
            return
        if name not in self.groups_open:
            raise _violation(f"I-PENDING: [{name}] free_group_end without free_group_begin")
        self.groups_open.discard(name)
        pending = ledger.holdings(ledger.pending_owner)
        if pending:
            ledger.transfer(sorted(pending), ledger.pending_owner, FREE_LIST, "free_group_end")

    # ------------------------------------------------------------------ the tree
    def _on_insert(self, ev: dict[str, Any]) -> None:
        node_id, parent_id = E.number(ev, "node", self.event), E.number(ev, "parent", self.event)
        if node_id in self.nodes:
            raise _violation(f"I-KEYS: insert: node {node_id!r} exists already (ids must be fresh)")
        parent = self._node(parent_id, f"insert of node {node_id} under its parent")
        self.nodes[node_id] = _Node(node_id, parent)
        parent.children.add(node_id)

    def _on_split(self, ev: dict[str, Any]) -> None:
        child = self._node(E.number(ev, "node", self.event), "split")
        upper_id = E.number(ev, "upper", self.event)
        if upper_id in self.nodes:
            raise _violation(f"I-KEYS: split of node {child.id}: the new node {upper_id!r} exists already")
        parent = child.parent
        if parent is None:
            raise _violation("I-KEYS: split of the root")
        upper = self.nodes[upper_id] = _Node(upper_id, parent)
        parent.children.discard(child.id)
        parent.children.add(upper_id)
        upper.children.add(child.id)
        child.parent = upper
        upper.lock_ref = child.lock_ref  # every holder locked below the child is below the new node too
        if upper.lock_ref:
            self._owner(E.owner_name(E.NODE_KIND, upper_id)).set_account(CACHE_PROTECTED, "split")

    def _on_evict(self, ev: dict[str, Any]) -> None:
        node = self._node(E.number(ev, "node", self.event), "evict", "I-EVICT-LOCKED")
        if node is self.root or node.parent is None:
            raise _violation("I-EVICT-LOCKED: evict of the root")
        if node.locked():
            raise _violation(f"I-EVICT-LOCKED: node {node.id} evicted while locked ({node.describe_locks()})")
        if node.children:
            raise _violation(f"I-KEYS: node {node.id} evicted with children {sorted(node.children)[:8]}")
        for kind in (E.NODE_KIND, E.STATE_KIND):
            owner = self.owners.get(E.owner_name(kind, node.id))
            if owner is not None:
                self._require_empty(owner, f"node {node.id} left the tree (evict at event {self.event})")
                del self.owners[owner.name]
        node.parent.children.discard(node.id)
        node.live = False

    def _path(self, node: _Node) -> Iterator[_Node]:
        root = self.root
        n: _Node | None = node
        while n is not None and n is not root:
            yield n
            n = n.parent

    def _on_lock(self, ev: dict[str, Any]) -> None:
        node = self._node(E.number(ev, "node", self.event), "lock", "I-LOCK-TREE")
        state = E.flag(ev, "state", self.event)
        if state:
            owner = self.owners.get(E.owner_name(E.STATE_KIND, node.id))
            if owner is None or not any(led.held_count(owner) for led in self.ledgers.values()):
                raise _violation(f"I-MAMBA-LOCK: lock of node {node.id}'s state, but the node holds no state")
            node.kind_locks[E.STATE_KIND] = node.locks_of(E.STATE_KIND) + 1
            if node.kind_locks[E.STATE_KIND] == 1:
                owner.set_account(CACHE_PROTECTED, "lock")
        for n in self._path(node):
            n.lock_ref += 1
            if n.lock_ref == 1:
                self._owner(E.owner_name(E.NODE_KIND, n.id)).set_account(CACHE_PROTECTED, "lock")

    def _on_unlock(self, ev: dict[str, Any]) -> None:
        node = self._node(E.number(ev, "node", self.event), "unlock", "I-LOCK-TREE")
        state = E.flag(ev, "state", self.event)
        path = list(self._path(node))
        under = [n for n in path if n.lock_ref < 1]
        if under:
            raise _violation(self._underflow(node, under[0], path))
        if state and node.locks_of(E.STATE_KIND) < 1:
            raise _violation(
                f"I-MAMBA-LOCK: unlock of node {node.id}'s state would take mamba_lock_ref below zero"
                " (an unlock its lock did not take: I-LOCK-SYMMETRY)"
            )
        if state:
            node.kind_locks[E.STATE_KIND] -= 1
            if node.kind_locks[E.STATE_KIND] == 0:
                self._owner(E.owner_name(E.STATE_KIND, node.id)).set_account(CACHE_EVICTABLE, "unlock")
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self._owner(E.owner_name(E.NODE_KIND, n.id)).set_account(CACHE_EVICTABLE, "unlock")

    def _underflow(self, node: _Node, at: _Node, path: list[_Node]) -> str:
        chain = " > ".join(f"node {n.id} (lock_ref {n.lock_ref})" for n in path) + " > root"
        text = f"I-LOCK-TREE: unlock of node {node.id} would take node {at.id}'s lock_ref below zero: {chain}"
        owner = self.owners.get(E.owner_name(E.NODE_KIND, at.id))
        if owner is not None:
            for ledger, ids in self._holdings(owner):
                text += "\n" + ledger.describe(
                    ids[:1], f"the last moves of node {at.id}'s KV (its locks show as retags)"
                )
        return text

    def _on_cow(self, ev: dict[str, Any]) -> None:
        node = self._node(E.number(ev, "node", self.event), "cow", "I-COW-SOURCE")
        ledger = self._pool(ev)
        src, dst = E.number(ev, "src", self.event), E.number(ev, "dst", self.event)
        self._ids({"ids": [src, dst]}, ledger, "cow")
        state = self.owners.get(E.owner_name(E.STATE_KIND, node.id))
        if state is None or ledger.owner_of(src) is not state:
            raise _violation(
                self._describe_ids(
                    ledger,
                    [src],
                    f"I-COW-SOURCE: copy-on-write from node {node.id}'s state: slot {src} is not that node's",
                    f"the log says it is node {node.id}'s state",
                )
            )
        holder = ledger.owner_of(dst)
        if dst == src or holder is None or holder is FREE_LIST or holder.kind in (E.NODE_KIND, E.STATE_KIND):
            raise _violation(
                self._describe_ids(
                    ledger,
                    [dst],
                    f"I-MAMBA-VALUE: copy-on-write into slot {dst}, which is not held by the requester",
                    "the log copies a state into it for a request",
                )
            )

    # ------------------------------------------------------------------ requests
    def _on_req(self, ev: dict[str, Any]) -> None:
        rid = ev.get("rid")
        if not (type(rid) is int and 0 <= rid <= E.MAX_NUMBER) and not E.is_name(rid):
            raise EventLogError(
                f"event {self.event}: req: rid must be an int in [0, {E.MAX_NUMBER}] or a string of 1 to"
                f" {E.MAX_NAME} characters, got {E.show(rid)}"
            )
        state = E.name(ev, "state", self.event)
        name = E.owner_name(E.REQ_KIND, rid)
        self.requests_seen.add(rid)
        if state == E.RELEASED:
            owner = self.owners.get(name)
            if owner is not None:
                self._require_empty(owner, f"{name} was released at event {self.event}")
                del self.owners[name]
            self.released_at[name] = self.event
            return
        account = E.REQ_STATES.get(state)
        if account is None:
            raise EventLogError(
                f"event {self.event}: req: unknown state {state!r} (known: {sorted(E.REQ_STATES)} and released)"
            )
        self.released_at.pop(name, None)
        self._owner(name).set_account(account, state)

    def _require_empty(self, owner: Owner, why: str) -> None:
        """I-OWNER-RELEASE: ``owner`` is done; any id still recorded as its own leaked."""
        held = self._holdings(owner)
        if not held:
            return
        parts = [f"I-OWNER-RELEASE: {owner.name} still owns ids in the replayed ledger ({why}): a leak"]
        for ledger, ids in held:
            disputes = [Dispute(i, owner, ()) for i in ids]
            parts.append(
                explain_disputes(
                    Census(ledger.pool), disputes, ledger, no_claim=f"no holder ({why})", view="the log"
                )
            )
        raise _violation("\n".join(parts))

    # ------------------------------------------------------------------ steps
    def _on_step(self, ev: dict[str, Any]) -> None:
        where = self.event
        step = E.number(ev, "step", where)
        if self.last_step is not None and step <= self.last_step:
            raise EventLogError(
                f"event {where}: step {step} after step {self.last_step}: step numbers strictly increase"
            )
        terms, quiescent = ev.get("terms"), E.flag(ev, "quiescent", where, default=False)
        if not isinstance(terms, dict):
            raise EventLogError(f"event {where}: step: terms must be an object per pool")
        rows: list[tuple[str, Ledger, dict[str, int]]] = []
        for pool, row in terms.items():
            ledger = self.ledgers.get(pool)
            if ledger is None:
                raise EventLogError(f"event {where}: step: pool {E.show(pool)} was never declared")
            # set(map(type, ...)), min, max: the checks run at C speed (a step is one event in six)
            if not isinstance(row, dict) or (
                row
                and not (
                    set(map(type, row.values())) == {int}
                    and min(row.values()) >= -E.MAX_NUMBER
                    and max(row.values()) <= E.MAX_NUMBER
                )
            ):
                raise EventLogError(
                    f"event {where}: step: terms of {pool!r} must map accounts to ints within +-{E.MAX_NUMBER}"
                )
            held = row.keys() - STANDARD_TERMS  # JSON keys are strings: only their length is in question
            if held and (len(held) > MAX_HELD_TERMS or "" in held or max(map(len, held)) > E.MAX_NAME):
                raise EventLogError(
                    f"event {where}: step: terms of {pool!r} name {len(held)} accounts besides"
                    f" {', '.join(sorted(STANDARD_TERMS))}: at most {MAX_HELD_TERMS}, each 1 to {E.MAX_NAME} characters"
                )
            rows.append((pool, ledger, row))
        self.last_step = step
        self.steps += 1
        for pool, ledger, row in rows:
            t = self._terms(pool, ledger, row)
            check_busy_identity(t)
            self._agree(t, ledger)
            if quiescent:
                check_idle_identity(t, lambda p: self._idle_culprits(p))
        if quiescent:
            self._check_idle_tree()

    # ------------------------------------------------------------------ the end
    def _on_end(self, ev: dict[str, Any]) -> None:
        where = self.event
        count = E.number(ev, "events", where)
        if count != where - 1:
            raise EventLogError(
                f"event {where}: the end marker counts {count} events before it, but {where - 1} lines came"
                " before it (lines were lost or added)"
            )
        outcome = E.name(ev, "outcome", where)
        if outcome not in E.OUTCOMES:
            raise EventLogError(
                f"event {where}: end: unknown outcome {E.show(outcome)} (known: {', '.join(E.OUTCOMES)})"
            )
        self.ended, self.outcome = where, outcome
        if outcome == "completed":  # the engine drained: the log's last word is a quiescent one
            for ledger in self.ledgers.values():
                self._idle_ledger(ledger)
            self._check_idle_tree()
        elif outcome == "violation":
            raise _violation(
                f"the engine stopped on a contract violation (its end marker says so): the {where - 1} events"
                " before it replay as shown, but the run did not finish, so the audit does not call it clean"
            )

    def unfinished(self) -> str:
        """Why a log without an end marker cannot be vouched for: what it saw last, what was still held."""
        requests = [o for o in self.owners.values() if o.kind == E.REQ_KIND]
        ids = {name: sum(led.held_count(o) for o in requests) for name, led in self.ledgers.items()}
        holding = sum(1 for o in requests if any(led.held_count(o) for led in self.ledgers.values()))
        live = sum(1 for rid in self.requests_seen if E.owner_name(E.REQ_KIND, rid) not in self.released_at)
        locked = sum(1 for n in self.nodes.values() if n.live and n is not self.root and n.lock_ref)
        held = ", ".join(f"{n} in {name}" for name, n in ids.items() if n)
        parts = [
            f"incomplete log: no end marker after event {self.event} (the last: {self.line.strip()[:160]});"
            " the run was cut off or its recorder never closed, so the audit cannot vouch for it",
            f"  {live} request(s) not released; {holding} of them still hold ids"
            + (f" ({held})" if held else ""),
        ]
        if locked or self.groups_open:
            parts.append(
                f"  {locked} cache node(s) locked; free groups open: {sorted(self.groups_open) or 'none'}"
            )
        if self.last_step is not None:
            parts.append(f"  the last step event: step {self.last_step}")
        return "\n".join(parts)

    def _terms(self, pool: str, ledger: Ledger, row: dict[str, int]) -> PoolTerms:
        known = STANDARD_TERMS
        return PoolTerms(
            pool,
            self.unit_names[pool],
            ledger.size * ledger.unit,
            row.get(FREE.name, 0),
            evictable=row.get(CACHE_EVICTABLE.name, 0),
            protected=row.get(CACHE_PROTECTED.name, 0),
            pending=row.get(PENDING_FREE.name, 0),
            held={k: v for k, v in row.items() if k not in known},
        )

    def _agree(self, t: PoolTerms, ledger: Ledger) -> None:
        """I-LEDGER-AGREES: the engine's terms equal the accounts the events add up to."""
        stated = {
            FREE.name: t.free,
            PENDING_FREE.name: t.pending,
            CACHE_EVICTABLE.name: t.evictable,
            CACHE_PROTECTED.name: t.protected,
            **t.held,
        }
        replayed = {k: n * ledger.unit for k, n in ledger.account_sizes().items()}
        diff = {
            k: (stated.get(k, 0), replayed.get(k, 0))
            for k in set(stated) | set(replayed)
            if stated.get(k, 0) != replayed.get(k, 0)
        }
        if not diff:
            return
        lines = [
            f"I-LEDGER-AGREES: [{t.pool}] the engine's terms and the replayed events disagree"
            f" (stated, replayed): {diff}",
            t.table(),
        ]
        for acct in sorted(diff):
            holders = [o for o in ledger.owners() if o.account.name == acct]
            for o in holders[:4]:
                ids = sorted(ledger.holdings(o))
                lines.append(
                    f"  replayed {acct}: {o!r} holds {ids[:8]}{'...' if len(ids) > 8 else ''} ({len(ids)})"
                )
        raise _violation("\n".join(lines))

    def _idle_culprits(self, pool: str) -> str:
        ledger = self.ledgers[pool]
        holders = [
            o for o in ledger.owners() if o is not FREE_LIST and o.account not in (FREE, CACHE_EVICTABLE)
        ]
        if not holders:
            return f"[{pool}] the replayed ledger agrees: nothing is held"
        disputes = [Dispute(i, o, ()) for o in holders[:4] for i in sorted(ledger.holdings(o))]
        return explain_disputes(
            Census(pool),
            disputes,
            ledger,
            no_claim="no holder: the engine says it is quiescent",
            view="the log",
        )

    def _check_idle_tree(self) -> None:
        locked = [
            n
            for n in self.nodes.values()
            if n.live and n is not self.root and n.locked()
        ]
        if locked:
            raise _violation(
                "I-IDLE-IDENTITY: quiescent but nodes are still locked: "
                + ", ".join(
                    f"node {n.id} ({n.describe_locks()})"
                    for n in locked[:8]
                )
            )
        if self.groups_open:
            raise _violation(
                f"I-IDLE-IDENTITY: quiescent inside an open free group of {sorted(self.groups_open)}"
            )
        for ledger in self.ledgers.values():
            self._idle_ledger(ledger)

    def _idle_ledger(self, ledger: Ledger) -> None:
        busy = {k: v for k, v in ledger.account_sizes().items() if k not in (FREE.name, CACHE_EVICTABLE.name)}
        if busy:
            raise _violation(
                f"I-IDLE-IDENTITY: [{ledger.pool}] quiescent but the replayed ledger has {busy}\n"
                + self._idle_culprits(ledger.pool)
            )


def audit_lines(lines: Iterable[str], path: str = "<lines>") -> AuditReport:
    """Audit a log given as lines; stops at the first violation (in the report, not raised). A log
    without its end marker is reported incomplete (not clean). A malformed log raises
    :class:`EventLogError`."""
    if isinstance(lines, (str, bytes)) or not isinstance(lines, Iterable):
        raise EventLogError(f"{path}: expected an iterable of lines, got {type(lines).__name__}")
    auditor = Auditor()
    report = AuditReport(path)
    cpu = time.process_time()
    where = 0
    try:
        for where, line in enumerate(lines, start=1):
            if not isinstance(line, str):
                raise EventLogError(f"event {where}: a line must be a str, got {type(line).__name__}")
            if not line.strip():
                raise EventLogError(f"event {where}: an empty line")
            auditor.feed_line(line, where)
    except AuditViolation as exc:
        report.violation, report.violation_event = str(exc), exc.event
    if where == 0:
        raise EventLogError(f"{path}: an empty log (no header)")
    if report.violation is None and auditor.ended is None:
        report.incomplete = True
        report.violation, report.violation_event = auditor.unfinished(), where
    report.cpu_s = time.process_time() - cpu
    report.outcome = auditor.outcome
    report.events = where
    report.by_kind = dict(auditor.by_kind)
    report.pools = {name: led.size for name, led in auditor.ledgers.items()}
    report.steps = auditor.steps
    report.requests = len(auditor.requests_seen)
    return report


def audit_file(path: str | Path) -> AuditReport:
    """Audit the log at ``path`` (JSON lines, UTF-8), as :func:`audit_lines`. Unreadable, not UTF-8, a line
    over :data:`~kvledger.audit.events.MAX_LINE_BYTES`: :class:`EventLogError` (naming the line)."""
    if not isinstance(path, (str, Path)):
        raise EventLogError(f"a log path must be a str or a Path, got {type(path).__name__}")
    try:
        with open(path, "rb") as f:
            return audit_lines(_read_lines(f), str(path))
    except OSError as exc:
        raise EventLogError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _read_lines(f: IO[bytes]) -> Iterator[str]:
    """The file's lines as text, each read with a bound (a file without newlines is not read whole) and
    decoded on its own (a decoding error names its line, not a buffer somewhere ahead)."""
    where = 0
    while raw := f.readline(E.MAX_LINE_BYTES + 1):
        where += 1
        if len(raw) > E.MAX_LINE_BYTES:
            raise EventLogError(f"event {where}: a line longer than {E.MAX_LINE_BYTES} bytes")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EventLogError(
                f"event {where}: not UTF-8 text (byte {exc.start + 1} of the line: {exc.reason})"
            ) from None
