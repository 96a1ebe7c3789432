"""``kvledger simulate`` as a finished tool: every bad input is one line on stderr and exit status 2.

Each case runs ``main`` in-process (argparse's errors end in ``SystemExit(2)``, the cross-option checks
return 2); one case runs the real entry point in a subprocess to show no traceback reaches the user.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvledger.cli import main
from kvledger.sim import simulate as simulate_module
from kvledger.sim.estimate import (
    LONG_RUN_S,
    computed_tokens,
    describe_duration,
    predicted_seconds,
    total_tokens,
)
from kvledger.sim.workload import GSPWorkload


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(["simulate", *args, "--no-progress"])
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    return code, out, err


BAD_INPUTS = [
    (["--kv-pool-tokens", "-5"], "argument --kv-pool-tokens: must be >= 1, got -5"),
    (["--kv-pool-tokens", "0"], "argument --kv-pool-tokens: must be >= 1, got 0"),
    (["--mamba-slots", "0"], "argument --mamba-slots: must be >= 1, got 0"),
    (["--mamba-slots", "-2"], "argument --mamba-slots: must be >= 1, got -2"),
    (["--req-pool-rows", "0"], "argument --req-pool-rows: must be >= 1, got 0"),
    (["--max-running-requests", "0"], "argument --max-running-requests: must be >= 1, got 0"),
    (["--chunked-prefill-size", "-1"], "argument --chunked-prefill-size: must be >= 0, got -1"),
    (["--max-prefill-tokens", "0"], "argument --max-prefill-tokens: must be >= 1, got 0"),
    (["--page-size", "0"], "argument --page-size: must be >= 1, got 0"),
    (["--gsp-output-len", "0"], "argument --gsp-output-len: must be >= 1, got 0"),
    (["--gsp-system-prompt-len", "-3"], "argument --gsp-system-prompt-len: must be >= 0, got -3"),
    (["--gsp-question-len", "-1"], "argument --gsp-question-len: must be >= 0, got -1"),
    (["--gsp-num-groups", "0"], "argument --gsp-num-groups: must be >= 1, got 0"),
    (["--gsp-prompts-per-group", "0"], "argument --gsp-prompts-per-group: must be >= 1, got 0"),
    (["--arrivals-per-step", "0"], "argument --arrivals-per-step: must be >= 1, got 0"),
    (["--kv-pool-tokens", "lots"], "argument --kv-pool-tokens: expected an integer, got 'lots'"),
    (["--model", "gpt"], "argument --model: invalid choice: 'gpt'"),
    (["--no-mamba", "--model", "tiny-hybrid"], "--model tiny-hybrid needs the Mamba pool"),
    (["--gsp-system-prompt-len", "0", "--gsp-question-len", "0"], "prompts would be empty"),
    (
        ["--page-size", "4", "--mamba-strategy", "no_buffer"],
        "--page-size 4 with the Mamba radix cache in no_buffer",
    ),
    (
        ["--page-size", "4", "--mamba-track-interval", "6"],
        "--mamba-track-interval 6 is not a multiple of --page-size 4",
    ),
    (
        ["--mamba-chunk-size", "48", "--page-size", "32"],
        "--mamba-chunk-size 48 and --page-size 32: one must divide",
    ),
    (["--chunked-prefill-size", "32"], "--chunked-prefill-size 32 is below the capture grid 64"),
    (["--overlap", "--mamba-track-interval", "1"], "--mamba-track-interval 1 with --overlap"),
    (["--overlap", "--mamba-slots", "2"], "--mamba-slots 2: one request under extra_buffer holds 3"),
    (["--page-size", "4", "--no-mamba", "--kv-pool-tokens", "5122"], "not a multiple of --page-size 4"),
    (["--page-size", "4", "--no-mamba", "--chunked-prefill-size", "2"], "must be 0 or >= --page-size 4"),
    (["--kv-pool-tokens", "700"], "every request needs 737 KV tokens alone"),
    (["--plot", "out/timeline.xyz"], "unsupported image format ('.xyz')"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *args)
    assert code == 2, (out, err)
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("kvledger simulate: error: ") and message in err, err
    assert "Traceback" not in err


def test_plot_paths_are_checked_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plot that cannot be written is refused up front: the run (minutes, maybe) never starts."""
    monkeypatch.setattr(simulate_module, "run_simulation", lambda *a, **k: pytest.fail("the run started"))
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    for plot, message in [
        (a_file / "timeline.png", f"{a_file} is not a directory"),
        (tmp_path, "is a directory"),
        (tmp_path / "timeline", "unsupported image format (no suffix)"),
    ]:
        code, out, err = run_cli(capsys, "--plot", str(plot))
        assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_the_real_entry_point_prints_no_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvledger", "simulate", "--no-mamba", "--model", "tiny-hybrid"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "kvledger simulate: error: --model tiny-hybrid needs the Mamba pool: drop --no-mamba or use --model hash"
    ]


