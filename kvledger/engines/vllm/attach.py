"""Put vLLM's ``KVCacheManager`` under a :class:`~kvledger.contracts.shared_owners.SharedLedger`.

:class:`WatchedHybrid` forwards the scheduler-facing calls (``get_computed_blocks``,
``allocate_slots``, ``free``, ``new_step_starts``, ``reset_prefix_cache``) to vLLM's real manager unchanged, then reads
the pool back: every request's block lists from each per-type manager (``req_to_blocks``), every
block's ``ref_cnt`` and hash, the free queue in order, and hands that to the ledger, which derives the
moves (acquire, release, eviction, hashing) and checks the shared-ownership invariants. A block
returned by ``get_computed_blocks`` is the only one a request may take while others hold it.

Reading the pool back after each call (rather than patching vLLM's methods) keeps vLLM's code
untouched and sees every internal path (touch, evict, free ordering) the same way. A full read-back
is O(blocks); between full audits (``audit_every``) the attach reads only the blocks of the request
the call named, before and after, which is O(that request's blocks). Both costs are measured by
``benchmarks/vllm_attach.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvledger.contracts.errors import KVLedgerError
from kvledger.contracts.shared_owners import EngineView, Move, SharedLedger
from kvledger.engines.vllm.build import BuiltHybrid


class BadAuditCadence(KVLedgerError, ValueError):
    """``audit_every`` below 1 (typed; nothing built)."""

    invariant = "I-TYPED-INPUT"


class UnknownRequest(KVLedgerError, KeyError):
    """A call named a request the watched manager has not seen (typed; nothing forwarded)."""

    invariant = "I-TYPED-INPUT"


def live_states(manager: Any, request: Any) -> int:
    """How many Mamba state blocks ``request`` may keep in ``align`` mode.

    Mamba needs only the state after its last processed token; align mode also keeps the block the
    current step writes and the previous one it copies from (two), plus one state per block of tokens
    still in flight (async scheduling: their outputs have not come back, so their states are not yet
    retired) and the spec's speculative and prefill-checkpoint blocks.
    """
    spec = manager.kv_cache_spec
    in_flight = getattr(request, "num_in_flight_tokens", 0) if request is not None else 0
    extra = getattr(spec, "num_speculative_blocks", 0) + getattr(spec, "num_prefill_checkpoint_blocks", 0)
    return 2 + extra + -(-in_flight // manager.block_size)


def retained_states(
    built: BuiltHybrid, requests: Mapping[str, Any], only: Collection[str] | None = None
) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Per known request (of ``only``, when given): (its bound, the real blocks it keeps) in each
    align-mode Mamba group."""
    out: dict[str, tuple[int, tuple[int, ...]]] = {}
    for manager in built.single_type_managers:
        if getattr(manager, "mamba_cache_mode", None) != "align":
            continue
        table = manager.req_to_blocks
        fixed = live_states(manager, None)  # the part of the bound that is the same for every request
        for request_id in table if only is None else [r for r in only if r in table]:
            request = requests.get(request_id)
            if request is None:
                continue
            kept = tuple(b.block_id for b in table[request_id] if not b.is_null)
            if len(kept) > fixed:  # only then can the bound matter: compute it
                out[request_id] = (live_states(manager, request), kept)
    return out


@dataclass
class _Lists:
    """Holders read from the per-request block lists (of every request, or of some)."""

    holders: dict[int, set[str]] = field(default_factory=dict)
    null_holds: Counter[str] = field(default_factory=Counter)
    duplicates: list[tuple[str, int]] = field(default_factory=list)


def _read_lists(built: BuiltHybrid, only: Collection[str] | None) -> _Lists:
    null_id = built.block_pool.null_block.block_id
    out = _Lists()
    for group, manager in enumerate(built.single_type_managers):
        table = manager.req_to_blocks
        for request_id in table if only is None else [r for r in only if r in table]:
            seen: set[int] = set()
            for block in table[request_id]:
                block_id = block.block_id
                if block_id == null_id:
                    # vLLM pads skipped positions with the null block (Mamba "align" mode); a null in
                    # the full-attention group is a real block that was never given.
                    if group == 0:
                        out.holders.setdefault(null_id, set()).add(request_id)
                    out.null_holds[request_id] += 1
                    continue
                if block_id in seen:
                    out.duplicates.append((request_id, block_id))
                seen.add(block_id)
                out.holders.setdefault(block_id, set()).add(request_id)
    return out


def read_view(built: BuiltHybrid, requests: Mapping[str, Any] | None = None) -> EngineView:
    """The whole pool as vLLM holds it now (O(blocks)): holders per block (null block apart), counts,
    the free queue in order, and the Mamba states each of ``requests`` keeps."""
    pool = built.block_pool
    lists = _read_lists(built, None)
    return EngineView(
        holders={b: frozenset(h) for b, h in lists.holders.items()},
        ref_cnt={b.block_id: b.ref_cnt for b in pool.blocks},
        free_queue=tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
        hashed={b.block_id: b.block_hash for b in pool.blocks},
        null_block=pool.null_block.block_id,
        null_holds=dict(lists.null_holds),
        duplicates=tuple(lists.duplicates),
        retained=retained_states(built, requests or {}),
        free_count=pool.free_block_queue.num_free_blocks,
    )


