"""``kvledger.process.staged.staged``: an output appears whole when the block succeeds, or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvledger.process.staged import staged


def test_a_block_that_succeeds_publishes_what_it_wrote(tmp_path: Path) -> None:
    log, plot, unused = tmp_path / "run.jsonl", tmp_path / "new" / "plot.svg", tmp_path / "never.png"
    with staged(log, plot, unused) as (log_tmp, plot_tmp, _):
        assert log_tmp.parent == tmp_path and log_tmp.name != log.name and plot_tmp.suffix == ".svg"
        log_tmp.write_text("whole\n")
        plot_tmp.write_text("<svg/>")
        assert not log.exists() and not plot.exists()  # nothing under the final names until the end
    assert log.read_text() == "whole\n" and plot.read_text() == "<svg/>"
    assert not unused.exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["new", "plot.svg", "run.jsonl"]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError, SystemExit])
def test_a_block_that_stops_leaves_nothing(tmp_path: Path, stop: type[BaseException]) -> None:
    existing = tmp_path / "run.jsonl"
    existing.write_text("the previous run\n")
    with pytest.raises(stop), staged(existing, tmp_path / "a" / "b" / "plot.png") as (log_tmp, plot_tmp):
        log_tmp.write_text("cut off")
        plot_tmp.write_text("half")
        raise stop()
    assert existing.read_text() == "the previous run\n"  # untouched: the new one never replaced it
    assert [p.name for p in tmp_path.iterdir()] == ["run.jsonl"]  # no temporary, no directory made for it


def test_a_device_is_written_in_place(tmp_path: Path) -> None:
    with staged(Path("/dev/null"), tmp_path / "x.txt") as (dev, tmp):
        assert dev == Path("/dev/null") and tmp != tmp_path / "x.txt"
