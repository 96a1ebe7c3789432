#!/usr/bin/env python
"""Run every benchmark in ``benchmarks/`` and print one table, then one JSON line per figure.

Discovery: every ``benchmarks/*.py`` whose name does not start with ``_`` (helpers) is a benchmark,
except this script. A benchmark prints JSON objects on stdout (one per line); a figure is an entry of
an object's ``figures`` list (see ``_figures.figure``: release, contracts on, their ratio, a target).
A benchmark that prints no ``figures`` still shows up: each number in its JSON becomes a row (its
dotted path as the name), so a new script is covered the moment it lands here. A script that refuses
to run without arguments (argparse's "required" error, e.g. a before/after driver that needs a
baseline tree) is listed as skipped, not failed.

    python benchmarks/run_all.py                 # everything, full size (tens of minutes on 2 cores)
    python benchmarks/run_all.py --quick         # every benchmark's --quick mode (a few minutes)
    python benchmarks/run_all.py --only radix    # the benchmarks whose file name contains "radix"

The ``on/off`` column is the cost of the contracts: contracts-on time over release time for the same
work (both settings are measured in the same invocation of each benchmark). Exit status 1 if any
benchmark failed (its error is printed in its row).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SKIPPED = "skipped (needs arguments): "


def discover(only: list[str], skip: list[str]) -> list[Path]:
    scripts = sorted(p for p in HERE.glob("*.py") if not p.name.startswith("_") and p.name != Path(__file__).name)
    if only:
        scripts = [p for p in scripts if any(o in p.stem for o in only)]
    return [p for p in scripts if not any(s in p.stem for s in skip)]


def _json_objects(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def _flatten(obj: Any, prefix: str = "") -> list[tuple[str, float]]:
    """Every number in a JSON value, with its dotted path (bools and lists of numbers excluded)."""
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [(prefix, float(obj))]
    if isinstance(obj, dict):
        rows: list[tuple[str, float]] = []
        for k, v in obj.items():
            rows += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return rows
    return []


def figures_of(name: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    figures: list[dict[str, Any]] = []
    for obj in objects:
        if isinstance(obj.get("figures"), list):
            figures += [dict(f, benchmark=f.get("benchmark", name)) for f in obj["figures"] if isinstance(f, dict)]
        else:
            for path, value in _flatten(obj):
                figures.append(
                    {"benchmark": name, "figure": path, "unit": "", "release": value, "contracts_on": None,
                     "on_off_ratio": None, "target": None, "note": "reported as is (no figures list)"}
                )  # fmt: skip
    return figures


def run(script: Path, quick: bool, timeout: float) -> tuple[list[dict[str, Any]], str | None, float]:
    cmd = [sys.executable, str(script), *(["--quick"] if quick else [])]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout:.0f} s", time.perf_counter() - start
    elapsed = time.perf_counter() - start
    if done.returncode == 2 and "the following arguments are required" in done.stderr:
        return [], SKIPPED + done.stderr.strip().splitlines()[-1], elapsed  # a driver that needs input
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return [], f"exit {done.returncode}: {' | '.join(tail)}", elapsed
    figures = figures_of(script.stem, _json_objects(done.stdout))
    if not figures:
        return [], "printed no JSON figures", elapsed
    return figures, None, elapsed


def _num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        if x == 0 or not math.isfinite(x):
            return str(x)
        magnitude = abs(x)
        if magnitude >= 1e5:
            return f"{x:,.0f}"
        if magnitude >= 100:
            return f"{x:.0f}"
        if magnitude >= 1:
            return f"{x:.2f}"
        return f"{x:.3g}"
    return str(x)


def table(rows: list[dict[str, Any]]) -> str:
    cols = ("benchmark", "figure", "unit", "release", "contracts_on", "on_off_ratio", "target", "note")
    heads = ("benchmark", "figure", "unit", "release", "contracts on", "on/off", "target", "note")
    numeric = ("release", "contracts_on", "on_off_ratio")
    cells = [[_num(r.get(c)) if c in numeric else str(r.get(c) or "-") for c in cols] for r in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(heads)]
    widths[-1] = len(heads[-1])  # the note runs free
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        pairs = enumerate(zip(row, widths, strict=True))
        padded = [c.rjust(w) if i in (3, 4, 5) else c.ljust(w) for i, (c, w) in pairs]
        lines.append("  ".join(padded))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument("--only", action="append", default=[], help="run the benchmarks whose name contains this")
    parser.add_argument("--skip", action="append", default=[], help="skip the benchmarks whose name contains this")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    parser.add_argument("--json-only", action="store_true", help="print the JSON lines only, no table")
    parser.add_argument("--list", action="store_true", help="list the benchmarks that would run, and stop")
    args = parser.parse_args(argv)
    scripts = discover(args.only, args.skip)
    if args.list:
        print("\n".join(p.name for p in scripts))
        return 0
    rows: list[dict[str, Any]] = []
    failed = False
    for script in scripts:
        print(f"running {script.name}{' --quick' if args.quick else ''} ...", file=sys.stderr, flush=True)
        figures, error, elapsed = run(script, args.quick, args.timeout)
        if error is not None and error.startswith(SKIPPED):
            rows.append({"benchmark": script.stem, "figure": "SKIPPED", "note": error})
            print(f"  {script.name}: {error}", file=sys.stderr)
            continue
        if error is not None:
            failed = True
            rows.append({"benchmark": script.stem, "figure": "FAILED", "note": error, "error": error})
            print(f"  {script.name} failed: {error}", file=sys.stderr)
            continue
        print(f"  {script.name}: {len(figures)} figures in {elapsed:.0f} s", file=sys.stderr)
        rows += figures
    if not args.json_only:
        print(table(rows))
        print()
    for row in rows:
        print(json.dumps(row))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
