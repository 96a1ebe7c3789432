"""SGLang's paged KV path as its scheduler drives it: unaligned prompts, decode across page boundaries,
partial last pages, free groups.

The cache machine (:mod:`.drive`) allocates and frees whole pages only, so a bug on the partial last page
of a request (SGLang's paged ``free`` dropping it, a release path that forgets the unaligned tail) is
never reached there (issue 37). :class:`SGLangPagedRequestMachine` plays a request's life the way
SGLang's scheduler does with a ``PagedTokenToKVPoolAllocator`` (page 2, 4 or 16) and a ``RadixCache``:

* admit: ``match_prefix`` on the prompt less its last token (the scheduler always computes one), the lock,
  ``alloc_extend`` for the rest of the prompt from the matched (page-aligned) prefix: the last page is
  partial whenever the prompt's length is not a page multiple; the shortfall evicted first;
* decode: ``alloc_decode`` for one token, continuing the partial page or opening a new one;
* finish: ``insert`` of the page-aligned part (``RadixCache`` leaves the duplicates to its caller, who
  frees them), the unaligned tail freed (the partial page), the unlock; some finishes inside a
  ``free_group_begin`` / ``free_group_end`` pair, as SGLang's batch release does;
* abort: the request's own ids freed, the unlock; explicit evictions and matches in between.

The oracle is the attach (:func:`.attach.watch` with an audit after every tree call): every id move is
mirrored and checked, each request is retired when it leaves (it must hold nothing: I-OWNER-RELEASE), a
free that SGLang's free list does not take in full is named at the call (I-COUNT), and a passing run ends
with everything free or cached (I-IDLE-IDENTITY). No model: the paged extend and decode are SGLang's own
arithmetic, which the ledger checks move by move.

    python -m kvledger.engines.sglang.drive_pages [EXAMPLES] [STEPS]   # one JSON line: found or null
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import Watch, watch
from kvledger.engines.sglang.drive import matched_ids, matched_len, receipt
from kvledger.engines.sglang.hunting import hunt_machine
from kvledger.engines.sglang.loader import load

PAGE_SIZES = (2, 4, 16)
TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=40)  # a small alphabet: prefixes are shared
picks = st.integers(0, 63)


@dataclass
class PagedRequest:
    rid: str
    tokens: list[int]
    kv: torch.Tensor  # the KV index of every token so far: the matched prefix, then its own
    matched: int  # the page-aligned prefix the tree gave it (locked)
    node: Any
    lock: Any


def _lens(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.tensor([n], dtype=torch.int64)
    return t, t.clone()


class SGLangPagedRequestMachine(RuleBasedStateMachine):
    """Requests with unaligned lengths through SGLang's paged allocator and ``RadixCache``, watched."""

    def __init__(self) -> None:
        super().__init__()
        self.w: Watch | None = None

    @initialize(page=st.sampled_from(PAGE_SIZES), pool_pages=st.integers(3, 12))
    def setup(self, page: int, pool_pages: int) -> None:
        self.sgl = load()
        self.ps = page
        self.alloc = build.token_allocator(pool_pages * page, page)
        self.tree = build.radix_cache(self.alloc, build.req_pool(4))
        self.w = watch(allocator=self.alloc, tree=self.tree, audit_each=True)
        self.live: list[PagedRequest] = []
        self.n = 0

    # ------------------------------------------------------------------ helpers
    def _room(self, tokens: int) -> bool:
        """Evict until ``tokens`` more fit (plus one page an extend may open); whether they do."""
        need = tokens + self.ps - self.alloc.available_size()
        if need > 0:
            self.tree.evict(self.sgl.EvictParams(num_tokens=need))
        return self.alloc.available_size() >= tokens + self.ps

    def _release(self, r: PagedRequest, *, cache: bool) -> None:
        """``cache_finished_req`` (``cache``) or an abort, inside ``holder(r.rid)``; then the unlock."""
        own = r.kv[r.matched :]
        if cache:
            aligned = len(r.tokens) - len(r.tokens) % self.ps
            params = self.sgl.InsertParams(
                key=build.radix_key(r.tokens[:aligned]), value=r.kv[:aligned], prev_prefix_len=r.matched
            )
            prefix = self.tree.insert(params).prefix_len
            dups = r.kv[r.matched : max(r.matched, prefix)]
            if dups.numel():
                self.alloc.free(dups)  # RadixCache leaves the duplicates to its caller
            own = r.kv[aligned:]  # the unaligned tail: the partial last page
        if own.numel():
            self.alloc.free(own)
        self.tree.dec_lock_ref(r.node, receipt(r.lock))

    def _leave(self, r: PagedRequest, *, cache: bool, grouped: bool = False) -> None:
        assert self.w is not None
        self.live.remove(r)
        with self.w.holder(r.rid):
            if grouped:
                self.alloc.free_group_begin()
            self._release(r, cache=cache)
            if grouped:
                self.alloc.free_group_end()
        self.w.retire(r.rid)  # it left the engine: it holds nothing (I-OWNER-RELEASE)

    # ------------------------------------------------------------------ rules
    @rule(tokens=TOKENS)
    def admit(self, tokens: list[int]) -> None:
        assert self.w is not None
        self.n += 1
        rid = f"r{self.n}"
        with self.w.holder(rid):
            m = self.tree.match_prefix(self.sgl.MatchPrefixParams(key=build.radix_key(tokens[:-1])))
            matched = matched_len(m)
            node = m.last_device_node
            lock = self.tree.inc_lock_ref(node)
            prefix = matched_ids(self.tree, m)
            extend = len(tokens) - matched
            out = None
            if self._room(extend):
                prefix_lens, prefix_cpu = _lens(matched)
                seq_lens, seq_cpu = _lens(len(tokens))
                last = torch.tensor([int(prefix[-1]) if matched else -1], dtype=torch.int64)
                out = self.alloc.alloc_extend(prefix_lens, prefix_cpu, seq_lens, seq_cpu, last, extend)
            if out is None:
                self.tree.dec_lock_ref(node, receipt(lock))
        if out is None:
            self.w.retire(rid)
            return
        self.live.append(PagedRequest(rid, list(tokens), torch.cat((prefix, out)), matched, node, lock))

    @precondition(lambda self: bool(getattr(self, "live", ())))
    @rule(pick=picks, token=st.integers(1, 3))
    def decode(self, pick: int, token: int) -> None:
        assert self.w is not None
        r = self.live[pick % len(self.live)]
        with self.w.holder(r.rid):
            out = None
            if self._room(1):
                seq_lens, seq_cpu = _lens(len(r.tokens) + 1)
                out = self.alloc.alloc_decode(seq_lens, seq_cpu, r.kv[-1:].clone())
        if out is not None:
            r.tokens.append(token)
            r.kv = torch.cat((r.kv, out))

    @precondition(lambda self: bool(getattr(self, "live", ())))
    @rule(pick=picks, grouped=st.booleans())
    def finish(self, pick: int, grouped: bool) -> None:
        self._leave(self.live[pick % len(self.live)], cache=True, grouped=grouped)

    @precondition(lambda self: bool(getattr(self, "live", ())))
    @rule(pick=picks)
    def abort(self, pick: int) -> None:
        self._leave(self.live[pick % len(self.live)], cache=False)

    @precondition(lambda self: self.w is not None)
    @rule(n=st.integers(0, 48))
    def evict(self, n: int) -> None:
        self.tree.evict(self.sgl.EvictParams(num_tokens=n))

    @precondition(lambda self: self.w is not None)
    @rule(tokens=TOKENS)
    def match_only(self, tokens: list[int]) -> None:
        self.tree.match_prefix(self.sgl.MatchPrefixParams(key=build.radix_key(tokens)))

    def teardown(self) -> None:
        if self.w is None:
            return
        try:
            if sys.exc_info()[0] is None:  # the run passed (Hypothesis calls teardown in a finally)
                while self.live:
                    self._leave(self.live[0], cache=False)
                self.w.check_idle()  # everything came back: free or the tree's, no lock (I-IDLE-IDENTITY)
        finally:
            self.w.detach()


def hunt(examples: int, steps: int = 30) -> dict[str, Any]:
    """Run the machine; the first violation (shrunk) and the rule calls Hypothesis printed, or None."""
    return hunt_machine(SGLangPagedRequestMachine, examples, steps)


def main(argv: list[str] | None = None) -> int:
    import json

    args = sys.argv[1:] if argv is None else argv
    examples = int(args[0]) if args else 200
    steps = int(args[1]) if len(args) > 1 else 30
    result = hunt(examples, steps)
    print(json.dumps({"version": load().version, "examples": examples, "steps_per_example": steps, **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
