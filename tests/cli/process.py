"""Run the ``kvledger`` command in a child process, as a user would, and see what it imported.

:func:`kvledger` runs ``python -m kvledger ARGS`` through a probe that, when the child exits, writes the
modules it imported to a file: whether the command touched torch or the engine is a fact about that
process, not about the test's own (which has long imported both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import atexit, json, runpy, sys
def _report(path=sys.argv[1]):
    with open(path, "w") as f:
        json.dump(sorted(sys.modules), f)
if sys.argv[1]:
    atexit.register(_report)
sys.argv = ["kvledger", *sys.argv[2:]]
runpy.run_module("kvledger", run_name="__main__", alter_sys=True)
"""


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str
    modules: frozenset[str]

    @property
    def imported_torch(self) -> bool:
        return "torch" in self.modules

    @property
    def imported_engine(self) -> bool:
        return any(m.startswith("kvledger.reference") for m in self.modules)


def kvledger(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, see_imports: bool = True, **kw: Any
) -> Done:
    """``kvledger ARGS`` in a child process; stdout, stderr, exit status and (``see_imports``, the default:
    the child then writes the list to a file) the modules it imported."""
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvledger-modules-{os.getpid()}-{id(args)}.json"
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, str(probe) if see_imports else "", *args],
            capture_output=True,
            text=True,
            timeout=kw.pop("timeout", 300),
            check=False,
            cwd=cwd,
            env=full_env,
            **kw,
        )
        modules = frozenset(json.loads(probe.read_text())) if see_imports else frozenset()
    finally:
        probe.unlink(missing_ok=True)
    return Done(done.returncode, done.stdout, done.stderr, modules)


SMALL = [
    "--gsp-num-groups", "2", "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "96",
    "--gsp-question-len", "32", "--gsp-output-len", "16", "--kv-pool-tokens", "1024",
]  # fmt: skip
"""A run of a second or two."""
