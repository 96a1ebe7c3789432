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
                "kv",
                "tokens",
                s.kv_allocator.size,
                s.kv_allocator.available_size(),
                evictable=0 if tree is None else tree.evictable_size(),
                protected=0 if tree is None else tree.protected_size(),
                pending=s.kv_allocator.pending_free_size(),
                held=dict(kv_held),
            ),
            PoolTerms(
                "req",
                "rows",
                s.req_to_token_pool.size,
                s.req_to_token_pool.available_size(),
                pending=s.req_to_token_pool.pending_free_size(),
                held=dict(rows_held),
            ),
        ]
        if s.mamba_pool is not None:
            mamba_tree = tree is not None and hasattr(tree, "mamba_evictable_size")
            terms.append(
                PoolTerms(
                    "mamba",
                    "slots",
                    s.mamba_pool.size,
                    s.mamba_pool.available_size(),
                    evictable=tree.mamba_evictable_size() if mamba_tree else 0,
                    protected=tree.mamba_protected_size() if mamba_tree else 0,
                    pending=s.mamba_pool.pending_free_size(),
                    held=dict(mamba_held),
                )
            )
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
            raise ContractViolation(f"I-QUIESCENT: check_quiescent outside quiescence: {self.s.describe_queues()}")
        for t in terms if terms is not None else self.pool_terms():
            check_idle_identity(t)
        for pool in self._pools():
            pool.audit()
        if self.s.tree is not None:
            self.s.tree.audit()
        self.s.stats.idle_checks += 1

    def check_not_in_flight(self, batch: ScheduleBatch) -> None:
        """I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT: what a launched batch references is not handed to another request.

        Rows are written by the host while the batch's forward reads them (B8), and a request's Mamba
        working slot is advanced by that forward, so neither may change hands until the results are
        processed. A KV slot freed meanwhile (a duplicate the tree already holds) may be reused: every
        write to it by a later batch is ordered after the in-flight batch on the device stream.
        """
        if not self.enabled:
            return
        for b in self.s.inflight:
            for r in batch.reqs:
                if r in b.reqs:
                    continue
                if r.req_pool_idx in b.ref_rows:
                    raise ContractViolation(
                        f"I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT: {r.owner!r} got row {r.req_pool_idx}"
                        f" that in-flight {b!r} reads"
                    )
                if r.mamba_pool_idx is not None and int(r.mamba_pool_idx[0]) in b.ref_mamba:
                    raise ContractViolation(
                        f"I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT: {r.owner!r} got Mamba slot"
                        f" {int(r.mamba_pool_idx[0])} that in-flight {b!r} advances"
                    )

    def _pools(self) -> list[Any]:
        pools = [self.s.kv_allocator, self.s.req_to_token_pool]
        if self.s.mamba_pool is not None:
            pools.append(self.s.mamba_pool)
        return pools

    def _cross_check_ledgers(self, terms: list[PoolTerms]) -> None:
        """I-LEDGER-AGREES: every identity term equals the ledger account of the same name."""
        by_name = {"kv": self.s.kv_allocator, "req": self.s.req_to_token_pool, "mamba": self.s.mamba_pool}
        for t in terms:
            pool = by_name[t.pool]
            ledger = pool.ledger
            if not ledger.enabled:
                continue
            unit = ledger.unit
            expected: dict[str, int] = {
                FREE.name: t.free,
                PENDING_FREE.name: t.pending,
                CACHE_EVICTABLE.name: t.evictable,
                CACHE_PROTECTED.name: t.protected,
            }
            expected.update(t.held)
            actual = {name: n * unit for name, n in ledger.account_sizes().items()}
            keys = set(expected) | set(actual)
            diff = {
                k: (expected.get(k, 0), actual.get(k, 0))
                for k in keys
                if expected.get(k, 0) != actual.get(k, 0)
            }
            if diff:
                raise ContractViolation(self._explain(t, pool, diff))

    def _explain(self, terms: PoolTerms, pool: Any, diff: dict[str, tuple[int, int]]) -> str:
        """Name the request(s) whose bookkeeping disagrees with the ledger, and the ids in question."""
        ledger = pool.ledger
        lines = [
            f"I-LEDGER-AGREES: [{terms.pool}] counters and ledger disagree (counted, ledger): {diff}",
            terms.table(),
        ]
        for r in self.s.requests.values():
            held = set(ledger.holdings(r.owner))
            expected = self._expected_ids(terms.pool, r)
            if held != expected:
                lines.append(
                    f"  {r!r}: bookkeeping says it holds {sorted(expected)[:8]}, ledger says {sorted(held)[:8]}"
                )
                lines.append(ledger.describe(sorted(held ^ expected)[:4], f"ids in dispute for {r.owner!r}"))
        return "\n".join(lines)

    def _expected_ids(self, pool: str, r: Req) -> set[int]:
        """The ids a request holds according to its own bookkeeping (row contents for KV)."""
        if pool == "mamba":
            return set() if r.mamba_pool_idx is None else {int(r.mamba_pool_idx[0])}
        if pool == "req":
            return set() if r.req_pool_idx is None else {r.req_pool_idx}
        if r.req_pool_idx is None or r.kv_allocated_len <= r.cache_protected_len:
            return set()
        slots = self.s.req_to_token_pool.read(r.req_pool_idx, r.cache_protected_len, r.kv_allocated_len)
        page = self.s.config.page_size
        return {s // page for s in slots.tolist()}

    # ------------------------------------------------------------------ reporting
    def snapshot(self) -> dict[str, dict[str, int]]:
        """Per pool, the identity's terms (in the pool's unit) — what the timeline plot stacks."""
        out: dict[str, dict[str, int]] = {}
        for t in self.pool_terms():
            row = {
                "size": t.size,
                "free": t.free + t.pending,
                "cache.evictable": t.evictable,
                "cache.protected": t.protected,
            }
            row.update(t.held)
            out[t.pool] = row
        return out
