"""The ``kvledger`` command: ``kvledger --version``, ``simulate``, ``audit``, ``hunt``, ``museum``, ``explore``.

One module per subcommand (:mod:`.simulate`, :mod:`.audit`, :mod:`.hunt`, :mod:`.museum`,
:mod:`.explore`), each with ``add_parser(sub)`` and ``run(ns) -> int``; this module only dispatches.
Building the parser imports no torch and none of the engine: ``--version``, ``--help``, a rejected
argument, ``museum`` and ``audit`` start in a fraction of a second; the commands that run the engine
import it when they run.

Every option is checked before anything runs: a bad value, a size beyond its stated bound, an option that
would have no effect under another, a combination the engine cannot run, or an output path that cannot be
written ends in one line on stderr and exit status 2, never a traceback. Exit status 1 means the run
found a contract violation or, with contracts off, a count identity failure; for ``audit``, that the log
breaks an invariant. Ctrl-C ends a command with one line on stderr and exit status 130, leaving none of
its output files behind.
"""

from __future__ import annotations

import argparse
import os
import sys
from types import ModuleType

from kvledger.cli import audit, explore, hunt, museum, sglang_serve, simulate
from kvledger.cli.checks import environment_level_error
from kvledger.cli.options import BROKEN_PIPE, INTERRUPTED, USAGE_ERROR, Parser, UsageError, usage_error
from kvledger.process import interrupt

COMMANDS: dict[str, ModuleType] = {m.NAME: m for m in (simulate, audit, hunt, museum, explore, sglang_serve)}

DESCRIPTION = (
    "kvledger: the memory bookkeeping of an LLM serving engine (KV slots and pages, request rows, Mamba"
    " states, prefix caches, scheduler, PD queues) with every slot's owner checked. Run a workload"
    " (simulate), check a recorded event log (audit), put historical bugs back and hunt them (hunt,"
    " museum, explore). 'kvledger COMMAND --help' for each command's options."
)
"""What ``kvledger --help`` says above the commands (plain text: argparse prints it as it is)."""


class _Version(argparse.Action):
    """``--version``: the version is read (importlib.metadata) only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit"
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from kvledger import __version__

        print(f"kvledger {__version__}")  # on stdout, as argparse's own version action prints it
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvledger", description=DESCRIPTION)
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_usage(sys.stderr)
        print("kvledger: error: a command is required (see kvledger --help)", file=sys.stderr)
        return USAGE_ERROR
    bad_level = environment_level_error(ns)
    if bad_level is not None:  # one line and the usage status, not an import-time traceback
        return usage_error(ns.command, bad_level)
    try:
        with interrupt.watching():
            status = int(COMMANDS[ns.command].run(ns))
            interrupt.check()  # a Ctrl-C some library swallowed still ends the command as one
            return status
    except UsageError as exc:
        return usage_error(ns.command, str(exc))
    except KeyboardInterrupt:
        print(f"kvledger {ns.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # `kvledger museum --json | head`: the reader left; nothing to say to anyone
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return BROKEN_PIPE


__all__ = ["COMMANDS", "build_parser", "main"]
