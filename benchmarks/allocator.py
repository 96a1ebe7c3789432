#!/usr/bin/env python
"""Allocator alloc/s and free/s: kvledger (release and contracts on) next to an SGLang-style baseline.

Issue 16 part 4: kvledger's release allocators must allocate and free at least as fast as SGLang's,
with validation kept (range, repeats and double frees checked in O(n) against the per-slot state, no
sort). SGLang cannot run here, so :class:`SGLangTokenBaseline` and :class:`SGLangPagedBaseline` below
perform the tensor operations SGLang's ``TokenToKVPoolAllocator`` and ``PagedTokenToKVPoolAllocator``
perform on ``alloc`` and ``free`` (``../shared/background/sglang-memory-model.md`` §1.1-1.2): slice
the front of a ``free_pages`` tensor; free by ``torch.cat`` onto its end (token) or, for pages,
``torch.unique`` of ``ids // page_size`` concatenated in front. They are this project's code, written
from that description, not SGLang's, and they validate nothing (SGLang's free does not either).

Method: for each pool size, page size and request size ``n`` (tokens per call), a round allocates
``n`` tokens repeatedly until half the pool is taken, then frees the results in allocation order;
rounds alternate between the baseline and kvledger in the same process so load hits both alike. The
figures are calls per second of process CPU time (steadier than wall time on a shared machine), the
best of ``--rounds`` rounds. Each setting of ``KVLEDGER_CONTRACTS`` runs in its own child (the switch
is read at import); the baseline is measured in the release child.

    benchmarks/allocator.py            # pools of 4,096 and 65,536 tokens
    benchmarks/allocator.py --quick    # a smoke run for tests
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, per_second, ratio

# (page size, tokens per call): a decode token and a prefill chunk at page 1; one page and 16 at page 16.
CASES = ((1, 1), (1, 64), (16, 16), (16, 256))
RANDOM_OPS = 4000  # operations of the random alloc/free loop per round (issue 38's "random loop" cell)


class SGLangTokenBaseline:
    """The tensor operations of SGLang's ``TokenToKVPoolAllocator`` (page size 1) on alloc and free."""

    page_size = 1

    def __init__(self, size: int) -> None:
        import torch

        self.torch = torch
        self.free_pages = torch.arange(1, size + 1, dtype=torch.int64)

    def alloc(self, need_size: int) -> Any:
        if need_size > len(self.free_pages):
            return None
        select_index = self.free_pages[:need_size]
        self.free_pages = self.free_pages[need_size:]
        return select_index

    def free(self, free_index: Any) -> None:
        if free_index.numel() == 0:
            return
        self.free_pages = self.torch.cat((self.free_pages, free_index))


