"""SGLang 0.5.23's real ``Scheduler`` built on CPU (the 0.5.2x family: the venv's own install).

0.5.23's ``__init__`` is an orchestrator of ``init_*`` calls reading a process-wide runtime context
(``runtime_context.publish``: ``get_schedule()``, ``get_parallel()``, ... instead of ``server_args``
fields). It runs as shipped except for what the CPU cannot do, overridden in a subclass (methods) or
stood in for the duration of the constructor (module names, restored after):

``init_model_config`` (method)
    a namespace with the fields the scheduler and ``kv_cache_builder.build_kv_cache`` read
    (:func:`model_config_23`); its ``linear_attn_registry_result`` says "a linear-attention model whose
    tree is the Mamba radix cache", which is how SGLang's own registry marks such a model, so
    ``build_kv_cache`` itself picks ``UnifiedRadixCache`` with the FULL and MAMBA components.
``init_ipc_channels`` (method)
    sinks instead of zmq sockets (requests are handed in-process; outputs are dropped).
``init_tp_model_worker`` (method)
    the fake tagging worker (:class:`_Fake23Worker`, a
    :class:`~kvledger.engines.sglang.scheduler.worker.FakeWorker` over SGLang's own pools). SGLang's own
    ``init_model_worker`` runs around it as shipped: no draft worker (no speculative algorithm),
    ``init_target_memory_pool`` keeps the worker's pools (its ``memory_pool_config`` is set), the
    retraction backup is resolved, the streams are ``torch.cpu``'s, and the worker's GPU steps
    (attention backends, CUDA graphs, sampling prewarm) are no-ops of the fake worker (no model, no
    GPU); the request limits come from ``get_worker_info``. ``kv_cache_builder.build_kv_cache`` (pools
    -> tree) then runs as shipped in ``__init__``.
``create_scheduler_watchdog`` (module name in ``sglang.srt.managers.scheduler``)
    returns no watchdog: SGLang's watchdog thread sends SIGQUIT to the parent process when the forward
    count stops advancing while a batch is set (300 s), and a stepped loop is idle between calls by
    design (a hunt keeps each seed's finished scheduler alive; their watchdogs killed the first long
    hunts). The scheduler only stores the watchdog; the memory saver and input blocker run as shipped.
``bootstrap.init_parallel_runtime`` (module name in ``sglang.srt.managers.scheduler``)
    binds OpenMP threads to NUMA nodes through ``sgl_kernel``'s CPU ops and opens a TCP rendezvous on
    the scheduler's port; stood in by the project's one-process gloo group (``file://`` rendezvous,
    the three calls SGLang's bootstrap makes to build its groups (``init_distributed_environment`` over
    gloo with a ``file://`` rendezvous, ``initialize_model_parallel`` at the published widths, all 1,
    ``initialize_dp_attention``); skipped are the thread binding, the device selection, Mooncake and the
    all-reduce flags (one process).
    ``bootstrap.init_layer_runtime`` runs as shipped.
``maybe_init_rust_server`` / ``init_request_receiver`` (methods)
    the embedded Rust frontend and the zmq receiver: no tokenizer process exists; requests arrive
    in-process through :func:`.loop.arrive`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

from kvledger.engines.sglang.scheduler.build_common import (
    SchedulerShape,
    Sink,
    model_config_fields,
    no_watchdog,
    server_args,
)
from kvledger.engines.sglang.scheduler.release import import_scheduler
from kvledger.engines.sglang.scheduler.worker import FakeWorker, WorkerShape, chain

RELEASE_23 = "0.5.23"


class _TextConfig(SimpleNamespace):
    """A Hugging Face config's text part: 0.5.23's hybrid checks call ``get_text_config()``."""

    def get_text_config(self, *_: Any, **__: Any) -> Any:
        return self


def model_config_23(shape: SchedulerShape) -> SimpleNamespace:
    """The model-config fields 0.5.23's scheduler and cache builder read (no model is loaded)."""
    hf = _TextConfig(
        architectures=["FakeMambaForCausalLM"], text_config=None, hidden_size=8, num_hidden_layers=1
    )
    # SGLang's linear-attention registry answers (spec, config); a spec whose model keeps its recurrent
    # state in the Mamba radix cache makes build_kv_cache add the MAMBA tree component
    spec = SimpleNamespace(uses_mamba_radix_cache=True)
    from sglang.srt.configs.model_config import ModelImpl

    return model_config_fields(
        shape,
        hf,
        dtype="float32",
        use_ngram_embedding=False,
        use_engram=False,  # n-gram / engram embedding layers: this model has neither
        ngram_embedding_n=0,  # ModelConfig's value without n-gram embedding
        # not a reasoning model, not multimodal: ModelConfig's values for such a model
        self_opened_think_start_ids=None,
        think_end_ids=None,
        request_selectable_think_end_id_sequences=None,
        requires_mm_token_modalities=frozenset(),
        linear_attn_registry_result=(spec, SimpleNamespace()),
        is_draft_model=False,
        num_hidden_layers=1,  # the fake KV pool's one layer (PD's KV args list the layers)
        get_total_num_kv_heads=lambda: 1,
        # the implementation serving the model: SGLang's own (the Transformers backend would turn the
        # radix cache off for multimodal models; this one is not multimodal either way)
        _resolved_model_impl=ModelImpl.SGLANG,
    )


