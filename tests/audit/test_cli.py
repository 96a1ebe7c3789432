"""``kvledger simulate --record FILE`` then ``kvledger audit FILE``: exit 0 clean, 1 violation, 2 bad file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvledger.cli import main
from tests.sim.test_simulate import SMALL


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audit") / "run.jsonl"
    assert main(["simulate", *SMALL, "--no-plot", "--json", "--record", str(path)]) == 0
    return path


def test_a_recorded_simulate_run_audits_clean(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["audit", str(recorded), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["clean"] is True and out["requests"] == 8 and out["steps"] > 0
    assert out["events"] == len(recorded.read_text().splitlines())
    assert main(["audit", str(recorded)]) == 0
    assert "clean: every event keeps every invariant" in capsys.readouterr().out


def test_a_planted_double_free_exits_1_naming_the_event(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = recorded.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if '"ev":"free"' in line)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]]) + "\n")
    capsys.readouterr()
    assert main(["audit", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"VIOLATION at event {i + 2}:" in out and "I-NODUP-FREE" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot be read"), ("not json\n", "event 1: not JSON")],
    ids=["missing", "garbage"],
)
def test_an_unreadable_log_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "log.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["audit", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvledger audit: error: ") and message in err


def test_record_path_is_checked_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--no-plot", "--record", str(tmp_path)]) == 2
    assert f"--record {tmp_path}: is a directory" in capsys.readouterr().err


def test_pd_record_paths_are_checked_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --pd, --record writes one log per instance beside FILE (tests/disagg/test_pd_record.py): a
    directory where one of them goes is refused before the run, and nothing is written."""
    (tmp_path / "run.decode.jsonl").mkdir()
    log = tmp_path / "run.jsonl"
    assert main(["simulate", *SMALL, "--no-plot", "--pd", "--record", str(log)]) == 2
    assert f"--record {tmp_path / 'run.decode.jsonl'}: is a directory" in capsys.readouterr().err
    assert not (tmp_path / "run.prefill.jsonl").exists() and not log.exists()


def test_a_cut_off_log_exits_1_as_incomplete_never_clean(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``head -100 run.jsonl > t.jsonl; kvledger audit t.jsonl``: a violation-class result (1), not 0."""
    cut = tmp_path / "t.jsonl"
    cut.write_bytes(b"".join(recorded.read_bytes().splitlines(keepends=True)[:100]))
    capsys.readouterr()
    assert main(["audit", str(cut), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["clean"] is False and out["verdict"] == "incomplete" and out["outcome"] is None
    assert out["violation"].startswith("incomplete log: no end marker after event 100")
    assert main(["audit", str(cut)]) == 1
    assert "incomplete log" in capsys.readouterr().out.lower()


def test_auditing_the_name_given_to_a_pd_record_names_the_two_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``simulate --pd --record run.jsonl`` writes run.prefill.jsonl and run.decode.jsonl; ``audit
    run.jsonl`` says so, naming both commands, instead of only "cannot be read"."""
    log = tmp_path / "run.jsonl"
    assert main(["simulate", *SMALL, "--no-plot", "--no-progress", "--pd", "--record", str(log)]) == 0
    capsys.readouterr()
    assert main(["audit", str(log)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for side in ("prefill", "decode"):
        assert f"kvledger audit {tmp_path / f'run.{side}.jsonl'}" in err, err