class SGLangPagedBaseline:
    """The tensor operations of SGLang's ``PagedTokenToKVPoolAllocator`` on alloc and free."""

    def __init__(self, size: int, page_size: int) -> None:
        import torch

        self.torch = torch
        self.page_size = page_size
        self.free_pages = torch.arange(1, size // page_size + 1, dtype=torch.int64)
        self.offsets = torch.arange(page_size, dtype=torch.int64)

    def alloc(self, need_size: int) -> Any:
        num_pages = need_size // self.page_size
        if num_pages > len(self.free_pages):
            return None
        out_pages = self.free_pages[:num_pages]
        self.free_pages = self.free_pages[num_pages:]
        return (out_pages[:, None] * self.page_size + self.offsets).reshape(-1)

    def free(self, free_index: Any) -> None:
        if free_index.numel() == 0:
            return
        free_page_indices = self.torch.unique(free_index // self.page_size)
        self.free_pages = self.torch.cat((free_page_indices, self.free_pages))


def _round(alloc: Any, free: Any, n: int, calls: int) -> tuple[float, float]:
    """CPU seconds for ``calls`` allocations of ``n`` tokens, then for freeing them in order."""
    out = []
    start = time.process_time()
    for _ in range(calls):
        out.append(alloc(n))
    mid = time.process_time()
    for ids in out:
        free(ids)
    end = time.process_time()
    if any(ids is None for ids in out):
        raise RuntimeError("an allocation failed: the round asked for more than the pool has")
    return mid - start, end - mid


def _random_plan(size: int, page: int, ops: int, seed: int = 0) -> list[tuple[int, int]]:
    """A random alloc/free loop, the same for every allocator: ``(tokens, 0)`` allocates, ``(0, k)`` frees
    the ``k``-th block still held (swap-removed). Allocations of 1 to 64 tokens (whole pages), at most half
    the pool held, so no allocator can run out; every block is freed at the end."""
    import random

    rng = random.Random(seed)
    plan: list[tuple[int, int]] = []
    held: list[int] = []
    used = 0
    for _ in range(ops):
        n = page * rng.randint(1, max(64 // page, 1))
        if held and (used + n > size // 2 or rng.random() < 0.5):
            k = rng.randrange(len(held))
            used -= held[k]
            held[k] = held[-1]
            held.pop()
            plan.append((0, k))
        else:
            held.append(n)
            used += n
            plan.append((n, 0))
    plan.extend((0, len(held) - 1 - j) for j in range(len(held)))
    return plan


def _random_round(alloc: Any, free: Any, plan: list[tuple[int, int]]) -> float:
    """CPU seconds for ``plan`` (:func:`_random_plan`) on one allocator."""
    held: list[Any] = []
    start = time.process_time()
    for n, k in plan:
        if n:
            held.append(alloc(n))
        else:
            ids = held[k]
            held[k] = held[-1]
            held.pop()
            free(ids)
    return time.process_time() - start


def _sglang_allocator(size: int, page: int) -> Any:
    """SGLang's own ``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator`` (the installed release,
    0.5.23 by the set-up, on CPU), or None when the extra is not installed."""
    from kvledger.engines.sglang import build, loader

    if loader.available() is not None:
        return None
    return build.token_allocator(size, page)


def _sglang_version() -> str | None:
    from kvledger.engines.sglang import loader

    return None if loader.available() is not None else loader.load().version


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from kvledger.contracts import switch
    from kvledger.contracts.owners import REQ_RUNNING, Owner
    from kvledger.reference.pools import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    torch.set_num_threads(1)
    owner = Owner("req", 0, REQ_RUNNING)
    results: list[dict[str, Any]] = []
    for size in args.pools:
        for page, n in CASES:
            calls = max(size // 2 // n, 1)
            ours: Any = TokenToKVPoolAllocator(size) if page == 1 else PagedTokenToKVPoolAllocator(size, page)
            theirs: Any = SGLangTokenBaseline(size) if page == 1 else SGLangPagedBaseline(size, page)
            variants = {
                "kvledger": (lambda k, o=ours: o.alloc(k, owner), lambda ids, o=ours: o.free(ids, owner))
            }
            if not switch.ENABLED:
                variants["sglang_baseline"] = (theirs.alloc, theirs.free)
                real = _sglang_allocator(size, page)
                if real is not None:  # issue 38: the class itself, not only its tensor operations
                    variants["sglang"] = (real.alloc, real.free)
            best: dict[str, list[float]] = {name: [float("inf"), float("inf")] for name in variants}
            for r in range(args.rounds + 1):  # round 0 warms up
                for name, (alloc, free) in variants.items():
                    a, f = _round(alloc, free, n, calls)
                    if r:
                        best[name][0] = min(best[name][0], a)
                        best[name][1] = min(best[name][1], f)
            plan = _random_plan(size, page, RANDOM_OPS)
            mixed = {
                name: min(_random_round(*variants[name], plan) for _ in range(args.rounds + 1))
                for name in variants
            }
            assert ours.available_size() == ours.size, "the rounds leaked"
            ours.audit()
            row: dict[str, Any] = {"pool": size, "page_size": page, "tokens_per_call": n, "calls": calls}
            for name, (a, f) in best.items():
                row[name] = {
                    "alloc_per_s": per_second(calls, a),
                    "free_per_s": per_second(calls, f),
                    "random_loop_ops_per_s": per_second(len(plan), mixed[name]),
                }
            results.append(row)
    return {
        "contracts": switch.ENABLED,
        "rows": results,
        "sglang": None if switch.ENABLED else _sglang_version(),
    }


def _run_child(contracts: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", f"--rounds={args.rounds}"]
    cmd += [f"--pool={p}" for p in args.pools]
    # KVLEDGER_CHECKS wins over KVLEDGER_CONTRACTS: an inherited one would put both children at its level.
    env = {k: v for k, v in os.environ.items() if k != "KVLEDGER_CHECKS"} | {"KVLEDGER_CONTRACTS": contracts}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child with KVLEDGER_CONTRACTS={contracts} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", dest="pools", type=int, action="append", help="pool size in tokens")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one small pool, one round")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.pools, args.rounds = [1024], 1
    args.pools = args.pools or [4096, 65536]
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    off, on = _run_child("0", args), _run_child("1", args)
    rows = []
    figures = []
    for a, b in zip(off["rows"], on["rows"], strict=True):
        row = {k: a[k] for k in ("pool", "page_size", "tokens_per_call", "calls")}
        row["release"] = a["kvledger"]
        row["contracts_on"] = b["kvledger"]
        row["sglang_baseline"] = a["sglang_baseline"]
        if "sglang" in a:
            row["sglang"] = a["sglang"] | {"version": off["sglang"]}
            row["release_vs_sglang"] = {
                op: ratio(a["kvledger"][f"{op}_per_s"], a["sglang"][f"{op}_per_s"])
                for op in ("alloc", "free", "random_loop_ops")
            }
        rows.append(row)
        case = f"pool {a['pool']}, page {a['page_size']}, {a['tokens_per_call']} tok/call"
        for op in ("alloc", "free"):
            key = f"{op}_per_s"
            rel, base = a["kvledger"][key], a["sglang_baseline"][key]
            figures.append(
                figure(
                    "allocator",
                    f"{op}/s ({case})",
                    "calls/s",
                    release=rel,
                    contracts_on=b["kvledger"][key],
                    target="release >= baseline; on/off <= 2",
                    sglang_baseline=base,
                    release_vs_baseline=None if rel is None or not base else rel / base,
                    release_vs_sglang=row.get("release_vs_sglang", {}).get(op),
                )
            )
    print(json.dumps({"benchmark": "allocator", "rounds": args.rounds, "rows": rows, "figures": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
