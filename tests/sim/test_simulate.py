"""``kvledger simulate``: the main job's outputs (table, JSON, plot) and the timeline's identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvledger import __version__
from kvledger.cli import main
from kvledger.sim.simulate import SimOptions, run_simulation
from kvledger.sim.workload import GSPWorkload

SMALL = [
    "--gsp-num-groups",
    "2",
    "--gsp-prompts-per-group",
    "4",
    "--gsp-system-prompt-len",
    "96",
    "--gsp-question-len",
    "24",
    "--gsp-output-len",
    "12",
    "--kv-pool-tokens",
    "640",
    "--mamba-slots",
    "8",
    "--chunked-prefill-size",
    "64",
]


def test_workload_is_deterministic_and_shares_prefixes() -> None:
    wl = GSPWorkload(
        num_groups=3, prompts_per_group=2, system_prompt_len=10, question_len=4, output_len=5, seed=7
    )
    reqs = wl.requests()
    assert reqs == wl.requests() and len(reqs) == 6
    systems = {tuple(p[:10]) for _, p, _ in reqs}
    assert len(systems) == 3 and all(len(p) == 14 and m == 5 for _, p, m in reqs)


@pytest.mark.parametrize("overlap", [False, True])
def test_timeline_stack_always_reaches_pool_size(overlap: bool) -> None:
    opts = SimOptions(
        workload=GSPWorkload(
            num_groups=2, prompts_per_group=4, system_prompt_len=96, question_len=24, output_len=12
        ),
        kv_pool_tokens=640,
        mamba_slots=8,
        chunked_prefill_size=64,
        overlap=overlap,
    )
    result = run_simulation(opts)
    assert result.violation is None and result.finished == 8
    assert result.prefix_hit_rate > 0
    for snap in result.timeline:
        for pool, row in snap.items():
            assert sum(v for k, v in row.items() if k != "size") == row["size"], (pool, row)


def test_cli_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "timeline.png"
    assert main(["simulate", *SMALL, "--json", "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "requests",
        "steps",
        "prefix_hit_rate",
        "retractions",
        "peak_use",
        "contract_checks",
        "violations",
    ):
        assert key in out
    assert out["violations"] == 0 and out["finished"] == out["requests"] == 8
    assert plot.exists() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--no-progress", "--plot", str(tmp_path / "t.png")]) == 0
    text = capsys.readouterr().out
    assert "prefix hit rate" in text and "violations" in text and "ledger timeline written" in text


def test_cli_tiny_hybrid_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--model", "tiny-hybrid", "--json", "--no-plot"]) == 0
    assert json.loads(capsys.readouterr().out)["finished"] == 8


def test_cli_contracts_off_reexecutes_with_the_switch() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvledger", "simulate", *SMALL, "--contracts", "off", "--json", "--no-plot"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "KVLEDGER_CONTRACTS"},
    ).stdout
    result = json.loads(out)
    assert result["contracts"] is False and result["contract_checks"] == 0 and result["finished"] == 8


def test_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvledger", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == f"kvledger {__version__}"


@pytest.mark.parametrize(
    ("chunk", "kv_pool_tokens", "overlap"),
    [(None, 640, False), (64, 640, False), (32, 320, True)],
    ids=["unchunked", "chunked", "chunked-tight-overlap"],
)
def test_prompt_token_totals_equal_the_sum_of_the_prompts(
    chunk: int | None, kv_pool_tokens: int, overlap: bool
) -> None:
    """Every prompt counts once and whole, however it was chunked or retracted; the hit rate is the
    cached share of all prompt tokens."""
    wl = GSPWorkload(num_groups=2, prompts_per_group=4, system_prompt_len=96, question_len=24, output_len=12)
    opts = SimOptions(
        workload=wl,
        kv_pool_tokens=kv_pool_tokens,
        mamba_slots=8,
        chunked_prefill_size=chunk,
        overlap=overlap,
        radix_cache=True,
        hybrid=chunk is not None,  # without chunking the Mamba cache only caches whole prompts
        mamba_chunk_size=16,  # extra_buffer's capture grid below the smallest chunk
    )
    result = run_simulation(opts)
    assert result.violation is None and result.finished == 8
    assert result.prompt_tokens == sum(len(p) for _, p, _ in wl.requests()) == 8 * 120
    assert 0 < result.cached_prompt_tokens < result.prompt_tokens
    assert result.prefix_hit_rate == round(result.cached_prompt_tokens / result.prompt_tokens, 4)


def test_reject_reasons_reach_the_table_and_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    from kvledger.sim.report import print_summary

    wl = GSPWorkload(num_groups=1, prompts_per_group=3, system_prompt_len=40, question_len=8, output_len=8)
    result = run_simulation(
        SimOptions(
            workload=wl,
            kv_pool_tokens=32,
            mamba_slots=4,
            chunked_prefill_size=16,
            mamba_chunk_size=16,
            mamba_track_interval=16,
        )
    )
    assert result.rejected == 3 and result.finished == 0 and result.prompt_tokens == 0
    assert result.reject_reasons == {"prompt + max_new_tokens exceeds the KV pool": 3}
    assert result.summary()["reject_reasons"] == result.reject_reasons
    print_summary(result)
    table = capsys.readouterr().out
    assert "rejected: prompt + max_new_tokens exceeds the KV pool" in table


# ---------------------------------------------------------------------- Mamba V2 (extra_buffer)
def test_the_default_run_uses_extra_buffer_and_v1_stays_selectable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", *SMALL, "--json", "--no-plot"]) == 0
    v2 = json.loads(capsys.readouterr().out)
    assert v2["options"]["mamba_strategy"] == "extra_buffer" and v2["violations"] == 0
    assert v2["mamba_tracking"]["captures"] > 0 and v2["mamba_tracking"]["donations"] > 0
    assert main(["simulate", *SMALL, "--mamba-strategy", "no_buffer", "--json", "--no-plot"]) == 0
    v1 = json.loads(capsys.readouterr().out)
    assert v1["options"]["mamba_strategy"] == "no_buffer" and v1["mamba_tracking"] is None
    assert v1["finished"] == v2["finished"] == 8 and v1["prefix_hit_rate"] > 0 and v2["prefix_hit_rate"] > 0


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("page_size", [4, 16])
def test_extra_buffer_at_page_sizes_above_one_keeps_every_identity(page_size: int, overlap: bool) -> None:
    opts = SimOptions(
        workload=GSPWorkload(
            num_groups=2, prompts_per_group=4, system_prompt_len=96, question_len=24, output_len=12
        ),
        kv_pool_tokens=640,
        mamba_slots=16,
        chunked_prefill_size=64,
        page_size=page_size,
        overlap=overlap,
        mamba_chunk_size=16,
        mamba_track_interval=16,
    )
    result = run_simulation(opts)
    assert result.violation is None and result.finished == 8
    assert result.mamba_tracking is not None and result.mamba_tracking["donations"] > 0
    assert result.prefix_hit_rate > 0
    for snap in result.timeline:
        for pool, row in snap.items():
            assert sum(v for k, v in row.items() if k != "size") == row["size"], (pool, row)


def test_the_issue_command_runs(tmp_path: Path) -> None:
    """``kvledger simulate --mamba-strategy extra_buffer --page-size 16`` (the whole default workload)."""
    command = ["kvledger", "simulate", "--mamba-strategy", "extra_buffer", "--page-size", "16"]
    out = subprocess.run(
        [sys.executable, "-m", *command, "--json", "--plot", str(tmp_path / "t.png")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    result = json.loads(out)
    assert result["violations"] == 0 and result["finished"] == result["requests"] == 128
    assert result["options"]["page_size"] == 16 and result["mamba_tracking"]["donations"] > 0
    assert (tmp_path / "t.png").stat().st_size > 0
