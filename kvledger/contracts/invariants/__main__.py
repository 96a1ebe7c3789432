"""``python -m kvledger.contracts.invariants {check,render,list}`` from the repository root.

* ``render``: write ``spec/invariants.md`` from the registry.
* ``check``: the traceability check (``trace.py``), including "the committed spec is up to date";
  exit 1 with one line per problem.
* ``list``: one line per invariant: ID, severity, origin, title.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvledger.contracts.invariants import PROOFS, all_areas, all_invariants
from kvledger.contracts.invariants.render import render_spec
from kvledger.contracts.invariants.trace import SPEC_PATH, check

ROOT = Path(__file__).resolve().parents[3]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvledger.contracts.invariants", description=__doc__)
    parser.add_argument("command", choices=["check", "render", "list"])
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: %(default)s)")
    args = parser.parse_args(argv)
    root: Path = args.root
    if args.command == "list":
        for inv in all_invariants():
            print(f"{inv.id:34} {inv.severity.value:16} {inv.origin.value:9} {inv.title}")
        return 0
    spec = render_spec(root, all_areas(), PROOFS)
    if args.command == "render":
        (root / SPEC_PATH).write_text(spec, encoding="utf-8")
        print(f"wrote {SPEC_PATH} ({len(all_invariants())} invariants)")
        return 0
    report = check(root, all_invariants(), PROOFS, rendered_spec=spec)
    for problem in report.problems:
        print(f"  {problem}")
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
