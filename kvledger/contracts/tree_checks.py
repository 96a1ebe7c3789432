"""O(tree) recounts of a radix cache: the §5.2-5.3 invariants as pure functions over duck-typed nodes.

The caches keep incremental counters and linked lists; these functions rebuild the same facts from
scratch and raise :class:`ContractViolation` naming the invariant (``I-...``) and the evidence. They are
too expensive for every operation, so the caches run them only in ``audit()`` (quiescence, tests).

House rule: this module never imports ``kvledger.reference`` (nor torch). A node is anything with the
attributes of :class:`NodeLike`; a node's ``value``/``mamba_value`` only needs ``len()`` and
``tolist()``. Ownership is checked through callables the cache passes in (``ids_of``, ``holdings_of``),
so the ledger's id unit (tokens or pages) stays the cache's business.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED


class NodeLike(Protocol):
    """What the checks read from a node. Mamba fields are read only by the Mamba checks."""

    key: Sequence[int]
    value: Any
    children: dict[tuple[int, ...], Any]
    parent: Any
    lock_ref: int
    last_access_time: int


def _name(node: Any) -> str:
    return repr(node)


def collect_nodes(root: Any) -> list[Any]:
    """Every non-root node, parents before children; a node reached twice (cycle, DAG) is a violation."""
    seen: set[int] = {id(root)}
    out: list[Any] = []
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        if id(node) in seen:
            raise ContractViolation(
                f"I-KEYS: {_name(node)} is reachable twice from the root (cycle or shared child)"
            )
        seen.add(id(node))
        out.append(node)
        stack.extend(node.children.values())
    return out


def check_node_keys(root: Any, nodes: Iterable[Any], page_size: int) -> None:
    """I-NODE-NONEMPTY and I-KEYS: non-empty, page-aligned keys as long as their values, keyed by first page.

    Also the parent links: a child's ``parent`` is the node whose ``children`` holds it (#36696: a split
    child registered under a stale key corrupts the tree far from the cause).
    """
    if len(root.key) or len(root.value) or root.parent is not None:
        raise ContractViolation(
            f"I-NODE-NONEMPTY: the root must have an empty key and value and no parent: {root!r}"
        )
    for parent in [root, *nodes]:
        for child_key, child in parent.children.items():
            if child.parent is not parent:
                raise ContractViolation(
                    f"I-KEYS: {_name(child)} is a child of {_name(parent)} but its parent is {child.parent!r}"
                )
            n = len(child.key)
            if n == 0 or len(child.value) != n:
                raise ContractViolation(
                    f"I-NODE-NONEMPTY: {_name(child)} has len(key)={n},"
                    f" len(value)={len(child.value)} (B16 ghost node)"
                )
            if n % page_size:
                raise ContractViolation(
                    f"I-NODE-NONEMPTY: {_name(child)} key length {n} is not a multiple of page {page_size}"
                )
            expected = tuple(child.key[:page_size])
            if tuple(child_key) != expected:
                raise ContractViolation(
                    f"I-KEYS: {_name(child)} is registered under {tuple(child_key)!r}"
                    f" but its first page is {expected!r} (#36696)"
                )


def check_lock_tree(root: Any, nodes: Sequence[Any], own: Mapping[int, int]) -> None:
    """I-LOCK-TREE: ``lock_ref(n) = own(n) + sum(lock_ref(c) for children c)``; the root is pinned at 1.

    ``own`` maps ``id(node)`` to the number of live lock handles whose locked node is that node.
    """
    if root.lock_ref != 1:
        raise ContractViolation(f"I-LOCK-TREE: the root's lock_ref must stay 1, got {root.lock_ref}")
    for node in nodes:
        expected = own.get(id(node), 0) + sum(c.lock_ref for c in node.children.values())
        if node.lock_ref != expected:
            raise ContractViolation(
                f"I-LOCK-TREE: {_name(node)} has lock_ref {node.lock_ref},"
                f" but {own.get(id(node), 0)} live lock(s) on it"
                f" plus its children's {expected - own.get(id(node), 0)} give {expected}"
            )


def _recount_accounts(
    inv: str, entries: Iterable[tuple[Any, int, int, Any]], evictable: int, protected: int
) -> None:
    """Recount ``(node, size, lock_count, owner)`` entries into evictable/protected and compare.

    Shared by the KV (I-PROTECTED-DEF) and state (I-MAMBA-DEF) recounts: an entry is protected iff its
    lock count is positive, and its ledger owner must sit in the matching account.
    """
    rec_e = rec_p = 0
    for node, size, lock_count, owner in entries:
        locked = lock_count > 0
        if locked:
            rec_p += size
        else:
            rec_e += size
        expected = CACHE_PROTECTED if locked else CACHE_EVICTABLE
        if owner.account != expected:
            raise ContractViolation(
                f"{inv}: {_name(node)} has lock count {lock_count} but its owner is in {owner.account!r}"
            )
    if (rec_e, rec_p) != (evictable, protected):
        raise ContractViolation(
            f"{inv}: counters evictable={evictable}, protected={protected};"
            f" recount evictable={rec_e}, protected={rec_p}"
        )


def check_size_counters(nodes: Iterable[Any], evictable: int, protected: int) -> None:
    """I-PROTECTED-DEF: token counters equal a recount; each node's KV owner sits in the right account."""
    entries = ((n, len(n.value), n.lock_ref, n.kv_owner) for n in nodes)
    _recount_accounts("I-PROTECTED-DEF", entries, evictable, protected)


