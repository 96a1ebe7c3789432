"""What the scheduler and the caches require of the components they are given: ``typing.Protocol`` classes.

The scheduler is built from a KV allocator, a request-row pool, an optional Mamba pool and an optional
prefix cache; the caches from an allocator (and a Mamba pool). They are typed with these protocols, not
with kvledger's classes, so another engine's component can stand in through a small adapter and be held
to the same checks: the scheduler's identities read only what is listed here, and every id an adapter
hands out or takes back goes through its ``ledger`` (a :class:`~kvledger.contracts.ledger.Ledger`, or the
no-op :class:`~kvledger.contracts.null_ledger.NullLedger` when contracts are off).

Conventions (SGLang's): ids are int64 tensors on the component's ``device``; ``alloc`` is all or nothing
and returns None when short; ``free`` takes an owner and refuses, with a typed
:class:`~kvledger.contracts.errors.KVLedgerError`, ids the owner does not hold. ``_free_unchecked`` and
``_copy_unchecked`` are the trusted paths a cache uses for ids it owns (validated by the caller; the
ledger still checks the owner). Structural: nothing needs to inherit from these classes.

Only ``kvledger.contracts`` is imported at run time (tensors are named for type checkers only), so the
spec stays independent of every implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast, runtime_checkable

from kvledger.contracts.ledger_by_level import AnyLedger
from kvledger.contracts.owners import Owner

if TYPE_CHECKING:  # pragma: no cover
    import torch

Ids: TypeAlias = "torch.Tensor | Sequence[int] | int"
"""How every pool method names ids (slots, rows, pages): an integer tensor, a sequence of ints or one int;
the pool turns it into its own index tensor and refuses anything else with a typed error."""


class IdPool(Protocol):
    """What every pool shares: a size in ids, a device, a ledger, and its own free counters."""

    @property
    def size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def ledger(self) -> AnyLedger: ...

    def available_size(self) -> int:
        """Free units (tokens for a KV pool, rows, slots); a free group's buffered ids excluded."""
        ...

    def pending_free_size(self) -> int:
        """Units freed inside the open free group (back on the free list at its end)."""
        ...

    def free_ids(self) -> Sequence[int]:
        """The ids on the free list, in reuse order (what a failed check's census reads)."""
        ...

    def audit(self) -> None:
        """Full recount of the pool's own structures against its ledger (quiescence, tests)."""
        ...


class KVAllocator(IdPool, Protocol):
    """``TokenToKVPoolAllocator`` (page size 1) and the common part of the paged allocator."""

    @property
    def page_size(self) -> int: ...

    def alloc(self, n: int, owner: Owner) -> torch.Tensor | None:
        """``n`` token slots for ``owner`` (a multiple of the page size), or None."""
        ...

    def alloc_decode(
        self, seq_lens: Sequence[int], last_loc: Sequence[int], owners: Sequence[Owner]
    ) -> torch.Tensor | None:
        """One slot per request of a decode step (``owners[i]`` gets ``result[i]``), all or none."""
        ...

    def free(self, ids: Ids, owner: Owner) -> None: ...

    def _free_unchecked(self, ids: torch.Tensor, owner: Owner, op: str = "free") -> None:
        """The trusted release path (a cache freeing its own ids)."""
        ...


class PagedKVAllocator(KVAllocator, Protocol):
    """``PagedTokenToKVPoolAllocator``: pages of ``page_size`` slots, the page the unit of ownership."""

    def alloc_extend(
        self,
        prefix_lens: Sequence[int],
        seq_lens: Sequence[int],
        last_loc: Sequence[int],
        owners: Sequence[Owner],
    ) -> torch.Tensor | None:
        """Slots extending each request from ``prefix_lens[i]`` to ``seq_lens[i]``: its partial last page
        first, then new pages; all requests or none."""
        ...


class ReqRowPool(IdPool, Protocol):
    """``ReqToTokenPool``: one row per request, mapping its positions to KV slots."""

    @property
    def max_context_len(self) -> int: ...

    def alloc(self, n: int, owner: Owner) -> list[int] | None: ...

    def free(self, rows: Ids, owner: Owner) -> None: ...

    def write(self, row: int, start: int, values: torch.Tensor) -> None: ...

    def write_each(self, rows: Sequence[int], positions: Sequence[int], values: Any) -> None: ...

    def forget_tail(self, row: int, start: int) -> None:
        """The owner gave back what positions ``start..`` named: those cells are stale (I-ROW-WRITE)."""
        ...

    def read(self, row: int, start: int, end: int) -> torch.Tensor: ...

    def read_each(self, rows: Sequence[int], positions: Sequence[int]) -> torch.Tensor: ...


