"""The generic Hypothesis machine (kvledger/engines/vllm/machine.py) on vLLM 0.34.0's hybrid manager.

Arrivals with three shared prefixes, chunked prefill, decode, preemption, re-admission, finish, abort,
a synchronous or asynchronous scheduler, pools of 10 to 24 blocks; the attach checks every call.
"""

from __future__ import annotations

from kvledger.engines.vllm.machine import HybridMachine

TestHybridMachine = HybridMachine.TestCase
