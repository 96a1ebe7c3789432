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

Everything else in ``__init__`` runs as shipped: the tree (``MambaRadixCache``), ``SchedulePolicy``,
chunked prefill, the disaggregation switch, the idle checker. The process group is a real one-process
gloo group (``file://`` rendezvous), as SGLang's CPU backend uses.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from kvledger.engines.sglang.scheduler.release import import_scheduler
from kvledger.engines.sglang.scheduler.worker import FakeWorker, WorkerShape


@dataclass(frozen=True)
class SchedulerShape:
    """Sizes of a built scheduler (small on purpose: no-room admissions and retractions happen)."""

    kv_tokens: int = 64
    rows: int = 8
    # SGLang's runner never builds fewer than 3 Mamba slots per request row with the radix cache on
    # (``max_num_reqs <= max_mamba_cache_size // MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO``, 3 in
    # 0.5.9/0.5.10): a running request's slot, the tree node it locks, a waiting request's copy. At 1:1
    # SGLang's own "Can not alloc mamba cache" assertion fires (repros/observed_0_5_10_mamba_alloc.json).
    mamba_slots: int = 24
    chunked_prefill_size: int = 16
    context_len: int = 128
    max_new_tokens: int = 8
    seed: int = 0


def model_config(shape: SchedulerShape) -> SimpleNamespace:
    """The model-config fields the scheduler reads; no model is loaded, so none of them reach a kernel."""
    hf = SimpleNamespace(architectures=["FakeMambaForCausalLM"], text_config=None)
    return SimpleNamespace(
        is_generation=True,
        is_matryoshka=False,
        hidden_size=8,
        vocab_size=1000,
        is_encoder_decoder=False,
        is_multimodal=False,
        is_multimodal_gen=False,
        is_image_gen=False,
        is_audio_model=False,
        context_len=shape.context_len,
        hf_config=hf,
        hf_text_config=hf,
        num_key_value_heads=1,
        attention_arch=None,
        dtype="float32",
        is_hybrid_swa=False,
        hf_eos_token_id=None,  # no EOS: lengths come from max_new_tokens (drawn by the caller)
        use_ngram_embedding=False,  # 0.5.10: an n-gram embedding model feature, off for this model
    )


class _Sink:
    """Stands for a zmq socket the scheduler sends on; keeps the last outputs for inspection."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_pyobj(self, obj: Any) -> None:
        self.sent.append(obj)
        del self.sent[:-64]  # keep memory bounded over long hunts

    def send_output(self, obj: Any, *_: Any, **__: Any) -> None:
        self.send_pyobj(obj)


def _server_args(module: Any, shape: SchedulerShape, **extra: Any) -> Any:
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    args = ServerArgs(
        model_path="dummy",
        device="cpu",
        attention_backend="torch_native",  # otherwise write_cache_indices launches a Triton kernel
        sampling_backend="pytorch",
        disable_overlap_schedule=True,
        skip_tokenizer_init=True,
        chunked_prefill_size=shape.chunked_prefill_size,
        page_size=1,
        max_running_requests=shape.rows,
        random_seed=shape.seed,
        **extra,  # e.g. the PD mode: ServerArgs' own post-init derives the PD fields from it
    )
    args._mamba_cache_chunk_size = 64
    if getattr(args, "pp_max_micro_batch_size", None) is None:
        args.pp_max_micro_batch_size = shape.rows  # init_model_worker derives it on a launched server
    set_global_server_args_for_scheduler(args)
    return args


_GROUP_READY = False


def _process_group() -> None:
    """One-process gloo group and SGLang's parallel state (TP/PP/attention groups of size 1)."""
    global _GROUP_READY
    if _GROUP_READY:
        return
    from sglang.srt.distributed import parallel_state as ps

    rendezvous = os.path.join(tempfile.mkdtemp(prefix="kvledger-gloo-"), "rendezvous")
    ps.init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=f"file://{rendezvous}", local_rank=0, backend="gloo"
    )
    ps.initialize_model_parallel(1, 1, 1, backend="gloo")
    _GROUP_READY = True


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
            self.send_to_tokenizer = _Sink()
            self.send_to_detokenizer = _Sink()

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
    of PD disaggregation (where #12432 lives), with the ``fake`` transfer backend."""
    if version.startswith("0.5.5"):
        from kvledger.engines.sglang.scheduler.build05 import build_scheduler_05

        return build_scheduler_05(version, shape)
    shape = shape or SchedulerShape()
    cls = scheduler_class(version)
    module = __import__("sglang.srt.managers.scheduler", fromlist=["Scheduler"])
    args = _server_args(module, shape)
    _process_group()
    cls.kv_shape = shape
    port_args = SimpleNamespace(nccl_port=0)
    return cls(
        args,
        port_args,
        gpu_id=0,
        tp_rank=0,
        moe_ep_rank=0,
        pp_rank=0,
        attn_cp_rank=0,
        moe_dp_rank=0,
        dp_rank=None,
    )


def build_attached(version: str, shape: SchedulerShape | None = None) -> Any:
    """:func:`build_scheduler` under :func:`~kvledger.engines.sglang.scheduler.ledgers.attach_scheduler`
    (the attach is ``scheduler.kvledger_watch``)."""
    from kvledger.engines.sglang.scheduler.ledgers import attach_scheduler

    scheduler = build_scheduler(version, shape)
    attach_scheduler(scheduler)
    return scheduler
