"""Before/after in one invocation: ``radix_cache.py`` modes from this tree and from a baseline tree, interleaved.

Usage: ``python benchmarks/radix_cache_vs_baseline.py --baseline DIR`` where ``DIR`` holds an exported
older tree (for example ``git archive <commit> | tar -x -C DIR``). For each contracts setting (off, on)
and each mode, the two trees' ``radix_cache.py --child MODE`` subprocesses alternate ``--rounds`` times
(so machine load hits both alike); each child already reports the best of its ``--repeats`` runs. The
JSON line gives, per tree, the best wall-clock and CPU-time requests/s over the rounds, and
``after/before`` ratios of both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import ratio

HERE = Path(__file__).resolve().parents[1]
MODES = ("plain_p1", "plain_p16", "mamba_p1")


def run_child(tree: Path, mode: str, switch: str, requests: int, repeats: int) -> dict[str, Any]:
    env = dict(os.environ, KVLEDGER_CONTRACTS=switch, PYTHONPATH=str(tree))
    script = str(tree / "benchmarks" / "radix_cache.py")
    proc = subprocess.run(
        [sys.executable, script, "--child", mode, "--requests", str(requests), "--repeats", str(repeats)],
        env=env,
        cwd=tree.parent,  # not a source tree: the import must come from PYTHONPATH
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tree} {mode}: {proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def best(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return max(values) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="an exported older source tree")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    args = parser.parse_args(argv)
    trees = {"before": args.baseline.resolve(), "after": HERE}
    out: dict[str, Any] = {}
    for label, switch in (("contracts_off", "0"), ("contracts_on", "1")):
        out[label] = {}
        for mode in args.modes:
            runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    runs[name].append(run_child(tree, mode, switch, args.requests, args.repeats))
            fig = {
                name: {"req_s": best(r, "req_s"), "req_s_cpu": best(r, "req_s_cpu")}
                for name, r in runs.items()
            }
            fig["after_over_before"] = {
                key: ratio(fig["after"][key], fig["before"][key]) for key in ("req_s", "req_s_cpu")
            }
            out[label][mode] = fig
    line = {
        "benchmark": "radix_cache_vs_baseline",
        "baseline": str(trees["before"]),
        "requests": args.requests,
        "repeats": args.repeats,
        "rounds": args.rounds,
        **out,
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
