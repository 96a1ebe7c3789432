"""``kvledger sglang-serve [--on-violation raise|log] [--report FILE] -- <SGLang's server arguments>``.

SGLang's own server with every scheduler process under kvledger's attach (the contract-enabled debug
build; :mod:`kvledger.engines.sglang.scheduler.serve`). Registration only: the launcher lives with the
scheduler attach, and nothing of SGLang is imported until the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvledger.cli.options import UsageError

NAME = "sglang-serve"
MODES = ("raise", "log")
"""What a violation does (``serve_plugin.MODES``, repeated so building the parser imports no engine; a
test keeps the two equal)."""


def add_parser(sub: Any) -> None:
    m = sub.add_parser(
        NAME,
        help="start SGLang's server with its scheduler under kvledger's attach",
        description="Start SGLang's own server (python -m sglang.launch_server) with every scheduler"
        " process it spawns under kvledger's attach: each step's pools, tree and queues checked.",
    )
    m.add_argument(
        "--on-violation",
        choices=MODES,
        default="raise",
        help="raise: log the evidence and stop the server at the first bad step; log: log it, detach"
        " and keep serving (default: raise)",
    )
    m.add_argument("--report", metavar="FILE", help="append each violation to FILE as a JSON line")
    m.add_argument(
        "sglang_args",
        nargs=argparse.REMAINDER,
        metavar="-- SGLANG_ARGS",
        help="SGLang's own server arguments (python -m sglang.launch_server's), after '--'",
    )


def run(ns: argparse.Namespace) -> int:
    from kvledger.contracts.errors import InvalidArgument
    from kvledger.engines.sglang.scheduler.serve import run_server

    try:
        return run_server(ns.on_violation, ns.report, list(ns.sglang_args))
    except InvalidArgument as exc:
        raise UsageError(str(exc)) from exc
