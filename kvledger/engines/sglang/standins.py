"""Stand-ins for the GPU-only or heavy modules SGLang's memory modules import but never run on CPU.

SGLang's allocator, pool and radix-cache modules import, at module level, configuration and layer
packages that in turn import modules whose code only a GPU server (or a notebook) ever executes. On
CPU the memory components never call into them; only the ``import`` statement has to succeed. A
stand-in is a synthetic module for exactly those names, installed on ``sys.meta_path`` for the
duration of the import (:func:`standins`) and removed afterwards; a real module of the same name, when
installed, always wins (the finder only answers for names no other finder can find).

What each stand-in replaces, and why the CPU path never runs it:

``IPython``
    ``sglang.utils`` imports ``IPython.display`` for a notebook helper (``print_highlight`` and the
    like). The memory components never display anything.
``tvm_ffi``
    Apache TVM's FFI, reached through ``memory_pool`` -> ``dp_attention`` -> a custom all-reduce op. The
    all-reduce runs only between GPUs of a data-parallel attention group.
``torchvision``
    Imported by a multimodal image-processing utility module on the config chain. Image preprocessing
    is never called by a pool or a tree; installing the real package unpinned would pull another torch.
``xgrammar``
    (0.5.20) used as a type in a pydantic field of the structured-output config. Grammar compilation
    is a sampler concern; pools and trees never compile a grammar.
``triton``
    Only when the real package is absent (kvledger itself depends on triton 3.7.1, so normally the real
    one is used). Kernel modules decorate functions with ``@triton.jit`` at import and call
    ``triton.cdiv`` / ``triton.next_power_of_2`` on sizes; on CPU, SGLang's platform reports
    ``supports_triton = False`` and the paged allocator takes its ``*_naive`` torch paths, so no kernel
    is launched. The stand-in computes ``cdiv`` and ``next_power_of_2`` for real, and its
    ``runtime.driver.active.get_current_target()`` raises, which is how FLA's device probe falls back
    to ``"cpu"``.

A stand-in module answers any attribute with a placeholder class that can be called (returning a
placeholder, or the function itself when used as a bare decorator), subscripted, subclassed and
inspected; submodules (``triton.language.extra.cuda``) are synthesised on import. Nothing of SGLang's
is edited or copied: this module only decides what an ``import`` of a missing name yields.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

STANDIN_ROOTS: tuple[str, ...] = ("IPython", "tvm_ffi", "torchvision", "xgrammar", "triton")
"""Top-level names that get a stand-in when no real module of that name can be found."""

RELEASE_STANDIN_ROOTS: dict[str, tuple[str, ...]] = {"0.5.11": ("sgl_kernel",), "0.5.12": ("sgl_kernel",)}
"""Further stand-ins for one release only. ``sgl_kernel`` (SGLang's CUDA kernel package): 0.5.11 and
0.5.12 import its HiCache transfer kernels (``sgl_kernel.kvcacheio``) at module level in the host-memory
pool, which a CPU run without HiCache never constructs. Later releases guard that import themselves
(an ``ImportError`` selects their fallback), so a stand-in there would change which path they take."""


class _PlaceholderMeta(type):
    """The metaclass of every placeholder: attribute access, calls and subscripts yield placeholders."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        # A bare decorator (``@triton.jit``, ``@torch_compile``) gets its function back unchanged; any
        # other call (a decorator with arguments, a constructor) yields another placeholder.
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _PlaceholderMeta):
            return args[0]
        return cls

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Iterator[Any]:
        return iter(())

    def __bool__(cls) -> bool:
        return False

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__


def _any_schema(cls: type, source: Any, handler: Any) -> Any:
    """A placeholder used as a pydantic field type (0.5.20: ``xgrammar.StructuralTag``) accepts anything."""
    from pydantic_core import core_schema

    return core_schema.any_schema()


def _placeholder(name: str) -> type:
    namespace = {
        "__module__": "kvledger.engines.sglang.standins",
        "__get_pydantic_core_schema__": classmethod(_any_schema),
    }
    return _PlaceholderMeta(name, (), namespace)


def _cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


class _NoDriver:
    """``triton.runtime.driver.active``: asking it for the current target raises, as with no GPU."""

    def get_current_target(self) -> Any:
        raise RuntimeError("kvledger stand-in for triton: no GPU driver on this machine")

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("kvledger stand-in for triton: no GPU driver on this machine")


class StandinModule(types.ModuleType):
    """A synthetic module: every missing attribute is a placeholder class."""

    __standin__ = True

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


def _populate(module: StandinModule) -> None:
    """What a few stand-ins must compute for real (the rest are placeholders)."""
    if module.__name__ == "triton":
        module.cdiv = _cdiv  # type: ignore[attr-defined]
        module.next_power_of_2 = _next_power_of_2  # type: ignore[attr-defined]
        module.__version__ = "0.0.0+kvledger-standin"  # type: ignore[attr-defined]
    elif module.__name__ == "triton.runtime":
        module.driver = types.SimpleNamespace(active=_NoDriver())  # type: ignore[attr-defined]
    elif module.__name__ in ("torchvision", "xgrammar", "IPython", "tvm_ffi"):
        module.__version__ = "0.0.0+kvledger-standin"  # type: ignore[attr-defined]


class _StandinLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandinModule(spec.name)
        module.__path__ = []  # a package: submodules are synthesised too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        assert isinstance(module, StandinModule)
        _populate(module)


class StandinFinder(importlib.abc.MetaPathFinder):
    """Answers only for ``roots`` (and their submodules) that no other finder on ``sys.meta_path`` finds.

    It sits last on ``sys.meta_path``, so real packages are always preferred; a submodule of a real
    package is never synthesised (its parent's finder decides).
    """

    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = tuple(roots)
        self.created: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        root = fullname.partition(".")[0]
        if root not in self.roots:
            return None
        parent = sys.modules.get(root)
        if "." in fullname and not isinstance(parent, StandinModule):
            return None  # a real package: its own finders answer for its submodules
        self.created.append(fullname)
        return importlib.machinery.ModuleSpec(fullname, _StandinLoader(), is_package=True)


def missing_roots(roots: Sequence[str] = STANDIN_ROOTS) -> list[str]:
    """The names among ``roots`` that no real installed module provides (those get a stand-in)."""
    out = []
    for name in roots:
        mod = sys.modules.get(name)
        if mod is not None:
            if isinstance(mod, StandinModule):
                out.append(name)
            continue
        if importlib.util.find_spec(name) is None:
            out.append(name)
    return out


@contextlib.contextmanager
def standins(roots: Sequence[str] = STANDIN_ROOTS) -> Iterator[StandinFinder]:
    """Install stand-ins for the missing ``roots`` while the block runs, then take the finder away.

    Afterwards the finder is removed and so are the stand-in modules from ``sys.modules`` (SGLang's
    modules keep the references they took at import): a later ``import IPython`` elsewhere in the
    process fails as it would have without kvledger, and code that probes ``sys.modules`` (matplotlib
    looks for ``IPython`` there when it makes a figure) never meets a stand-in.
    """
    finder = StandinFinder(missing_roots(roots))
    sys.meta_path.append(finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, StandinModule)]:
            del sys.modules[name]
