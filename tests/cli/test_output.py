"""What the commands print: whole IDs and paths off a terminal, ``museum --json``, explore's progress."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvledger.cli import hunt as hunt_cli
from kvledger.cli import main
from kvledger.cli.museum_index import EXHIBITS
from kvledger.museum.hunt import HuntResult
from tests.cli.process import kvledger


def test_museum_table_keeps_every_id_and_name_whole_in_a_pipe() -> None:
    """Piped (stdout is not a terminal), a narrow COLUMNS must not cut an invariant ID short with an ellipsis."""
    done = kvledger("museum", env={"COLUMNS": "40"})
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    for e in EXHIBITS:
        assert f" {e['id']} " in done.stdout, e["id"]
        assert ", ".join(e["breaks"]) in done.stdout, e["breaks"]
        for replaced in e["replaces"].split(", "):
            assert replaced in done.stdout, replaced


def test_museum_json_lists_every_exhibit() -> None:
    done = kvledger("museum", "--json")
    assert done.returncode == 0 and done.stderr == ""
    doc = json.loads(done.stdout)
    assert [e["id"] for e in doc] == [e["id"] for e in EXHIBITS]
    b1 = doc[0]
    assert b1["id"] == "B1" and b1["huntable"] is True and b1["machine"] == "scheduler"
    assert b1["breaks"][0] == "I-NODUP-FREE" and b1["replaces"] == "Scheduler.process_batch_result"
    out_of_scope = [e for e in doc if not e["huntable"]]
    assert out_of_scope and all(e["why_out_of_scope"] for e in out_of_scope)


def _result(**kw: Any) -> HuntResult:
    base: dict[str, Any] = dict(
        exhibit="N6a", machine="pd", found=True, seconds=3.25, shrink_seconds=1.0, examples=40,
        invariant="I-HANDLE-OWNED", expected=True, repro_steps=7,
        repro="hunt-repros/a/deeply/nested/directory/for/the/repro/scripts/repro_N6a.py",
        repro_verified=True, message="I-HANDLE-OWNED: ...",
    )  # fmt: skip
    base.update(kw)
    return HuntResult(**base)


def test_hunt_table_keeps_invariant_ids_and_repro_paths_whole_in_a_pipe(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    hunt_cli._summary([_result(), _result(exhibit="#16067", invariant="I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT", repro=None)])
    out = capsys.readouterr().out
    assert "…" not in out
    for whole in ("I-HANDLE-OWNED", "I-ROW-EXCLUSIVE-WHILE-IN-FLIGHT", "#16067", str(_result().repro)):
        assert whole in out, whole


def test_explore_reports_progress_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explore", "--depth", "2", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    lines = captured.err.splitlines()
    for run in doc["runs"]:
        where = f"explore (clean) on {run['scope']}"
        assert f"{where}: to depth 2" in lines
        assert any(line.startswith(f"{where}: depth 1 of 2 reached, ") for line in lines)
        assert f"{where}: clean ({run['states']:,} states, {run['schedules']:,} schedules," in captured.err


def test_hunt_results_on_a_narrow_terminal_are_short_blocks_not_a_folded_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An 80-column terminal folded the table's row into three-line cells; there, each hunt is one line (and
    its repro on a second), every ID and path whole."""
    from io import StringIO

    from rich.console import Console

    buffer = StringIO()
    monkeypatch.setattr(hunt_cli, "console", lambda: Console(file=buffer, width=80, force_terminal=True))
    hunt_cli._summary([_result(), _result(exhibit="#16067", found=False, invariant=None, repro=None)])
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("N6a (pd): found I-HANDLE-OWNED (listed) in 3.2 s, 40 examples"), lines
    assert lines[1] == f"  repro: {_result().repro} (7 steps, verified)", lines
    assert any(line.startswith("#16067 (pd): not found in 3.2 s, 40 examples") for line in lines), lines
    assert not any(c in buffer.getvalue() for c in "┏┃│"), "a table was printed"


def test_hunt_says_what_it_does_after_the_first_failure(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Shrinking and verifying count no example: the progress names each phase instead of standing still."""
    assert main(["hunt", "--exhibit", "B8", "--batches", "8", "--shrink", "2", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    phases = [line for line in err if line.startswith("hunt B8: found, ")]
    assert phases == [f"hunt B8: found, {phase}" for phase in ("shrinking", "deleting steps", "verifying the repro")]
