"""The import stand-ins leave nothing behind: after SGLang's modules are loaded, no stand-in is in
``sys.modules`` (matplotlib probes ``sys.modules["IPython"]`` when it makes a figure, and a stand-in there
broke every plot made later in the same process)."""

from __future__ import annotations

import sys
from typing import Any

from kvledger.engines.sglang.standins import StandinModule


def test_no_stand_in_is_left_in_sys_modules(sgl: Any) -> None:
    left = sorted(n for n, m in sys.modules.items() if isinstance(m, StandinModule))
    assert left == []


def test_a_figure_can_be_made_after_sglang_was_loaded(sgl: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots()
    plt.close(fig)
