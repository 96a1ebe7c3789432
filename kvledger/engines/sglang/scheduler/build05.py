"""SGLang 0.5.5.x's real ``Scheduler`` built on CPU (monolithic ``__init__``), PD prefill or plain.

0.5.5.x has no ``init_model_config`` / ``init_ipc_channels`` / ``init_tp_model_worker`` methods: its
``__init__`` builds the model config, the model worker and the sockets inline. The whole ``__init__``
runs as shipped; what the CPU cannot do is stood in, each for the duration of the constructor only:

``ModelConfig`` (name looked up in ``sglang.srt.managers.scheduler``)
    ``from_server_args`` would fetch a Hugging Face config for a real model; it returns
    :func:`model_config_05` instead (fields only size buffers and limits; no model runs).
``TpModelWorker`` (imported inside ``__init__`` from ``sglang.srt.managers.tp_worker``)
    :class:`~kvledger.engines.sglang.scheduler.worker.FakeWorker` over SGLang's own pools, with the
    0.5.5 extras (process groups, ``hybrid_gdn_config`` which selects ``MambaRadixCache``).
``PrefillBootstrapQueue``'s KV manager (``get_kv_class`` looked up in ``disaggregation.prefill``)
    the ``fake`` transfer backend has a sender and a receiver but no manager in 0.5.5.x (a manager is
    an RDMA engine); the queue's ``_init_kv_manager`` runs as shipped (buffer infos, KV args) and gets
    :class:`NoTransferManager`, which holds the KV args and is handed to ``FakeKVSender`` (which ignores
    it). Requests carry SGLang's ``FAKE_BOOTSTRAP_HOST``, so ``PrefillBootstrapQueue.add`` picks
    ``FakeKVSender`` itself, as for SGLang's warm-up requests: the handshake completes at the first
    poll, the transfer at ``send`` (no decode side to emulate).

Overridden in a subclass (methods): ``init_sockets`` (sinks, no zmq), ``watchdog_thread`` (SGLang's
watchdog sends SIGQUIT to the parent process when a batch does not advance for ``watchdog_timeout``; a
stepped loop is idle between calls by design). Listed in spec/sglang-scheduler.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

from kvledger.engines.sglang.scheduler.build_common import (
    SchedulerShape,
    Sink,
    model_config_fields,
    process_group,
    server_args,
)
from kvledger.engines.sglang.scheduler.release import import_scheduler
from kvledger.engines.sglang.scheduler.worker import FakeWorker, WorkerShape

PD_PREFILL = "prefill"


def model_config_05(shape: SchedulerShape) -> SimpleNamespace:
    """The model-config fields 0.5.5.x's scheduler, batch and PD prefill read (no model is loaded)."""
    # hf_text_config (= hf): PD prefill sizes its metadata buffers' hidden states from its hidden_size
    hf = SimpleNamespace(architectures=["FakeMambaForCausalLM"], hidden_size=8)
    return model_config_fields(shape, hf, dtype=torch.float32)  # PD prefill's metadata buffers take it


class NoTransferManager:
    """Stands for a KV transfer manager (an RDMA engine) with the ``fake`` backend: keeps the KV args the
    bootstrap queue computed; ``FakeKVSender`` never calls it."""

    def __init__(self, kv_args: Any, mode: Any, server_args: Any, is_mla_backend: bool) -> None:
        self.kv_args = kv_args
        self.mode = mode


class _Fake05Worker(FakeWorker):
    """The fake worker plus what 0.5.5.x's ``__init__`` asks of ``TpModelWorker``."""

    is_hybrid = False

    def __init__(self, shape: WorkerShape, model_config: Any) -> None:
        super().__init__(shape)
        self.model_config = model_config
        # 0.5.5.x builds MambaRadixCache when the runner has a hybrid GDN config (the only Mamba switch)
        self.model_runner.hybrid_gdn_config = SimpleNamespace()

    def get_worker_info(self) -> tuple[Any, ...]:
        return super().get_worker_info()[:11]  # 0.5.5.x unpacks eleven fields (0.5.9: twelve)

    def get_tp_group(self) -> Any:
        from sglang.srt.distributed import parallel_state as ps

        return ps.get_tp_group()

    def get_attention_tp_group(self) -> Any:
        return self.get_tp_group()

    def get_attention_tp_cpu_group(self) -> Any:
        return self.get_tp_group().cpu_group


