"""What the attach reads off SGLang's objects, release by release: a request's handles, a tree node's
lock counts and values, an allocator's free pages, the tree's counters; and the check of :func:`watch`'s
arguments (bad input refused before anything is wrapped).

Each reader knows the shapes the supported releases give the same fact (``lock_ref`` on a
``RadixCache`` node, ``full_lock_ref`` on a ``MambaRadixCache`` one, the FULL component's on a
``UnifiedRadixCache`` Python node); the attach (:mod:`.attach`) asks these and never looks itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.ledger import as_id_array


def handles(req: Any) -> list[tuple[str, str, list[int]]]:
    """``(field, pool, ids)`` for every id an SGLang ``Req`` names (fields of the request itself before
    0.5.14, of ``req.kv`` after; -1 marks an unset ping-pong entry in the lazy mode)."""
    kv = getattr(req, "kv", None) or req
    out: list[tuple[str, str, list[int]]] = []
    row = getattr(kv, "req_pool_idx", None)
    if row is not None:
        out.append(("req_pool_idx", "req", [int(row)]))
    for name in ("mamba_pool_idx", "mamba_ping_pong_track_buffer"):
        value = getattr(kv, name, None)
        if value is not None:
            ids = [int(i) for i in as_id_array(value).tolist() if int(i) >= 0]
            if ids:
                out.append((name, "mamba", ids))
    return out


def assertion_text(exc: AssertionError) -> str:
    """SGLang's assertion message, or (a bare ``assert``) the source line that failed."""
    if str(exc):
        return str(exc)
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "assertion failed"
    import linecache

    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()
    return f"{line} ({tb.tb_frame.f_code.co_name})"


def asserts_lock(exc: AssertionError) -> bool:
    """An assertion about a lock count (``lock_ref``): SGLang checking that the node it evicts is unlocked."""
    return "lock_ref" in assertion_text(exc)


def all_free_pages(allocator: Any) -> np.ndarray:
    """The allocator's free pages, its release list included (``get_all_free_pages`` from 0.5.20 on;
    earlier releases keep the same two lists without the accessor)."""
    if hasattr(allocator, "get_all_free_pages"):
        return as_id_array(allocator.get_all_free_pages())
    parts = [p for p in (allocator.free_pages, getattr(allocator, "release_pages", None)) if p is not None]
    return np.concatenate([as_id_array(p) for p in parts]) if parts else np.empty(0, dtype=np.int64)


def python_root(tree: Any) -> Any:
    """The root node when the tree's nodes are Python objects; None for the Rust tree core, whose
    nodes are ids (its ``root_node`` raises ``NotImplementedError``)."""
    try:
        root = tree.root_node
    except NotImplementedError:
        return None
    return None if isinstance(root, int) or not hasattr(root, "children") else root


def tree_values(tree: Any) -> np.ndarray:
    """Every KV id the tree holds. (0.5.23's ``RadixCache.all_values_flatten`` raises on an empty tree:
    ``torch.cat`` of no tensors; an empty tree holds nothing.)"""
    root = python_root(tree)
    if root is not None and not root.children:
        return np.empty(0, dtype=np.int64)
    return as_id_array(tree.all_values_flatten())


# ComponentType's values (SGLang's int enum, the same in every release with UnifiedRadixCache): the Unified
# tree's Python nodes keep one ComponentData per component in a list indexed by it.
FULL, MAMBA = 0, 2


def components(node: Any) -> Any:
    return getattr(node, "component_data", None)


def lock_ref(node: Any) -> int:
    """The node's KV lock count: ``lock_ref`` (RadixCache), ``full_lock_ref`` (MambaRadixCache), or the
    FULL component's (UnifiedRadixCache's Python core)."""
    data = components(node)
    if data is not None:
        return int(data[FULL].lock_ref)
    return int(getattr(node, "full_lock_ref", getattr(node, "lock_ref", 0)))


def kv_len(node: Any) -> int:
    data = components(node)
    return len(data[FULL].value) if data is not None else len(node.value)


def kv_value(node: Any) -> Any:
    """The node's KV ids (its FULL component's on the Unified tree's Python nodes); None for a Rust node id."""
    data = components(node)
    if data is not None:
        return data[FULL].value
    return getattr(node, "value", None)


