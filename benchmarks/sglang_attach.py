"""The cost of the attach: SGLang's real caches bare and watched, the same workload, alternated.

Two workloads, served through SGLang's caches the way its scheduler does
(``kvledger.engines.sglang.workload``), 8,192-token pool so the tree evicts all the time:

* shared-prefix: requests of one of 20 shared 512-token prefixes plus 64 unique tokens (``serve``);
* decode-heavy: prompts of one of 20 shared 64-token prefixes plus 16 unique tokens, then 128 decode
  steps of one KV allocation each (``serve_decoding``).

Per cell (workload, cache, page size), ``--rounds`` rounds in one process, each a bare run and a watched
run at the attach's default cadence (``watch(...)``: every call checked, I-COUNT at every free, no full
audit) on fresh caches, their order alternated; CPU time (``time.process_time``). Figures: the median of
the per-round ratios watched / bare, and the per-call cost: (watched - bare) CPU over the calls the watch
checked (``Watch.calls``), in microseconds. ``--audit`` adds a run with ``audit_each=True``.

    python benchmarks/sglang_attach.py [--rounds R] [--quick] [--audit]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

WORKLOADS = {"shared-prefix": 300, "decode-heavy": 40}  # requests per run
CELLS = {
    "shared-prefix": (("radix", 1), ("radix", 16), ("unified-full", 1), ("unified-mamba", 1)),
    # serve_decoding has no Mamba slot of its own: the FULL trees only
    "decode-heavy": (("radix", 1), ("radix", 16), ("unified-full", 1)),
}
DECODE_STEPS = 128


def run(workload: str, kind: str, page: int, setting: str, requests: int) -> tuple[float, int]:
    """CPU seconds for ``requests`` requests through fresh caches, and the calls the watch checked."""
    from kvledger.engines.sglang import build, load
    from kvledger.engines.sglang.attach import watch
    from kvledger.engines.sglang.workload import (
        decode_heavy_requests,
        serve,
        serve_decoding,
        shared_prefix_requests,
    )

    sgl = load()
    alloc = build.token_allocator(8192, page)
    mamba = kind == "unified-mamba"
    rows = build.hybrid_req_pool(8, 64) if mamba else build.req_pool(8, 1024)
    tree = (
        build.unified_radix_cache(alloc, rows, mamba=mamba)
        if kind.startswith("unified")
        else build.radix_cache(alloc, rows)
    )
    w = None
    if setting != "bare":
        w = watch(
            allocator=alloc, req_pool=rows, mamba_pool=rows if mamba else None, tree=tree,
            audit_each=setting == "watched+audit",
        )  # fmt: skip
    if workload == "shared-prefix":
        reqs = list(shared_prefix_requests(requests))
        start = time.process_time()
        for rid, tokens in enumerate(reqs):
            serve(sgl, alloc, rows, tree, w, rid, tokens)
    else:
        reqs = list(decode_heavy_requests(requests))
        start = time.process_time()
        for rid, tokens in enumerate(reqs):
            serve_decoding(sgl, alloc, rows, tree, w, rid, tokens, DECODE_STEPS)
    elapsed = time.process_time() - start
    if w is not None:
        w.check_idle()  # nothing leaked, everything free or the tree's, then the full audit
        return elapsed, w.calls
    return elapsed, 0


def cell(workload: str, kind: str, page: int, rounds: int, audit: bool, requests: int) -> dict[str, Any]:
    ratios, per_call, bare_s, watched_s = [], [], [], []
    for r in range(rounds):
        order = ("bare", "watched") if r % 2 == 0 else ("watched", "bare")
        got = {s: run(workload, kind, page, s, requests) for s in order}
        (b, _), (wt, calls) = got["bare"], got["watched"]
        ratios.append(wt / b)
        per_call.append((wt - b) / max(calls, 1) * 1e6)
        bare_s.append(b)
        watched_s.append(wt)
    out: dict[str, Any] = {
        "bare_req_per_cpu_s": round(requests / statistics.median(bare_s), 1),
        "watched_req_per_cpu_s": round(requests / statistics.median(watched_s), 1),
        "watched_over_bare": round(statistics.median(ratios), 2),
        "watched_over_bare_rounds": [round(x, 2) for x in ratios],
        "watched_calls_per_request": round(calls / requests, 1),
        "us_per_watched_call": round(statistics.median(per_call), 1),
    }
    if audit:
        n = max(1, requests // 5)
        audited, _ = run(workload, kind, page, "watched+audit", n)
        out["audit_each_req_per_cpu_s"] = round(n / audited, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 rounds, a fifth of the requests")
    parser.add_argument("--audit", action="store_true", help="also a run with audit_each=True")
    parser.add_argument("--only", default="", help="workload[/kind/page] prefix filter")
    args = parser.parse_args()
    from kvledger.engines.sglang import available, load

    reason = available()
    if reason is not None:  # the optional extra is absent: nothing to measure
        print(json.dumps({"benchmark": "sglang_attach", "skipped": reason}))
        return
    sgl = load()
    rounds = 2 if args.quick else args.rounds
    out: dict[str, Any] = {
        "benchmark": "sglang_attach",
        "sglang": sgl.version,
        "rounds": rounds,
        "import_seconds": round(sgl.import_seconds, 1),
        "cadence": "default (watch(...): per-call checks, I-COUNT at every free, no audit_each)",
    }
    for workload, requests in WORKLOADS.items():
        n = max(4, requests // 5) if args.quick else requests
        for kind, page in CELLS[workload]:
            name = f"{workload}/{kind}/page{page}"
            if not name.startswith(args.only):
                continue
            out[name] = {"requests": n, **cell(workload, kind, page, rounds, args.audit, n)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
