"""The scheduler's identities: busy after every step, idle at quiescence, and the ledger's cross-check.

Terms come from the implementation's own counters: allocator free lists, tree counters and each
request's bookkeeping (``memory.kv_held_tokens``), grouped by the request's account. When the pools carry
a real ledger the same terms are compared account by account with it, and on a mismatch every
request's bookkeeping is compared with what the ledger says it holds, so the report names the request
and the slots (with their history) rather than a count.

Incremental (issue 12): after a step only the requests whose bookkeeping changed are recounted. Every
write of a field the identity reads (``Req._TRACKED``) and every account change of a request's owner
marks the request (contracts on); :meth:`Accounting.after_step` recomputes those requests' terms from
their fields, so the per-request sums stay a recount of the bookkeeping, independent of the ledger
they are checked against. The full recount (:meth:`Accounting.pool_terms`, every live request) runs at
quiescence, where it must equal the incremental sums, and after every step when
``recount_every_step`` is set (``KVLEDGER_RECOUNT_EVERY_STEP=1``; the ``deep`` test profile sets it).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvledger.contracts.diagnosis import diagnose
from kvledger.contracts.errors import ContractViolation, IdentityFailure
from kvledger.contracts.identity import PoolTerms, check_busy_identity, check_idle_identity
from kvledger.contracts.owners import (
    CACHE_EVICTABLE,
    CACHE_PROTECTED,
    FREE,
    PENDING_FREE,
    Owner,
)
from kvledger.contracts.switch import ENABLED
from kvledger.reference.scheduler import census
from kvledger.reference.scheduler.request import ReqState, ladder_holds, track_point_holds

if TYPE_CHECKING:  # pragma: no cover
    from kvledger.reference.scheduler.batch import ScheduleBatch
    from kvledger.reference.scheduler.request import Req
    from kvledger.reference.scheduler.state import SchedulerState

RECOUNT_ENV_VAR = "KVLEDGER_RECOUNT_EVERY_STEP"


def _recount_setting() -> bool:
    return os.environ.get(RECOUNT_ENV_VAR, "0").strip().lower() in ("1", "true", "on", "yes")


UNITS = {"kv": "tokens", "req": "rows", "mamba": "slots", "metadata": "slots"}
"""What each pool's identity terms count."""

_DONE = frozenset(s for s in ReqState if s.is_done)

_Parts = tuple[str, int, int, int]  # account, KV tokens, Mamba slots, rows held by one request