@contextlib.contextmanager
def _stand_ins(module: Any, shape: SchedulerShape) -> Iterator[None]:
    """The three stand-ins, in place only while ``__init__`` runs (module names restored after)."""
    import sglang.srt.disaggregation.prefill as prefill
    import sglang.srt.managers.tp_worker as tp_worker
    from sglang.srt.disaggregation.utils import KVClassType, TransferBackend

    config = model_config_05(shape)
    real_get_kv_class = prefill.get_kv_class

    def get_kv_class(backend: Any, class_type: Any) -> Any:
        if backend == TransferBackend.FAKE and class_type == KVClassType.MANAGER:
            return NoTransferManager
        return real_get_kv_class(backend, class_type)

    def make_worker(**_: Any) -> _Fake05Worker:
        s = shape
        return _Fake05Worker(
            WorkerShape(s.kv_tokens, s.rows, s.mamba_slots, s.context_len, s.max_new_tokens, s.seed), config
        )

    saved = (module.ModelConfig, tp_worker.TpModelWorker)
    module.ModelConfig = SimpleNamespace(from_server_args=lambda _args: config)
    tp_worker.TpModelWorker = make_worker
    prefill.get_kv_class = get_kv_class
    try:
        yield
    finally:
        module.ModelConfig, tp_worker.TpModelWorker = saved
        prefill.get_kv_class = real_get_kv_class


def scheduler_class_05(version: str) -> Any:
    """0.5.5.x's ``Scheduler`` with ``init_sockets`` and ``watchdog_thread`` overridden (subclass)."""
    module, _ = import_scheduler(version)

    class CPUScheduler05(module.Scheduler):  # type: ignore[name-defined]
        def init_sockets(self, server_args: Any, port_args: Any) -> None:
            self.idle_sleeper = None
            self.recv_from_tokenizer = None
            self.recv_from_rpc = None
            self.send_to_tokenizer = Sink()
            self.send_to_detokenizer = Sink()

        def watchdog_thread(self) -> None:
            return None

    return CPUScheduler05


def build_scheduler_05(version: str, shape: SchedulerShape | None = None, *, pd: str = PD_PREFILL) -> Any:
    """A real 0.5.5.x ``Scheduler`` on CPU; ``pd="prefill"`` (default) builds the PD prefill side with the
    ``fake`` transfer backend, ``pd="null"`` the plain scheduler."""
    shape = shape or SchedulerShape()
    cls = scheduler_class_05(version)
    module = __import__("sglang.srt.managers.scheduler", fromlist=["Scheduler"])
    pd_args: dict[str, Any] = (
        {"disaggregation_mode": "prefill", "disaggregation_transfer_backend": "fake"}
        if pd == PD_PREFILL
        else {}
    )
    args = server_args(module, shape, **pd_args)
    if pd == PD_PREFILL:
        # ServerArgs skips its whole post-init for model_path "dummy"; its own PD step derives the decode
        # side's TP/DP (1 here) and the prefill PP size
        args._handle_disaggregation()
    # what ServerArgs' environment step sets on a launched server (the pool reads it); float32 keeps the
    # worker's data tags exact
    os.environ.setdefault("SGLANG_MAMBA_SSM_DTYPE", "float32")
    process_group()
    port_args = SimpleNamespace(nccl_port=0)
    with _stand_ins(module, shape):
        return cls(args, port_args, gpu_id=0, tp_rank=0, moe_ep_rank=0, pp_rank=0, dp_rank=None)
