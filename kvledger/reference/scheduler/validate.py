"""Input validation for the scheduler's entry points: collaborators, prompts, request and batch handles.

Each check raises a typed :class:`KVLedgerError` before the scheduler changes anything. Collaborators
are checked by the interface the scheduler uses (an adapter with the same methods passes), and for the
wiring that would corrupt silently: a tree built over another allocator or another Mamba pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from kvledger.contracts.errors import InvalidArgument, KVLedgerError
from kvledger.contracts.pool_kinds import MAMBA
from kvledger.contracts.protocols import CacheSizes, caches_kind

KV_ALLOCATOR_API = ("page_size", "size", "device", "ledger", "alloc", "free", "available_size")
ROWS_API = ("size", "max_context_len", "device", "ledger", "alloc", "free", "read", "write", "write_each")
MAMBA_POOL_API = ("size", "device", "ledger", "alloc", "free", "fork_from")
TREE_API = ("page_size", "cached_kinds", "counts", "match_prefix", "insert", "inc_lock_ref", "dec_lock_ref", "evict")

MAX_TOKEN_ID = 2**63 - 1
"""Without a vocabulary to check against, a token must still fit the int64 tensors it ends up in."""


class UnknownRequest(KVLedgerError):
    """A request id or request object this scheduler does not know (never added, or another scheduler's)."""


# The arguments are typed ``object``: a caller may pass anything, and these checks decide what it is.
def _check_api(obj: object, api: tuple[str, ...], what: str) -> None:
    missing = [name for name in api if not hasattr(obj, name)]
    if obj is None or missing:
        raise InvalidArgument(f"Scheduler: {what} {type(obj).__name__} lacks {missing}")


def check_collaborators(
    config: object,
    kv_allocator: object,
    req_to_token_pool: object,
    mamba_pool: object,
    tree: object,
    runner: object,
    on_step: object,
) -> None:
    """The scheduler's pools, tree, runner and callback, and how they are wired to each other."""
    from kvledger.reference.scheduler.config import SchedulerConfig

    if not isinstance(config, SchedulerConfig):
        raise InvalidArgument(f"Scheduler: config must be a SchedulerConfig, got {type(config).__name__}")
    _check_api(kv_allocator, KV_ALLOCATOR_API, "kv_allocator")
    _check_api(req_to_token_pool, ROWS_API, "req_to_token_pool")
    if mamba_pool is not None:
        _check_api(mamba_pool, MAMBA_POOL_API, "mamba_pool")
    if tree is not None:
        _check_api(tree, TREE_API, "tree")
        built_on = getattr(tree, "token_to_kv_pool_allocator", kv_allocator)
        if built_on is not kv_allocator:
            raise InvalidArgument("Scheduler: the tree caches another allocator's KV, not kv_allocator's")
        if caches_kind(cast(CacheSizes, tree), MAMBA.name):  # cached_kinds is in TREE_API: present
            if mamba_pool is None:
                raise InvalidArgument("Scheduler: a Mamba radix cache needs the mamba_pool it caches states of")
            if getattr(tree, "mamba_pool", mamba_pool) is not mamba_pool:
                raise InvalidArgument("Scheduler: the tree caches another Mamba pool's states, not mamba_pool's")
    if runner is not None and not callable(getattr(runner, "forward", None)):
        raise InvalidArgument(f"Scheduler: runner {type(runner).__name__} has no forward()")
    if on_step is not None and not callable(on_step):
        raise InvalidArgument(f"Scheduler: on_step must be callable, got {type(on_step).__name__}")
    devices = {str(getattr(p, "device", None)) for p in (kv_allocator, req_to_token_pool, mamba_pool) if p is not None}
    if len(devices) > 1:
        raise InvalidArgument(f"Scheduler: the pools are on different devices {sorted(devices)}")


MAX_RID = 2**63 - 2
"""The largest request id. The rule for request ids, the same for the scheduler, both PD instances and
the PD system: an int (not a bool) with ``0 <= rid <= MAX_RID``, so that the id and its PD bootstrap
room ``rid + 1`` fit the int64 tensors and event logs they end up in. An id is unique among the requests
its holder still keeps: a scheduler refuses one that is live or among the ended requests it keeps
(``SchedulerConfig.finished_window``); a PD system keeps every request, so its ids never repeat."""


def check_rid(rid: object) -> int:
    """A request id by the rule of :data:`MAX_RID` (its uniqueness is the caller's table's business)."""
    if isinstance(rid, bool) or not isinstance(rid, int):
        raise InvalidArgument(f"a request id is an int, got {type(rid).__name__} {rid!r}")
    if not 0 <= rid <= MAX_RID:
        raise InvalidArgument(f"request id {rid} outside [0, {MAX_RID}]")
    return rid


def check_prompt(rid: int, prompt: object, vocab_size: int | None) -> list[int]:
    """A non-empty list or tuple of token ids: ints in ``[0, vocab_size)`` (the runner's vocabulary, when
    it has one). One pass over the types, two over the values: O(len(prompt)), once per request."""
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise InvalidArgument(
            f"request {rid}: prompt must be a non-empty list or tuple of token ids, got {type(prompt).__name__}"
            f" of length {len(prompt) if isinstance(prompt, Sequence) else '?'}"
        )
    if not all(type(t) is int for t in prompt):
        bad = next(t for t in prompt if type(t) is not int)
        raise InvalidArgument(f"request {rid}: token ids are ints, got {type(bad).__name__} {bad!r}")
    high = MAX_TOKEN_ID if vocab_size is None else vocab_size - 1
    if min(prompt) < 0 or max(prompt) > high:
        bad = next(t for t in prompt if not 0 <= t <= high)
        limit = "the int64 range" if vocab_size is None else f"the vocabulary [0, {vocab_size})"
        raise InvalidArgument(f"request {rid}: token id {bad} outside {limit}")
    return list(prompt)


def check_max_new_tokens(rid: int, max_new_tokens: object) -> int:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InvalidArgument(f"request {rid}: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    return max_new_tokens