def check_no_alias(
    nodes: Iterable[Any],
    ids_of: Callable[[Any], list[int]],
    holdings_of: Callable[[Any], frozenset[int]] | None = None,
) -> None:
    """I-NO-TREE-ALIAS: no KV id in two nodes; with a ledger, each node's owner holds exactly its ids.

    The second half is what rules out a request owning a tree id: the ledger gives every id one owner.
    """
    seen: dict[int, Any] = {}
    for node in nodes:
        ids = ids_of(node)
        if len(set(ids)) != len(ids):
            dups = sorted(i for i, c in Counter(ids).items() if c > 1)
            raise ContractViolation(f"I-NO-TREE-ALIAS: {_name(node)} holds ids twice: {dups[:8]}")
        for i in ids:
            other = seen.get(i)
            if other is not None:
                raise ContractViolation(f"I-NO-TREE-ALIAS: id {i} is in {_name(other)} and in {_name(node)}")
            seen[i] = node
        if holdings_of is not None:
            held = holdings_of(node.kv_owner)
            if held != frozenset(ids):
                raise ContractViolation(
                    f"I-NO-TREE-ALIAS: {_name(node)} has ids {sorted(ids)[:8]} but the ledger gives its owner"
                    f" {sorted(held)[:8]} (missing {sorted(set(ids) - held)[:8]},"
                    f" extra {sorted(held - set(ids))[:8]})"
                )


def check_lru(
    label: str,
    order: Sequence[Any],
    members: Iterable[Any],
    time_of: Callable[[Any], int] = lambda n: n.last_access_time,
) -> None:
    """I-LRU-ORDER: the list (oldest first) holds exactly ``members``, each once, in access-time order.

    ``time_of`` reads the stamp that orders this list (a node of the Mamba tree carries one per list: its
    KV recency and its state's recency are refreshed by different operations). Times are compared
    non-strictly: equal times are harmless to eviction order.
    """
    in_list: set[int] = set()
    for node in order:
        if id(node) in in_list:
            raise ContractViolation(f"I-LRU-ORDER: {label} list holds {_name(node)} twice")
        in_list.add(id(node))
    expected = {id(n): n for n in members}
    if in_list != set(expected):
        extra = [n for n in order if id(n) not in expected][:4]
        missing = [n for i, n in expected.items() if i not in in_list][:4]
        raise ContractViolation(f"I-LRU-ORDER: {label} list has extra {extra} and misses {missing}")
    for older, newer in itertools.pairwise(order):
        if time_of(older) > time_of(newer):
            raise ContractViolation(
                f"I-LRU-ORDER: {label} list puts {_name(older)} (t={time_of(older)}) before"
                f" {_name(newer)} (t={time_of(newer)}): the list is not in access-time order (B3)"
            )


