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

from kvledger.contracts.levels import CONTRACTS_ENV_VAR, LEVEL_ENV_VAR, LEVEL_NAMES, checks_help, read_level


def add_checks_option(group: Any) -> None:
    """``--checks {release,owners,ledger,full}`` on ``group`` (a parser or an argument group)."""
    group.add_argument(
        "--checks",
        choices=LEVEL_NAMES,
        default=None,
        help=(
            f"{checks_help()}; re-executes the process with KVLEDGER_CHECKS set (default: KVLEDGER_CHECKS,"
            " else KVLEDGER_CONTRACTS=1/0 as full/release, else full; spec/checking-levels.md)"
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


def environment_level_error(ns: argparse.Namespace) -> str | None:
    """The complaint about ``KVLEDGER_CHECKS`` / ``KVLEDGER_CONTRACTS`` when the command takes its level
    from them and they do not name one; None when they do, or when the command line sets the level
    (``--checks``, ``simulate --contracts``: the re-executed process gets a valid variable)."""
    if getattr(ns, "checks", None) is not None or getattr(ns, "contracts", None) is not None:
        return None
    try:
        read_level(os.environ.get(LEVEL_ENV_VAR), os.environ.get(CONTRACTS_ENV_VAR))
    except ValueError as exc:
        return str(exc)
    return None


def apply_checks(ns: argparse.Namespace) -> None:
    """Re-execute at ``ns.checks`` when the process runs at another level; return when it already does.

    The process's level is read from the environment as the switch will read it, without importing the
    switch (which refuses an unreadable variable at import): an unreadable one is overridden here."""
    if getattr(ns, "checks", None) is None:
        return
    try:
        current = read_level(os.environ.get(LEVEL_ENV_VAR), os.environ.get(CONTRACTS_ENV_VAR)).label
    except ValueError:
        current = None
    if ns.checks == current:
        return
    env = dict(os.environ, **{LEVEL_ENV_VAR: ns.checks})
    args = without_option(list(sys.argv[1:]), "--checks")
    os.execvpe(sys.executable, [sys.executable, "-m", "kvledger", *args], env)
