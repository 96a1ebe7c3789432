"""SGLang's real ``Scheduler`` built on CPU (0.5.9 / 0.5.10, the ``init_*`` family) with a fake worker.

Three methods of SGLang's ``Scheduler`` are overridden in a subclass (SGLang's source is untouched):

``init_model_config``
    a namespace with the fields the scheduler reads (:func:`model_config`) instead of a Hugging Face
    config fetched for a real model: there is no model; the fields only size buffers and limits.
``init_ipc_channels``
    sinks instead of zmq sockets: requests are handed to the scheduler in-process
    (``handle_generate_request`` / the waiting queue) and outputs are dropped (the detokenizer is not
    under test).
``init_tp_model_worker``
    :class:`~kvledger.engines.sglang.scheduler.worker.FakeWorker`, which returns SGLang's own memory pools
    (``HybridReqToTokenPool`` with a real ``MambaPool``, a real KV allocator over a real
    ``MHATokenToKVPool``) and writes data tags on every forward.

``create_scheduler_watchdog`` (module name, while ``__init__`` runs) returns no watchdog
(:func:`.build_common.no_watchdog`: a stepped loop is idle between calls by design).

Everything else in ``__init__`` runs as shipped: the tree (``MambaRadixCache``), ``SchedulePolicy``,
chunked prefill, the disaggregation switch, the idle checker. The process group is a real one-process
gloo group (``file://`` rendezvous), as SGLang's CPU backend uses.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kvledger.engines.sglang.scheduler.build_common import SchedulerShape as SchedulerShape
from kvledger.engines.sglang.scheduler.build_common import (
    Sink,
    model_config_fields,
    no_watchdog,
    process_group,
    server_args,
)
from kvledger.engines.sglang.scheduler.release import import_scheduler
from kvledger.engines.sglang.scheduler.worker import FakeWorker, WorkerShape


def model_config(shape: SchedulerShape) -> SimpleNamespace:
    """The model-config fields the scheduler reads; no model is loaded, so none of them reach a kernel."""
    hf = SimpleNamespace(architectures=["FakeMambaForCausalLM"], text_config=None)
    return model_config_fields(
        shape,
        hf,
        dtype="float32",
        use_ngram_embedding=False,  # 0.5.10: an n-gram embedding model feature, off for this model
    )


def scheduler_class(version: str) -> Any:
    """SGLang's ``Scheduler`` of ``version`` with the three overrides (subclass; nothing patched)."""
    module, _ = import_scheduler(version)

    class CPUScheduler(module.Scheduler):  # type: ignore[name-defined]
        kv_shape: SchedulerShape

        def init_model_config(self) -> None:
            self.model_config = model_config(self.kv_shape)
            try:  # 0.5.10 asks which model implementation serves the model: SGLang's own (no transformers)
                from sglang.srt.configs.model_config import ModelImpl

                self.model_config._resolved_model_impl = ModelImpl.SGLANG
            except ImportError:
                pass

        def init_ipc_channels(self, port_args: Any) -> None:
            self.idle_sleeper = None
            self.recv_from_tokenizer = None
            self.recv_from_rpc = None
            self.send_to_tokenizer = Sink()
            self.send_to_detokenizer = Sink()

        def init_tp_model_worker(self) -> None:
            s = self.kv_shape
            self.tp_worker = FakeWorker(
                WorkerShape(s.kv_tokens, s.rows, s.mamba_slots, s.context_len, s.max_new_tokens, s.seed)
            )
            self.tp_worker.model_config = self.model_config  # 0.5.10 reads the worker's copy

    return CPUScheduler


def build_scheduler(version: str, shape: SchedulerShape | None = None) -> Any:
    """A real SGLang ``Scheduler`` of ``version`` on CPU (see the module docstring for what stands in).

    0.5.5.x (monolithic ``__init__``) is built by :func:`.build05.build_scheduler_05` as the prefill side
    of PD disaggregation (where #12432 lives), with the ``fake`` transfer backend; 0.5.23 by
    :func:`.build23.build_scheduler_23`."""
    if version.startswith("0.5.5"):
        from kvledger.engines.sglang.scheduler.build05 import build_scheduler_05

        return build_scheduler_05(version, shape)
    if version == "0.5.23":  # the 0.5.2x family: runtime-context config, bootstrap, kv_cache_builder
        from kvledger.engines.sglang.scheduler.build23 import build_scheduler_23

        return build_scheduler_23(shape)
    shape = shape or SchedulerShape()
    cls = scheduler_class(version)
    module = __import__("sglang.srt.managers.scheduler", fromlist=["Scheduler"])
    args = server_args(module, shape)
    process_group()
    cls.kv_shape = shape
    port_args = SimpleNamespace(nccl_port=0)
    ranks = {"gpu_id": 0, "tp_rank": 0, "moe_ep_rank": 0, "pp_rank": 0, "attn_cp_rank": 0, "moe_dp_rank": 0}
    with no_watchdog(module):
        return cls(args, port_args, dp_rank=None, **ranks)


def build_attached(version: str, shape: SchedulerShape | None = None) -> Any:
    """:func:`build_scheduler` under :func:`~kvledger.engines.sglang.scheduler.ledgers.attach_scheduler`
    (the attach is ``scheduler.kvledger_watch``)."""
    from kvledger.engines.sglang.scheduler.ledgers import attach_scheduler

    scheduler = build_scheduler(version, shape)
    attach_scheduler(scheduler)
    return scheduler
