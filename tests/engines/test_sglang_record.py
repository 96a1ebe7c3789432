"""A recorded run of SGLang's own components replays in ``kvledger audit`` (a subprocess: exit codes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvledger.engines.sglang import build
from kvledger.engines.sglang.attach import watch
from kvledger.engines.sglang.record import SGLangRecorder
from kvledger.engines.sglang.workload import serve, shared_prefix_requests


def audit(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvledger", "audit", str(path)], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def test_a_recorded_sglang_run_replays_clean_and_a_planted_double_free_stops_it(
    sgl: Any, tmp_path: Path
) -> None:
    alloc = build.token_allocator(512, 4)
    rows = build.req_pool(8, 1024)
    tree = build.radix_cache(alloc, rows)
    w = watch(allocator=alloc, req_pool=rows, tree=tree)
    log = tmp_path / "sglang.jsonl"
    with log.open("w") as out:
        rec = SGLangRecorder(w, out)
        for rid, tokens in enumerate(shared_prefix_requests(30, groups=4, prefix_len=64, unique_len=16)):
            serve(sgl, alloc, rows, tree, w, rid, tokens)
        rec.close()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert {e["ev"] for e in events} >= {"header", "pool", "req", "alloc", "move", "free"}
    assert any(e["ev"] == "free" and e["from"] == "tree#kv" for e in events), "the tree evicted"
    done = audit(log)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "clean" in done.stdout
    # the same log with one free repeated: the replay stops at it, naming the invariant
    lines = log.read_text().splitlines()
    if events[-1]["ev"] == "end":
        lines = lines[:-1]
    at = max(i for i, line in enumerate(lines) if json.loads(line)["ev"] == "free")
    bad = tmp_path / "double.jsonl"
    bad.write_text("\n".join([*lines[: at + 1], lines[at], *lines[at + 1 :]]) + "\n")  # freed twice in a row
    done = audit(bad)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "I-NODUP-FREE" in done.stdout + done.stderr
