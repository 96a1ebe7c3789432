"""SGLang 0.5.23's request path (the request's KV record ``req.kv``) driven under the attach.

From 0.5.14 on a ``Req`` keeps what it holds in ``req.kv`` (``ReqKvInfo``: the row ``req_pool_idx``,
``cache_protected_len`` (the tree's part of the row), ``kv_committed_len``, ``kv_allocated_len``), the row
pool hands out rows with ``alloc_rows`` / ``free_rows``, a running request publishes its KV with the
tree's ``checkpoint`` and leaves through ``release_kv_cache`` (``mem_cache.common``). The machine of
:mod:`.drive_requests` (0.5.11 to 0.5.13: ``cache_finished_req``, ``alloc(reqs)`` / ``free(req)`` on the
request's own fields) does not reach any of it. :class:`SGLangReqKvMachine` plays the scheduler's calls
on real ``Req`` objects over the installed release's ``ReqToTokenPool``, a token or paged KV allocator
(page 1, 2 or 4) and ``RadixCache``:

* admit: ``Req.init_next_round_input(tree)`` (SGLang's own match; it sets ``prefix_len`` and
  ``cache_protected_len``), ``tree.lock(req.last_node)`` (the prefill adder's lock), ``alloc([req])``
  (``alloc_rows``), the matched prefix written into the row (``prefix_device_indices``), KV for the
  first chunk (``alloc_extend`` from the matched prefix on a paged allocator: the last page partial
  whenever the chunk ends off a page boundary; ``alloc`` at page 1), the shortfall evicted first;
* a chunk boundary: ``checkpoint_kv_cache`` (the tree's ``checkpoint``: insert, the duplicates freed, the
  row repointed, the lock moved to the new node, ``cache_protected_len`` advanced); the next chunk:
  ``init_next_round_input()`` without a tree, KV from ``kv_allocated_len``;
* decode: one token (``alloc_decode`` on a paged allocator, continuing or opening a page);
* finish: ``FINISH_LENGTH`` set, ``release_kv_cache(req, tree, checkpoint=True)``, some inside a
  ``free_group_begin`` / ``free_group_end`` pair as the batch result processor does;
* retract: ``release_kv_cache(checkpoint=False)``, ``Req.reset_for_retract()``; the request waits and is
  admitted again (the same object); abort: ``release_kv_cache(checkpoint=False)``, the request leaves;
* explicit evictions and matches in between.

Prompts share prefixes (a three-token alphabet) and have any length, so matches, splits, duplicate frees
and partial pages all occur. The oracle is the attach (:func:`.attach.watch`, audit after every tree
call, each request tracked: its row must be its own, I-HANDLE-OWNED), each request retired when it
leaves (I-OWNER-RELEASE) and a passing run ends with :meth:`~.attach.Watch.check_idle`
(I-IDLE-IDENTITY). :data:`STATS` counts what the runs drove (call kinds, partial pages).

    python -m kvledger.engines.sglang.drive_req_kv [EXAMPLES] [STEPS]   # one JSON line: found or null
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import Watch, watch
from kvledger.engines.sglang.drive_requests import new_request
from kvledger.engines.sglang.hunting import driver_main, hunt_machine
from kvledger.engines.sglang.loader import load

PAGE_SIZES = (1, 2, 4)
TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=24)  # a small alphabet: prefixes are shared
CHUNKS = st.integers(1, 12)
picks = st.integers(0, 63)

STATS: Counter[str] = Counter()
"""What the machine drove in this process (call kinds, partial pages): the closing note's figures."""


def req_kv_path() -> Any:
    """SGLang's ``mem_cache.common`` (``release_kv_cache``, ``checkpoint_kv_cache``), or ``None`` on a
    release whose requests have no ``req.kv`` record (before 0.5.14)."""
    from sglang.srt.managers.schedule_batch import Req

    if not hasattr(Req, "detach_kv"):
        return None
    import sglang.srt.mem_cache.common as common

    return common


@dataclass(eq=False)  # one per request object: compared by identity
class Live:
    rid: str
    req: Any
    chunked: bool = False  # between chunks of its prompt
    waiting: bool = False  # retracted: waits for a new admission


