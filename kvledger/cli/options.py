"""What every subcommand's options share: the one-line usage error, bounded value types, and which
options the user actually set.

The bounds are part of the interface: each size option says its range in ``--help`` and a value outside
it is refused while the arguments are parsed, before anything is allocated (a pool of 10^14 tokens would
otherwise be a ``MemoryError`` minutes later). Knowing which options were set lets a conflict blame the
option the user typed, not a default they never saw.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from kvledger.argtypes import grouped
from kvledger.argtypes import int_in as int_in  # re-exported: the subcommands take their value types here
from kvledger.argtypes import probability as probability
from kvledger.argtypes import seconds as seconds

USAGE_ERROR = 2
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a command whose reader went away

_EXPLICIT = "_explicit_options"  # namespace attribute: the dests of the options given on the command line


def _tracking(base: type[argparse.Action]) -> type[argparse.Action]:
    """``base``, recording its ``dest`` as given on the command line whenever argparse calls it."""

    class Tracked(base):  # type: ignore[valid-type, misc]
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: str | Sequence[Any] | None,
            option_string: str | None = None,
        ) -> None:
            super().__call__(parser, namespace, values, option_string)
            if option_string is not None:
                vars(namespace).setdefault(_EXPLICIT, set()).add(self.dest)

    Tracked.__name__ = f"Tracked{base.__name__}"
    return Tracked


def _action_class(action: str) -> type[argparse.Action]:
    """The class argparse registers for ``action``, read from the action object ``add_argument`` returns
    (argparse's public interface) rather than from argparse's private class names."""
    probe = argparse.ArgumentParser(add_help=False)
    return type(probe.add_argument("--probe", action=action))


_TRACKED = {
    kind: _tracking(_action_class(kind or "store")) for kind in (None, "store", "store_true", "store_false", "append")
}


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (argparse prints the whole usage block first) that records which
    options were given (:func:`given`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, action in _TRACKED.items():
            self.register("action", name, action)

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class UsageError(Exception):
    """Raised by a command for a one-line usage error (exit status 2) found after its checks began: the
    dispatcher prints it, and whatever the command had staged is discarded on the way out."""


def given(ns: argparse.Namespace) -> frozenset[str]:
    """The dests of the options set on the command line (defaults the user never typed are not in it)."""
    return frozenset(getattr(ns, _EXPLICIT, ()))


def usage_error(command: str, message: str) -> int:
    """Print ``message`` as the command's one-line error; the exit status of a usage error."""
    import sys

    print(f"kvledger {command}: error: {message}", file=sys.stderr)
    return USAGE_ERROR


# --------------------------------------------------------------------------------------- value types
# Bounded value types live below every floor (kvledger/argtypes.py), so a tool's own CLI (an engine's
# hunt) refuses the same bad values with the same words; re-exported here for the subcommands.


def bounded_help(text: str, low: int, high: int, default: object = "%(default)s") -> str:
    """``text`` followed by the option's range and default, as every size option states them."""
    return f"{text} ({low} to {grouped(high)}; default: {default})"