class MambaStatePool(IdPool, Protocol):
    """``MambaPool``: one recurrent state per slot; states are copied, never shared."""

    @property
    def name(self) -> str: ...

    def alloc(self, n: int, owner: Owner) -> torch.Tensor | None:
        """``n`` zeroed slots for ``owner``, or None."""
        ...

    def free(self, slots: Ids, owner: Owner) -> None: ...

    def fork_from(self, src_index: Ids, owner: Owner) -> torch.Tensor | None:
        """A new slot for ``owner`` holding a copy of ``src_index``'s state, or None (pool empty)."""
        ...

    def copy_from(self, src_index: Ids, dst_index: Ids) -> None: ...

    def _copy_unchecked(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """The trusted copy (a cache's copy-on-write from its own slot into the caller's)."""
        ...

    def _free_unchecked(self, slots: torch.Tensor, owner: Owner, op: str = "free") -> None: ...


@runtime_checkable
class MambaStateTensors(Protocol):
    """A Mamba pool's data plane: every layer's conv and temporal state, indexed ``[layer, slot]`` (what a
    PD retraction copies to the host and back; the id protocol above exposes ids, not contents)."""

    @property
    def num_layers(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def conv_state(self) -> torch.Tensor: ...

    @property
    def temporal_state(self) -> torch.Tensor: ...


class NodeLike(Protocol):
    """A cache node, as far as a caller checks one: its depth in tokens and (Mamba cache) its state slot."""

    @property
    def mamba_value(self) -> torch.Tensor | None: ...

    def depth(self) -> int: ...


class MatchLike(Protocol):
    """What ``match_prefix`` returns: the matched KV ids, the node it ends at, the copy-on-write slot."""

    @property
    def device_indices(self) -> torch.Tensor: ...

    @property
    def last_node(self) -> NodeLike: ...

    @property
    def cow_slot(self) -> torch.Tensor | None: ...


class MambaMatchLike(MatchLike, Protocol):
    """A Mamba cache's match: also the branching point (Mamba V2; None in V1 and when the match stops at
    its node)."""

    @property
    def mamba_branching_seqlen(self) -> int | None: ...


class LockLike(Protocol):
    """A lock handle from ``inc_lock_ref``: the node, and whether it also took the node's state."""

    @property
    def node(self) -> NodeLike: ...

    @property
    def took_mamba(self) -> bool: ...

    @property
    def released(self) -> bool:
        """Whether ``dec_lock_ref`` has given it back (a released handle locks nothing)."""
        ...


class InsertLike(Protocol):
    """A Mamba cache insert's result: tokens already cached, and whether the cache took the slot."""

    @property
    def prefix_len(self) -> int: ...

    @property
    def mamba_adopted(self) -> bool: ...

    @property
    def node(self) -> NodeLike | None:
        """The node that ends at the key's length (None for an empty key)."""
        ...


@dataclass
class KindCounts:
    """One cached pool kind's counters in a prefix cache: units (tokens for KV, slots for states) held by
    unlocked (evictable) and locked (protected) nodes, the root excluded. Kept by the kind's tree component."""

    evictable: int = 0
    protected: int = 0


@dataclass
class CacheCounts(KindCounts):
    """A prefix cache's own counters, kept in this record: ``evictable`` / ``protected`` are the full KV's
    tokens (the tree's base kind, ``kv``); every other kind the cache holds at its nodes has its
    :class:`KindCounts` in ``kinds`` under the pool kind's name (``"mamba"``: state slots).

    Public so the scheduler reads them every step without evaluating the cache's class invariants on each
    read (its per-step identity checks these very counters against the ledger); ``evictable_size()`` and
    the other accessors are the checked reads. Never written from outside the cache.
    """

    kinds: dict[str, KindCounts] = field(default_factory=dict)

    def of(self, kind: str) -> KindCounts:
        """The counters of pool kind ``kind`` (``kv``: this record; a kind the cache does not hold: zeros)."""
        if kind == "kv":
            return self
        return self.kinds.get(kind) or KindCounts()

    @property
    def mamba_evictable(self) -> int:
        """The Mamba states' evictable slots (0 without a Mamba component)."""
        k = self.kinds.get("mamba")
        return 0 if k is None else k.evictable

    @property
    def mamba_protected(self) -> int:
        """The Mamba states' protected slots (0 without a Mamba component)."""
        k = self.kinds.get("mamba")
        return 0 if k is None else k.protected


class TreeComponentLike(Protocol):
    """One cached kind's part of a prefix cache (``cache.component(kind)``): its counters, and what a node
    holds of the kind (read by the census behind a failure report)."""

    @property
    def kind(self) -> str: ...

    @property
    def counts(self) -> KindCounts: ...

    def held(self, node: Any) -> tuple[list[int], Owner] | None:
        """The ledger ids ``node`` holds of this kind and their owner (None: nothing, or not by id)."""
        ...


class CacheSizes(Protocol):
    """What every prefix cache reports (SGLang's names), and its audit."""

    @property
    def page_size(self) -> int: ...

    @property
    def counts(self) -> CacheCounts:
        """The counters, read without the checks (see :class:`CacheCounts`)."""
        ...

    @property
    def root(self) -> Any: ...

    def cached_kinds(self) -> tuple[str, ...]:
        """The pool kinds (``PoolKind.name``) this cache holds at its nodes: ``kv`` first, then one per tree
        component (``mamba``: the Mamba radix cache). What a caller asks instead of a per-variant switch."""
        ...

    def component(self, kind: str) -> TreeComponentLike:
        """The tree component of pool kind ``kind`` (InvalidArgument if the cache does not hold it)."""
        ...

    def inc_lock_ref(self, node: Any) -> LockLike: ...

    def live_locks(self) -> Sequence[LockLike]:
        """The handles ``inc_lock_ref`` returned that are not yet released (no particular order)."""
        ...

    def dec_lock_ref(self, lock: Any) -> None: ...

    def evict(self, num_tokens: int) -> int: ...

    def evictable_size(self) -> int: ...

    def protected_size(self) -> int: ...

    def audit(self) -> None: ...


class PrefixCache(CacheSizes, Protocol):
    """``RadixCache``: KV ids keyed by token ids (and what its components hold, kinds other than Mamba)."""

    def match_prefix(self, key: Sequence[int]) -> MatchLike: ...

    def insert(self, key: Sequence[int], value: torch.Tensor, owner: Owner, protected_len: int = 0) -> int:
        """Cache ``key -> value``; returns the length already cached (the caller's duplicates are freed)."""
        ...


class MambaPrefixCache(CacheSizes, Protocol):
    """``MambaRadixCache``: KV ids plus a Mamba state at node ends (copy-on-write on a match); its
    ``cached_kinds()`` name ``mamba``."""

    def match_prefix(
        self, key: Sequence[int], *, cow_owner: Owner | None = None, cow_slot: torch.Tensor | None = None
    ) -> MambaMatchLike: ...

    def insert(
        self,
        key: Sequence[int],
        value: torch.Tensor,
        owner: Owner,
        *,
        mamba_slot: torch.Tensor | None,
        protected_len: int = 0,
        state_op: str = "insert",
    ) -> InsertLike:
        """Cache ``key -> value`` with the state in ``mamba_slot`` at its end; ``state_op`` names the slot's
        ledger move (``"donate"``: a Mamba V2 tracking slot handed over)."""
        ...

    def match_prefix_kv(self, key: Sequence[int]) -> MatchLike:
        """The longest cached KV prefix whatever states its nodes hold (SGLang's ``skip_mamba_match``)."""
        ...

    def evict_mamba(self, num_slots: int) -> int: ...

    def mamba_evictable_size(self) -> int: ...

    def mamba_protected_size(self) -> int: ...


AnyPrefixCache = PrefixCache | MambaPrefixCache
"""The cache a scheduler may be given (or None: no prefix cache)."""


def caches_kind(tree: CacheSizes | None, kind: str) -> bool:
    """Whether ``tree`` holds pool kind ``kind`` at its nodes (False without a tree)."""
    return tree is not None and kind in tree.cached_kinds()


def mamba_cache_of(tree: AnyPrefixCache | None) -> MambaPrefixCache | None:
    """``tree`` as the Mamba cache it is when it caches the ``mamba`` kind, else None (the one place the
    kind-keyed answer is turned into the Mamba cache's type)."""
    if tree is not None and caches_kind(tree, "mamba"):
        return cast(MambaPrefixCache, tree)
    return None
