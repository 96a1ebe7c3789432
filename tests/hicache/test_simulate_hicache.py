"""``kvledger simulate --hicache``: both tiers in the summary and the timeline, every step audited."""

from __future__ import annotations

import json

import pytest

from kvledger.cli import main
from kvledger.contracts.errors import ContractViolation
from kvledger.reference.hicache import HostKVComponent
from kvledger.sim.hicache import HiCacheOptions, HiCacheSim
from kvledger.sim.workload import GSPWorkload

SMALL = ["--gsp-num-groups", "3", "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "64"]
SMALL += ["--gsp-question-len", "16", "--gsp-output-len", "8", "--kv-pool-tokens", "160"]
SMALL += ["--no-progress", "--no-plot", "--no-mamba"]


def test_simulate_hicache_runs_the_scheduler_over_both_tiers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--hicache", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "peak use: host_kv" in out and "host tier: " in out and "backups" in out


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_simulate_hicache_json_loads_host_hits_back(policy: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "simulate",
        "--hicache",
        "--json",
        "--hicache-policy",
        policy,
        "--hicache-fail-rate",
        "0.2",
        *SMALL,
    ]
    assert main([*args, "--seed", "3"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["violations"] == 0 and summary["finished"] == 9
    assert summary["units"]["host_kv"] == "tokens" and "host_kv" in summary["peak_use"]
    assert summary["hicache"].get("load_loaded_tokens", 0) + summary["hicache"].get("load_failed", 0) > 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--record", "x.jsonl"], "--record with --hicache"),
        (["--page-size", "4"], "--hicache models a KV-only engine"),
    ],
)
def test_simulate_hicache_refuses_what_it_does_not_model(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--hicache", *SMALL, *extra]) == 2
    assert message in capsys.readouterr().err


def test_the_cache_level_run_keeps_both_identities() -> None:
    workload = GSPWorkload(num_groups=3, prompts_per_group=3, system_prompt_len=64, question_len=16)
    opts = HiCacheOptions(
        workload=workload, device_tokens=160, host_tokens=320, fail_rate=0.2, abort_rate=0.1
    )
    result = HiCacheSim(opts).run()
    for row in result.timeline:
        device = sum(row[f"device_{k}"] for k in ("free", "evictable", "protected", "loading"))
        host = sum(row[f"host_{k}"] for k in ("free", "evictable", "protected"))
        assert (device, host) == (160, 320)
    assert result.counts["requests"] == 9 and result.counts["loads_started"] >= 1


def test_the_run_audits_every_step_and_finds_a_bad_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    def lossy(self: HostKVComponent, node: object) -> object:  # write-back that forgets the data
        copy = real(self, node)
        if copy is not None:
            self.pool.buffer[:, copy.ids] = -1.0
        return copy

    real = HostKVComponent.write_backup
    monkeypatch.setattr(HostKVComponent, "write_backup", lossy)
    workload = GSPWorkload(num_groups=2, prompts_per_group=2, system_prompt_len=32, question_len=8)
    with pytest.raises(ContractViolation, match="I-HOST-DATA"):
        HiCacheSim(HiCacheOptions(workload=workload, device_tokens=128, host_tokens=256)).run()
