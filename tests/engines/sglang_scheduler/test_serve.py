"""``kvledger sglang-serve``: the attach installed in SGLang's scheduler process through SGLang's plugin loading.

The served run (one subprocess, ~40 s): SGLang 0.5.23's own ``run_scheduler_process`` in a spawned child,
the attach arriving by ``load_plugins``, requests over SGLang's zmq IPC (:mod:`...serve_cpu` says what
stands in). A bug planted in the child (``serve_plant``, an SGLang plugin) must be reported by the
launcher's process: the report file's record, the child's log line with the evidence. The fast tests
check the parts without a child: the plugin folder SGLang's discovery reads, the reporter, the CLI.
The raise-mode served run (SGLang SIGQUITs the launcher) is ``deep``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvledger.cli import main as cli_main
from kvledger.cli import sglang_serve
from kvledger.contracts.errors import ContractViolation, InvalidArgument
from kvledger.engines.sglang.scheduler import serve, serve_plugin
from tests.engines.sglang_scheduler.test_scheduler_23 import _installed_or_skip
from tests.engines.sglang_scheduler.test_scheduler_seeds import _run_with_log

PLANT = "kvledger_plant=tests.engines.sglang_scheduler.serve_plant:leak_one_kv_slot"


def _serve_cpu(*args: str) -> tuple[dict[str, Any], str]:
    return _run_with_log("serve-cpu", "--release", "0.5.23", *args)


@pytest.fixture(scope="module")
def served_with_plant() -> tuple[dict[str, Any], str]:
    _installed_or_skip()
    return _serve_cpu("--on-violation", "log", "--plugin", PLANT)


def test_served_scheduler_attached_in_the_child_serves_a_clean_wave(
    served_with_plant: tuple[dict[str, Any], str],
) -> None:
    """The child ran SGLang's run_scheduler_process (its ready message came back over SGLang's pipe),
    the attach was installed there by SGLang's plugin loading (its log line), and the first wave
    (shared prefix, a chunked prompt) finished over the real IPC with no violation."""
    out, log = served_with_plant
    assert out["ready"]["status"] == "ready" and out["ready"]["max_total_num_tokens"] == 64
    assert "kvledger: scheduler pid" in log and "attached (on violation: log)" in log
    for rid, n in (("a", 4), ("b", 3), ("c", 5)):
        assert len(out["finished"][rid]) == n, out["finished"]
    assert out["violations_after_wave"][0] == 0, out["violations"]


def test_planted_leak_in_the_child_is_reported_by_the_launcher(
    served_with_plant: tuple[dict[str, Any], str],
) -> None:
    """The planted KV slot taken for nobody is named at its step's end: one record (the launcher's
    process reads it back), the log line with the slot and its history; in ``log`` mode the attach
    detaches and the second wave still finishes. Fails if the attach misses the leak."""
    out, log = served_with_plant
    assert out["violations_after_wave"] == [0, 1]
    (record,) = out["violations"]
    assert record["kind"] == "SchedulerLedgerViolation" and record["mode"] == "log"
    assert "a leak" in record["message"] and "[kv]" in record["message"]
    assert "history" in record["message"] or "alloc:" in record["message"]
    assert record["pid"] != os.getpid()
    assert "kvledger: SchedulerLedgerViolation in scheduler pid" in log
    assert "the server keeps serving unchecked" in log
    assert len(out["finished"]["d"]) == 2 and len(out["finished"]["planted-e"]) == 3
    assert out["sigquit"] is False


@pytest.mark.deep
def test_planted_leak_in_raise_mode_stops_the_server() -> None:
    """``raise``: the violation is raised in the scheduler's step; SGLang's run_scheduler_process logs
    it and SIGQUITs the launcher's process, which still has the record."""
    _installed_or_skip()
    out, log = _serve_cpu("--on-violation", "raise", "--plugin", PLANT)
    assert out["sigquit"] is True and out["violations_after_wave"][0] == 0
    (record,) = out["violations"]
    assert record["mode"] == "raise" and "a leak" in record["message"]
    assert "Scheduler hit an exception" in log and "SchedulerLedgerViolation" in log
    assert "planted-e" not in out["finished"]


# ---------------------------------------------------------------------- the parts, without a child


def test_plugin_folder_declares_the_entry_point_sglang_discovers(tmp_path: Path, monkeypatch: Any) -> None:
    """importlib.metadata, which SGLang's load_plugins asks, finds the launcher's folder on sys.path."""
    root = serve.write_plugin_dist(tmp_path, {"kvledger_attach": serve.ATTACH_ENTRY[1]})
    monkeypatch.syspath_prepend(str(root))
    found = {ep.name: ep.value for ep in entry_points(group=serve.PLUGIN_GROUP)}
    assert found.get("kvledger_attach") == "kvledger.engines.sglang.scheduler.serve_plugin:install"
    with pytest.raises(InvalidArgument):
        serve.write_plugin_dist(tmp_path / "x", {})


