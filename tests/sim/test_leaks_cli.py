"""``kvledger simulate`` with an injected leak (issue 10): named with contracts on, never silent with them off.

The leak (every 3rd finished request keeps its row, Mamba slot or KV: ``tests/leaks.py``) is injected
from outside the reference code. Contracts on: the run stops with a violation naming the request and
the ids, exit status 1, and the plot ends at the marked failing step. Contracts off (a new process: the
switch is read at import): the count identities still run after every step, so the run reports an
identity failure in its own category and exits 1 instead of printing "0 violations".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvledger.cli import main
from kvledger.contracts import switch
from kvledger.sim.simulate import SimOptions, run_simulation
from kvledger.sim.workload import GSPWorkload
from tests.leaks import leaking
from tests.sim.test_simulate import SMALL

ROOT = Path(__file__).resolve().parents[2]
needs_contracts = pytest.mark.skipif(not switch.ENABLED, reason="contracts are off (KVLEDGER_CONTRACTS=0)")
BOOT = (
    "import sys; from tests.leaks import install; install(sys.argv[1], 3);"
    " from kvledger.cli import main; sys.exit(main(sys.argv[2:]))"
)


@needs_contracts
@pytest.mark.fires("I-COUNT")
def test_contracts_on_a_row_leak_names_the_request_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "t.png"
    # V1 (no_buffer): the count identity is the first check to see it. Under V2 (the default) the
    # finish-path check I-V2-CACHE-LEN fires first; the next test holds it to the same standard.
    with leaking("row", 3) as leaked:
        assert main(["simulate", *SMALL, "--mamba-strategy", "no_buffer", "--json", "--plot", str(plot)]) == 1
    out = json.loads(capsys.readouterr().out)
    rid = leaked[0][0]
    assert out["violations"] == 1 and out["identity_failures"] == 0 and out["failed_at_step"] > 0
    assert out["violation"].startswith("I-COUNT: 1 rows unaccounted (leak)")
    assert re.search(rf"leaked \[\d+\] \(1\): ledger owner req#{rid}\[", out["violation"]), out["violation"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # written although the run stopped


@needs_contracts
def test_contracts_on_a_row_leak_under_v2_names_the_request_its_row_and_moves(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with leaking("row", 3) as leaked:
        assert main(["simulate", *SMALL, "--json", "--no-plot"]) == 1
    msg = json.loads(capsys.readouterr().out)["violation"]
    rid = leaked[0][0]
    found = re.search(rf"req#{rid}\[req\.\w+\] still holds \[(\d+)\]", msg)
    assert found and msg.startswith("[req] I-V2-CACHE-LEN"), msg
    assert f"slot {found.group(1)}: owner req#{rid}[" in msg and "alloc: free_list[free] -> " in msg, msg


@needs_contracts
def test_the_timeline_reaches_the_failing_step() -> None:
    wl = GSPWorkload(num_groups=2, prompts_per_group=4, system_prompt_len=96, question_len=24, output_len=12)
    with leaking("kv", 3):
        result = run_simulation(
            SimOptions(workload=wl, kv_pool_tokens=640, mamba_slots=8, chunked_prefill_size=64)
        )
    assert result.violation is not None and result.failed_at_step is not None
    assert result.timeline_steps[-1] == result.failed_at_step == result.steps
    last = result.timeline[-1]["kv"]
    assert sum(v for k, v in last.items() if k != "size") < last["size"]  # the leak shows in the last sample
    assert result.units == {"kv": "tokens", "req": "rows", "mamba": "slots"}


def _simulate_off(kind: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KVLEDGER_CONTRACTS="0", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", BOOT, kind, "simulate", *SMALL, "--no-plot", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.parametrize("kind", ["mamba", "kv"])
def test_contracts_off_a_leak_is_an_identity_failure_in_the_json(kind: str) -> None:
    done = _simulate_off(kind, "--json")
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["contracts"] is False and out["violations"] is None and out["violation"] is None
    assert out["identity_failures"] == 1 and out["count_checks"] > 0
    unit = {"mamba": "slots", "kv": "tokens"}[kind]
    assert re.match(rf"I-COUNT: \d+ {unit} unaccounted \(leak\)", out["identity_failure"]), out[
        "identity_failure"
    ]
    assert "leaked [" in out["identity_failure"]


def test_contracts_off_a_row_leak_shows_in_the_summary() -> None:
    done = _simulate_off("row", "--no-progress")
    assert done.returncode == 1, done.stderr
    text = done.stdout
    assert re.search(r"count identity failures\s+.\s+1", text), text
    assert re.search(r"violations\s+.\s+not looked for \(release knows no owner per id\)", text), text
    assert re.search(r"checking level\s+.\s+release: ", text), text
    assert "Count identity failure at step" in text and "I-COUNT: 1 rows unaccounted (leak)" in text
