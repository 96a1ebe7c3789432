"""The cost of the attach: SGLang's real caches bare and watched, the same workload, one run each.

Workload (as in the CPU measurements of shared/background/sglang-on-cpu.md, smaller by default): requests
of one of 20 shared 512-token prefixes plus 64 unique tokens, served through SGLang's cache the way its
scheduler does (``kvledger.engines.sglang.workload.serve``) with an 8,192-token pool, so the tree evicts
all the time. Three settings per cache: bare SGLang; watched (every id move mirrored into the ledgers and
checked; ``watch(...)``); watched with a full audit after every tree call (``audit_each=True``, O(pool +
tree) each). Prints JSON: requests per CPU second and the slowdown (watched / bare CPU time).

    python benchmarks/sglang_attach.py [--requests N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def run(kind: str, page: int, setting: str, requests: int) -> float:
    """CPU seconds for ``requests`` requests through a fresh cache."""
    from kvledger.engines.sglang import build, load
    from kvledger.engines.sglang.attach import watch
    from kvledger.engines.sglang.workload import serve, shared_prefix_requests

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
    reqs = list(shared_prefix_requests(requests))
    start = time.process_time()
    for rid, tokens in enumerate(reqs):
        serve(sgl, alloc, rows, tree, w, rid, tokens)
    elapsed = time.process_time() - start
    if w is not None:
        w.audit()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="60 requests per setting")
    args = parser.parse_args()
    if args.quick:
        args.requests = 60
    from kvledger.engines.sglang import available, load

    reason = available()
    if reason is not None:  # the optional extra is absent: nothing to measure
        print(json.dumps({"benchmark": "sglang_attach", "skipped": reason}))
        return
    sgl = load()
    out: dict[str, Any] = {
        "sglang": sgl.version,
        "requests": args.requests,
        "import_seconds": round(sgl.import_seconds, 1),
    }
    for kind, page in (("radix", 1), ("radix", 16), ("unified-full", 1), ("unified-mamba", 1)):
        bare = run(kind, page, "bare", args.requests)
        watched = run(kind, page, "watched", args.requests)
        audited = run(kind, page, "watched+audit", args.requests // 5)
        out[f"{kind}/page{page}"] = {
            "bare_req_per_cpu_s": round(args.requests / bare, 1),
            "watched_req_per_cpu_s": round(args.requests / watched, 1),
            "watched_over_bare": round(watched / bare, 2),
            "audit_each_req_per_cpu_s": round((args.requests // 5) / audited, 1),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
