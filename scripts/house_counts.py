#!/usr/bin/env python
"""The house counts of issue 36: how much of the package goes around its seams, read from the source.

* ``any_in_reference``: ``Any`` names (``Any`` and ``typing.Any``) in ``kvledger/reference/``, from the
  AST: each one is a place the type checker stops checking the reference's own objects.
* ``private_reach_through``: attribute reads or writes of a ``_private`` name on anything but ``self``
  or ``cls`` in ``kvledger/`` (``other._field``): one object using another's insides instead of its API
  (``super()._name``, the object's own base class, is not counted).
* ``files_over_800_lines`` and ``functions_over_80_lines``: the size limits of the house rules, as lists.
* ``lines``: the package's lines, all files.
* ``duplicate_pairs``: with ``--duplicates``, the pairs of places sharing six lines or more as the
  workplace's ``duplicates`` tool finds them in ``kvledger/`` (not installed everywhere, so not by default).

Prints one JSON document. ``--check BASELINE`` compares with a committed baseline
(``tests/house_baseline.json``) and exits 1 naming every count that rose or every new long file or
function: a change may hold or lower each count, not raise it (the test suite runs the same comparison).
``--write BASELINE`` records today's counts.

    scripts/house_counts.py                      # the counts
    scripts/house_counts.py --duplicates         # and the duplicated pairs (the tool must be installed)
    scripts/house_counts.py --write tests/house_baseline.json   # after a change that lowered a count
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvledger"
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80
COUNTS = ("any_in_reference", "private_reach_through")
LISTS = ("files_over_800_lines", "functions_over_80_lines")


def _sources(below: Path) -> list[Path]:
    return sorted(below.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def any_names(tree: ast.AST) -> int:
    """``Any`` and ``typing.Any`` / ``t.Any`` uses (imports of the name not counted)."""
    names = sum(isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(tree))
    attributes = sum(isinstance(n, ast.Attribute) and n.attr == "Any" for n in ast.walk(tree))
    return names + attributes


def private_reach_through(tree: ast.AST) -> int:
    """``x._name`` where ``x`` is not ``self`` or ``cls`` (dunder names are the language's, not private)."""
    count = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or (attr.startswith("__") and attr.endswith("__")):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if _is_super_call(node.value):  # super()._name: the object's own base class, not another object
            continue
        count += 1
    return count


def _is_super_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def long_functions(tree: ast.AST, where: str) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append(f"{where}::{node.name}")
    return sorted(out)


def duplicate_pairs() -> int | None:
    """Rows the ``duplicates`` tool lists for ``kvledger/`` (None when it is not installed)."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    proc = subprocess.run(
        [tool, "--repo", str(PACKAGE), "--most", "1", "--seconds", "120"],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"^(\d+) pairs of places", proc.stdout, re.MULTILINE)  # its summary line
    return int(found.group(1)) if found else None


def counts(with_duplicates: bool = False) -> dict[str, object]:
    any_total = reach = lines = 0
    long_files: list[str] = []
    long_funcs: list[str] = []
    for path in _sources(PACKAGE):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        n_lines = text.count("\n")
        lines += n_lines
        where = _name(path)
        if n_lines > MAX_FILE_LINES:
            long_files.append(where)
        long_funcs += long_functions(tree, where)
        reach += private_reach_through(tree)
        if path.is_relative_to(PACKAGE / "reference"):
            any_total += any_names(tree)
    doc: dict[str, object] = {
        "any_in_reference": any_total,
        "private_reach_through": reach,
        "files_over_800_lines": sorted(long_files),
        "functions_over_80_lines": sorted(long_funcs),
        "lines": lines,
    }
    if with_duplicates:
        doc["duplicate_pairs"] = duplicate_pairs()
    return doc


def regressions(now: dict[str, object], baseline: dict[str, object]) -> list[str]:
    """What rose above the baseline: a count, or a file or function newly over its limit."""
    out = []
    for key in COUNTS:
        if int(now[key]) > int(baseline[key]):  # type: ignore[call-overload]
            out.append(f"{key}: {now[key]} > baseline {baseline[key]}")
    for key in LISTS:
        new = sorted(set(now[key]) - set(baseline[key]))  # type: ignore[call-overload]
        if new:
            out.append(f"{key}: new {new}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duplicates", action="store_true", help="also count duplicated pairs (needs the tool)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--check", type=Path, help="exit 1 when a count rose above this baseline")
    group.add_argument("--write", type=Path, help="record today's counts as the baseline")
    args = p.parse_args(argv)
    now = counts(args.duplicates)
    print(json.dumps(now, indent=1))
    if args.write:
        keep = {k: now[k] for k in (*COUNTS, *LISTS)}
        args.write.write_text(json.dumps(keep, indent=1) + "\n")
    if args.check:
        bad = regressions(now, json.loads(args.check.read_text()))
        for line in bad:
            print(f"house_counts: {line}", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