class Accounting:
    """Checks and the per-step snapshot the CLI plots."""

    recount_every_step: bool = _recount_setting()
    """Also run the full recount after every step and compare (slow; the ``deep`` profile's setting)."""

    def __init__(self, scheduler: SchedulerState) -> None:
        self.s = scheduler
        self.enabled = ENABLED and scheduler.config.check_every_step
        # Contracts off: the count identities alone, still after every step (issue 10), so a leak is
        # reported by every build; ``check_every_step=False`` turns them off too (the benchmark's baseline).
        self.counting = not ENABLED and scheduler.config.check_every_step
        self.checks_run = 0
        # Per tracked request, the terms it contributed at the last count, and their sums per pool.
        self._parts: dict[Req, _Parts] = {}
        self._sums: dict[str, Counter[str]] = {"kv": Counter(), "mamba": Counter(), "req": Counter()}
        # Changed since the last count (an ordered set); their ladders are verified when counted, so a
        # request outside it has a ladder that held when it last changed.
        self._dirty: dict[Req, None] = {}
        self._by_owner: dict[Owner, Req] = {}
        # The terms of the last after-step check, reused by the timeline snapshot taken right after it;
        # any tracked change in between drops them.
        self._last_terms: tuple[int, list[PoolTerms]] | None = None
        # The pools' ledgers, and their counters read directly (``counters``: the identity checks them).
        self._ledgers: dict[str, Any] = {
            "kv": scheduler.kv_allocator.ledger,
            "req": scheduler.req_to_token_pool.ledger,
        }
        if scheduler.mamba_pool is not None:
            self._ledgers["mamba"] = scheduler.mamba_pool.ledger
        self._sizes = {
            "kv": scheduler.kv_allocator.size,
            "req": scheduler.req_to_token_pool.size,
            "mamba": 0 if scheduler.mamba_pool is None else scheduler.mamba_pool.size,
        }

    # ------------------------------------------------------------------ tracking
    def track(self, req: Req) -> None:
        """Follow ``req`` from its arrival until it is released (contracts on)."""
        if not ENABLED:
            return
        req.watch = self
        req.owner.watcher = self._owner_changed
        self._by_owner[req.owner] = req
        self._dirty[req] = None

    def touch(self, req: Req) -> None:
        """``req`` changed a tracked field (called by ``Req.__setattr__``)."""
        self._dirty[req] = None
        self._last_terms = None

    def _owner_changed(self, owner: Owner) -> None:
        req = self._by_owner.get(owner)
        if req is not None:
            self._dirty[req] = None
            self._last_terms = None

    def released(self, req: Req) -> None:
        """``req`` gave everything back: recount it once more, then forget it."""
        if req.watch is self:
            self._dirty[req] = None

    def tracked_requests(self) -> int:
        """Requests the accounting still follows (what a long run must keep bounded)."""
        return len(self._by_owner)

    def _untrack(self, req: Req) -> None:
        req.watch = None
        req.owner.watcher = None
        self._by_owner.pop(req.owner, None)

    def _parts_of(self, req: Req) -> _Parts:
        return (
            req.owner.account.name,
            self.s.memory.kv_held_tokens(req),
            len(req.mamba_slots()),
            int(req.req_pool_idx is not None),
        )

    def _count_changed(self) -> None:
        """Recount the requests marked since the last count: O(changed)."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, {}
        kv, mamba, rows = self._sums["kv"], self._sums["mamba"], self._sums["req"]
        ps, ctx = self.s.config.page_size, self.s.config.max_context_len
        tracking = self.s.memory.tracking
        for req in dirty:
            if not ladder_holds(req, ps, ctx):
                self._dirty.update(dirty)  # keep them for the report and the next check
                raise ContractViolation(f"I-REQ-LADDER for every live request: {req!r}")
            if tracking is not None and not req.released:
                try:  # Mamba V2: I-REQ-MAMBA and I-STATE-BOUND on what changed
                    tracking.check_requests((req,))
                except ContractViolation:
                    self._dirty.update(dirty)
                    raise
            old = self._parts.pop(req, None)
            if old is not None:
                kv[old[0]] -= old[1]
                mamba[old[0]] -= old[2]
                rows[old[0]] -= old[3]
            new = self._parts_of(req)
            if new[1] or new[2] or new[3]:
                self._parts[req] = new
                kv[new[0]] += new[1]
                mamba[new[0]] += new[2]
                rows[new[0]] += new[3]
            elif req.released:
                self._untrack(req)

    def tracks_hold(self) -> bool:
        """I-TRACK-POINT for every request whose tracked fields changed since the last count (every live
        request under ``recount_every_step`` or with contracts off)."""
        s = self.s
        ps = s.config.page_size
        reqs = s.live_requests() if self.recount_every_step or not ENABLED else list(self._dirty)
        return all(track_point_holds(r, ps) for r in reqs)

    def ladders_hold(self) -> bool:
        """I-REQ-LADDER for every request whose ladder fields changed since the last count (the count
        verifies them too); for every live request under ``recount_every_step``."""
        s = self.s
        ps, ctx = s.config.page_size, s.config.max_context_len
        if self.recount_every_step or not ENABLED:
            return all(ladder_holds(r, ps, ctx) for r in s.live_requests())
        for r in self._dirty:
            if not ladder_holds(r, ps, ctx):
                return False
        if not self.enabled:  # nothing else consumes the marks: forget the verified ones
            self._dirty.clear()
        return True

    # ------------------------------------------------------------------ terms
    def _request_held_recount(self) -> dict[str, dict[str, int]]:
        """Per pool and account, what live requests hold by their bookkeeping: O(live).

        The release build's count identities run this after every step, so the loop is lean: most live
        requests wait and hold nothing (two attribute reads each); only holders are looked at further.
        """
        kv_held = self.s.memory.kv_held_tokens
        kv: dict[str, int] = {}
        mamba: dict[str, int] = {}
        rows: dict[str, int] = {}
        parked = self.s.parked_accounts
        for r in self.s.queued_requests():
            row = r.req_pool_idx
            slot = r.mamba_pool_idx
            track = r.mamba_ping_pong_track_buffer  # Mamba V2's tracking slots (None otherwise)
            if row is None and slot is None and track is None:
                continue
            owner = r.owner
            account = owner.account
            if r.state in _DONE and account not in parked:
                continue  # ended, not parked (a launched batch, a PD lease): not live (Scheduler.live_requests)
            acct = account.name
            if slot is not None or track is not None:
                n = (slot is not None) + (0 if track is None else len(track))  # == len(r.mamba_slots())
                mamba[acct] = mamba.get(acct, 0) + n
            if row is not None:
                rows[acct] = rows.get(acct, 0) + 1
                kv[acct] = kv.get(acct, 0) + kv_held(r)
        return {"kv": kv, "mamba": mamba, "req": rows}

    def _request_held(self) -> Mapping[str, Mapping[str, int]]:
        """The same sums, kept incrementally (contracts on) or recounted (contracts off)."""
        if not ENABLED:
            return self._request_held_recount()
        self._count_changed()
        return self._sums

    def pool_terms(self) -> list[PoolTerms]:
        """The identity's terms with a full recount of the requests (quiescence, tests, reports)."""
        return self._build_terms(self._request_held_recount())

    def terms(self) -> list[PoolTerms]:
        """The identity's terms as of now: incremental with contracts on."""
        return self._build_terms(self._request_held())

    def _build_terms(self, held: Mapping[str, Mapping[str, int]]) -> list[PoolTerms]:
        c = self.s.memory.counters
        evictable, protected, m_evictable, m_protected = c.tree_counters()

        def nonzero(c: Mapping[str, int]) -> dict[str, int]:
            return {k: v for k, v in c.items() if v}

        terms = [
            PoolTerms(
                "kv",
                UNITS["kv"],
                self._sizes["kv"],
                c.kv_available(),
                evictable=evictable,
                protected=protected,
                pending=c.kv_pending(),
                held=nonzero(held["kv"]),
            ),
            PoolTerms(
                "req",
                UNITS["req"],
                self._sizes["req"],
                c.rows_available(),
                pending=c.rows_pending(),
                held=nonzero(held["req"]),
            ),
        ]
        if "mamba" in self._ledgers:
            terms.append(
                PoolTerms(
                    "mamba",
                    UNITS["mamba"],
                    self._sizes["mamba"],
                    c.mamba_available(),
                    evictable=m_evictable,
                    protected=m_protected,
                    pending=c.mamba_pending(),
                    held=nonzero(held["mamba"]),
                )
            )
        return terms

    # ------------------------------------------------------------------ checks
    def after_step(self) -> None:
        if not self.enabled:
            if self.counting:
                self._count_identities()
            return
        terms = self.terms()
        self._last_terms = (self.s.step_no, terms)
        for t in terms:
            check_busy_identity(t, self.culprits)
        self._cross_check_ledgers(terms)
        if self.recount_every_step:
            self._check_incremental(terms, self.pool_terms())
            if self.s.memory.tracking is not None:  # Mamba V2: every live request, not only the changed
                self.s.memory.tracking.check_requests(self.s.live_requests())
        self.checks_run += 1
        self.s.stats.busy_checks += 1
        if self.s.is_quiescent():
            self.check_quiescent(terms)

    def _count_identities(self) -> None:
        """Contracts off: I-COUNT and I-CAP per pool after every step, I-IDLE-IDENTITY at quiescence.

        O(1) per term from the counters plus one pass over the live requests' bookkeeping (the terms a
        simulate run computes for its timeline anyway: the snapshot reuses them). A failure is an
        :class:`IdentityFailure` naming the ids nobody's bookkeeping holds (no ledger, so no owner).
        """
        s = self.s
        terms = self.terms()
        self._last_terms = (s.step_no, terms)
        try:
            for t in terms:
                check_busy_identity(t, self.culprits)
            if s.is_quiescent():
                for t in terms:
                    check_idle_identity(t, self.culprits)
        except IdentityFailure:
            raise
        except ContractViolation as exc:
            raise IdentityFailure(f"{exc}\n(found by the count identities of a build with contracts off)") from None
        s.stats.count_checks += 1

    def culprits(self, pool: str) -> str:
        """The ids of ``pool`` in dispute between the bookkeeping and the ledger, with their owners, the
        holders the bookkeeping names, their last moves and the requests involved (only on a failure)."""
        s = self.s
        obj = self.pools_by_name()[pool]
        return diagnose(
            census.census(s, pool, obj, lambda r: self._expected_ids(pool, r)),
            obj.ledger.domain,
            obj.ledger,
            describe_owner=lambda owner: census.describe_owner(s, owner),
        )

    def check_quiescent(self, terms: list[PoolTerms] | None = None) -> None:
        """The strong identity and the full recounts; only meaningful at quiescence (I-QUIESCENT)."""
        if not self.s.is_quiescent():
            raise ContractViolation(f"I-QUIESCENT: check_quiescent outside quiescence: {self.s.describe_queues()}")
        recount = self.pool_terms()
        if ENABLED:
            self._check_incremental(terms if terms is not None else self.terms(), recount)
        for t in recount:
            check_idle_identity(t, self.culprits)
        for pool in self._pools():
            pool.audit()
        if self.s.tree is not None:
            self.s.tree.audit()
        self.s.stats.idle_checks += 1

    def _check_incremental(self, incremental: list[PoolTerms], recount: list[PoolTerms]) -> None:
        """The incremental sums must equal a full recount of the requests' bookkeeping."""
        for inc, full in zip(incremental, recount, strict=True):
            if inc != full:
                raise ContractViolation(
                    f"[{inc.pool}] I-COUNT: the incremental identity drifted from the recount (a write that"
                    f" bypassed tracking?):\n  incremental {inc.table()}\n  recount     {full.table()}"
                )

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
                shared = set(r.mamba_slots()) & b.ref_mamba
                if shared:
                    raise ContractViolation(
                        f"I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT: {r.owner!r} got Mamba slot(s) {sorted(shared)}"
                        f" that in-flight {b!r} advances or captures into"
                    )

    def _pools(self) -> list[Any]:
        return list(self.pools_by_name().values())

    def pools_by_name(self) -> dict[str, Any]:
        """The pools the identity covers, keyed by the ``PoolTerms.pool`` name of their terms."""
        pools = {"kv": self.s.kv_allocator, "req": self.s.req_to_token_pool}
        if self.s.mamba_pool is not None:
            pools["mamba"] = self.s.mamba_pool
        return pools

    def _cross_check_ledgers(self, terms: list[PoolTerms]) -> None:
        """I-LEDGER-AGREES: every identity term equals the ledger account of the same name."""
        for t in terms:
            ledger = self._ledgers[t.pool]
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
            if actual == {k: v for k, v in expected.items() if v}:
                continue
            keys = set(expected) | set(actual)
            diff = {
                k: (expected.get(k, 0), actual.get(k, 0))
                for k in keys
                if expected.get(k, 0) != actual.get(k, 0)
            }
            if diff:
                raise ContractViolation(self._explain(t, ledger, diff))

    def _explain(self, terms: PoolTerms, ledger: Any, diff: dict[str, tuple[int, int]]) -> str:
        """Name the request(s) whose bookkeeping disagrees with the ledger, and the ids in question."""
        return "\n".join(
            [
                f"I-LEDGER-AGREES: [{terms.pool}] counters and ledger disagree (counted, ledger): {diff}",
                terms.table(),
                self.culprits(terms.pool),
            ]
        )

    # ------------------------------------------------------------------ reporting
    def free_terms(self) -> dict[str, tuple[int, int]]:
        """Per pool, (size, free + pending) from the counters: O(1), for a per-step peak-use figure."""
        c = self.s.memory.counters
        out = {
            "kv": (self._sizes["kv"], c.kv_available() + c.kv_pending()),
            "req": (self._sizes["req"], c.rows_available() + c.rows_pending()),
        }
        if "mamba" in self._ledgers:
            out["mamba"] = (self._sizes["mamba"], c.mamba_available() + c.mamba_pending())
        return out

    def _expected_ids(self, pool: str, r: Req) -> set[int]:
        """The ids of ``pool`` that ``r`` holds by its own bookkeeping (a subclass with more pools adds)."""
        return census.request_ids(self.s, pool, r)

    def units(self) -> dict[str, str]:
        """Per pool of this scheduler, what its terms count (the plot's axis labels)."""
        return {pool: UNITS[pool] for pool in self._ledgers}

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Per pool, the identity's terms (in the pool's unit) — what the timeline plot stacks."""
        out: dict[str, dict[str, int]] = {}
        last = self._last_terms
        terms = last[1] if last is not None and last[0] == self.s.step_no else self.terms()
        for t in terms:
            row = {
                "size": t.size,
                "free": t.free,
                PENDING_FREE.name: t.pending,
                "cache.evictable": t.evictable,
                "cache.protected": t.protected,
            }
            row.update(t.held)
            out[t.pool] = row
        return out
