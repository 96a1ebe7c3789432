"""The cost of the host-tier attach: SGLang 0.5.23's HiCache controller and host pool bare and watched.

One seeded host workload (``random.Random(seed)``, the same calls in both settings), played the way the
tree plays the controller (:mod:`kvledger.engines.sglang.drive_hicache`, without Hypothesis): nodes of 1 to
4 pages inserted on the device and written through to host (``HiCacheController.write``, its ack taken),
device copies evicted, host-only nodes loaded back on a hit (``load``, ``start_loading``, the ack), host
copies evicted (``evict_host``); a full device or host pool evicts the oldest copies first. Device pool
4,096 tokens, host pool twice that (SGLang's default ratio), page 1 and page 16; the data copies are
``build_host.SyncTransferEngine``'s torch copies in both settings.

Per page size, ``--rounds`` rounds in one process, each a bare run and a watched run (``watch`` on the
device allocator, ``watch_host`` on the host pool with the controller: every call checked, no audit per
call; one full audit and the everything-came-back check at the end, outside the timing) on fresh objects,
their order alternated; CPU time (``time.process_time``). Figures: the median of the per-round ratios
watched / bare and the per-call cost: (watched - bare) CPU over the calls the watches checked, in
microseconds.

    python benchmarks/sglang_hicache_attach.py [--rounds R] [--ops N] [--seed S]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import time
from collections import Counter
from typing import Any

DEVICE_TOKENS = 4096


class Workload:
    """The tree's part of the host tier over SGLang's objects, watched or bare."""

    def __init__(self, page: int, watched: bool) -> None:
        from kvledger.engines.sglang import build, build_host
        from kvledger.engines.sglang.attach import watch
        from kvledger.engines.sglang.attach_host import watch_host

        self.page = page
        self.alloc = build.token_allocator(DEVICE_TOKENS, page)
        self.host = build_host.kv_host_pool(self.alloc)
        self.ctl = build_host.controller(self.alloc, self.host)
        self.dw = watch(allocator=self.alloc) if watched else None
        self.hw = watch_host(self.host, controller=self.ctl, device=self.dw) if watched else None
        self.dev: dict[int, Any] = {}  # node -> device indices
        self.hst: dict[int, Any] = {}  # node -> host indices
        self.next = 1
        self.counts: Counter[str] = Counter()  # what the run did (the same in both settings)

    def holder(self, key: str) -> contextlib.AbstractContextManager[Any]:
        return self.dw.holder(key) if self.dw is not None else contextlib.nullcontext()

    def free_device(self, nid: int) -> None:
        with self.holder(f"node:{nid}"):
            self.alloc.free(self.dev.pop(nid))
        self.counts["device eviction"] += 1
        if self.dw is not None:
            self.dw.retire(f"node:{nid}")

    def evict_host(self, nid: int) -> None:
        self.ctl.evict_host(self.hst.pop(nid))
        self.counts["host eviction"] += 1
        if self.hw is not None:
            self.hw.node_dropped(nid)

    def device_room(self, key: str, tokens: int) -> Any:
        with self.holder(key):
            got = self.alloc.alloc(tokens)
        while got is None:
            backed = next((n for n in self.dev if n in self.hst), None)
            if backed is None:
                return None
            self.free_device(backed)
            with self.holder(key):
                got = self.alloc.alloc(tokens)
        return got

    def insert(self, pages: int) -> None:
        nid, self.next = self.next, self.next + 1
        dev = self.device_room(f"node:{nid}", pages * self.page)
        if dev is None:
            return
        self.dev[nid] = dev
        host = self.ctl.write(dev, node_id=nid)
        while host is None and self.hst:
            self.evict_host(next(iter(self.hst)))
            host = self.ctl.write(dev, node_id=nid)
        if host is None:
            return
        ack = self.ctl.ack_write_queue.pop(0)
        assert ack.finish_event.query()
        if self.hw is not None:
            self.hw.commit_backup(nid, host)
        self.hst[nid] = host
        self.counts["write-through"] += 1

    def load_back(self, nid: int) -> None:
        key = f"load:{nid}"
        loaded = self.ctl.load(self.hst[nid], node_id=nid)
        if loaded is None:
            room = self.device_room(key, len(self.hst[nid]))
            if room is None:
                return
            with self.holder(key):
                self.alloc.free(room)
            loaded = self.ctl.load(self.hst[nid], node_id=nid)
        self.ctl.start_loading()
        self.ctl.ack_load_queue.pop(0)
        if self.dw is not None and self.dw.kv is not None:
            from kvledger.engines.sglang.attach_pools import page_ids

            owner = self.dw.owner_of_request
            self.dw.kv.transfer(page_ids(loaded, self.page), owner(key), owner(f"node:{nid}"), "load-back")
            self.dw.retire(key)
        self.dev[nid] = loaded
        self.counts["load-back"] += 1

    def step(self, rng: random.Random) -> None:
        r = rng.random()
        host_only = [n for n in self.hst if n not in self.dev]
        if r < 0.4:
            self.insert(rng.randint(1, 4))
        elif r < 0.6 and self.dev:
            self.free_device(rng.choice([n for n in self.dev if n in self.hst] or list(self.dev)))
        elif r < 0.85 and host_only:
            self.load_back(rng.choice(host_only))
        elif self.hst:
            nid = rng.choice(list(self.hst))
            self.evict_host(nid)

    def drain(self) -> None:
        for nid in list(self.hst):
            self.evict_host(nid)
        for nid in list(self.dev):
            self.free_device(nid)
        if self.dw is not None and self.hw is not None:
            self.dw.check_idle()
            self.hw.check_idle()


def run(page: int, watched: bool, ops: int, seed: int) -> tuple[float, int, dict[str, int]]:
    """CPU seconds for ``ops`` workload steps on fresh objects, the calls the watches checked, and what
    the run did."""
    wl = Workload(page, watched)
    rng = random.Random(seed)
    start = time.process_time()
    for _ in range(ops):
        wl.step(rng)
    elapsed = time.process_time() - start
    calls = (wl.dw.calls if wl.dw else 0) + (wl.hw.calls if wl.hw else 0)
    done = dict(wl.counts)  # before the drain's evictions
    wl.drain()
    return elapsed, calls, done


def cell(page: int, rounds: int, ops: int, seed: int) -> dict[str, Any]:
    ratios, per_call, bare_s, watched_s = [], [], [], []
    done_first: dict[str, int] = {}
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {w: run(page, w, ops, seed + r) for w in order}
        (bare, _, done), (watched, calls, watched_done) = got[False], got[True]
        assert done == watched_done, (done, watched_done)  # the same calls in both settings
        done_first = done_first or done
        bare_s.append(bare)
        watched_s.append(watched)
        ratios.append(watched / bare)
        per_call.append((watched - bare) / calls * 1e6)
    return {
        "page": page,
        "ops": ops,
        "first_round_did": done_first,
        "rounds": rounds,
        "bare_cpu_s_median": round(statistics.median(bare_s), 4),
        "watched_cpu_s_median": round(statistics.median(watched_s), 4),
        "watched_over_bare_median": round(statistics.median(ratios), 3),
        "extra_us_per_checked_call_median": round(statistics.median(per_call), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from kvledger.engines.sglang import load

    version = load().version
    run(1, True, 50, args.seed)  # warm-up: imports and first-call costs outside the figures
    cells = [cell(page, args.rounds, args.ops, args.seed) for page in (1, 16)]
    print(
        json.dumps(
            {"benchmark": "sglang_hicache_attach", "sglang": version, "seed": args.seed, "cells": cells}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