def test_help_shows_defaults_and_units(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # argparse wraps help at the terminal width
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for fragment in (
        "--kv-pool-tokens TOKENS KV pool size in tokens, a multiple of --page-size (1 to 33,554,432; default: 5120)",
        "--mamba-slots SLOTS Mamba state pool size in slots; SGLang sizes it as max running requests x 3,",
        "(1 to 65,536; default: 64)",
        "--mamba-strategy {no_buffer,extra_buffer}",
        "--mamba-track-interval TOKENS extra_buffer: decoding captures a state every TOKENS tokens",
        "--req-pool-rows ROWS request-to-token pool size in rows (1 to 65,536; default: --max-running-requests + 4)",
        "--gsp-output-len TOKENS new tokens per request (1 to 1,048,576; default: 96)",
        "--gsp-num-groups N groups sharing a system prompt (1 to 1,048,576; default: 8)",
        "--chunked-prefill-size TOKENS tokens per prefill chunk, 0 disables chunking (0 to 1,048,576; default: 256)",
        "(default: out/ledger_timeline.png)",
    ):
        assert fragment in text, fragment


def test_row_pool_size_is_settable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = {}

    def fake_run(opts: simulate_module.SimOptions, progress: object = None, record: object = None) -> object:
        seen["rows"] = opts.engine_spec().rows
        raise SystemExit(0)

    monkeypatch.setattr(simulate_module, "run_simulation", fake_run)
    with pytest.raises(SystemExit):
        main(["simulate", "--req-pool-rows", "3", "--no-plot", "--no-progress"])
    assert seen["rows"] == 3
    with pytest.raises(SystemExit):
        main(["simulate", "--max-running-requests", "5", "--no-plot", "--no-progress"])
    assert seen["rows"] == 9  # the default: max running + 4


# ---------------------------------------------------------------------- long runs are announced
def test_a_long_run_is_announced_before_it_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(simulate_module, "run_simulation", lambda *a, **k: pytest.fail("stop here"))
    with pytest.raises(pytest.fail.Exception, match="stop here"):
        main(["simulate", "--model", "tiny-hybrid", "--gsp-num-groups", "64", "--no-plot", "--no-progress"])
    err = capsys.readouterr().err
    assert err.startswith("kvledger simulate: warning: this run may take about ") and err.count("\n") == 1
    assert "262,144 tokens to compute, --model tiny-hybrid" in err


def test_a_short_run_is_not_announced(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(simulate_module, "run_simulation", lambda *a, **k: pytest.fail("stop here"))
    with pytest.raises(pytest.fail.Exception):
        main(["simulate", "--no-plot", "--no-progress"])
    assert "warning" not in capsys.readouterr().err


def test_estimate_scales_with_the_workload() -> None:
    default = GSPWorkload()
    assert total_tokens(default) == 128 * (512 + 128 + 96)
    assert computed_tokens(default) == 8 * 512 + 128 * (128 + 96)
    # the default tiny-hybrid run takes about 8 s here: not announced (the first estimate said 4 min)
    assert 5 < predicted_seconds(default, "tiny-hybrid", True) < LONG_RUN_S
    big = GSPWorkload(num_groups=64)
    assert predicted_seconds(big, "tiny-hybrid", True) > LONG_RUN_S > predicted_seconds(big, "hash", True)
    small = GSPWorkload(num_groups=1, prompts_per_group=4)
    assert predicted_seconds(small, "tiny-hybrid", True) < predicted_seconds(default, "tiny-hybrid", True)
    assert [describe_duration(s) for s in (42, 240, 9000)] == ["42 s", "4 min", "2.5 h"]


def test_json_carries_reject_reasons(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    small = ["--gsp-num-groups", "1", "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "16"]
    small += ["--gsp-question-len", "8", "--gsp-output-len", "4", "--kv-pool-tokens", "256"]
    code = main(["simulate", *small, "--json", "--no-plot"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["reject_reasons"] == {} and out["rejected"] == 0
    assert out["options"]["rows"] is None and out["prompt_tokens"] == 2 * 24
