"""``benchmarks/tiny_model.py --quick``: one JSON line, both settings, both paths, bit-exact, figures well-formed.

Timings are checked for their domain (finite, non-negative, or None when unmeasurable), never their size
(issue 8); derived figures are checked against the raw ones they come from (the benchmark reports
unrounded values).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clock_figures import assert_clock_figure

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "tiny_model.py"


def _rate(count: float, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


@pytest.mark.slow
def test_quick_run_prints_one_json_line_with_both_settings_and_paths() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    assert result["benchmark"] == "tiny_model" and result["quick"] is True
    for setting in ("off", "on"):
        entry = result[setting]
        assert entry["bit_exact"] is True  # pooled outputs == generate_alone outputs
        pooled, alone = entry["pooled"], entry["alone"]
        assert pooled["requests"] == 4 and alone["requests"] == 2
        assert pooled["generated_tokens"] == 4 * 8  # every request ran to max_new_tokens
        assert pooled["forward_tokens"] >= pooled["generated_tokens"]
        for figure in ("wall_s", "cpu_s", "model_s", "forward_tokens_per_s", "generated_tokens_per_s"):
            assert_clock_figure(pooled[figure], f"{setting}.pooled.{figure}")
        for figure in ("wall_s", "cpu_s", "tokens_per_s"):
            assert_clock_figure(alone[figure], f"{setting}.alone.{figure}")
        assert pooled["forward_tokens_per_s"] == pytest.approx(
            _rate(pooled["forward_tokens"], pooled["wall_s"])
        )
        assert alone["tokens_per_s"] == pytest.approx(_rate(alone["tokens"], alone["wall_s"]))
        assert pooled["model_s"] <= pooled["wall_s"]  # the model's share of the same interval
    # The same work in both settings: contracts change the cost, never the tokens.
    assert result["off"]["pooled"]["forward_tokens"] == result["on"]["pooled"]["forward_tokens"]
    for key in (
        "pooled_ratio_on_off",
        "alone_ratio_on_off",
        "pooled_cpu_ratio_on_off",
        "alone_cpu_ratio_on_off",
    ):
        assert_clock_figure(result[key], key)
    off, on = result["off"]["pooled"]["wall_s"], result["on"]["pooled"]["wall_s"]
    assert result["pooled_ratio_on_off"] == (pytest.approx(on / off) if off > 0 else None)
