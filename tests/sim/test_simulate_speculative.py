"""``kvledger simulate --speculative K``: the summary reports accepted tokens per step and the
over-allocation peak, the run matches one-token decoding in what it generates, and bad combinations are
one line and exit status 2 (in a subprocess: what the user sees)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvledger.cli import main
from kvledger.sim.simulate import SimOptions, run_simulation
from kvledger.sim.workload import GSPWorkload

SMALL = [
    "--gsp-num-groups", "2", "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "96",
    "--gsp-question-len", "16", "--gsp-output-len", "24", "--kv-pool-tokens", "1024", "--no-progress",
]  # fmt: skip


def summary(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    assert main(["simulate", *SMALL, "--json", "--no-plot", *args]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


PAGE16 = ["--page-size", "16", "--mamba-track-interval", "32", "--mamba-chunk-size", "16"]


@pytest.mark.parametrize(
    ("extra", "spec_extra"),
    [
        ([], []),
        ([*PAGE16, "--overlap"], []),
        (["--mamba-strategy", "no_buffer"], []),
        (PAGE16, ["--speculative-topk", "2"]),
    ],
)
def test_the_summary_reports_accepted_tokens_and_the_over_allocation(
    capsys: pytest.CaptureFixture[str], extra: list[str], spec_extra: list[str]
) -> None:
    plain = summary(capsys, *extra)
    spec = summary(capsys, "--speculative", "3", *spec_extra, *extra)
    assert plain["speculative"] is None
    sp = spec["speculative"]
    assert spec["generated_tokens"] == plain["generated_tokens"] and spec["finished"] == 8
    assert spec["decode_batches"] < plain["decode_batches"]  # fewer steps for the same tokens
    assert 1.0 < sp["accepted_tokens_per_step"] <= 4.0
    assert sp["over_allocation_peak_tokens"] >= sp["reserve_tokens"] > 0
    assert sp["rejected_tail_freed_tokens"] > 0
    assert sum(sp["accept_histogram"].values()) == sp["request_steps"]


def test_the_acceptance_follows_the_stated_distribution() -> None:
    """Each draft accepted with probability p if every earlier one was: E[accepted] = p + p^2 + p^3 for
    K = 3 (a truncated geometric count), within a few standard errors over a long run."""
    wl = GSPWorkload(num_groups=4, prompts_per_group=8, system_prompt_len=64, question_len=16, output_len=120)
    for p in (0.0, 0.5, 1.0):
        result = run_simulation(
            SimOptions(workload=wl, kv_pool_tokens=4096, speculative=3, speculative_accept_rate=p)
        )
        sp = result.speculative
        assert sp is not None
        hist = {int(k): v for k, v in sp["accept_histogram"].items()}
        n = sum(hist.values())
        mean = sum(k * v for k, v in hist.items()) / n
        expected = p + p**2 + p**3
        if p in (0.0, 1.0):  # only requests about to finish accept fewer than they drew
            assert hist.get(0 if p == 0.0 else 3, 0) > 0.9 * n
        else:
            assert abs(mean - expected) < 0.15, (mean, expected, hist)


def test_bad_combinations_are_one_line_and_status_2() -> None:
    cases = [
        (["--speculative-topk", "2"], "--speculative-topk applies to --speculative runs only"),
        (["--speculative", "3", "--pd"], "--speculative does not support --pd runs yet"),
        (
            ["--speculative", "3", "--overlap", "--mamba-track-interval", "6"],
            "two consecutive verifies could both capture into one tracking half; use >= 8",
        ),
        (
            ["--speculative", "3", "--overlap", "--mamba-strategy", "no_buffer"],
            "V1 would cache a working state an in-flight verify already moved",
        ),
        (["--speculative", "-1"], "argument --speculative: must be >= 0, got -1"),
        (["--speculative", "3", "--speculative-accept-rate", "1.5"], "--speculative-accept-rate"),
    ]
    for args, message in cases:
        done = subprocess.run(
            [sys.executable, "-m", "kvledger", "simulate", *args, "--no-plot"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 2 and done.stdout == "", (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and message in done.stderr, (args, done.stderr)
