"""``python -m kvledger.engines.sglang.scheduler {hunt,replay,alias,ci} --release X``: prints one JSON object.

One release per process (two SGLang releases cannot share one). ``hunt``: seeds x ops of the generic
workload (:mod:`.workload`), stops at the first finding and shrinks it. ``replay FILE``: a saved repro
(``repros/*.json``). ``alias``: a control run where two requests are made to share one Mamba slot by a
scoped patch (outside SGLang and outside the reference code), which the fake worker's tags must catch.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any
from unittest import mock

from kvledger.argtypes import int_in, probability
from kvledger.engines.sglang.scheduler.controls import attach_controls, pd_attach_controls
from kvledger.engines.sglang.scheduler.loop import STRICT_IDLE_CHECK
from kvledger.engines.sglang.scheduler.release import OWN_RELEASE, SCHEDULER_RELEASES

REPROS = Path(__file__).with_name("repros")


def _hunt(release: str, seeds: int, n_ops: int, first_seed: int = 0, aborts: float = 0.0) -> dict[str, Any]:
    from kvledger.engines.sglang.scheduler.build import SchedulerShape, build_attached
    from kvledger.engines.sglang.scheduler.repro import replay, shrink
    from kvledger.engines.sglang.scheduler.workload import run

    cpu, total_ops, requests, aborted = time.process_time(), 0, 0, 0
    for seed in range(first_seed, first_seed + seeds):
        report = run(build_attached(release, SchedulerShape(seed=seed)), seed, n_ops, aborts)
        total_ops += report.steps
        requests += report.requests
        aborted += sum(op[0] == "abort" for op in report.ops[: report.steps])
        if report.finding is not None:
            make = functools.partial(build_attached, release, SchedulerShape(seed=seed))
            small = shrink(make, report.ops[: report.steps], report.finding.kind)
            again = replay(make(), small)  # what the shrunk list names (its step numbers are its own)
            return {
                "release": release,
                "seed": seed,
                "examples": seed - first_seed + 1,
                "ops": total_ops,
                "requests": requests,
                "aborted": aborted,
                "cpu_s": round(time.process_time() - cpu, 2),
                "finding": asdict(report.finding),
                "repro_ops": len(small),
                "repro_finding": None if again is None else asdict(again),
                "repro": small,
            }
    return {
        "release": release,
        "examples": seeds,
        "ops": total_ops,
        "requests": requests,
        "aborted": aborted,
        "cpu_s": round(time.process_time() - cpu, 2),
        "finding": None,
    }


ISSUES = {"0.5.9": ("#16067", "0.5.10"), "0.5.5.post1": ("#12432", "0.5.5.post2")}
"""Release with a seed -> (the seed's issue, the release that fixed it), for saved repro files."""


def _save(out: dict[str, Any], path: str, argv: list[str]) -> None:
    """Write a hunt's or the machine's shrunk finding as a repro file (the shape of
    ``repros/issue16067.json``; ``replay`` reads both). A clean run writes nothing and says so on stderr:
    its report (seeds, ops, requests) still goes to stdout, as without ``--save``."""
    if out.get("finding") is None:
        print(f"nothing to save: {argv[0]} on {out['release']} found nothing", file=sys.stderr)
        return
    issue, fixed = ISSUES.get(out["release"], ("", ""))
    finding = out["repro_finding"] or out["finding"]
    command = f"python -m kvledger.engines.sglang.scheduler {' '.join(argv)}"
    if "seed" in out:
        how = f"seed {out['seed']}, op {out['finding']['step']}, shrunk greedily from {out['ops']} ops"
        shape: dict[str, Any] = {"seed": out["seed"]}
    else:
        how = f"Hypothesis's shrunk example, {out['examples']} machine runs, {out['operations']} ops"
        shape = out["repro_shape"]
    saved = {
        "issue": issue,
        "release_with_bug": out["release"],
        "fixed_in": fixed,
        "found_by": f"{command} ({how}; {out['repro_ops']} ops kept)",
        "expected_kind": finding["kind"],
        "expected": finding["message"].splitlines()[0],
        "shape": shape,
        "ops": out["repro"],
    }
    Path(path).write_text(json.dumps(saved, indent=1) + "\n")


def _replay(release: str, path: str) -> dict[str, Any]:
    from kvledger.engines.sglang.scheduler.build import SchedulerShape, build_attached
    from kvledger.engines.sglang.scheduler.repro import replay

    saved = json.loads(Path(path).read_text())
    found = replay(
        build_attached(release, SchedulerShape(**saved["shape"])), [tuple(o) for o in saved["ops"]]
    )
    return {"release": release, "ops": len(saved["ops"]), "finding": None if found is None else asdict(found)}


def _replay_put_back(release: str, path: str) -> dict[str, Any]:
    """The repro on ``release`` with #12432 put back by a scoped patch (:mod:`.reenact`)."""
    from kvledger.engines.sglang.scheduler.build import SchedulerShape, build_attached
    from kvledger.engines.sglang.scheduler.reenact import put_back_12432
    from kvledger.engines.sglang.scheduler.repro import replay

    saved = json.loads(Path(path).read_text())
    scheduler = build_attached(release, SchedulerShape(**saved["shape"]))
    put_back_12432(scheduler)
    found = replay(scheduler, [tuple(o) for o in saved["ops"]])
    return {"release": release, "finding": None if found is None else asdict(found)}


def _pd_side(side: str) -> contextlib.AbstractContextManager[Any]:
    """Builds in this block are 0.5.23's ``side`` of PD disaggregation (``fake`` transfer backend)."""
    from kvledger.engines.sglang.scheduler.build23 import PD_ENV

    return mock.patch.dict(os.environ, {PD_ENV: side})


def _pd_hunt(release: str, side: str, seeds: int, ops: int, aborts: float = 0.0) -> dict[str, Any]:
    """The seeded hunt on one of 0.5.23's PD sides, in this process."""
    with _pd_side(side):
        return _hunt(release, seeds, ops, aborts=aborts)


def _pd_replay(release: str, side: str, path: str) -> dict[str, Any]:
    with _pd_side(side):
        return _replay(release, path)


def _machine(release: str, examples: int, steps: int) -> dict[str, Any]:
    from kvledger.engines.sglang.scheduler.machine import hunt_machine

    return hunt_machine(release, examples, steps)


def _undelivered(release: str) -> dict[str, Any]:
    """Control: 0.5.23's PD decode side with transfers that bring no data (the fake backend as is): the
    first decode must fail the fake worker's tags (the decode side's tag check is live)."""
    from kvledger.engines.sglang.scheduler.build23 import build_scheduler_23
    from kvledger.engines.sglang.scheduler.loop import arrive, step
    from kvledger.engines.sglang.scheduler.worker import TagMismatch

    scheduler = build_scheduler_23(pd="decode", deliver=False)
    arrive(scheduler, "a", list(range(1, 12)), 4)
    try:
        for _ in range(6):
            step(scheduler)
        return {"caught": False}
    except TagMismatch as error:
        return {"caught": True, "message": str(error)}


def _build_seconds(release: str) -> dict[str, float]:
    """Seconds to import the release's scheduler and to build one scheduler (after the import)."""
    from kvledger.engines.sglang.scheduler.build import build_scheduler
    from kvledger.engines.sglang.scheduler.release import import_scheduler

    _, imported = import_scheduler(release)
    start = time.perf_counter()
    build_scheduler(release)
    return {"import_s": round(imported, 2), "build_s": round(time.perf_counter() - start, 2)}


def _alias(release: str) -> dict[str, Any]:
    """Two running requests made to share one Mamba slot (the #12432 symptom) must fail a tag check."""
    from kvledger.engines.sglang.scheduler.build import build_scheduler
    from kvledger.engines.sglang.scheduler.ledgers import req_memory
    from kvledger.engines.sglang.scheduler.loop import arrive, step
    from kvledger.engines.sglang.scheduler.worker import TagMismatch

    scheduler = build_scheduler(release)
    a = arrive(scheduler, "a", list(range(1, 11)), 6)
    b = arrive(scheduler, "b", list(range(50, 58)), 6)
    while not (
        req_memory(a).req_pool_idx is not None
        and req_memory(b).req_pool_idx is not None
        and len(a.output_ids)
        and len(b.output_ids)
    ):
        step(scheduler)  # until both are prefilled and decoding
    pool = scheduler.req_to_token_pool
    # the fault, outside SGLang: b's row now maps to a's Mamba slot (a slot handed out twice)
    pool.req_index_to_mamba_index_mapping[req_memory(b).req_pool_idx] = pool.req_index_to_mamba_index_mapping[
        req_memory(a).req_pool_idx
    ]
    try:
        step(scheduler)
        return {"release": release, "caught": False, "message": f"{a.output_ids} {b.output_ids}"}
    except TagMismatch as error:
        return {"release": release, "caught": True, "message": str(error)}


def _ci(release: str, seeds: int, ops: int) -> dict[str, Any]:
    """What CI runs for ``release``, in one process (one import)."""
    if release.startswith("0.5.5"):  # CI for the PD prefill seed, one process per release
        out = {
            "replay": _replay(release, str(REPROS / "issue12432.json")),
            "replay_machine": _replay(release, str(REPROS / "issue12432_machine.json")),
            "hunt": _hunt(release, seeds, ops),
            "put_back": _replay_put_back(release, str(REPROS / "issue12432.json")),
            "attach": pd_attach_controls(release),
        }
    elif release == "0.5.23":  # the newest release: the build, replays, controls, budgeted hunts
        out = {
            "build_s": _build_seconds(release),
            "replay": _replay(release, str(REPROS / "clean_0_5_23.json")),
            # the hunt's first 0.5.23 report, settled as the attach's gap (evict_for_alloc unwrapped)
            "evict_for_alloc": _replay(release, str(REPROS / "observed_0_5_23_evict_for_alloc.json")),
            # the second: a matched prefix's Mamba state is copied at the forward (the fake worker's gap)
            "deferred_cow": _replay(release, str(REPROS / "observed_0_5_23_deferred_cow.json")),
            "alias": _alias(release),
            "pd_prefill_hunt": _pd_hunt(release, "prefill", seeds, ops),
            "pd_decode_hunt": _pd_hunt(release, "decode", seeds, ops, aborts=0.15),
            "pd_decode_undelivered": _undelivered(release),
            # the decode side's report, settled as the build's gap (radix cache left on at the decode side)
            "pd_decode_radix_on": _pd_replay(
                release, "decode", str(REPROS / "observed_0_5_23_pd_decode_radix_on.json")
            ),
            "abort_hunt": _hunt(release, seeds, ops, aborts=0.15),
            "attach": attach_controls(release),
            "machine": _machine(release, 12, 30),
        }
    else:  # what CI runs per release, in one process (one import): the repro, a budgeted hunt, the control
        out = {
            "replay": _replay(release, str(REPROS / "issue16067.json")),
            "hunt": _hunt(release, seeds, ops),
            "alias": _alias(release),
            "attach": attach_controls(release),
            "undersized": _replay(release, str(REPROS / "observed_0_5_10_mamba_alloc.json")),
        }
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kvledger.engines.sglang.scheduler")
    parser.add_argument(
        "command", choices=["hunt", "replay", "alias", "ci", "machine", "serve-cpu", "pd-faults"]
    )
    parser.add_argument("file", nargs="?")
    parser.add_argument("--release", required=True, choices=sorted(SCHEDULER_RELEASES))
    parser.add_argument("--seeds", type=int_in(1), default=4)
    parser.add_argument(
        "--aborts", type=probability, default=0.0, help="hunt: chance a non-arrival op is an abort"
    )
    parser.add_argument(
        "--first-seed", type=int_in(0), default=0, help="hunt: seeds first-seed .. first-seed+seeds-1"
    )
    parser.add_argument("--ops", type=int_in(1), default=200)
    parser.add_argument("--examples", type=int_in(1), default=50, help="machine: Hypothesis examples")
    parser.add_argument("--save", help="hunt, machine: write the shrunk finding to this repro file")
    parser.add_argument(
        "--pd", choices=["prefill", "decode"], help="0.5.23: build a PD side (fake transfer backend)"
    )
    parser.add_argument(
        "--on-violation", choices=["raise", "log"], default="raise", help="serve-cpu: the launcher's option"
    )
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="NAME=MODULE:FUNCTION",
        help="serve-cpu: one more SGLang plugin for the scheduler process (a planted bug in a test)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_intermixed_args(argv)  # the repro file may follow the options
    if args.command in ("serve-cpu", "pd-faults") and args.release != OWN_RELEASE:
        parser.error(
            f"{args.command} runs {OWN_RELEASE} only (the venv's own; earlier fake PD backends cannot fail)"
        )
    if any("=" not in p or ":" not in p for p in args.plugin):
        parser.error("--plugin takes NAME=MODULE:FUNCTION")
    if args.pd and args.release != OWN_RELEASE:
        parser.error(f"--pd builds {OWN_RELEASE}'s PD sides; 0.5.5.x runs its PD prefill loop without it")
    os.environ.setdefault(STRICT_IDLE_CHECK, "1")
    if args.pd:
        from kvledger.engines.sglang.scheduler.build23 import PD_ENV

        os.environ[PD_ENV] = args.pd
    start = time.perf_counter()
    out = _run(args)
    out["wall_s"] = round(time.perf_counter() - start, 2)
    sys.stdout.write("KVLEDGER-JSON " + json.dumps(out) + "\n")
    return 0


def _run(args: argparse.Namespace) -> dict[str, Any]:
    """One command's figures (the JSON line ``main`` prints)."""
    if args.command == "hunt":
        out = _hunt(args.release, args.seeds, args.ops, args.first_seed, args.aborts)
        out["first_seed"], out["aborts"] = args.first_seed, args.aborts
        if args.save:
            _save(
                out,
                args.save,
                ["hunt", "--release", args.release, "--seeds", str(args.seeds), "--ops", str(args.ops)],
            )
    elif args.command == "replay":
        out = _replay(args.release, args.file or str(REPROS / "issue16067.json"))
    elif args.command == "machine":
        from kvledger.engines.sglang.scheduler.machine import hunt_machine

        out = hunt_machine(args.release, args.examples, args.ops)
        if args.save:
            argv_ = [
                "machine",
                "--release",
                args.release,
                "--examples",
                str(args.examples),
                "--ops",
                str(args.ops),
            ]
            _save(out, args.save, argv_)
    elif args.command == "alias":
        out = _alias(args.release)
    elif args.command == "pd-faults":
        from kvledger.engines.sglang.scheduler.controls import pd_failure_controls

        out = pd_failure_controls()
    elif args.command == "serve-cpu":
        from kvledger.engines.sglang.scheduler.serve_cpu import WAVES, serve_on_cpu

        plugins = dict(p.split("=", 1) for p in args.plugin)
        out = serve_on_cpu(WAVES, on_violation=args.on_violation, extra_plugins=plugins)
    else:
        out = _ci(args.release, args.seeds, args.ops)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
