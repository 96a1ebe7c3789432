"""``kvledger sglang-serve [--on-violation raise|log] [--report FILE] -- <SGLang's server arguments>``.

The contract-enabled debug build of an SGLang server: SGLang's own entry point (``python -m
sglang.launch_server``, run in this process as ``-m`` would run it) with every scheduler process it
spawns under :func:`.ledgers.attach_scheduler`. The attach reaches the scheduler processes through
SGLang's plugin framework (:mod:`.serve_plugin` says how and why that is the path SGLang itself takes):
this module writes a ``.dist-info`` folder declaring the ``sglang.srt.plugins`` entry point, puts it on
``sys.path`` and ``PYTHONPATH`` (a spawned child inherits both), and sets
:data:`~.serve_plugin.ATTACH_ENV` / :data:`~.serve_plugin.REPORT_ENV`. Nothing is installed in the
environment; the folder is removed when the server exits.

The attach checks the normal loop's step boundaries, so the launcher adds ``--disable-overlap-schedule``
unless the arguments name it (the overlap loop under the attach is not built: spec/sglang-scheduler.md).
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kvledger.contracts.errors import InvalidArgument
from kvledger.engines.sglang.scheduler.serve_plugin import ATTACH_ENV, MODES, REPORT_ENV

DIST_NAME = "kvledger_sglang_attach"
PLUGIN_GROUP = "sglang.srt.plugins"  # SGLang's group of general plugins (sglang.srt.plugins)
ATTACH_ENTRY = ("kvledger_attach", "kvledger.engines.sglang.scheduler.serve_plugin:install")
NO_OVERLAP = "--disable-overlap-schedule"


def write_plugin_dist(root: Path, entries: Mapping[str, str]) -> Path:
    """A ``.dist-info`` folder under ``root`` declaring ``entries`` (name -> ``module:function``) in
    SGLang's plugin group; ``importlib.metadata`` finds it on any ``sys.path`` entry. Returns ``root``."""
    if not entries:
        raise InvalidArgument("write_plugin_dist: no entry points to declare")
    info = root / f"{DIST_NAME}-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: 0.0\n")
    lines = [f"[{PLUGIN_GROUP}]"] + [f"{name} = {target}" for name, target in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


@contextmanager
def attached_environment(
    on_violation: str, report: str | None = None, extra_plugins: Mapping[str, str] | None = None
) -> Iterator[Path]:
    """This process's environment while a server runs under the attach: the plugin folder on
    ``sys.path`` and ``PYTHONPATH``, :data:`ATTACH_ENV` (and :data:`REPORT_ENV`) set; all restored
    after. ``extra_plugins``: more SGLang plugins for the children (the CPU stand-ins, a planted bug)."""
    if on_violation not in MODES:
        raise InvalidArgument(f"on_violation={on_violation!r}: expected one of {MODES}")
    root = Path(tempfile.mkdtemp(prefix="kvledger-sglang-plugin-"))
    write_plugin_dist(root, {ATTACH_ENTRY[0]: ATTACH_ENTRY[1], **(extra_plugins or {})})
    saved = {k: os.environ.get(k) for k in (ATTACH_ENV, REPORT_ENV, "PYTHONPATH")}
    os.environ[ATTACH_ENV] = on_violation
    if report:
        os.environ[REPORT_ENV] = str(Path(report).resolve())
    else:
        os.environ.pop(REPORT_ENV, None)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), saved["PYTHONPATH"]) if p)
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        if str(root) in sys.path:
            sys.path.remove(str(root))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)


def sglang_arguments(args: list[str]) -> list[str]:
    """SGLang's server arguments as the attached server gets them (the overlap loop turned off)."""
    if not args:
        raise InvalidArgument(
            "sglang-serve: give SGLang's server arguments after '--' (at least --model-path)"
        )
    return args if NO_OVERLAP in args else [*args, NO_OVERLAP]


def run_server(on_violation: str, report: str | None, sglang_args: list[str]) -> int:
    """SGLang's server entry point (``python -m sglang.launch_server`` ``sglang_args``) run in this
    process with the attach reaching every scheduler process it spawns; returns when the server exits."""
    args = sglang_arguments(sglang_args[1:] if sglang_args[:1] == ["--"] else sglang_args)
    with attached_environment(on_violation, report):
        saved_argv = sys.argv
        sys.argv = ["sglang.launch_server", *args]
        try:
            # as `python -m` runs it: __main__ is SGLang's module, so a spawned child re-imports that
            runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
        finally:
            sys.argv = saved_argv
    return 0
