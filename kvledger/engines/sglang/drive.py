"""The generic cache machine's request life cycle, run on SGLang's real radix caches with kvledger's as the model.

:class:`SGLangCacheMachine` draws the same rules and keys as the museum's cache machine
(:mod:`kvledger.museum.machines.cache_base`: ``key_draws``, ``picks``, its ``key`` construction, the
scheduler's life cycle match -> lock -> evict the shortfall -> alloc -> insert -> free the uncached tail
-> unlock, aborts, extra locks, explicit evictions) and plays each step twice: on SGLang's cache
(``RadixCache`` or ``UnifiedRadixCache`` with FULL, page 1 or 4), watched by :func:`.attach.watch` with
an audit after every tree call, and on kvledger's reference ``RadixCache``, which is the model. After
every step the two must agree on every result (matched length, insert prefix length, evicted tokens,
allocation outcome) and on the sizes (free, evictable, protected); the attached ledgers check every id
move of SGLang's side. A disagreement is an ``AssertionError`` starting ``divergence:``; a wrong move
is a ``ContractViolation`` naming its invariant.

SGLang's caller conventions are kept on its side: ``RadixCache.insert`` leaves the caller's duplicate
ids to the caller (SGLang's ``_insert_cache`` frees them), ``UnifiedRadixCache.insert`` frees the
duplicates above ``prev_prefix_len`` itself, and the Unified tree's unlock takes the receipt its lock
returned. The Mamba trees are not driven here (spec/sglang-attach.md says why).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, cast

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvledger.contracts.owners import REQ_RUNNING, Owner
from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import Watch, watch
from kvledger.engines.sglang.loader import load
from kvledger.museum.machines.cache_base import KeyDraw, RadixCacheMachine, key_draws, picks
from kvledger.museum.machines.cache_support import cut_for_finish, make_allocator
from kvledger.reference.radix import RadixCache as ReferenceRadixCache

KINDS = ("radix", "unified")


@dataclass
class Request:
    rid: int
    owner: Owner
    key: tuple[int, ...]
    protected: int
    node: Any  # SGLang's locked node (a TreeNode, or a node id for the Rust core)
    lock: Any  # SGLang's IncLockRefResult (its to_dec_params() is the unlock receipt)
    ref_lock: Any
    prefix: torch.Tensor  # SGLang's matched ids
    ref_prefix: torch.Tensor
    own: torch.Tensor
    ref_own: torch.Tensor


def matched_len(m: Any) -> int:
    """A match result's device prefix length (0.5.23: ``device_prefix_len``; earlier: its ids)."""
    n = getattr(m, "device_prefix_len", None)
    return int(n) if n is not None else int(m.device_indices.numel())


def matched_ids(tree: Any, m: Any) -> torch.Tensor:
    """The matched KV ids (0.5.23 returns the node and a ``path_device_indices`` walk; earlier the ids)."""
    ids = getattr(m, "device_indices", None)
    if ids is None:
        ids = tree.path_device_indices(m.last_device_node)
    return cast(torch.Tensor, ids).to(torch.int64)


def receipt(lock: Any) -> Any:
    """The unlock receipt of a lock result (``to_dec_params()``; releases before it: none)."""
    return lock.to_dec_params() if hasattr(lock, "to_dec_params") else None


def agree(what: str, sglang: Any, model: Any) -> None:
    if sglang != model:
        raise AssertionError(f"divergence: {what}: SGLang {sglang!r}, kvledger {model!r}")


