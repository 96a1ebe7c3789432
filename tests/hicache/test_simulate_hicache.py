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
SMALL += ["--gsp-question-len", "16", "--kv-pool-tokens", "256", "--no-progress"]


def test_simulate_hicache_prints_both_tiers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--hicache", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "host tier: write_through, device 256 tokens, host 512 tokens" in out
    assert "device" in out and "host" in out and "loads_committed" in out


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_simulate_hicache_json_keeps_both_identities(policy: str, capsys: pytest.CaptureFixture[str]) -> None:
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
    assert main([*args, "--abort-rate", "0.1", "--seed", "3"]) == 0
    summary = json.loads(capsys.readouterr().out)
    final = summary["final"]
    device = sum(final[f"device_{k}"] for k in ("free", "evictable", "protected", "loading"))
    host = sum(final[f"host_{k}"] for k in ("free", "evictable", "protected"))
    assert (device, host) == (256, 512)
    assert summary["requests"] == 9 and summary["loads_started"] >= 1


def test_simulate_hicache_refuses_record(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--hicache", "--record", "x.jsonl", *SMALL]) == 2
    assert "--record with --hicache" in capsys.readouterr().err


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