def test_attached_environment_reaches_a_child_and_is_restored(monkeypatch: Any) -> None:
    monkeypatch.delenv(serve_plugin.ATTACH_ENV, raising=False)
    before = (list(sys.path), os.environ.get("PYTHONPATH"))
    with serve.attached_environment("log", "r.jsonl") as root:
        assert os.environ[serve_plugin.ATTACH_ENV] == "log"
        assert os.environ[serve_plugin.REPORT_ENV].endswith("r.jsonl")
        assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(root) == sys.path[0]
    assert (list(sys.path), os.environ.get("PYTHONPATH")) == before
    assert serve_plugin.ATTACH_ENV not in os.environ and not root.exists()
    with pytest.raises(InvalidArgument), serve.attached_environment("ignore"):
        pass


def test_plugin_registers_nothing_without_the_switch(monkeypatch: Any) -> None:
    monkeypatch.delenv(serve_plugin.ATTACH_ENV, raising=False)
    serve_plugin.install()  # would import SGLang's hook registry if it registered anything
    assert serve_plugin.mode() is None
    monkeypatch.setenv(serve_plugin.ATTACH_ENV, "yes")
    with pytest.raises(InvalidArgument):
        serve_plugin.mode()


class _Watch:
    """What the reporter reads of an attach: its scheduler, step count, and detach."""

    def __init__(self) -> None:
        self.scheduler = SimpleNamespace()
        vars(self.scheduler)["kvledger_watch"] = self
        self.steps = 7
        self.detached = False

    def detach(self) -> None:
        self.detached = True
        vars(self.scheduler).pop("kvledger_watch")


@pytest.mark.parametrize("mode", serve_plugin.MODES)
def test_reporter_logs_records_then_raises_or_detaches(
    mode: str, tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    report = tmp_path / "v.jsonl"
    monkeypatch.setenv(serve_plugin.REPORT_ENV, str(report))
    sw = _Watch()
    error = ContractViolation("slot 3: owner req a; step 2: alloc")
    with caplog.at_level(logging.ERROR, logger="kvledger.sglang.serve"):
        if mode == "raise":
            with pytest.raises(ContractViolation):
                serve_plugin.reporter(sw, mode)(error, None)
        else:
            serve_plugin.reporter(sw, mode)(error, None)
    (record,) = [json.loads(line) for line in report.read_text().splitlines()]
    assert record["step"] == 7 and record["mode"] == mode and "slot 3" in record["message"]
    assert any("slot 3: owner req a" in r.getMessage() for r in caplog.records)
    assert sw.detached is (mode == "log")


def test_cli_modes_match_the_plugin_and_arguments_are_required(capsys: Any) -> None:
    assert sglang_serve.MODES == serve_plugin.MODES
    assert cli_main(["sglang-serve", "--on-violation", "log"]) == 2
    assert "after '--'" in capsys.readouterr().err
    assert serve.sglang_arguments(["--model-path", "m"])[-1] == serve.NO_OVERLAP
    assert serve.sglang_arguments(["--model-path", "m", serve.NO_OVERLAP]).count(serve.NO_OVERLAP) == 1


@pytest.mark.deep
def test_served_loop_needs_the_batch_being_run_as_a_queue() -> None:
    """Regression: a launched ``event_loop_normal`` keeps the batch it runs in ``cur_batch_for_debug``
    only; with that queue put back out of the attach's list, the clean first wave's prefill batch reads
    as a leak at its step's end (what the first served run reported)."""
    _installed_or_skip()
    put_back = "kvledger_put_back=tests.engines.sglang_scheduler.serve_plant:forget_the_batch_being_run"
    out, _ = _serve_cpu("--on-violation", "log", "--plugin", put_back)
    assert out["violations_after_wave"][0] >= 1, out
    assert "a leak" in out["violations"][0]["message"]


def test_launcher_runs_sglangs_entry_point_with_the_plugin_visible(monkeypatch: Any, tmp_path: Path) -> None:
    """``kvledger sglang-serve`` runs ``sglang.launch_server`` as ``python -m`` would, with SGLang's
    arguments (overlap off), while the attach's entry point is discoverable and the switch is set; all of
    it is gone when the server returns. (SGLang's server itself needs fastapi/uvicorn and a model: not
    here; serve-cpu runs the scheduler-process half.)"""
    seen: dict[str, Any] = {}

    def run_module(name: str, run_name: str, alter_sys: bool) -> None:
        seen.update(name=name, run_name=run_name, argv=list(sys.argv))
        seen["env"] = (os.environ.get(serve_plugin.ATTACH_ENV), os.environ.get(serve_plugin.REPORT_ENV))
        seen["plugins"] = {ep.name: ep.value for ep in entry_points(group=serve.PLUGIN_GROUP)}

    monkeypatch.setattr(serve.runpy, "run_module", run_module)
    monkeypatch.delenv(serve_plugin.ATTACH_ENV, raising=False)
    report = str(tmp_path / "v.jsonl")
    assert cli_main(["sglang-serve", "--report", report, "--", "--model-path", "m", "--port", "3"]) == 0
    assert seen["name"] == "sglang.launch_server" and seen["run_name"] == "__main__"
    assert seen["argv"][1:] == ["--model-path", "m", "--port", "3", serve.NO_OVERLAP]
    assert seen["env"] == ("raise", report)
    assert seen["plugins"]["kvledger_attach"] == serve.ATTACH_ENTRY[1]
    assert serve_plugin.ATTACH_ENV not in os.environ
    assert "kvledger_attach" not in {ep.name for ep in entry_points(group=serve.PLUGIN_GROUP)}