class SGLangCacheMachine(RuleBasedStateMachine):
    """SGLang's radix cache (watched) against kvledger's, step by step."""

    KINDS: tuple[str, ...] = KINDS
    PAGE_SIZES: tuple[int, ...] = (1, 4)

    def __init__(self) -> None:
        super().__init__()
        self.tree: Any = None

    @initialize(kind=st.integers(0, 1), page=st.integers(0, 1), pool_pages=st.integers(4, 10))
    def setup(self, kind: int, page: int, pool_pages: int) -> None:
        self.sgl = load()
        self.kind = self.KINDS[kind % len(self.KINDS)]
        self.ps = self.PAGE_SIZES[page % len(self.PAGE_SIZES)]
        self.alloc = build.token_allocator(pool_pages * self.ps, self.ps)
        rows = build.req_pool(4)
        self.unified = self.kind == "unified"
        self.tree = (
            build.unified_radix_cache(self.alloc, rows)
            if self.unified
            else build.radix_cache(self.alloc, rows)
        )
        self.watch: Watch = watch(allocator=self.alloc, tree=self.tree, audit_each=True)
        self.ref_alloc = make_allocator(self.ps, pool_pages)
        self.ref = ReferenceRadixCache(self.ref_alloc)
        self.reqs: list[Request] = []
        self.extra: list[tuple[Any, Any, Any]] = []
        self.seen: list[tuple[int, ...]] = []
        self.next_rid = 0

    def key(self, draw: KeyDraw, *, min_pages: int = 0, tail: int = 0) -> tuple[int, ...]:
        """The museum machine's key construction (it reads only ``ps`` and ``seen``)."""
        return RadixCacheMachine.key(cast(Any, self), draw, min_pages=min_pages, tail=tail)

    # ------------------------------------------------------------------ both sides
    def match(self, key: tuple[int, ...]) -> tuple[Any, Any]:
        m = self.tree.match_prefix(self.sgl.MatchPrefixParams(key=build.radix_key(key)))
        r = self.ref.match_prefix(key)
        agree(f"match_prefix({list(key)}) length", matched_len(m), r.device_indices.numel())
        return m, r

    def evict(self, n: int) -> None:
        freed = self.tree.evict(self.sgl.EvictParams(num_tokens=n)).num_tokens_evicted
        agree(f"evict({n}) tokens freed", freed, self.ref.evict(n))

    def unlock(self, node: Any, lock: Any, ref_lock: Any) -> None:
        self.tree.dec_lock_ref(node, receipt(lock))
        self.ref.dec_lock_ref(ref_lock)

    def admit_one(self, draw: KeyDraw) -> Request | None:
        key = self.key(draw, min_pages=1)
        self.seen.append(key)
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        owner = Owner("req", rid, REQ_RUNNING)
        with self.watch.holder(rid):
            m, r = self.match(key)
            matched = matched_len(m)
            node = m.last_device_node
            lock = self.tree.inc_lock_ref(node)
            ref_lock = self.ref.inc_lock_ref(r.last_node)
            need = len(key) - matched
            short = need - self.alloc.available_size()
            agree(
                "free KV before the allocation", self.alloc.available_size(), self.ref_alloc.available_size()
            )
            if short > 0:
                self.evict(short)
            own = self.alloc.alloc(need)
            ref_own = self.ref_alloc.alloc(need, owner)
            agree(f"alloc({need}) succeeds", own is not None, ref_own is not None)
            if own is None:
                self.unlock(node, lock, ref_lock)
                return None
            prefix = matched_ids(self.tree, m)
        return Request(rid, owner, key, matched, node, lock, ref_lock, prefix, r.device_indices, own, ref_own)

    def finish_one(self, req: Request, cut: int) -> None:
        """cache_finished_req: insert ``key[:cut]``, free the uncached tail, release the lock."""
        with self.watch.holder(req.rid):
            value = torch.cat((req.prefix, req.own))[:cut]
            params = self.sgl.InsertParams(
                key=build.radix_key(req.key[:cut]), value=value, prev_prefix_len=req.protected
            )
            prefix = self.tree.insert(params).prefix_len
            dups = req.own[: max(0, prefix - req.protected)]
            if dups.numel() and not self.unified:
                self.alloc.free(dups)  # RadixCache leaves the duplicates to its caller
            tail = req.own[cut - req.protected :]
            if tail.numel():
                self.alloc.free(tail)
            ref_value = torch.cat((req.ref_prefix, req.ref_own))[:cut]
            ref_prefix = self.ref.insert(req.key[:cut], ref_value, req.owner, protected_len=req.protected)
            agree(f"insert({list(req.key[:cut])}) prefix_len", prefix, ref_prefix)
            ref_tail = req.ref_own[cut - req.protected :]
            if ref_tail.numel():
                self.ref_alloc.free(ref_tail, req.owner)
            self.unlock(req.node, req.lock, req.ref_lock)
        self.watch.retire(req.rid)  # it left the engine: it holds nothing (I-OWNER-RELEASE)

    def abort_one(self, req: Request) -> None:
        with self.watch.holder(req.rid):
            if req.own.numel():
                self.alloc.free(req.own)
                self.ref_alloc.free(req.ref_own, req.owner)
            self.unlock(req.node, req.lock, req.ref_lock)
        self.watch.retire(req.rid)

    # ------------------------------------------------------------------ rules
    @rule(key=key_draws)
    def serve(self, key: KeyDraw) -> None:
        req = self.admit_one(key)
        if req is not None:
            self.finish_one(req, len(req.key))

    @rule(key=key_draws)
    def admit(self, key: KeyDraw) -> None:
        req = self.admit_one(key)
        if req is not None:
            self.reqs.append(req)

    @precondition(lambda self: self.reqs)
    @rule(pick=picks, cut=picks)
    def finish(self, pick: int, cut: int) -> None:
        req = self.reqs.pop(pick % len(self.reqs))
        self.finish_one(req, cut_for_finish(req.protected, len(req.key), self.ps, cut))

    @precondition(lambda self: self.reqs)
    @rule(pick=picks)
    def abort(self, pick: int) -> None:
        self.abort_one(self.reqs.pop(pick % len(self.reqs)))

    @rule(key=key_draws, tail=st.integers(0, 15))
    def match_only(self, key: KeyDraw, tail: int) -> None:
        self.match(self.key(key, tail=tail))

    @rule(key=key_draws)
    def lock_extra(self, key: KeyDraw) -> None:
        m, r = self.match(self.key(key))
        node = m.last_device_node
        self.extra.append((node, self.tree.inc_lock_ref(node), self.ref.inc_lock_ref(r.last_node)))

    @precondition(lambda self: self.extra)
    @rule(pick=picks)
    def unlock_extra(self, pick: int) -> None:
        self.unlock(*self.extra.pop(pick % len(self.extra)))

    @rule(n=st.integers(0, 24))
    def evict_tokens(self, n: int) -> None:
        self.evict(n)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def sizes_agree(self) -> None:
        if self.tree is None:
            return
        agree("free KV tokens", self.alloc.available_size(), self.ref_alloc.available_size())
        agree("evictable tokens", self.tree.evictable_size(), self.ref.evictable_size())
        agree("protected tokens", self.tree.protected_size(), self.ref.protected_size())

    def teardown(self) -> None:
        if self.tree is None:
            return
        for req in self.reqs:
            self.abort_one(req)
        for node, lock, ref_lock in self.extra:
            self.unlock(node, lock, ref_lock)
        self.evict(self.ref.evictable_size())
        if sys.exc_info()[0] is None:  # the run passed (Hypothesis calls teardown in a finally)
            self.watch.check_idle()  # everything came back: free or the tree's, no lock (I-IDLE-IDENTITY)
        self.watch.audit()
        agree("everything free at the end", self.alloc.available_size(), self.alloc.size)
        self.watch.detach()


