"""Put an installed vLLM release on ``sys.path`` and import its v1 KV cache modules on CPU.

Releases live side by side in ``.venv/vllm-X`` (``scripts/setup_vllm.sh``: ``pip install --no-deps
--target``). Two releases cannot share a process (both are the package ``vllm``): the first
:func:`load` pins the process to one release, a different one afterwards is a typed error.

``vllm.v1.request`` imports the structured-output back-ends, whose grammar classes appear only in
annotations; xgrammar and llguidance (GPU-oriented, not installed) get stand-in modules whose every
attribute is an inert placeholder class (any submodule too: 0.30.0's parser imports
``xgrammar.structural_tag`` and builds one placeholder at module level). No vLLM code path the attach
drives calls them.

Releases: 0.34.0 (the default) and the pair of vLLM PR #55450 (align-mode Mamba retirement across null
gaps): 0.29.0 has the bug, 0.30.0 the fix (spec/vllm-attach.md, "Historical bugs").
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvledger.contracts.errors import KVLedgerError
from kvledger.engines.modules import EngineModules

DEFAULT_RELEASE = "0.34.0"
SUPPORTED_RELEASES: tuple[str, ...] = ("0.29.0", "0.30.0", "0.34.0")
RELEASE_DIR_ENV = "KVLEDGER_VLLM_RELEASE_DIR"
STANDIN_MODULES: tuple[str, ...] = ("xgrammar", "llguidance")  # with every submodule


class VLLMUnavailable(KVLedgerError, ImportError):
    """The requested vLLM release is not installed here, or another release is already imported."""

    invariant = "I-TYPED-INPUT"


def _accept_anything(self: object, *args: object, **kwargs: object) -> None:
    del self, args, kwargs


class _StandinModule(types.ModuleType):
    """A package whose attributes are placeholder classes: enough for annotations, isinstance and a
    module-level construction (the placeholder ignores its arguments)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package: ``import xgrammar.structural_tag`` reaches the finder

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        placeholder = type(name, (), {"__module__": self.__name__, "__init__": _accept_anything})
        setattr(self, name, placeholder)
        return placeholder


class _StandinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a stand-in for any submodule of :data:`STANDIN_MODULES`, only while :func:`load` imports."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        # only under a root that is itself a stand-in (a real xgrammar, if installed, is left alone)
        if isinstance(sys.modules.get(fullname.split(".")[0]), _StandinModule):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return _StandinModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        del module


@dataclass
class VLLMModules(EngineModules):
    """The imported vLLM classes the builder and the attach use."""


_IMPORTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vllm.v1.core.kv_cache_manager", ("KVCacheManager", "KVCacheBlocks")),
    ("vllm.v1.core.block_pool", ("BlockPool",)),
    ("vllm.v1.core.kv_cache_coordinator", ("HybridKVCacheCoordinator",)),
    ("vllm.v1.core.single_type_kv_cache_manager", ("FullAttentionManager", "MambaManager")),
    ("vllm.v1.core.kv_cache_utils", ("get_request_block_hasher", "init_none_hash", "KVCacheBlock")),
    (
        "vllm.v1.kv_cache_interface",
        ("FullAttentionSpec", "MambaSpec", "KVCacheConfig", "KVCacheGroupSpec"),
    ),
    ("vllm.v1.request", ("Request",)),
    ("vllm.sampling_params", ("SamplingParams",)),
    ("vllm.utils.hashing", ("sha256",)),
)

_LOADED: VLLMModules | None = None


def release_dir(release: str) -> Path:
    """The side-by-side folder of ``release`` (``KVLEDGER_VLLM_RELEASE_DIR`` overrides it)."""
    env = os.environ.get(RELEASE_DIR_ENV)
    if env:
        return Path(env)
    return Path(sys.prefix) / f"vllm-{release}"


def load(release: str = DEFAULT_RELEASE) -> VLLMModules:
    """Import ``release``'s v1 KV cache modules once per process.

    Pre: ``release`` is in :data:`SUPPORTED_RELEASES` and installed; no other release imported.
    Post: the same :class:`VLLMModules` is returned on every later call with the same release.
    """
    global _LOADED
    if _LOADED is not None:
        if _LOADED.version != release:
            raise VLLMUnavailable(
                f"vLLM {_LOADED.version} is already imported in this process; {release} needs its own"
            )
        return _LOADED
    if release not in SUPPORTED_RELEASES:
        raise VLLMUnavailable(f"vLLM {release!r} is not supported (supported: {SUPPORTED_RELEASES})")
    folder = release_dir(release)
    if not (folder / "vllm").is_dir():
        raise VLLMUnavailable(f"vLLM {release} is not installed in {folder}: run scripts/setup_vllm.sh")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    placed = [name for name in STANDIN_MODULES if name not in sys.modules]
    for name in placed:
        sys.modules[name] = _StandinModule(name)
    finder = _StandinFinder()
    sys.meta_path.insert(0, finder)
    started = time.perf_counter()
    classes: dict[str, Any] = {}
    try:
        for module_name, names in _IMPORTS:
            module = importlib.import_module(module_name)
            for name in names:
                classes[name] = getattr(module, name)
    finally:
        sys.meta_path.remove(finder)
    vllm = importlib.import_module("vllm")
    location = str(Path(vllm.__file__ or "").parent)
    # The stand-ins are bound where vLLM imported them; leaving them in sys.modules would make
    # other code (matplotlib probes, SGLang's optional imports) believe the real packages exist.
    # vLLM's LazyLoader also registers them under its local aliases (``xgr``): drop every one.
    for name in [n for n, m in list(sys.modules.items()) if isinstance(m, _StandinModule)]:
        sys.modules.pop(name, None)
    if not location.startswith(str(folder)):
        raise VLLMUnavailable(f"imported vllm from {location}, not from {folder}")
    _LOADED = VLLMModules(release, location, time.perf_counter() - started, placed, classes)
    return _LOADED
