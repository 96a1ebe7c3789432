#!/usr/bin/env python
"""The tiny hybrid model's tokens/s, contracts off and on, in one invocation: one JSON line.

Contracts are fixed at import, so each setting runs in its own child process of this script. Each
child measures two paths on the same generated-shared-prefix workload:

* ``pooled``: the whole engine (pools, Mamba radix cache, scheduler, ``TinyHybridRunner``) serving
  the workload. ``forward_tokens_per_s``: tokens the model computed (prefill after cache hits, plus
  decode) per wall second of the whole run; ``model_s``: the part of that spent in the runner's
  ``forward`` (with contracts on it includes the read checks I-NO-POISON-READ, I-KV-ROW-CONTENT);
  ``generated_tokens_per_s``: output tokens per wall second.
* ``alone``: ``generate_alone`` (the oracle: no pools, no cache) on the first ``--alone-requests``
  prompts. ``tokens_per_s``: prompt plus generated tokens per wall second.

``bit_exact`` says whether those requests' pooled outputs equal their alone outputs (they must).
Ratios are on/off of wall time for the same work (``cpu_ratio_on_off``: process CPU time, steadier
on a shared machine). Rates are raw floats, ``None`` when an interval read as 0 (``_figures``).

    benchmarks/tiny_model.py                  # 4 groups x 8 prompts, 512 + 128 prompt, 64 new tokens
    benchmarks/tiny_model.py --quick          # a smoke run for tests
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import per_second, ratio


def _workload(args: argparse.Namespace) -> Any:
    from kvledger.sim.workload import GSPWorkload

    return GSPWorkload(
        num_groups=args.groups,
        prompts_per_group=args.prompts_per_group,
        system_prompt_len=args.system_len,
        question_len=args.question_len,
        output_len=args.output_len,
    )


def _pooled(args: argparse.Namespace) -> tuple[dict[str, Any], dict[int, list[int]]]:
    from kvledger.reference.engine import build_engine
    from kvledger.sim.simulate import SimOptions

    workload = _workload(args)
    sched = build_engine(SimOptions(workload=workload, model="tiny-hybrid").engine_spec())
    runner: Any = sched.runner
    model_s = 0.0
    forward = runner.forward

    def timed_forward(*a: Any, **kw: Any) -> list[int]:
        nonlocal model_s
        t = time.perf_counter()
        try:
            return forward(*a, **kw)
        finally:
            model_s += time.perf_counter() - t

    runner.forward = timed_forward
    arrivals = workload.requests()
    start, start_cpu = time.perf_counter(), time.process_time()
    next_arrival = 0
    while next_arrival < len(arrivals) or sched.has_work():
        for rid, prompt, max_new in arrivals[next_arrival : next_arrival + workload.arrivals_per_step]:
            sched.add_request(rid, prompt, max_new)
        next_arrival = min(len(arrivals), next_arrival + workload.arrivals_per_step)
        sched.step()
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    generated = sum(len(r.output_ids) for r in sched.requests.values())
    figures = {
        "requests": len(arrivals),
        "steps": sched.step_no,
        "forward_tokens": runner.tokens_computed,
        "generated_tokens": generated,
        "wall_s": wall,
        "cpu_s": cpu,
        "model_s": model_s,
        "forward_tokens_per_s": per_second(runner.tokens_computed, wall),
        "generated_tokens_per_s": per_second(generated, wall),
        "model_forward_tokens_per_s": per_second(runner.tokens_computed, model_s),
    }
    outputs = {rid: list(sched.requests[rid].output_ids) for rid, _, _ in arrivals[: args.alone_requests]}
    return figures, outputs


def _alone(args: argparse.Namespace) -> tuple[dict[str, Any], dict[int, list[int]]]:
    from kvledger.reference.engine import model_weights
    from kvledger.reference.model import generate_alone

    workload = _workload(args)
    weights = model_weights(workload.vocab_size)
    chosen = workload.requests()[: args.alone_requests]
    outputs: dict[int, list[int]] = {}
    start, start_cpu = time.perf_counter(), time.process_time()
    for rid, prompt, max_new in chosen:
        outputs[rid] = generate_alone(weights, prompt, max_new)
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    tokens = sum(len(prompt) + len(outputs[rid]) for rid, prompt, _ in chosen)
    return {
        "requests": len(chosen),
        "tokens": tokens,
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens_per_s": per_second(tokens, wall),
    }, outputs


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from kvledger.contracts import switch

    torch.set_num_threads(1)  # as every benchmark here: figures comparable on a shared machine
    pooled, pooled_out = _pooled(args)
    alone, alone_out = _alone(args)
    return {
        "contracts": switch.ENABLED,
        "pooled": pooled,
        "alone": alone,
        "bit_exact": pooled_out == alone_out,
    }


def _run_child(contracts: str, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ, KVLEDGER_CONTRACTS=contracts)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", *argv]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child with KVLEDGER_CONTRACTS={contracts} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=4, help="shared system prompts")
    parser.add_argument("--prompts-per-group", type=int, default=8)
    parser.add_argument("--system-len", type=int, default=512)
    parser.add_argument("--question-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--alone-requests", type=int, default=4, help="requests also run by generate_alone")
    parser.add_argument(
        "--quick", action="store_true", help="2 groups x 2 prompts, short prompts and outputs"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.groups, args.prompts_per_group, args.system_len = 2, 2, 32
        args.question_len, args.output_len, args.alone_requests = 8, 8, 2
    if min(args.groups, args.prompts_per_group, args.system_len, args.output_len) < 1:
        parser.error("--groups, --prompts-per-group, --system-len and --output-len must be >= 1")
    if args.question_len < 0 or args.alone_requests < 0:
        parser.error("--question-len and --alone-requests must be >= 0")
    if args.child:
        print(json.dumps(_child(args)))
        return 0

    child_argv = [
        f"--groups={args.groups}",
        f"--prompts-per-group={args.prompts_per_group}",
        f"--system-len={args.system_len}",
        f"--question-len={args.question_len}",
        f"--output-len={args.output_len}",
        f"--alone-requests={args.alone_requests}",
    ]
    off, on = _run_child("0", child_argv), _run_child("1", child_argv)
    if off["contracts"] is not False or on["contracts"] is not True:
        raise SystemExit(f"the children did not see the switch: off={off['contracts']}, on={on['contracts']}")
    result: dict[str, Any] = {
        "benchmark": "tiny_model",
        "quick": args.quick,
        "workload": {
            "groups": args.groups,
            "prompts_per_group": args.prompts_per_group,
            "system_len": args.system_len,
            "question_len": args.question_len,
            "output_len": args.output_len,
            "alone_requests": args.alone_requests,
        },
        "off": {k: off[k] for k in ("pooled", "alone", "bit_exact")},
        "on": {k: on[k] for k in ("pooled", "alone", "bit_exact")},
    }
    for path in ("pooled", "alone"):
        result[f"{path}_ratio_on_off"] = ratio(on[path]["wall_s"], off[path]["wall_s"])
        result[f"{path}_cpu_ratio_on_off"] = ratio(on[path]["cpu_s"], off[path]["cpu_s"])
    result["pooled_model_ratio_on_off"] = ratio(on["pooled"]["model_s"], off["pooled"]["model_s"])
    result["python"] = platform.python_version()
    result["cpus"] = os.cpu_count()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
