"""The scheduler's identities: busy after every step, idle at quiescence, and the ledger's cross-check.

Terms come from the implementation's own counters: allocator free lists, tree counters and each
request's bookkeeping (``memory.kv_held_units``), grouped by the request's account. When the pools carry
a real ledger the same terms are compared account by account with it, and on a mismatch every
request's bookkeeping is compared with what the ledger says it holds, so the report names the request
and the slots (with their history) rather than a count.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.identity import PoolTerms, check_busy_identity, check_idle_identity
from kvledger.contracts.owners import CACHE_EVICTABLE, CACHE_PROTECTED, FREE, PENDING_FREE
from kvledger.contracts.switch import ENABLED

if TYPE_CHECKING:  # pragma: no cover
    from kvledger.reference.scheduler.batch import ScheduleBatch
    from kvledger.reference.scheduler.request import Req
    from kvledger.reference.scheduler.scheduler import Scheduler


class Accounting:
    """Checks and the per-step snapshot the CLI plots."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self.enabled = ENABLED and scheduler.config.check_every_step
        self.checks_run = 0

    # ------------------------------------------------------------------ terms
    def pool_terms(self) -> list[PoolTerms]:
        s = self.s
        mem = s.memory
        live = s.live_requests()
        kv_held: Counter[str] = Counter()
        mamba_held: Counter[str] = Counter()
        rows_held: Counter[str] = Counter()
        for r in live:
            acct = r.owner.account.name
            kv_held[acct] += mem.kv_held_tokens(r)
            mamba_held[acct] += r.mamba_pool_idx is not None
            rows_held[acct] += r.req_pool_idx is not None
        tree = s.tree
        terms = [
            PoolTerms(
                "kv", "tokens", s.kv_allocator.size, s.kv_allocator.available_size(),
                evictable=0 if tree is None else tree.evictable_size(),
                protected=0 if tree is None else tree.protected_size(),
                pending=_pending_units(s.kv_allocator),
                held=dict(kv_held),
            ),
            PoolTerms("req", "rows", s.req_to_token_pool.size, s.req_to_token_pool.available_size(),
                      pending=_pending_units(s.req_to_token_pool), held=dict(rows_held)),
        ]
        if s.mamba_pool is not None:
            mamba_tree = tree is not None and hasattr(tree, "mamba_evictable_size")
            terms.append(PoolTerms(
                "mamba", "slots", s.mamba_pool.size, s.mamba_pool.available_size(),
                evictable=tree.mamba_evictable_size() if mamba_tree else 0,
                protected=tree.mamba_protected_size() if mamba_tree else 0,
                pending=_pending_units(s.mamba_pool),
                held=dict(mamba_held),
            ))
        return terms

    # ------------------------------------------------------------------ checks
    def after_step(self) -> None:
        if not self.enabled:
            return
        terms = self.pool_terms()
        for t in terms:
            check_busy_identity(t)
        self._cross_check_ledgers(terms)
        self.checks_run += 1
        self.s.stats.busy_checks += 1
        if self.s.is_quiescent():
            self.check_quiescent(terms)

    def check_quiescent(self, terms: list[PoolTerms] | None = None) -> None:
        """The strong identity and the full recounts; only meaningful at quiescence (I-QUIESCENT)."""
        if not self.s.is_quiescent():
            raise ContractViolation(f"check_quiescent outside quiescence: {self.s.describe_queues()}")
        for t in terms if terms is not None else self.pool_terms():
            check_idle_identity(t)
        for pool in self._pools():
            pool.audit()
        if self.s.tree is not None:
            self.s.tree.audit()
        self.s.stats.idle_checks += 1

    def check_not_in_flight(self, batch: ScheduleBatch) -> None:
        """I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT: nothing a launched batch references goes to another request."""
        if not self.enabled:
            return
        new_kv = set(batch.out_cache_loc.tolist())
        for b in self.s.inflight:
            if new_kv & b.ref_kv:
                raise ContractViolation(
                    f"{batch!r} was given KV slots {sorted(new_kv & b.ref_kv)[:8]} that in-flight {b!r} writes"
                )
            for r in batch.reqs:
                if r in b.reqs:
                    continue
                if r.req_pool_idx in b.ref_rows:
                    raise ContractViolation(f"{r.owner!r} got row {r.req_pool_idx} that in-flight {b!r} reads")
                if r.mamba_pool_idx is not None and int(r.mamba_pool_idx[0]) in b.ref_mamba:
                    raise ContractViolation(
                        f"{r.owner!r} got Mamba slot {int(r.mamba_pool_idx[0])} that in-flight {b!r} uses"
                    )

    def _pools(self) -> list[Any]:
        pools = [self.s.kv_allocator, self.s.req_to_token_pool]
        if self.s.mamba_pool is not None:
            pools.append(self.s.mamba_pool)
        return pools

    def _cross_check_ledgers(self, terms: list[PoolTerms]) -> None:
        by_name = {"kv": self.s.kv_allocator, "req": self.s.req_to_token_pool, "mamba": self.s.mamba_pool}
        for t in terms:
            pool = by_name[t.pool]
            ledger = pool.ledger
            if not ledger.enabled:
                continue
            unit = ledger.unit
            expected: dict[str, int] = {FREE.name: t.free, PENDING_FREE.name: t.pending,
                                        CACHE_EVICTABLE.name: t.evictable, CACHE_PROTECTED.name: t.protected}
            expected.update(t.held)
            actual = {name: n * unit for name, n in ledger.account_sizes().items()}
            keys = set(expected) | set(actual)
            diff = {k: (expected.get(k, 0), actual.get(k, 0)) for k in keys if expected.get(k, 0) != actual.get(k, 0)}
            if diff:
                raise ContractViolation(self._explain(t, pool, diff))

    def _explain(self, terms: PoolTerms, pool: Any, diff: dict[str, tuple[int, int]]) -> str:
        """Name the request(s) whose bookkeeping disagrees with what the ledger says they hold."""
        ledger = pool.ledger
        lines = [f"[{terms.pool}] counters and ledger disagree (counted, ledger): {diff}", terms.table()]
        mem = self.s.memory
        for r in self.s.requests.values():
            held = ledger.holdings(r.owner)
            expected = _expected_units(terms.pool, r, mem)
            if len(held) != expected:
                lines.append(f"  {r!r}: bookkeeping says {expected} id(s), ledger says {len(held)}")
                lines.append(ledger.describe(sorted(held)[:4], f"ids held by {r.owner!r}"))
        return "\n".join(lines)

    # ------------------------------------------------------------------ reporting
    def snapshot(self) -> dict[str, dict[str, int]]:
        """Per pool, the identity's terms (in the pool's unit) — what the timeline plot stacks."""
        out: dict[str, dict[str, int]] = {}
        for t in self.pool_terms():
            row = {"size": t.size, "free": t.free + t.pending, "cache.evictable": t.evictable,
                   "cache.protected": t.protected}
            row.update(t.held)
            out[t.pool] = row
        return out


def _pending_units(pool: Any) -> int:
    ids = getattr(pool, "_ids", None) or getattr(pool, "_pages", None) or getattr(pool, "_slots", None) \
        or getattr(pool, "_rows", None)
    if ids is None:
        return 0
    return ids.pending_count() * getattr(ids.ledger, "unit", 1)


def _expected_units(pool: str, r: Req, mem: Any) -> int:
    if pool == "kv":
        return mem.kv_held_units(r)
    if pool == "mamba":
        return int(r.mamba_pool_idx is not None)
    return int(r.req_pool_idx is not None)