def locked_path_values(nodes: Iterable[Any]) -> np.ndarray:
    """Every KV id on the paths from ``nodes`` up to the root: what a lock on each node protects."""
    parts: list[np.ndarray] = []
    seen: set[int] = set()
    for node in nodes:
        while node is not None and id(node) not in seen:
            seen.add(id(node))
            value = kv_value(node)
            if value is not None and len(value):
                parts.append(as_id_array(value))
            node = getattr(node, "parent", None)
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def key_path(node: Any, first: int = 8) -> str:
    """The first tokens on the path from the root to ``node``, for messages: how a reader finds the node
    in a dump of the tree ("?" for a Rust node id, which carries no key)."""
    keys: list[Any] = []
    while getattr(node, "parent", None) is not None:
        keys.append(getattr(node, "key", None))
        node = node.parent
    if not keys:
        return "?"
    tokens: list[int] = []
    for key in reversed(keys):
        ids: Any = getattr(key, "token_ids", key)
        try:
            tokens.extend(int(t) for t in list(ids)[: first + 1 - len(tokens)])
        except TypeError:
            return "?"
        if len(tokens) > first:
            return str(tokens[:first])[:-1] + ", ...]"
    return str(tokens)


def state_lock_ref(node: Any) -> int | None:
    """The node's Mamba state lock count, or None for a node without one (no Mamba, or a Rust node id)."""
    data = components(node)
    if data is not None:
        kinds = getattr(node, "component_types", getattr(node, "tree_components", None))
        if len(data) <= MAMBA or (kinds is not None and MAMBA not in kinds):
            return None
        return int(data[MAMBA].lock_ref)
    ref = getattr(node, "mamba_lock_ref", None)
    return None if ref is None else int(ref)


def full_counters(tree: Any) -> tuple[int, int]:
    """(evictable, protected) KV tokens as the tree counts them (0.5.20's Mamba tree: the full part)."""
    if hasattr(tree, "full_evictable_size_"):  # 0.5.20's MambaRadixCache (its evictable_size() raises)
        return int(tree.full_evictable_size()), int(tree.full_protected_size())
    e, p = tree.evictable_size(), tree.protected_size()
    return (int(e[0]) if isinstance(e, tuple) else int(e)), (int(p[0]) if isinstance(p, tuple) else int(p))


NEEDS: dict[str, tuple[str, ...]] = {
    "allocator": (
        "alloc",
        "free",
        "free_group_begin",
        "free_group_end",
        "available_size",
        "page_size",
        "size",
    ),
    "req_pool": ("free_slots", "size"),
    "mamba_pool": ("mamba_pool",),
    "tree": ("match_prefix", "insert", "evict", "inc_lock_ref", "dec_lock_ref"),
}
"""What each argument of :func:`watch` must offer (the calls it wraps and the counts its audit reads)."""


def watched(obj: Any) -> bool:
    """Whether a watch is attached to ``obj`` now (an instance attribute shadows one of its methods)."""
    names = ("alloc", "free", "alloc_rows", "match_prefix", "inc_lock_ref")
    return any(name in vars(obj) for name in names) if hasattr(obj, "__dict__") else False


def refuse_kvledgers_own(name: str, obj: Any) -> None:
    """kvledger's own pools and caches already carry a ledger of their own: wrapping one would count every
    move twice, in two ledgers that disagree about the owners (the attach knows SGLang's call shapes, not
    the reference's), and a check that contradicts itself is worse than none."""
    module = type(obj).__module__
    if module == "kvledger" or module.startswith("kvledger."):
        raise InvalidArgument(
            f"watch: {name}={type(obj).__name__} is kvledger's own ({module}), already checked by its own"
            " ledger; watch takes SGLang's components"
        )


def check_arguments(allocator: Any, req_pool: Any, mamba_pool: Any, tree: Any, audit_each: Any) -> None:
    """Reject bad arguments before anything is wrapped (the objects are left exactly as they were)."""
    if not isinstance(audit_each, bool):
        raise InvalidArgument(f"watch: audit_each must be a bool, got {type(audit_each).__name__}")
    given = {"allocator": allocator, "req_pool": req_pool, "mamba_pool": mamba_pool, "tree": tree}
    for name, obj in given.items():
        if obj is None:
            continue
        refuse_kvledgers_own(name, obj)
        missing = [a for a in NEEDS[name] if not hasattr(obj, a)]
        if missing:
            raise InvalidArgument(
                f"watch: {name}={type(obj).__name__} is not an SGLang {name.replace('_', ' ')}"
                f" (no {', '.join(missing)})"
            )
        if watched(obj):
            raise InvalidArgument(
                f"watch: {name} ({type(obj).__name__}) is already watched; detach that watch first"
            )
    if mamba_pool is not None:
        states = mamba_pool.mamba_pool
        slots = getattr(mamba_pool, "mamba_allocator", None) or states
        if states is None or not all(hasattr(slots, a) for a in ("alloc", "free", "free_slots", "size")):
            raise InvalidArgument(
                f"watch: mamba_pool={type(mamba_pool).__name__} has no Mamba slots (a HybridReqToTokenPool has)"
            )
        if watched(slots):
            raise InvalidArgument(
                "watch: the Mamba slot allocator is already watched; detach that watch first"
            )
    if all(obj is None for obj in given.values()):
        raise InvalidArgument("watch: give at least one of allocator, req_pool, mamba_pool, tree")