class _Fake23Worker(FakeWorker):
    """The fake worker plus what 0.5.23's scheduler and cache builder ask of ``TpModelWorker``."""

    weight_load_time = 0.0  # read by the start-up timing summary: no weights are loaded

    def __init__(self, shape: WorkerShape, model_config: Any) -> None:
        super().__init__(shape)
        self.graph_time_usage: dict[str, float] = {}  # no CUDA graphs are captured
        self.model_config = model_config
        runner = self.model_runner
        runner.model_config = model_config
        runner.token_to_kv_pool = self.kv
        runner.mtp_draft_device_pools = ()
        runner.mtp_draft_mamba_pools = ()
        runner.canary_manager = None
        runner.forward_stream = torch.cpu.Stream()  # a model runner's forward stream (CPU's stub stream)
        runner.device = "cpu"
        # the KV pool's capacity in tokens, as the runner reports it (PD prefill sizes its queue by it)
        runner.effective_logical_max_total_num_tokens = shape.kv_tokens
        runner.logical_max_total_num_tokens = shape.kv_tokens
        runner.kv_cache_dtype_str = "auto"  # ServerArgs' kv_cache_dtype default (PD's KV args carry it)
        runner.prewarm_sampling = lambda: None  # the sampler's warm-up kernels: no GPU
        # what the torch_native backend declares (AttentionBackend's default): the overlap relay keeps
        # host sequence lengths
        runner.attn_backend = SimpleNamespace(needs_cpu_seq_lens=True)
        # SGLang's own n-gram embedding manager for a model without n-gram embedding layers (disabled;
        # the batch choice calls it on every step)
        from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (
            NgramEmbeddingManager,
        )

        runner.ngram_embedding_manager = NgramEmbeddingManager.from_model(
            model=torch.nn.Module(),
            model_config=model_config,
            req_to_token_pool=self.req_to_token_pool,
            max_running_requests=shape.rows,
            device="cpu",
        )
        # model features this fake model does not have (HiSparse, EPLB)
        runner.hisparse_coordinator = None
        runner.eplb_manager = None
        runner.prefill_aware_swa = False
        # the pools exist already (SGLang's own, built by the worker): init_target_memory_pool keeps them
        runner.memory_pool_config = SimpleNamespace()

    # GPU set-up that init_model_worker asks of its worker: nothing to do without a model or a GPU
    def init_attention_backends(self) -> None:
        return None

    def init_cuda_graphs(self, *_: Any, **__: Any) -> None:
        return None

    def register_hicache_layer_transfer_counter(self, counter: Any) -> None:
        return None

    def receive_transfer(self, req: Any) -> None:
        """Write what a transferred request's KV and Mamba state hold after its prefill: the tag chain of
        its prompt in its row's first cells, the last tag in its Mamba slot (PD decode, fake backend)."""
        row = int(req.kv.req_pool_idx)
        tokens = [int(t) for t in req.origin_input_ids]
        locs = self.req_to_token_pool.req_to_token[row, : len(tokens)].tolist()
        previous = 0
        for token, loc in zip(tokens, locs, strict=True):
            previous = chain(previous, token)
            self.kv.k_buffer[0][loc, 0, 0] = float(previous)
            self.kv.v_buffer[0][loc, 0, 0] = float(token)
        self.req_to_token_pool.mamba_pool.mamba_cache.temporal[0, self._slot(row)] = float(previous)

    def get_worker_info(self) -> tuple[Any, ...]:
        info = super().get_worker_info()
        return (*info[:8], self.model_runner.forward_stream, *info[9:])  # 0.5.23 reads the forward stream

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
        self._deferred_mamba_actions(batch)
        return super().forward_batch_generation(batch, **kwargs)

    def _deferred_mamba_actions(self, batch: Any) -> None:
        """What 0.5.23's ``ModelRunner`` does on an extend before the Mamba layers read the pool: the
        scheduler defers its slot clears and copy-on-write copies (a request matching a cached prefix
        gets the node's state copied into its own slot) to the forward. SGLang's own pool calls, as the
        runner makes them; without them a matched request would start from a blank slot."""
        if not batch.forward_mode.is_extend():
            return
        pool = self.req_to_token_pool
        clear = getattr(batch, "mamba_clear_indices", None)
        if clear is not None and len(clear) > 0:
            pool.mamba_pool.clear_slots(pool.translate_mamba_indices(clear))
        src = getattr(batch, "mamba_cow_src_indices", None)
        if src is not None and len(src) > 0:
            dst = batch.mamba_cow_dst_indices
            pool.copy_mamba_state(pool.translate_mamba_indices(src), pool.translate_mamba_indices(dst))


