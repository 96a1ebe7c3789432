#!/usr/bin/env bash
# Kernel checks on a CUDA machine: the Triton kernels compiled for the GPU against the torch
# reference (tests/kernels, including the triton-vs-reference file, which runs on CUDA tensors),
# then the bandwidth benchmark (one JSON line on stdout).
#
# Usage: scripts/gpu_check.sh            (from anywhere; uses .venv/bin/python if present, or $PYTHON)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -n "${PYTHON:-}" ]]; then
    py="$PYTHON"
elif [[ -x .venv/bin/python ]]; then
    py=.venv/bin/python
else
    py=python3
fi

# The compiled path, not the interpreter: TRITON_INTERPRET must not leak in from the caller.
unset TRITON_INTERPRET
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$py" - <<'PY'
import sys

import torch

import kvledger.kernels as K

if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible to torch")
backend = K.backend_for(torch.empty(0, device="cuda"))
if backend != "triton":
    sys.exit(f"gpu_check: CUDA tensors dispatch to {backend!r}, expected 'triton' (is triton importable?)")
print(f"gpu_check: {torch.cuda.get_device_name()} torch {torch.__version__}, backend {backend}")
PY

"$py" -m pytest tests/kernels -m "not deep" -q -p no:cacheprovider
"$py" benchmarks/kernel_bandwidth.py