def check_path_recency(root: Any, node: Any) -> bool:
    """I-LRU-ORDER on a refreshed path: each node strictly more recent than its parent (root excluded)."""
    while node is not root and node.parent is not root:
        if node.parent.last_access_time >= node.last_access_time:
            return False
        node = node.parent
    return True


def check_mamba_counters(nodes: Iterable[Any], evictable: int, protected: int) -> None:
    """I-MAMBA-DEF: state counters equal a recount over non-tombstone nodes; owners in the right account."""
    entries = ((n, 1, n.mamba_lock_ref, n.mamba_owner) for n in nodes if n.mamba_value is not None)
    _recount_accounts("I-MAMBA-DEF", entries, evictable, protected)


def check_mamba_lock(nodes: Iterable[Any], own_mamba: Mapping[int, int]) -> None:
    """I-MAMBA-LOCK: mamba_lock_ref(n) = live locks on n that took the state, <= lock_ref, 0 on tombstones."""
    for node in nodes:
        m = node.mamba_lock_ref
        if m != own_mamba.get(id(node), 0):
            raise ContractViolation(
                f"I-MAMBA-LOCK: {_name(node)} has mamba_lock_ref {m}"
                f" but {own_mamba.get(id(node), 0)} live lock(s)"
                " on it took the state"
            )
        if not 0 <= m <= node.lock_ref:
            raise ContractViolation(
                f"I-MAMBA-LOCK: {_name(node)} has mamba_lock_ref {m} > lock_ref {node.lock_ref}"
            )
        if node.mamba_value is None and m:
            raise ContractViolation(f"I-MAMBA-LOCK: tombstone {_name(node)} has mamba_lock_ref {m}")


def check_tombstones(root: Any, nodes: Iterable[Any]) -> None:
    """I-TOMBSTONE: no unlocked leaf is a tombstone; the root has no state (and is in no LRU list)."""
    if root.mamba_value is not None:
        raise ContractViolation(f"I-TOMBSTONE: the root has a state {root.mamba_value!r}")
    for node in nodes:
        if not node.children and node.mamba_value is None and node.lock_ref == 0:
            raise ContractViolation(
                f"I-TOMBSTONE: {_name(node)} is an unlocked tombstone leaf (its KV can never be matched)"
            )


def check_mamba_values(
    nodes: Iterable[Any], holdings_of: Callable[[Any], frozenset[int]] | None = None
) -> None:
    """I-MAMBA-VALUE: one slot per state, pairwise distinct, held by the node's state owner (never shared)."""
    seen: dict[Hashable, Any] = {}
    for node in nodes:
        if node.mamba_value is None:
            continue
        slots = node.mamba_value.tolist()
        if len(slots) != 1:
            raise ContractViolation(f"I-MAMBA-VALUE: {_name(node)} has {len(slots)} state slots, expected 1")
        slot = slots[0]
        other = seen.get(slot)
        if other is not None:
            raise ContractViolation(
                f"I-MAMBA-VALUE: state slot {slot} is shared by {_name(other)} and {_name(node)}"
            )
        seen[slot] = node
        if holdings_of is not None:
            held = holdings_of(node.mamba_owner)
            if held != frozenset(slots):
                raise ContractViolation(
                    f"I-MAMBA-VALUE: {_name(node)} has state slot {slot}"
                    f" but the ledger gives its owner {sorted(held)}"
                )
