"""Effective bandwidth of the slot kernels next to torch's own indexed copies, as ONE JSON line.

Why: a Mamba slot copy (prefix-cache fork, copy-on-write) moves tens of MiB per slot, and KV stores
happen every step for every layer, so the Triton kernels must run near copy bandwidth; the number
that matters is how they compare with the obvious torch one-liner measured in the same process.

Cases
* ``mamba_copy``: ``state[:, dst] = state[:, src]`` on a Qwen3-Next-like temporal state, fp32
  ``[36, S, 32, 128, 128]`` (2 MiB per layer, 72 MiB per slot), for several numbers of slot pairs.
* ``kv_store``: ``k_buffer[layer, loc] = k`` (and v) for bf16 buffers shaped like Qwen3-Next's
  full-attention layers (12 layers, 2 KV heads, head dim 256) and Llama-3-8B's (32, 8, 128), with
  T in {256, 4096} scattered slots.

Bytes counted: everything read plus everything written (``2 * payload``); indices are ignored.
``triton_gbps`` is the raw launch (``triton_impl``, no host checks), ``triton_checked_gbps`` the
public ``kvledger.kernels`` function including its host-side validation (which synchronises).
On CPU (``--device cpu`` or no CUDA) sizes are tiny, only torch is timed and the triton fields are
null: the point there is that the script runs (``--quick`` is what the test suite smoke-tests).

Timing: warm-up calls, then CUDA events around a loop of calls (``time.perf_counter`` on CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

try:
    import kvledger.kernels as K
except ImportError:  # run from a checkout without an editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import kvledger.kernels as K

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, per_second


def _seconds_per_call(fn: Callable[[], None], device: torch.device, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def _gbps(nbytes: int, seconds: float) -> float | None:
    """GB/s, unrounded (a rounded figure reads 0.0 on a slow or loaded machine); None if unmeasurable."""
    rate = per_second(nbytes, seconds)
    return None if rate is None else rate / 1e9


def _time_variants(
    variants: dict[str, Callable[[], None] | None], nbytes: int, device: torch.device, warmup: int, iters: int
) -> dict[str, float | None]:
    return {
        f"{name}_gbps": None if fn is None else _gbps(nbytes, _seconds_per_call(fn, device, warmup, iters))
        for name, fn in variants.items()
    }


def _copy_variants(state: torch.Tensor, n: int, use_triton: bool) -> dict[str, Callable[[], None] | None]:
    """Copy slots ``[0, n)`` onto ``[n, 2n)``: torch's indexed copy, the raw kernel, the checked op."""
    src = torch.arange(n, device=state.device)
    dst = torch.arange(n, 2 * n, device=state.device)

    def torch_copy() -> None:
        state[:, dst] = state[:, src]

    variants: dict[str, Callable[[], None] | None] = {
        "torch": torch_copy,
        "triton": None,
        "triton_checked": None,
    }
    if use_triton:
        from kvledger.kernels import triton_impl

        view = state.view(state.shape[0], state.shape[1], -1)
        variants["triton"] = lambda: triton_impl.copy_slots(view, src, dst)
        variants["triton_checked"] = lambda: K.copy_slots(state, src, dst)
    return variants


def bench_mamba_copy(
    device: torch.device, quick: bool, use_triton: bool, warmup: int, iters: int
) -> list[dict[str, Any]]:
    pair_counts: tuple[int, ...]
    if device.type == "cuda":
        layers, feat, pair_counts = 36, (32, 128, 128), (1, 8, 32)
    elif quick:
        layers, feat, pair_counts = 2, (4, 8, 8), (1, 4)
    else:
        layers, feat, pair_counts = 8, (8, 32, 32), (1, 4, 16)
    state = torch.randn(layers, 2 * max(pair_counts), *feat, device=device)
    slot_bytes = state[:, 0].numel() * state.element_size()
    results = []
    for n in pair_counts:
        row: dict[str, Any] = {"pairs": n, "layers": layers, "slot_mib": round(slot_bytes / 2**20, 3)}
        row["dtype"] = "float32"
        row.update(
            _time_variants(_copy_variants(state, n, use_triton), 2 * n * slot_bytes, device, warmup, iters)
        )
        row["verified"] = bool(torch.equal(state[:, :n], state[:, n : 2 * n]))
        results.append(row)
    return results


