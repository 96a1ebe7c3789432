"""The import stand-ins on their own (no SGLang needed): what a stand-in module must support, and its scope."""

from __future__ import annotations

import importlib
import sys

import pydantic
import pytest

from kvledger.engines.sglang.standins import StandinModule, missing_roots, standins

FAKE = "kvledger_fake_gpu_lib"


@pytest.fixture
def clean_fake():
    yield
    for name in [m for m in sys.modules if m == FAKE or m.startswith(FAKE + ".")]:
        del sys.modules[name]


def test_a_standin_imports_calls_decorates_subscripts_and_subclasses(clean_fake: None) -> None:
    with standins((FAKE,)) as finder:
        mod = importlib.import_module(f"{FAKE}.language.extra.cuda")
        top = sys.modules[FAKE]

        @top.jit
        def kernel(x: int) -> int:
            return x + 1

        @top.jit(do_not_specialize=["x"])
        def kernel2(x: int) -> int:
            return x * 2

        class Sub(top.Base):  # type: ignore[name-defined,misc]
            pass

        class Model(pydantic.BaseModel):
            tag: top.StructuralTag | None = None  # type: ignore[name-defined]

    assert isinstance(mod, StandinModule) and FAKE in finder.created[0]
    assert kernel(1) == 2 and kernel2 is not None and top.Anything[int] is top.Anything
    assert issubclass(Sub, top.Base) and Model(tag=3).tag == 3
    # the finder is gone after the block: a name it never synthesised is not found any more
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"{FAKE}_other")


def test_real_modules_win_and_the_triton_standin_computes(clean_fake: None) -> None:
    assert "json" not in missing_roots(("json",))
    with standins(("json",)) as finder:
        import json

        assert not isinstance(json, StandinModule) and finder.created == []
    with standins((FAKE,)):
        mod = importlib.import_module(FAKE)
    assert mod.SomeClass is mod.SomeClass  # attributes are stable once made
    # what the triton stand-in computes for real (used only where triton is absent)
    from kvledger.engines.sglang import standins as s

    assert (s._cdiv(7, 4), s._next_power_of_2(5), s._next_power_of_2(8), s._next_power_of_2(1)) == (
        2,
        8,
        8,
        1,
    )
    with pytest.raises(RuntimeError):  # FLA's device probe falls back to "cpu" when this raises
        s._NoDriver().get_current_target()
