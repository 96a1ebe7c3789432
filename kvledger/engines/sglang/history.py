"""Catalogued bugs in the SGLang releases that had them, found by the generic machines with the attach.

Each :class:`HistoricalBug` names a release that still had the bug and the release that fixed it, both
installed side by side (``scripts/setup_sglang.sh``: ``.venv/sglang-X`` made with ``pip install --no-deps
--target``), the machine that hunts it and its budget. :func:`hunt_in` runs the machine in a subprocess
that loads one release (one SGLang per process) and returns its JSON line; :func:`replay_in` replays the
shrunk rule calls the hunt printed. ``python -m kvledger.engines.sglang.history [EXAMPLES]`` runs every
bug in both releases and prints one JSON line per run (spec/sglang-attach.md, "Historical bugs").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvledger.engines.sglang.loader import RELEASE_DIR_ENV

ROOT = Path(__file__).resolve().parents[3]
RELEASES_DIR = ROOT / ".venv"


@dataclass(frozen=True)
class HistoricalBug:
    name: str
    what: str
    has_it: str  # the last release with the bug
    fixed_in: str  # the first release without it
    tree: str  # drive_run.MACHINES key
    examples: int  # the hunt's budget (examples of `steps` rule calls)
    steps: int
    found: str  # the replay constant in `module` (the shrunk rule calls)
    invariant: str
    module: str = "drive_mamba"  # where `found` lives (kvledger.engines.sglang.<module>)


B14_UNIFIED = HistoricalBug(
    name="B14 (tombstone lock, revival, eviction of a locked node)",
    what=(
        "UnifiedRadixCache FULL + MAMBA: a lock taken on a tombstone takes no state lock; a request"
        " ending there revives it; a state eviction then cascades into the leaf's locked KV"
    ),
    has_it="0.5.11",
    fixed_in="0.5.12",
    tree="unified",
    examples=1500,
    steps=30,
    found="FOUND_0511",
    invariant="I-EVICT-LOCKED",
)

N1_PING_PONG = HistoricalBug(
    name="N1 (ping-pong tracking slots freed, the request's handle left set)",
    what=(
        "HybridReqToTokenPool.free_mamba_cache (Mamba extra buffer): frees the request's ping-pong tracking"
        " slots and leaves req.mamba_ping_pong_track_buffer naming them; alloc([req]) trusts a set handle"
    ),
    has_it="0.5.12",
    fixed_in="0.5.13",
    tree="requests",
    examples=300,
    steps=30,
    found="FOUND_0512",
    invariant="I-HANDLE-OWNED",
    module="drive_requests",
)

BUGS: tuple[HistoricalBug, ...] = (B14_UNIFIED, N1_PING_PONG)


def release_dir(version: str) -> Path:
    return RELEASES_DIR / f"sglang-{version}"


def installed(version: str) -> bool:
    return (release_dir(version) / "sglang").is_dir()


def _run(version: str, code: list[str], timeout: float) -> dict[str, Any]:
    env = {**os.environ, RELEASE_DIR_ENV: str(release_dir(version)), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, *code], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"SGLang {version}: exit {out.returncode}\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def hunt_in(
    version: str, bug: HistoricalBug, examples: int | None = None, timeout: float = 1800
) -> dict[str, Any]:
    """The machine's hunt in ``version`` (a subprocess): ``found`` (the first violation, shrunk) and ``steps``."""
    n = bug.examples if examples is None else examples
    args = ["-m", "kvledger.engines.sglang.drive_run", str(n), str(bug.steps), f"--tree={bug.tree}"]
    return _run(version, args, timeout)


def replay_in(
    version: str, bug: HistoricalBug, calls: str | None = None, timeout: float = 600
) -> dict[str, Any]:
    """Replay rule calls (``bug.found``, the hunt's shrunk ones, unless ``calls`` names another constant of
    ``bug.module``) in ``version`` (a subprocess): ``{"version", "found"}``."""
    code = (
        "import json; from kvledger.engines.sglang import drive_run as d, loader; loader.load();"
        f" from kvledger.engines.sglang import {bug.module} as m;"
        f" print(json.dumps({{'version': loader.load().version,"
        f" 'found': d.replay(m.{calls or bug.found}, {bug.tree!r})}}))"
    )
    return _run(version, ["-c", code], timeout)


def main() -> None:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else None
    for bug in BUGS:
        for version in (bug.has_it, bug.fixed_in):
            if not installed(version):
                print(json.dumps({"bug": bug.name, "version": version, "skipped": "not installed"}))
                continue
            report = hunt_in(version, bug, examples)
            print(json.dumps({"bug": bug.name, **report}), flush=True)


if __name__ == "__main__":
    main()