class SGLangReqKvMachine(RuleBasedStateMachine):
    """0.5.23's ``Req`` life cycle (``req.kv``, ``checkpoint``, ``release_kv_cache``) on SGLang's own
    row pool, KV allocator and ``RadixCache``, watched."""

    def __init__(self) -> None:
        super().__init__()
        self.w: Watch | None = None

    @initialize(page=st.sampled_from(PAGE_SIZES), pool_pages=st.integers(4, 16), rows=st.integers(2, 5))
    def setup(self, page: int, pool_pages: int, rows: int) -> None:
        self.sgl = load()
        self.common = req_kv_path()
        if self.common is None:
            raise RuntimeError(f"SGLang {self.sgl.version}: requests have no req.kv record (0.5.14 on)")
        build.ensure_server_args(page, self.sgl)
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH

        self.finish_reason = FINISH_LENGTH
        self.ps = page
        self.alloc = build.token_allocator(pool_pages * page, page)
        self.rows = build.req_pool(rows + 1)  # row 0 is SGLang's padding row
        self.tree = build.radix_cache(self.alloc, self.rows)
        self.w = watch(allocator=self.alloc, req_pool=self.rows, tree=self.tree, audit_each=True)
        self.live: list[Live] = []
        self.n = 0

    # ------------------------------------------------------------------ helpers
    def _room(self, tokens: int) -> bool:
        """Evict until ``tokens`` more fit (plus one page an extend may open); whether they do."""
        need = tokens + self.ps - self.alloc.available_size()
        if need > 0:
            self.tree.evict(self.sgl.EvictParams(num_tokens=need))
            STATS["evict (shortfall)"] += 1
        return self.alloc.available_size() >= tokens + self.ps

    def _row(self, req: Any) -> torch.Tensor:
        return self.rows.req_to_token[req.kv.req_pool_idx]

    def _extend(self, req: Any, start: int, end: int) -> torch.Tensor | None:
        """KV for row positions ``[start, end)`` (SGLang's ``alloc_for_extend`` arithmetic, one request)."""
        n = end - start
        if self.ps == 1:
            STATS["alloc"] += 1
            return self.alloc.alloc(n)
        lens = (torch.tensor([start], dtype=torch.int64), torch.tensor([end], dtype=torch.int64))
        last = torch.tensor([int(self._row(req)[start - 1]) if start else -1], dtype=torch.int64)
        out = self.alloc.alloc_extend(lens[0], lens[0].clone(), lens[1], lens[1].clone(), last, n)
        STATS["alloc_extend"] += 1
        STATS["alloc_extend ending on a partial page"] += int(end % self.ps != 0)
        return out

    def _decode(self, req: Any, pos: int) -> torch.Tensor | None:
        if self.ps == 1:
            STATS["alloc (decode)"] += 1
            return self.alloc.alloc(1)
        seq = torch.tensor([pos + 1], dtype=torch.int64)
        last = self._row(req)[pos - 1 : pos].to(torch.int64)
        STATS["alloc_decode"] += 1
        STATS["alloc_decode opening a page"] += int(pos % self.ps == 0)
        return self.alloc.alloc_decode(seq, seq.clone(), last)

    def _commit(self, req: Any, start: int, kv: torch.Tensor) -> None:
        end = start + kv.numel()
        self.rows.write((req.kv.req_pool_idx, slice(start, end)), kv.to(torch.int32))
        req.kv.kv_committed_len = req.kv.kv_allocated_len = end

    def _release(self, lv: Live, *, checkpoint: bool) -> None:
        """SGLang's ``release_kv_cache`` for a request that holds a row, inside its holder block."""
        assert self.w is not None
        STATS["release_kv_cache (finish)" if checkpoint else "release_kv_cache (retract/abort)"] += 1
        STATS["released with a partial last page"] += int(lv.req.kv.kv_allocated_len % self.ps != 0)
        with self.w.holder(lv.rid):
            self.common.release_kv_cache(lv.req, self.tree, checkpoint=checkpoint)

    def _leave(self, lv: Live) -> None:
        assert self.w is not None
        self.live.remove(lv)
        self.w.untrack(lv.req)
        self.w.retire(lv.rid)  # it left the engine: it holds nothing (I-OWNER-RELEASE)

    # ------------------------------------------------------------------ rules
    @rule(tokens=TOKENS, chunk=CHUNKS)
    def admit(self, tokens: list[int], chunk: int) -> None:
        assert self.w is not None
        self.n += 1
        rid = f"r{self.n}"
        lv = Live(rid, new_request(rid, tuple(tokens)))
        self.w.track(lv.req, rid)
        self.live.append(lv)
        self._prefill(lv, chunk, first=True)

    def _prefill(self, lv: Live, chunk: int, *, first: bool) -> None:
        assert self.w is not None
        req = lv.req
        with self.w.holder(lv.rid):
            total = len(req.origin_input_ids) + len(req.output_ids)
            if first:
                if self.rows.available_size() == 0:
                    lv.waiting = True
                    return
                req.init_next_round_input(self.tree)  # SGLang's match: prefix_len, cache_protected_len
                req.lock = self.tree.lock(req.last_node)
                end = min(total, req.prefix_len + chunk)
                if not self._room(end - req.prefix_len):
                    # the adder budgets KV before it takes a row (a row never goes out without KV)
                    self.tree.unlock(req.lock)
                    req.lock, lv.waiting = None, True
                    STATS["admission refused (no room)"] += 1
                    return
                prefix = self.tree.prefix_device_indices(req) if req.prefix_len else None
                self.rows.alloc([req])
                STATS["alloc_rows"] += 1
                if prefix is not None:
                    self.rows.write((req.kv.req_pool_idx, slice(0, req.prefix_len)), prefix.to(torch.int32))
                req.kv.kv_committed_len = req.kv.kv_allocated_len = req.prefix_len
                STATS["admitted on a matched prefix"] += int(req.prefix_len > 0)
            else:
                req.init_next_round_input()  # the chunked request's next round: no match
            start = req.kv.kv_allocated_len
            end = min(total, start + chunk)
            req.extend_end = end
            kv = self._extend(req, start, end) if self._room(end - start) else None
            if kv is None:  # no KV for the chunk: retracted
                self._retract(lv)
                return
            self._commit(req, start, kv)
            if end < total:
                lv.chunked = True
                self.common.checkpoint_kv_cache(req, self.tree)  # the tree's checkpoint; prefix_len = end
                STATS["checkpoint (chunk)"] += 1
            else:
                lv.chunked = False
                req.output_ids.append(1)  # the first sampled token

    @precondition(lambda self: any(lv.chunked for lv in getattr(self, "live", ())))
    @rule(pick=picks, chunk=CHUNKS)
    def next_chunk(self, pick: int, chunk: int) -> None:
        chunked = [lv for lv in self.live if lv.chunked]
        self._prefill(chunked[pick % len(chunked)], chunk, first=False)

    def running(self) -> list[Live]:
        return [lv for lv in getattr(self, "live", ()) if not lv.chunked and not lv.waiting]

    @precondition(lambda self: bool(self.running()))
    @rule(pick=picks, token=st.integers(1, 3))
    def decode(self, pick: int, token: int) -> None:
        assert self.w is not None
        lv = self.running()[pick % len(self.running())]
        with self.w.holder(lv.rid):
            pos = lv.req.kv.kv_allocated_len
            kv = self._decode(lv.req, pos) if self._room(1) else None
            if kv is None:
                self._retract(lv)
                return
            self._commit(lv.req, pos, kv)
            lv.req.output_ids.append(token)

    @precondition(lambda self: bool(self.running()))
    @rule(pick=picks, grouped=st.booleans())
    def finish(self, pick: int, grouped: bool) -> None:
        lv = self.running()[pick % len(self.running())]
        lv.req.finished_reason = self.finish_reason(length=len(lv.req.output_ids))
        if grouped:  # the batch result processor frees a batch's finished requests in one group
            self.alloc.free_group_begin()
            STATS["free group"] += 1
        self._release(lv, checkpoint=True)
        if grouped:
            self.alloc.free_group_end()
        self._leave(lv)

    def _retract(self, lv: Live) -> None:
        self._release(lv, checkpoint=False)
        lv.req.reset_for_retract()
        lv.waiting, lv.chunked = True, False

    @precondition(lambda self: any(not lv.waiting for lv in getattr(self, "live", ())))
    @rule(pick=picks)
    def retract(self, pick: int) -> None:
        active = [lv for lv in self.live if not lv.waiting]
        self._retract(active[pick % len(active)])

    @precondition(lambda self: any(lv.waiting for lv in getattr(self, "live", ())))
    @rule(pick=picks, chunk=CHUNKS)
    def readmit(self, pick: int, chunk: int) -> None:
        waiting = [lv for lv in self.live if lv.waiting]
        lv = waiting[pick % len(waiting)]
        lv.waiting = False
        STATS["readmit"] += 1
        self._prefill(lv, chunk, first=True)

    @precondition(lambda self: bool(getattr(self, "live", ())))
    @rule(pick=picks)
    def abort(self, pick: int) -> None:
        lv = self.live[pick % len(self.live)]
        if not lv.waiting:
            self._release(lv, checkpoint=False)
        self._leave(lv)

    @precondition(lambda self: self.w is not None)
    @rule(n=st.integers(0, 32))
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
                    self.abort(0)
                self.w.check_idle()  # everything came back: free or the tree's, no lock (I-IDLE-IDENTITY)
                STATS["runs clean"] += 1
        finally:
            self.w.detach()


def hunt(examples: int, steps: int = 30) -> dict[str, Any]:
    """Run the machine; the first violation (shrunk) and the rule calls Hypothesis printed, or None."""
    return hunt_machine(SGLangReqKvMachine, examples, steps)


def main(argv: list[str] | None = None) -> int:
    return driver_main(hunt, STATS, load().version, 200, argv)


if __name__ == "__main__":
    raise SystemExit(main())
