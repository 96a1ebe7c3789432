"""The timeline plots label each pool's axis with its unit, the ``--pd`` ones included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import pytest

from kvledger.sim.pd import PDSimOptions, run_pd_simulation
from kvledger.sim.report import pd_timeline_paths, plot_pd_timelines, plot_timeline
from kvledger.sim.simulate import SimOptions, run_simulation
from kvledger.sim.workload import GSPWorkload

matplotlib.use("Agg")

WORKLOAD = GSPWorkload(num_groups=1, prompts_per_group=4, system_prompt_len=64, question_len=16, output_len=8)


@pytest.fixture
def labels(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Per file written: the y-axis labels of its figure, read as it is saved."""
    from matplotlib.figure import Figure

    seen: dict[str, list[str]] = {}
    save = Figure.savefig

    def spy(self: Figure, fname: Any, *args: Any, **kwargs: Any) -> None:
        seen[Path(fname).name] = [ax.get_ylabel() for ax in self.axes]
        save(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


def test_each_axis_is_labelled_with_its_pools_unit(labels: dict[str, list[str]], tmp_path: Path) -> None:
    result = run_simulation(SimOptions(workload=WORKLOAD, kv_pool_tokens=512))
    plot_timeline(result, tmp_path / "t.png")
    assert labels["t.png"] == ["kv (tokens)", "req (rows)", "mamba (slots)"]


def test_pd_timelines_label_each_axis_with_its_unit(labels: dict[str, list[str]], tmp_path: Path) -> None:
    result = run_pd_simulation(PDSimOptions(base=SimOptions(workload=WORKLOAD, kv_pool_tokens=512, mamba_slots=8)))
    paths = pd_timeline_paths(tmp_path / "t.svg")
    assert paths == {"prefill": tmp_path / "t.prefill.svg", "decode": tmp_path / "t.decode.svg"}
    assert plot_pd_timelines(result, paths) == list(paths.values())
    expected = ["kv (tokens)", "req (rows)", "mamba (slots)", "metadata (slots)"]
    assert labels["t.prefill.svg"] == expected and labels["t.decode.svg"] == expected
    assert not any("(ids)" in label for names in labels.values() for label in names)
