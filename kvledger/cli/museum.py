"""``kvledger museum [--json]``: list the museum's exhibits.

The listing comes from :mod:`kvledger.cli.museum_index`, a copy of the catalogue's descriptive fields
kept in step with it by a test: the catalogue itself is built from the reference classes it patches,
which would import torch to print a table.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvledger.cli.options import UsageError
from kvledger.cli.output import console

NAME = "museum"
COLUMNS = ("id", "scope", "machine", "replaces", "breaks", "title")


def add_parser(sub: Any) -> None:
    m = sub.add_parser(NAME, help="list the museum's exhibits", description="List the museum's exhibits.")
    m.add_argument(
        "--json",
        action="store_true",
        help="print the exhibits as one JSON document (a list of objects) on stdout",
    )


def indexed(name: str) -> dict[str, Any]:
    """The exhibit called ``name`` (case-insensitive, as the catalogue looks it up), found without importing
    the catalogue: ``hunt`` and ``explore`` refuse an unknown or out-of-scope name before torch loads."""
    from kvledger.cli.museum_index import EXHIBITS

    for e in EXHIBITS:
        if e["id"].lower() == name.lower():
            if not e["huntable"]:
                raise UsageError(f"{e['id']} is out of the model's scope: {e['why_out_of_scope']}")
            return e
    raise UsageError(f"no exhibit {name!r}; known: {', '.join(e['id'] for e in EXHIBITS)}")


def run(ns: argparse.Namespace) -> int:
    from rich.table import Table

    from kvledger.cli.museum_index import EXHIBITS

    if ns.json:
        print(json.dumps(list(EXHIBITS), indent=1))
        return 0
    table = Table(title="kvledger museum")
    for col in COLUMNS:
        # The key columns fold on a narrow terminal instead of ending in an ellipsis.
        table.add_column(col, overflow="fold" if col in ("id", "replaces", "breaks") else "ellipsis")
    for e in EXHIBITS:
        table.add_row(
            e["id"],
            e["scope"],
            e["machine"] if e["huntable"] else "-",
            e["replaces"] or "-",
            ", ".join(e["breaks"]),
            e["title"],
        )
    console().print(table)
    return 0
