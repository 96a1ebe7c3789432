"""The launcher's scheduler-process path on CPU: SGLang's real ``run_scheduler_process`` in a spawned child,
under the attach, driven by requests over SGLang's real zmq IPC.

What is real: the child is started as SGLang's engine starts it (``multiprocessing`` ``spawn`` context,
a pipe for the ready handshake); it runs 0.5.23's own ``run_scheduler_process`` (``load_plugins``,
``publish``, ``configure_scheduler_process``, ``Scheduler(server_args, port_args)``, the ready message,
``run_event_loop`` -> ``event_loop_normal``); the attach arrives through SGLang's plugin loading
(:mod:`.serve_plugin`, by :func:`.serve.attached_environment`, the launcher's own function); the
scheduler's IPC channels are SGLang's (``SchedulerIpcChannels.create``, ``SchedulerRequestReceiver``)
and this process talks to them as the tokenizer manager does (``sock_send`` of a
``TokenizedGenerateReqInput`` to ``scheduler_input_ipc_name``; ``sock_recv`` of the outputs on
``tokenizer_ipc_name``, the route with ``--skip-tokenizer-init``).

What stands in, and why: the HTTP server, tokenizer manager and detokenizer (``fastapi`` / ``uvicorn``
are not in this environment, and no model or tokenizer exists): this process plays the tokenizer
manager's two sockets. In the child, one more SGLang plugin (:func:`stand_in`) replaces
``Scheduler`` by the CPU build's subclass (:func:`.build23.scheduler_class_23`: model config, fake
tagging worker, the parallel runtime over gloo, no watchdog; spec/sglang-scheduler.md lists each) with
SGLang's own IPC channels and request receiver put back. A GPU server needs neither stand-in.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import pickle
import signal
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

from kvledger.engines.sglang.scheduler.build_common import SchedulerShape
from kvledger.engines.sglang.scheduler.release import OWN_RELEASE, import_scheduler, prepare_imports
from kvledger.engines.sglang.scheduler.serve import attached_environment

STAND_IN_ENTRY = ("kvledger_cpu_scheduler", "kvledger.engines.sglang.scheduler.serve_cpu:stand_in")
SCHEDULER_CLASS = "sglang.srt.managers.scheduler.Scheduler"
READY_TIMEOUT_S = 300.0
"""How long the launching process waits for the child's ready message (its imports and the build)."""


