"""What every SGLang release's scheduler build shares: its sizes, the output sinks, the server arguments,
and the one-process gloo group (:mod:`.build` for the ``init_*`` family, :mod:`.build05` for 0.5.5.x)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from kvledger.engines.sglang.build import preseed_mamba_cache_chunk_size


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


class Sink:
    """Stands for a zmq socket the scheduler sends on; keeps the last outputs for inspection."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_pyobj(self, obj: Any) -> None:
        self.sent.append(obj)
        del self.sent[:-64]  # keep memory bounded over long hunts

    def send_output(self, obj: Any, *_: Any, **__: Any) -> None:
        self.send_pyobj(obj)


def server_args(
    module: Any,
    shape: SchedulerShape,
    *,
    publish: Callable[[Any], None] | None = None,
    pp_default: bool = True,
    **extra: Any,
) -> Any:
    """The server arguments of a CPU scheduler build, registered for the scheduler process (``publish``:
    how the release registers them; default ``set_global_server_args_for_scheduler``). ``pp_default``:
    set ``pp_max_micro_batch_size`` by hand (releases before 0.5.23 read it unset)."""
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
    preseed_mamba_cache_chunk_size(args, 64)
    if pp_default and getattr(args, "pp_max_micro_batch_size", None) is None:
        args.pp_max_micro_batch_size = shape.rows  # init_model_worker derives it on a launched server
    (publish or set_global_server_args_for_scheduler)(args)
    return args


_GROUP_READY = False


def process_group() -> None:
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


def model_config_fields(shape: SchedulerShape, hf: SimpleNamespace, **per_release: Any) -> SimpleNamespace:
    """The model-config fields every release's scheduler reads (no model is loaded, so none of them reach
    a kernel), and those one release family adds or reads differently (``per_release``)."""
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
        is_hybrid_swa=False,
        hf_eos_token_id=None,  # no EOS: lengths come from max_new_tokens (drawn by the caller)
        **per_release,
    )


@contextlib.contextmanager
def no_watchdog(module: Any) -> Iterator[None]:
    """``create_scheduler_watchdog`` (as the scheduler module ``module`` sees it) returns no watchdog while
    a ``Scheduler`` is constructed (0.5.9 on). SGLang's watchdog thread SIGQUITs the parent process when
    the forward count stops while a batch is set (300 s); a stepped loop is idle between calls by design,
    and a hunt keeps each seed's finished scheduler alive (their watchdogs killed long hunts). The
    scheduler only stores the object."""
    real = getattr(module, "create_scheduler_watchdog", None)
    if real is None:
        yield
        return
    module.create_scheduler_watchdog = lambda *_, **__: None
    try:
        yield
    finally:
        module.create_scheduler_watchdog = real