def read_touched(
    built: BuiltHybrid, ledger: SharedLedger, touched: Collection[str], requests: Mapping[str, Any]
) -> EngineView:
    """The blocks one call on ``touched`` requests can have changed (O(their blocks)): what they held
    before (the ledger's record), what they hold now, and the null block. A manager call only
    changes its own request's lists; blocks it evicts or re-uses from the free queue enter that list,
    so they are in scope too. Other holders of a scoped block are taken from the ledger."""
    pool = built.block_pool
    null_id = pool.null_block.block_id
    lists = _read_lists(built, touched)
    scope = {null_id, *lists.holders}
    for request_id in touched:
        scope |= ledger.held.get(request_id, set())
    leaving = set(touched)
    holders = {}
    for block in scope:
        now = (ledger.holders.get(block, frozenset()) - leaving) | lists.holders.get(block, set())
        if now:
            holders[block] = frozenset(now)
    blocks = [pool.blocks[b] for b in sorted(scope)]  # block order, as the full read-back
    return EngineView(
        holders=holders,
        ref_cnt={b.block_id: b.ref_cnt for b in blocks},
        # a block is in vLLM's doubly linked free queue exactly when it has a predecessor there
        free_queue=tuple(b.block_id for b in blocks if b.prev_free_block is not None),
        hashed={b.block_id: b.block_hash for b in blocks},
        null_block=null_id,
        null_holds=dict(lists.null_holds),
        duplicates=tuple(lists.duplicates),
        retained=retained_states(built, requests, touched),
        scope=frozenset(scope),
        free_count=pool.free_block_queue.num_free_blocks,
    )


class WatchedHybrid:
    """vLLM's hybrid ``KVCacheManager`` with every call mirrored into a shared-ownership ledger.

    Invariant: after every forwarded call the ledger's holder sets equal vLLM's block lists and the
    shared-ownership identities hold (registry area ``shared``); otherwise the call raises
    ``SharedOwnershipViolation`` with the block, its holders and its last moves.

    ``audit_every``: every that many calls (and at build and ``reset_prefix_cache``) the whole pool is
    read back and every identity checked on every block; in between only the blocks the call could
    touch are read (:func:`read_touched`) and checked, plus the engine's free count against the
    ledger's. 1 (the default) audits after every call.
    """

    def __init__(self, built: BuiltHybrid, audit_every: int = 1) -> None:
        if audit_every < 1:
            raise BadAuditCadence(f"audit_every must be at least 1, got {audit_every!r}")
        self.built = built
        self.manager = built.manager
        self.audit_every = audit_every
        self.ledger = SharedLedger(f"vllm-{built.modules.version}", len(built.block_pool.blocks))
        self.hits: dict[str, set[int]] = {}
        self.requests: dict[str, Any] = {}
        self.moves: list[Move] = []
        self.calls = 0
        self.audits = 0
        self._observe("build", audit=True)

    def _observe(
        self, op: str, touched: tuple[str, ...] = (), released: tuple[str, ...] = (), audit: bool = False
    ) -> None:
        self.calls += 1
        if audit or self.calls % self.audit_every == 0:
            self.audits += 1
            view = read_view(self.built, self.requests)
        else:
            view = read_touched(self.built, self.ledger, touched, self.requests)
        self.moves += self.ledger.observe(op, view, self.hits, released)

    def get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        """Forward; the hit's blocks become the ones ``request`` may share. Post: pool unchanged."""
        blocks, n_hit, _ = self.manager.get_computed_blocks(request)
        self.requests[request.request_id] = request
        hit = {b.block_id for group in blocks.blocks for b in group}
        self.hits[request.request_id] = self.hits.get(request.request_id, set()) | hit
        self._observe(f"get_computed_blocks({request.request_id})", (request.request_id,))
        return blocks, n_hit

    def allocate_slots(
        self, request: Any, num_new_tokens: int, num_computed: int = 0, hit: Any = None
    ) -> Any:
        """Forward ``allocate_slots``; None (pool exhausted) must leave the pool as it was."""
        self.requests[request.request_id] = request
        out = self.manager.allocate_slots(request, num_new_tokens, num_computed, hit)
        self._observe(f"allocate_slots({request.request_id}, {num_new_tokens})", (request.request_id,))
        return out

    def free(self, request: Any) -> None:
        """Forward ``free``. Post: the request holds no block; its hit allowance is dropped."""
        if request.request_id not in self.requests:
            raise UnknownRequest(f"free of unknown request {request.request_id!r}")
        self.manager.free(request)
        self.hits.pop(request.request_id, None)
        self._observe(f"free({request.request_id})", (request.request_id,), (request.request_id,))

    def new_step(self) -> None:
        """Forward ``new_step_starts`` (the scheduler calls it once per step): blocks the Mamba manager
        cached during the step become hittable only after it."""
        self.manager.new_step_starts()
        self._observe("new_step_starts")

    def reset_prefix_cache(self) -> bool:
        """Forward; a reset only evicts unheld hashed blocks."""
        done = bool(self.manager.reset_prefix_cache())
        self._observe("reset_prefix_cache", audit=True)  # it may evict any unheld cached block
        return done

    def num_free_blocks(self) -> int:
        return int(self.built.block_pool.get_num_free_blocks())