def machine(kind: str | None = None, page: int | None = None) -> type[SGLangCacheMachine]:
    """The machine restricted to one tree (``"radix"`` or ``"unified"``) and/or one page size (any
    positive size, 16 included), for long runs of one configuration."""

    class Machine(SGLangCacheMachine):
        KINDS = (kind,) if kind is not None else SGLangCacheMachine.KINDS
        PAGE_SIZES = (page,) if page is not None else SGLangCacheMachine.PAGE_SIZES

    return Machine


def main(argv: list[str] | None = None) -> int:
    """``python -m kvledger.engines.sglang.drive EXAMPLES STEPS [--kind=radix|unified] [--page=N]``: one
    JSON line, the first divergence or violation (shrunk) and its rule calls, or ``null``."""
    import io
    import json
    import sys
    from contextlib import redirect_stdout

    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    args = sys.argv[1:] if argv is None else argv
    opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
    rest = [a for a in args if not a.startswith("--")]
    kind = opts.get("kind")
    if kind is not None and kind not in KINDS:
        print(f"drive: --kind must be one of {KINDS}", file=sys.stderr)
        return 2
    page = int(opts["page"]) if "page" in opts else None
    examples = int(rest[0]) if rest else 200
    steps = int(rest[1]) if len(rest) > 1 else 40
    buf = io.StringIO()
    found: str | None = None
    calls: list[str] = []
    try:
        with redirect_stdout(buf):
            run_state_machine_as_test(
                machine(kind, page),
                settings=settings(
                    max_examples=examples, stateful_step_count=steps, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False,
                ),
            )  # fmt: skip
    except Exception as exc:
        text = buf.getvalue().splitlines() + list(getattr(exc, "__notes__", []))
        calls = [ln.strip() for ln in text if ln.strip().startswith("state.") and "teardown" not in ln]
        found = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    print(json.dumps({"version": load().version, "kind": kind, "page": page, "examples": examples,
                      "steps_per_example": steps, "found": found, "steps": calls}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
