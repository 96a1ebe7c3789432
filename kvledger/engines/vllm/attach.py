"""Put vLLM's ``KVCacheManager`` under a :class:`~kvledger.contracts.shared_owners.SharedLedger`.

:class:`WatchedHybrid` forwards the scheduler-facing calls (``get_computed_blocks``,
``allocate_slots``, ``free``, ``new_step_starts``, ``reset_prefix_cache``) to vLLM's real manager unchanged, then reads
the pool back: every request's block lists from each per-type manager (``req_to_blocks``), every
block's ``ref_cnt`` and hash, the free queue in order, and hands that to the ledger, which derives the
moves (acquire, release, eviction, hashing) and checks the shared-ownership invariants. A block
returned by ``get_computed_blocks`` is the only one a request may take while others hold it.

Reading the pool back after each call (rather than patching vLLM's methods) keeps vLLM's code
untouched and sees every internal path (touch, evict, free ordering) the same way; the cost is an
O(blocks) scan per call, measured by ``benchmarks/vllm_attach.py``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvledger.contracts.errors import KVLedgerError
from kvledger.contracts.shared_owners import EngineView, Move, SharedLedger
from kvledger.engines.vllm.build import BuiltHybrid


class UnknownRequest(KVLedgerError, KeyError):
    """A call named a request the watched manager has not seen (typed; nothing forwarded)."""

    invariant = "I-TYPED-INPUT"


def read_view(built: BuiltHybrid) -> EngineView:
    """The pool as vLLM holds it now: holders per block (null block apart), counts, free queue."""
    pool = built.block_pool
    null_id = pool.null_block.block_id
    holders: dict[int, set[str]] = {}
    null_holds: Counter[str] = Counter()
    duplicates: list[tuple[str, int]] = []
    for group, manager in enumerate(built.single_type_managers):
        for request_id, blocks in manager.req_to_blocks.items():
            ids = [b.block_id for b in blocks]
            seen: set[int] = set()
            for block_id in ids:
                if block_id == null_id:
                    # vLLM pads skipped positions with the null block (Mamba "align" mode); a null in
                    # the full-attention group is a real block that was never given.
                    if group == 0:
                        holders.setdefault(null_id, set()).add(request_id)
                    null_holds[request_id] += 1
                    continue
                if block_id in seen:
                    duplicates.append((request_id, block_id))
                seen.add(block_id)
                holders.setdefault(block_id, set()).add(request_id)
    return EngineView(
        holders={b: frozenset(h) for b, h in holders.items()},
        ref_cnt={b.block_id: b.ref_cnt for b in pool.blocks},
        free_queue=tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
        hashed={b.block_id: b.block_hash for b in pool.blocks},
        null_block=null_id,
        null_holds=dict(null_holds),
        duplicates=tuple(duplicates),
    )


class WatchedHybrid:
    """vLLM's hybrid ``KVCacheManager`` with every call mirrored into a shared-ownership ledger.

    Invariant: after every forwarded call the ledger's holder sets equal vLLM's block lists and the
    shared-ownership identities hold (registry area ``shared``); otherwise the call raises
    ``SharedOwnershipViolation`` with the block, its holders and its last moves.
    """

    def __init__(self, built: BuiltHybrid) -> None:
        self.built = built
        self.manager = built.manager
        self.ledger = SharedLedger(f"vllm-{built.modules.version}", len(built.block_pool.blocks))
        self.hits: dict[str, set[int]] = {}
        self.requests: dict[str, Any] = {}
        self.moves: list[Move] = []
        self.calls = 0
        self._observe("build")

    def _observe(self, op: str, released: tuple[str, ...] = ()) -> None:
        self.calls += 1
        self.moves += self.ledger.observe(op, read_view(self.built), self.hits, released)

    def get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        """Forward; the hit's blocks become the ones ``request`` may share. Post: pool unchanged."""
        blocks, n_hit, _ = self.manager.get_computed_blocks(request)
        self.requests[request.request_id] = request
        hit = {b.block_id for group in blocks.blocks for b in group}
        self.hits[request.request_id] = self.hits.get(request.request_id, set()) | hit
        self._observe(f"get_computed_blocks({request.request_id})")
        return blocks, n_hit

    def allocate_slots(
        self, request: Any, num_new_tokens: int, num_computed: int = 0, hit: Any = None
    ) -> Any:
        """Forward ``allocate_slots``; None (pool exhausted) must leave the pool as it was."""
        self.requests[request.request_id] = request
        out = self.manager.allocate_slots(request, num_new_tokens, num_computed, hit)
        self._observe(f"allocate_slots({request.request_id}, {num_new_tokens})")
        return out

    def free(self, request: Any) -> None:
        """Forward ``free``. Post: the request holds no block; its hit allowance is dropped."""
        if request.request_id not in self.requests:
            raise UnknownRequest(f"free of unknown request {request.request_id!r}")
        self.manager.free(request)
        self.hits.pop(request.request_id, None)
        self._observe(f"free({request.request_id})", (request.request_id,))

    def new_step(self) -> None:
        """Forward ``new_step_starts`` (the scheduler calls it once per step): blocks the Mamba manager
        cached during the step become hittable only after it."""
        self.manager.new_step_starts()
        self._observe("new_step_starts")

    def reset_prefix_cache(self) -> bool:
        """Forward; a reset only evicts unheld hashed blocks."""
        done = bool(self.manager.reset_prefix_cache())
        self._observe("reset_prefix_cache")
        return done

    def num_free_blocks(self) -> int:
        return int(self.built.block_pool.get_num_free_blocks())