_GROUPS_BUILT = False


@contextlib.contextmanager
def stand_ins(module: Any) -> Iterator[None]:
    """``bootstrap.init_parallel_runtime`` and ``create_scheduler_watchdog`` as the scheduler module sees
    them, only while ``__init__`` runs."""
    real = module.bootstrap

    def init_parallel_runtime(*, server_args: Any, device: str, dist_port: int) -> None:
        # the three calls SGLang's bootstrap makes to build its groups (WORLD; TP/PP/attention groups at
        # the published widths, all 1; DP attention), over gloo with a file rendezvous; skipped are the
        # thread binding, the device selection, Mooncake and the all-reduce flags. Once per process, as
        # SGLang's own (a hunt builds one scheduler per seed in one process)
        global _GROUPS_BUILT
        if _GROUPS_BUILT:
            return
        _GROUPS_BUILT = True
        from sglang.srt.distributed import parallel_state as ps
        from sglang.srt.layers.dp_attention import initialize_dp_attention

        rendezvous = os.path.join(tempfile.mkdtemp(prefix="kvledger-gloo-"), "rendezvous")
        ps.init_distributed_environment(
            backend="gloo", world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{rendezvous}"
        )
        ps.initialize_model_parallel()
        initialize_dp_attention(server_args=server_args)

    module.bootstrap = SimpleNamespace(
        init_parallel_runtime=init_parallel_runtime,
        init_layer_runtime=real.init_layer_runtime,
    )
    try:
        with no_watchdog(module):  # no watchdog threads (module docstring)
            yield
    finally:
        module.bootstrap = real


def scheduler_class_23() -> Any:
    """0.5.23's ``Scheduler`` with the overrides listed in the module docstring (subclass)."""
    module, _ = import_scheduler(RELEASE_23)

    class CPUScheduler23(module.Scheduler):  # type: ignore[name-defined]
        kv_shape: SchedulerShape

        def init_model_config(self) -> None:
            self.model_config = model_config_23(self.kv_shape)

        def init_ipc_channels(self, port_args: Any) -> None:
            # SchedulerIpcChannels' fields: sinks to send on, nothing to receive from
            self.ipc_channels = SimpleNamespace(
                recv_from_tokenizer=None,
                recv_from_rpc=None,
                send_to_tokenizer=Sink(),
                send_to_detokenizer=Sink(),
                send_metrics_from_scheduler=None,
            )
            self.load_snapshot_writer = None
            self.recv_from_tokenizer = None

        def init_tp_model_worker(self) -> None:
            s = self.kv_shape
            shape = WorkerShape(s.kv_tokens, s.rows, s.mamba_slots, s.context_len, s.max_new_tokens, s.seed)
            self.tp_worker = _Fake23Worker(shape, self.model_config)

        def maybe_init_rust_server(self) -> None:
            self.rust_server = None

        def init_request_receiver(self) -> None:
            return None

    return CPUScheduler23


