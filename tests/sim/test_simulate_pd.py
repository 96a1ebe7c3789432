"""``kvledger simulate --pd``: per-instance summaries and timelines, with the PD accounts in them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvledger.cli import main
from kvledger.sim.pd import PDSimOptions, run_pd_simulation
from kvledger.sim.simulate import SimOptions
from kvledger.sim.workload import GSPWorkload
from tests.sim.test_simulate import SMALL

WORKLOAD = GSPWorkload(num_groups=2, prompts_per_group=4, system_prompt_len=96, question_len=24, output_len=12)


def test_pd_timelines_reach_pool_size_and_show_the_pd_accounts() -> None:
    opts = PDSimOptions(
        base=SimOptions(workload=WORKLOAD, kv_pool_tokens=640, mamba_slots=8, chunked_prefill_size=64),
        fault_rate=0.1,
        abort_rate=0.1,
    )
    result = run_pd_simulation(opts)
    assert result.violation is None, result.violation
    assert result.finished + result.aborted + result.rejected == 8 and result.finished > 0
    seen: dict[str, set[str]] = {"prefill": set(), "decode": set()}
    for side, timeline in result.timelines.items():
        assert set(timeline[0]) == {"kv", "req", "mamba", "metadata"}
        for snap in timeline:
            for pool, row in snap.items():
                assert sum(v for k, v in row.items() if k != "size") == row["size"], (side, pool, row)
                seen[side] |= {k for k, v in row.items() if v and k.startswith("pd.")}
    assert "pd.prefill.inflight" in seen["prefill"] and "pd.decode.transfer" in seen["decode"]
    decode = result.instances["decode"]
    assert decode.transfers_started >= decode.transfers_succeeded >= result.finished  # some aborted later
    assert result.longest_drain <= result.drain_bound
    assert sum(result.channel["faults"].values()) > 0  # the seeded faults fired


def test_cli_pd_json_and_two_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "timeline.png"
    argv = ["simulate", *SMALL, "--pd", "--pd-fault-rate", "0.05", "--json", "--plot", str(plot)]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["violations"] == 0 and out["requests"] == 8
    for side in ("prefill", "decode"):
        summary = out["instances"][side]
        for key in ("transfers_started", "transfers_succeeded", "failures", "retries", "aborts_by_stage"):
            assert key in summary
        png = tmp_path / f"timeline.{side}.png"
        assert str(png) in out["plots"] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_pd_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--pd", "--no-progress", "--plot", str(tmp_path / "t.png")]) == 0
    text = capsys.readouterr().out
    assert "per instance" in text and "aborts by stage" in text and "t.decode.png" in text


def test_cli_pd_table_with_faults_stays_narrow_and_shows_the_decode_side_prefix_hits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log is not a terminal: the tables never wrap or cut a cell there, so a breakdown (faults by kind,
    failures by reason) is one entry per line, not one line of hundreds of characters; the decode side's
    prefix hits are in the table, not only in --json."""
    args = ["simulate", *SMALL, "--pd", "--pd-decode-cache", "--pd-fault-rate", "0.3", "--pd-abort-rate", "0.05"]
    assert main([*args, "--no-progress", "--no-plot"]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 160, max(text.splitlines(), key=len)
    assert re.search(r"prefix hits \(tokens not transferred\)\s+.\s+0 \(0\)\s+.\s+\d+ \(\d+\)", text), text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pd", "--pd-fault-rate", "1.5"], "argument --pd-fault-rate: must be a probability in [0, 1], got 1.5"),
        (["--pd", "--pd-abort-rate", "x"], "argument --pd-abort-rate: expected a number, got 'x'"),
        (["--pd", "--pd-latency", "0"], "argument --pd-latency: must be >= 1, got 0"),
        (["--pd", "--pd-transfer-timeout", "0"], "argument --pd-transfer-timeout: must be >= 1, got 0"),
        (["--pd-fault-rate", "0.1"], "--pd-fault-rate applies to --pd runs only: add --pd"),
    ],
)
def test_bad_pd_options_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    try:
        code = main(["simulate", *args, "--no-progress", "--no-plot"])
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
