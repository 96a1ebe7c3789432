"""Which SGLang release a scheduler process runs, and importing its ``Scheduler`` on CPU.

The scheduler seeds live in releases older than the ones :mod:`kvledger.engines.sglang.loader` imports
(#16067 in 0.5.9, fixed in 0.5.10; #12432 in 0.5.5.post1, fixed in 0.5.5.post2). Each is installed side
by side by ``scripts/setup_sglang.sh`` in ``.venv/sglang-X`` (``pip install --no-deps --target``); one
release per process, put first on ``sys.path``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import ModuleType

from kvledger.contracts.errors import InvalidArgument
from kvledger.engines.sglang.standins import STANDIN_ROOTS, StandinFinder, missing_roots

SCHEDULER_RELEASES: dict[str, str] = {
    "0.5.9": "#16067 present: a waiting request's copy-on-write Mamba slot is not counted by the idle check",
    "0.5.10": "#16067 fixed: _get_new_batch_prefill_raw returns the slot when the request is not added",
    "0.5.5.post1": "#12432 present: PD prefill's process_prefill_chunk frees the chunked request's Mamba slot",
    "0.5.5.post2": "#12432 fixed: process_prefill_chunk frees the row with free_mamba_cache=False",
    "0.5.23": "the newest release (the venv's own install): no known seed; hunted for findings",
}
"""Releases whose real ``Scheduler`` this subpackage builds, with the seed each holds (0.5.5.x: the
monolithic ``__init__``, :mod:`.build05`; 0.5.9 on: the ``init_*`` family, :mod:`.build`)."""

SCHEDULER_STANDIN_ROOTS: tuple[str, ...] = (*STANDIN_ROOTS, "sgl_kernel", "setproctitle")
OWN_RELEASE = "0.5.23"
"""The release installed in the venv itself (``scripts/setup_sglang.sh``'s current one), not side by side."""

EINOPS_DIR = "einops-0.8.2"
"""``einops`` (imported at module level by ``eplb.expert_distribution`` on 0.5.23's scheduler import chain)
is not among the venv's own packages; the set-up installs it pinned, alone, in ``.venv/einops-0.8.2``."""

OWN_RELEASE_STANDIN_ROOTS: tuple[str, ...] = (*STANDIN_ROOTS, "setproctitle", "uvicorn", "fastapi")
"""0.5.23's stand-ins: the project's, ``setproctitle`` (as below), ``uvicorn`` and ``fastapi`` (the
encoder-disaggregation receiver's HTTP server, imported at module level by the scheduler; no encoder
process exists here). No ``sgl_kernel``: 0.5.23 guards its own imports of it (an ImportError picks its
CPU fallback), so a stand-in would change the path taken."""

"""Stand-ins for the scheduler's import chain: the project's, plus ``sgl_kernel`` (0.5.9 imports its
HiCache transfer kernels at module level; a CPU run without HiCache never calls them) and
``setproctitle`` (names the OS process; the scheduler here never runs as a launched process)."""


def release_dir(version: str) -> Path:
    """``.venv/sglang-<version>`` of the environment running this interpreter."""
    if version not in SCHEDULER_RELEASES:
        raise InvalidArgument(f"scheduler release {version!r} is not one of {sorted(SCHEDULER_RELEASES)}")
    root = Path(os.environ.get("KVLEDGER_VENV", Path(sys.prefix)))
    if version == OWN_RELEASE:
        return _own_release_dir(root)
    path = root / f"sglang-{version}"
    if not (path / "sglang").is_dir():
        raise InvalidArgument(f"{path} is missing: run scripts/setup_sglang.sh")
    return path


def _own_release_dir(root: Path) -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise InvalidArgument("SGLang is not installed in this environment: run scripts/setup_sglang.sh")
    path = Path(spec.origin).parent.parent
    einops = root / EINOPS_DIR
    if not (einops / "einops").is_dir():
        raise InvalidArgument(f"{einops} is missing: run scripts/setup_sglang.sh")
    if str(einops) not in sys.path:
        sys.path.append(str(einops))  # after site-packages: it only adds the one missing package
    return path


def prepare_imports(version: str) -> None:
    """Make ``version``'s SGLang importable in this process: its folder first on ``sys.path`` (the own
    release is on the path already) and the stand-in finder for the packages this environment lacks.

    The stand-in finder stays installed for the life of the process: the scheduler imports some
    modules lazily (the tree class inside ``init_cache_with_memory_pool``), and this process exists only
    to run this one release."""
    path = str(release_dir(version))
    loaded = sys.modules.get("sglang")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(path):
        raise InvalidArgument(f"another SGLang is already imported in this process: {loaded.__file__}")
    if version != OWN_RELEASE and path not in sys.path:
        sys.path.insert(0, path)
    if not any(isinstance(f, StandinFinder) for f in sys.meta_path):
        roots = OWN_RELEASE_STANDIN_ROOTS if version == OWN_RELEASE else SCHEDULER_STANDIN_ROOTS
        sys.meta_path.append(StandinFinder(missing_roots(roots)))


def import_scheduler(version: str) -> tuple[ModuleType, float]:
    """Import ``sglang.srt.managers.scheduler`` of ``version`` (:func:`prepare_imports` first); returns
    (module, seconds)."""
    prepare_imports(version)
    start = time.perf_counter()
    import importlib

    module = importlib.import_module("sglang.srt.managers.scheduler")
    return module, time.perf_counter() - start