PD_ENV = "KVLEDGER_SCHEDULER_PD"
"""``prefill`` / ``decode``: build 0.5.23 as that side of PD disaggregation with the ``fake`` transfer
backend (the CLI's ``--pd`` sets it, so a subprocess per release inherits it); unset: the plain loop."""


def build_scheduler_23(
    shape: SchedulerShape | None = None, *, pd: str | None = None, deliver: bool = True
) -> Any:
    """A real 0.5.23 ``Scheduler`` on CPU (see the module docstring for what stands in); ``pd="prefill"``
    (default: :data:`PD_ENV`) builds the PD prefill side with the ``fake`` transfer backend, which 0.5.23
    constructs itself (``FakeKVManager``, ``FakeKVSender``; no bootstrap server).

    The overlap schedule stays off: SGLang's own argument validation refuses it with the Mamba
    ``no_buffer`` strategy this build uses (``arg_groups/mamba_hook.validate_mamba_no_buffer``), which
    ``ServerArgs`` skips for the "dummy" model path (spec/sglang-scheduler.md)."""
    shape = shape or SchedulerShape()
    pd = pd if pd is not None else os.environ.get(PD_ENV) or None
    cls = scheduler_class_23()
    module = __import__("sglang.srt.managers.scheduler", fromlist=["Scheduler"])
    extra: dict[str, Any] = (
        {"disaggregation_mode": pd, "disaggregation_transfer_backend": "fake"} if pd else {}
    )
    if pd == "decode":
        # the decode side reserves this many tokens per running request (default 512, never fits)
        extra["num_reserved_decode_tokens"] = shape.max_new_tokens
        # what ServerArgs' PD step sets on a decode server without the decode radix cache (which the
        # fake backend does not support); ServerArgs skips that step for the "dummy" model path
        extra["disable_radix_cache"] = True
    args = server_args_23(shape, **extra)
    cls.kv_shape = shape
    with stand_ins(module):
        scheduler = cls(args, SimpleNamespace(nccl_port=0))
    _event_loop_preamble(scheduler)
    if pd == "decode" and deliver:  # deliver=False: the control run where transfers bring no data
        _deliver_transfers(scheduler)
    return scheduler


def _deliver_transfers(scheduler: Any) -> None:
    """The data a KV transfer delivers, which the ``fake`` backend does not move: when SGLang's transfer
    queue hands a request on (``pop_transferred``), the fake worker writes the prompt's tags into the
    request's preallocated KV cells and its Mamba slot, as the prefill side's forward would have
    (:meth:`_Fake23Worker.receive_transfer`). Which cells and which slot is SGLang's choice, untouched."""
    queue = scheduler.disagg_decode_transfer_queue
    worker = scheduler.tp_worker
    pop = queue.pop_transferred

    def pop_transferred(*args: Any, **kwargs: Any) -> Any:
        reqs = pop(*args, **kwargs)
        for req in reqs:
            worker.receive_transfer(req)
        return reqs

    queue.pop_transferred = pop_transferred


def _event_loop_preamble(scheduler: Any) -> None:
    """What ``run_event_loop`` sets before it dispatches to a loop that never returns (the stepped loop
    calls the loop body itself): on CPU the schedule stream's ``synchronize`` is a no-op. (Its WAR
    barrier flag is read only by the overlap loops, which are not run here.)"""
    scheduler.schedule_stream.synchronize = lambda: None


def server_args_23(shape: SchedulerShape, **extra: Any) -> Any:
    """0.5.23's ``ServerArgs`` (the fields every release's build sets, :func:`.build_common.server_args`)
    published as ``run_scheduler_process`` publishes them: ``runtime_context.publish`` with the process's
    placement (world rank 0, no DP controller, device 0)."""
    from sglang.srt.runtime_context import SpawnRanks, publish

    def publish_scheduler(args: Any) -> None:
        publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))

    # pp_max_micro_batch_size is left to 0.5.23's own init_model_worker, which derives it
    return server_args(None, shape, publish=publish_scheduler, pp_default=False, **extra)
