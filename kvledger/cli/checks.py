"""``--checks LEVEL``: the checking level of a command (spec/checking-levels.md).

The level is the process's, read once at import (icontract's decorators are applied then), so a command
asked for another level than its process runs at re-executes itself with ``KVLEDGER_CHECKS`` set and
the option removed: the new process starts at that level, and everything it builds is built at it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kvledger.contracts.levels import LEVEL_NAMES


def add_checks_option(group: Any) -> None:
    """``--checks {release,owners,ledger,full}`` on ``group`` (a parser or an argument group)."""
    group.add_argument(
        "--checks",
        choices=LEVEL_NAMES,
        default=None,
        help=(
            "checking level: release (counts only), owners (who holds every id), ledger (plus the move"
            " history and poisoned frees), full (plus icontract); re-executes the process with"
            " KVLEDGER_CHECKS set (default: KVLEDGER_CHECKS, else KVLEDGER_CONTRACTS=1/0 as full/release,"
            " else full)"
        ),
    )


def without_option(args: list[str], option: str) -> list[str]:
    """``args`` without ``option VALUE`` and ``option=VALUE`` (every occurrence)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == option:
            skip = True
            continue
        if arg.startswith(option + "="):
            continue
        out.append(arg)
    return out


def apply_checks(ns: argparse.Namespace) -> None:
    """Re-execute at ``ns.checks`` when the process runs at another level; return when it already does."""
    if getattr(ns, "checks", None) is None:
        return
    from kvledger.contracts import switch

    if ns.checks == switch.LEVEL.label:
        return
    env = dict(os.environ, **{switch.LEVEL_ENV_VAR: ns.checks})
    args = without_option(list(sys.argv[1:]), "--checks")
    os.execvpe(sys.executable, [sys.executable, "-m", "kvledger", *args], env)