def stand_in() -> None:
    """SGLang plugin (child only): ``Scheduler`` is the CPU build's subclass with SGLang's own IPC."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(SCHEDULER_CLASS, cpu_scheduler_class(), HookType.REPLACE)


def cpu_scheduler_class() -> Any:
    from kvledger.engines.sglang.scheduler.build23 import scheduler_class_23, stand_ins

    base = scheduler_class_23()
    real = base.__mro__[1]  # SGLang's own Scheduler
    module = __import__("sglang.srt.managers.scheduler", fromlist=["Scheduler"])

    class ServedCPUScheduler(base):  # type: ignore[misc, valid-type]
        kv_shape = SchedulerShape()
        # the real zmq channels and receiver, as a launched server has them
        init_ipc_channels = real.init_ipc_channels
        init_request_receiver = real.init_request_receiver
        maybe_init_rust_server = real.maybe_init_rust_server

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            with stand_ins(module):
                super().__init__(*args, **kwargs)

    return ServedCPUScheduler


def run_scheduler_on_cpu(arguments: bytes, writer: Any) -> None:
    """The child's target: the import stand-ins of this environment, then SGLang's own
    ``run_scheduler_process`` (gpu 0, tp 0, pp 0, no DP rank), as the engine calls it. The server and
    port arguments come pickled, unpickled here: unpickling imports SGLang, which in this environment
    needs the import stand-ins first (a GPU server's environment has the real packages)."""
    module, _ = import_scheduler(OWN_RELEASE)
    server_args, port_args = pickle.loads(arguments)
    module.run_scheduler_process(server_args, port_args, 0, 0, 0, None, writer)


def _server_args(shape: SchedulerShape) -> Any:
    from kvledger.engines.sglang.scheduler.build_common import server_args

    # not published here: run_scheduler_process publishes them in the child
    return server_args(None, shape, publish=lambda _: None, pp_default=False)


def _request(rid: str, tokens: list[int], max_new_tokens: int) -> Any:
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    params.normalize(None)  # the tokenizer manager's step before it sends (no tokenizer: no stop strings)
    return TokenizedGenerateReqInput(
        rid=rid,
        input_text=None,
        input_ids=array("q", tokens),
        input_embeds=None,
        mm_inputs=None,
        token_type_ids=None,
        sampling_params=params,
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=False,
    )


Request = tuple[str, list[int], int]
"""(rid, prompt ids, max new tokens)."""

_SHARED = list(range(1, 13))
WAVES: list[list[Request]] = [
    # a shared prefix (b extends a's prompt: a tree match), a prompt longer than one prefill chunk
    [("a", _SHARED, 4), ("b", [*_SHARED, 40, 41, 42, 43], 3), ("c", list(range(100, 121)), 5)],
    # a follow-up turn on a's prefix, and one more request (a planted bug in a test acts on "planted-*")
    [("d", [*_SHARED, 50, 51], 2), ("planted-e", list(range(200, 210)), 3)],
]
"""The served workload of ``serve-cpu``: two waves, the second sent after the first finished."""


def serve_on_cpu(
    waves: list[list[Request]],
    *,
    on_violation: str = "raise",
    extra_plugins: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Start the attached scheduler process; send each wave of requests over SGLang's IPC and wait for
    all of it to finish (or the child to fail) before the next; stop the child. Returns what this
    process saw: the ready message, each finished request's output ids, the violations the child had
    reported after each wave, whether it SIGQUIT this process (SGLang's reaction to a scheduler
    exception)."""
    import zmq

    prepare_imports(OWN_RELEASE)  # this process plays the tokenizer manager: no scheduler import
    from sglang.srt.server_args import PortArgs
    from sglang.srt.utils.network import get_zmq_socket

    args = _server_args(SchedulerShape())
    port_args = PortArgs.init_new(args)
    report = Path(tempfile.mkdtemp(prefix="kvledger-serve-")) / "violations.jsonl"
    quits: list[float] = []
    previous = signal.signal(signal.SIGQUIT, lambda *_: quits.append(time.monotonic()))
    plugins = {STAND_IN_ENTRY[0]: STAND_IN_ENTRY[1], **(extra_plugins or {})}
    out: dict[str, Any] = {"on_violation": on_violation, "sent": [r[0] for wave in waves for r in wave]}
    context = zmq.Context(2)
    try:
        to_scheduler = get_zmq_socket(context, zmq.PUSH, port_args.scheduler_input_ipc_name, True)
        from_scheduler = get_zmq_socket(context, zmq.PULL, port_args.tokenizer_ipc_name, True)
        # the plugin folder must outlive the child: it loads its plugins after its imports
        with attached_environment(on_violation, str(report), plugins):
            out.update(
                _run_child(args, port_args, (to_scheduler, from_scheduler), waves, (quits, report), timeout_s)
            )
    finally:
        signal.signal(signal.SIGQUIT, previous)
        context.destroy(linger=0)
    out["sigquit"] = bool(quits)
    out["violations"] = _read_report(report)
    return out


def _run_child(
    args: Any,
    port_args: Any,
    sockets: tuple[Any, Any],
    waves: list[list[Request]],
    seen: tuple[list[float], Path],
    timeout_s: float,
) -> dict[str, Any]:
    quits = seen[0]
    out: dict[str, Any] = {}
    spawn = multiprocessing.get_context("spawn")  # SGLang's engine sets this start method
    reader, writer = spawn.Pipe(duplex=False)
    payload = pickle.dumps((args, port_args))
    child = spawn.Process(target=run_scheduler_on_cpu, args=(payload, writer))
    start = time.monotonic()
    child.start()
    # SGLang's message module is imported while the child imports and builds (two cores, not one after
    # the other)
    from sglang.srt.managers.io_struct import sock_send

    try:
        # the child's imports take 10-25 s on a quiet machine; a loaded CI runner may take far longer
        out["ready"] = reader.recv() if reader.poll(READY_TIMEOUT_S) else None
        out["ready_s"] = round(time.monotonic() - start, 2)
        to_scheduler, from_scheduler = sockets
        quits, report = seen
        out["finished"], out["violations_after_wave"] = {}, []
        for wave in waves:
            for rid, tokens, n in wave:
                sock_send(to_scheduler, _request(rid, tokens, n))
            done = _collect(from_scheduler, {r[0] for r in wave}, child, quits, timeout_s)
            out["finished"].update(done)
            out["violations_after_wave"].append(len(_read_report(report)))
            if len(done) < len(wave):
                break  # the child stopped serving (raise mode) or timed out
        out["served_s"] = round(time.monotonic() - start - out["ready_s"], 2)
    finally:
        with contextlib.suppress(Exception):
            child.join(5.0 if quits else 0.0)  # SGLang's child exits after its SIGQUIT
        if child.is_alive():
            child.kill()
            child.join(10.0)
        out["exitcode"] = child.exitcode
    return out


def _collect(
    sock: Any, rids: set[str], child: Any, quits: list[float], timeout_s: float
) -> dict[str, list[int]]:
    """Outputs until every rid finished, the child died or SIGQUIT us, or ``timeout_s`` passed."""
    import zmq
    from sglang.srt.managers.io_struct import sock_recv

    done: dict[str, list[int]] = {}
    tokens: dict[str, list[int]] = {}
    deadline = time.monotonic() + timeout_s
    while set(done) != rids and time.monotonic() < deadline and not quits and child.is_alive():
        if not sock.poll(200):
            continue
        batch = sock_recv(sock, zmq.NOBLOCK)
        for i, rid in enumerate(getattr(batch, "rids", None) or []):
            ids = (batch.output_ids or [None] * len(batch.rids))[i]
            tokens.setdefault(rid, []).extend(int(t) for t in (ids or []))
            if batch.finished_reasons[i] is not None:
                done[rid] = tokens[rid]
    return done


def _read_report(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
