"""Import SGLang's memory modules once per process, on CPU, with the stand-ins of :mod:`.standins`.

Which SGLang is imported: the one installed in the environment (``pip install --no-deps
sglang==0.5.23``, what ``scripts/setup_sglang.sh`` does), unless ``KVLEDGER_SGLANG_RELEASE_DIR`` (or
:func:`load`'s ``release_dir``) names a folder made with ``pip install --no-deps --target DIR
sglang==X``; that folder is then put first on ``sys.path``. Two SGLang releases cannot share one
process (both are the package ``sglang``), so a second release runs in a subprocess.

Supported releases: :data:`SUPPORTED_RELEASES`. 0.5.23 is the newest release and has the legacy
``RadixCache`` and the ``UnifiedRadixCache`` the scheduler builds; 0.5.20 is the last release with
``MambaRadixCache`` (deleted upstream by PR #40313).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from kvledger.contracts.errors import KVLedgerError
from kvledger.engines.modules import EngineModules
from kvledger.engines.sglang.standins import RELEASE_STANDIN_ROOTS, STANDIN_ROOTS, standins

SUPPORTED_RELEASES: tuple[str, ...] = ("0.5.11", "0.5.12", "0.5.13", "0.5.20", "0.5.23")
"""SGLang releases whose memory components this package builds and watches (tests run each).

0.5.23 and 0.5.20 are the current and the last-with-``MambaRadixCache`` releases; 0.5.11, 0.5.12 and
0.5.13 are historical, releases that still had a catalogued bug and the ones that fixed it
(:data:`HISTORICAL_RELEASES`)."""

HISTORICAL_RELEASES: dict[str, str] = {
    "0.5.11": "B14 present: UnifiedRadixCache's MAMBA lock release re-reads the node's state",
    "0.5.12": "B14 fixed: the lock records the components it skipped (skip_lock_node_ids);"
    " N1 present: free_mamba_cache leaves the request's ping-pong handle set",
    "0.5.13": "N1 fixed: free_mamba_cache clears mamba_ping_pong_track_buffer (PR #26941)",
}

RELEASE_DIR_ENV = "KVLEDGER_SGLANG_RELEASE_DIR"


class SGLangUnavailable(KVLedgerError, ImportError):
    """SGLang (the optional extra) is not installed, or is a release this package does not support."""

    invariant = "I-TYPED-INPUT"


@dataclass
class SGLangModules(EngineModules):
    """The imported SGLang modules and classes the builders and the attach use."""

    @property
    def has_mamba_radix_cache(self) -> bool:
        return "MambaRadixCache" in self.classes

    @property
    def has_unified_radix_cache(self) -> bool:
        return "UnifiedRadixCache" in self.classes


# (module, names) imported from every supported release; then the release-specific ones.
_COMMON: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sglang.srt.mem_cache.allocator", ("TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator")),
    (
        "sglang.srt.mem_cache.memory_pool",
        ("MHATokenToKVPool", "ReqToTokenPool", "HybridReqToTokenPool", "MambaPool"),
    ),
    ("sglang.srt.mem_cache.radix_cache", ("RadixCache", "RadixKey", "TreeNode")),
    ("sglang.srt.mem_cache.cache_init_params", ("CacheInitParams",)),
    ("sglang.srt.mem_cache.base_prefix_cache", ("MatchPrefixParams", "InsertParams", "EvictParams")),
    ("sglang.srt.configs.mamba_utils", ("Mamba2CacheParams", "Mamba2StateShape")),
)
_OPTIONAL: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sglang.srt.mem_cache.mamba_radix_cache", ("MambaRadixCache",)),
    ("sglang.srt.mem_cache.unified_radix_cache", ("UnifiedRadixCache",)),
    ("sglang.srt.mem_cache.unified_cache.component_type", ("ComponentType",)),
    # 0.5.11 to 0.5.16 keep the component types beside the tree components
    ("sglang.srt.mem_cache.unified_cache_components.tree_component", ("ComponentType",)),
)

_loaded: SGLangModules | None = None


def _version_of(module: ModuleType) -> str:
    version = getattr(module, "__version__", None)
    if version is None:
        version = importlib.import_module("sglang.version").__version__
    return str(version)


def _release_on_path() -> str | None:
    """The version of the ``sglang`` an import would find, read from the ``_version.py`` its build wrote
    (``__version__ = version = '0.5.11'``), without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        return None
    text = Path(spec.origin).with_name("_version.py")
    if not text.is_file():
        return None
    for line in text.read_text().splitlines():
        if line.startswith("__version__") and "=" in line:
            return line.rsplit("=", 1)[1].strip().strip("\"'")
    return None


def load(release_dir: str | os.PathLike[str] | None = None) -> SGLangModules:
    """Import SGLang's memory modules (once per process) and return their classes.

    Raises :class:`SGLangUnavailable` when SGLang is absent, a different release is already imported,
    or the release is not in :data:`SUPPORTED_RELEASES`.
    """
    global _loaded
    wanted = release_dir if release_dir is not None else os.environ.get(RELEASE_DIR_ENV)
    if _loaded is not None:
        if wanted is not None and not _loaded.location.startswith(str(Path(wanted).resolve())):
            raise SGLangUnavailable(
                f"SGLang {_loaded.version} from {_loaded.location} is already imported in this process;"
                f" a second release ({wanted}) needs its own process"
            )
        return _loaded
    if wanted is not None:
        folder = str(Path(wanted).resolve())
        if not Path(folder, "sglang").is_dir():
            raise SGLangUnavailable(f"{RELEASE_DIR_ENV}={wanted}: no sglang package in that folder")
        if folder not in sys.path:
            sys.path.insert(0, folder)
    start = time.perf_counter()
    classes: dict[str, Any] = {}
    # SGLang's layer modules warn about every quantisation method a CPU cannot run and log their
    # platform probes; none of it concerns the memory components.
    roots = STANDIN_ROOTS + RELEASE_STANDIN_ROOTS.get(_release_on_path() or "", ())
    with standins(roots) as finder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            try:
                top = importlib.import_module("sglang")
            except ImportError as exc:
                raise SGLangUnavailable(
                    f"SGLang is not installed ({exc}); run: bash scripts/setup_sglang.sh"
                ) from exc
            version = _version_of(top)
            if version not in SUPPORTED_RELEASES:
                raise SGLangUnavailable(
                    f"SGLang {version} is not a supported release (supported: {', '.join(SUPPORTED_RELEASES)})"
                )
            for name, attrs in _COMMON:
                module = importlib.import_module(name)
                classes.update((a, getattr(module, a)) for a in attrs)
            for name, attrs in _OPTIONAL:
                try:
                    module = importlib.import_module(name)
                except ModuleNotFoundError as exc:
                    if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                        raise  # a module the release has failed on its own imports
                    continue
                if any(a in classes for a in attrs):
                    continue
                classes.update((a, getattr(module, a)) for a in attrs)
        finally:
            logging.disable(previous)
    _loaded = SGLangModules(
        version=version,
        location=str(Path(top.__file__ or "").parent),
        import_seconds=time.perf_counter() - start,
        standins=sorted({n.partition(".")[0] for n in finder.created}),
        classes=classes,
    )
    return _loaded


def available() -> str | None:
    """None when SGLang can be loaded here; else the one-line reason (for a test skip)."""
    try:
        load()
    except SGLangUnavailable as exc:
        return str(exc)
    return None