def _store_variants(
    kb: torch.Tensor, vb: torch.Tensor, tokens: int, use_triton: bool
) -> tuple[dict[str, Callable[[], None] | None], Callable[[], bool]]:
    """Store ``tokens`` random rows at scattered slots of the middle layer; also return a verifier."""
    layers, slots = kb.shape[:2]
    layer = layers // 2
    gen = torch.Generator().manual_seed(tokens)
    loc = torch.randperm(slots, generator=gen)[:tokens].to(kb.device)
    k = torch.randn(tokens, *kb.shape[2:], generator=gen).to(device=kb.device, dtype=kb.dtype)
    v = torch.randn(tokens, *vb.shape[2:], generator=gen).to(device=vb.device, dtype=vb.dtype)

    def torch_store() -> None:
        kb[layer, loc] = k
        vb[layer, loc] = v

    variants: dict[str, Callable[[], None] | None] = {
        "torch": torch_store,
        "triton": None,
        "triton_checked": None,
    }
    if use_triton:
        from kvledger.kernels import triton_impl

        kv, vv = kb.view(layers, slots, -1), vb.view(layers, slots, -1)
        variants["triton"] = lambda: triton_impl.store_kv(kv, vv, layer, loc, k, v)
        variants["triton_checked"] = lambda: K.store_kv(kb, vb, layer, loc, k, v)
    return variants, lambda: bool(torch.equal(kb[layer, loc], k) and torch.equal(vb[layer, loc], v))


def bench_kv_store(
    device: torch.device, quick: bool, use_triton: bool, warmup: int, iters: int
) -> list[dict[str, Any]]:
    if device.type == "cuda":
        models = [("qwen3-next", 12, 2, 256), ("llama3-8b", 32, 8, 128)]
        slots, token_counts = 65536, (256, 4096)
    else:
        models = [("tiny", 2, 2, 16)]
        slots, token_counts = (512, (16, 64)) if quick else (8192, (256, 4096))
    results = []
    for model, layers, heads, dim in models:
        kb = torch.zeros(layers, slots, heads, dim, dtype=torch.bfloat16, device=device)
        vb = torch.zeros_like(kb)
        for tokens in token_counts:
            variants, verify = _store_variants(kb, vb, tokens, use_triton)
            nbytes = 2 * 2 * tokens * heads * dim * kb.element_size()  # (k + v) x (read + write)
            row: dict[str, Any] = {"model": model, "layers": layers, "kv_heads": heads, "head_dim": dim}
            row.update(tokens=tokens, dtype="bfloat16")
            row.update(_time_variants(variants, nbytes, device, warmup, iters))
            row["verified"] = verify()
            results.append(row)
    return results


def _figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for ``run_all.py``: GB/s per case (the kernels do not depend on the contracts switch)."""
    rows = []
    for row in report["mamba_copy"]:
        case = f"mamba_copy {row['pairs']} pair(s), {row['slot_mib']} MiB/slot"
        rows.append((case, row))
    for row in report["kv_store"]:
        rows.append((f"kv_store {row['model']}, {row['tokens']} tokens", row))
    out = []
    for case, row in rows:
        for variant in ("torch", "triton", "triton_checked"):
            value = row[f"{variant}_gbps"]
            if value is not None:
                out.append(
                    figure(
                        "kernel_bandwidth",
                        f"{case}: {variant}",
                        "GB/s",
                        release=value,
                        ratio=False,
                        note=f"{report['device_name']}; the kernels do not depend on the contracts switch",
                    )
                )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few iterations (smoke test)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args(argv)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    # Interpreter timings are meaningless, so the Triton variants run only when compiled for CUDA.
    use_triton = device.type == "cuda" and K.backend_for(torch.empty(0, device=device)) == "triton"
    warmup, iters = (1, 3) if args.quick or device.type == "cpu" else (5, 20)
    triton_version = None
    if K.HAVE_TRITON:
        import triton

        triton_version = triton.__version__
    report: dict[str, Any] = {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "triton_timed": use_triton,
        "quick": bool(args.quick),
        "mamba_copy": bench_mamba_copy(device, args.quick, use_triton, warmup, iters),
        "kv_store": bench_kv_store(device, args.quick, use_triton, warmup, iters),
    }
    report["figures"] = _figures(report)
    print(json.dumps(report), flush=True)
    return report


if __name__ == "__main__":
    main()
