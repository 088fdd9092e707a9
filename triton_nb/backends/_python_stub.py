"""The process a Python model instance runs in when the server runs Python models as processes.

Started by :class:`triton_nb.backends.python_process.ProcessPythonBackend` as
``<interpreter> _python_stub.py FD[,DATA_FD] PACKAGE_DIR``: ``FD`` is its end of a Unix socket pair
(the channel), ``DATA_FD`` its end of a second one that carries the batches,
``PACKAGE_DIR`` the folder of the ``triton_nb`` package whose modules it uses — the Python backend
itself (:class:`~triton_nb.backends.python.PythonBackend`, ``triton_python_backend_utils``), the
tensor arena and the channel — without importing the package as a whole: the interpreter may be a
model's own (``EXECUTION_ENV_PATH``), with the standard library and numpy and nothing else.

What it does (Triton's stub process does the same for its model):

1. receives ``("init", settings)``, creates the instance (``initialize``), answers ``("ready", pid)``
   or ``("init_failed", message)`` — or, started for nothing else, ``("autocomplete", job)``: runs the
   model's ``auto_complete_config`` before the server creates instances, answers and exits;
2. answers each ``("execute", batch, arena, requests)`` (on the data socket) — inputs read from the
   server's arena — with ``("done", batch, arena, responses)``, outputs written into its own arena,
   or ``("failed", batch, error)``, on the data socket too; a decoupled model's responses go on the
   channel as ``("response", batch, index, response, final)`` whenever the model sends them, and
   its batches are answered on the channel after them, so that nothing overtakes a response;
3. forwards what the model asks of the server — BLS ``infer`` (and its streamed responses),
   ``is_model_ready``, model loading — as ``("server_call", ...)`` and waits for the answer;
4. forwards the model's log records (``pb_utils.Logger``) as ``("log", level, message)``;
5. on ``("finalize",)`` calls the model's ``finalize`` and exits; when the server goes away it exits.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import socket
import sys
import threading
import types
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any


def _bare_packages(package_dir: str) -> None:
    """Make ``triton_nb.<module>`` importable without running the package's ``__init__`` (which
    imports the whole server and its dependencies)."""
    for name, path in (("triton_nb", package_dir), ("triton_nb.backends", os.path.join(package_dir, "backends"))):
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module


class _ServerProxy:
    """What a model may call on its server (the ``ServerHandle`` protocol), over the channel."""

    def __init__(self, channel: Any, model_control_mode: str | None) -> None:
        self._channel = channel
        self.model_control_mode = model_control_mode  # what pb_utils.load_model checks, as of the start
        # pb_utils files a model's custom metrics under its server's scope (they outlive an unload):
        # this process's stand-in for it; the server keeps the exported series in its own
        self.stats = types.SimpleNamespace(custom_scope=object())
        self._ids = itertools.count(1)
        self._calls: dict[int, Future] = {}
        self._streams: dict[int, Any] = {}
        self._requests: dict[int, Any] = {}  # call -> the model's BLS request it runs
        self._lock = threading.Lock()

    def _call(self, method: str, *args: Any, sender: Any = None, **kwargs: Any) -> Future:
        return self._numbered_call(next(self._ids), method, *args, sender=sender, **kwargs)

    def _numbered_call(self, call: int, method: str, *args: Any, sender: Any = None, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._lock:
            self._calls[call] = future
            if sender is not None:
                self._streams[call] = sender
        self._channel.send(("server_call", call, method, args, kwargs, sender is not None))
        return future

    def infer_async(self, request: Any) -> Future:
        call = next(self._ids)
        with self._lock:
            self._requests[call] = request  # what cancel_request looks for, while the call runs
        return self._numbered_call(call, "infer", replace(request, response_sender=None),
                                   sender=request.response_sender)

    def cancel_request(self, request: Any) -> None:
        """A BLS request's ``ResponseIterator.cancel()``: the server cancels the request it runs for
        this call; as python_backend's ``PbBLSCancel``, the model waits for that to be done."""
        with self._lock:
            call = next((call for call, running in self._requests.items() if running is request), None)
        if call is not None:
            self._call("cancel_call", call).result()

    def request_cancelled(self, batch: int, index: int) -> bool:
        """Whether request ``index`` of batch ``batch`` was cancelled, asked of the server as
        python_backend's stub asks (``PYTHONSTUB_IsRequestCancelled``)."""
        return bool(self._call("request_cancelled", batch, index).result())

    def infer(self, request: Any) -> Any:
        return self.infer_async(request).result()

    def is_model_ready(self, name: str, version: int | None = None) -> bool:
        return bool(self._call("is_model_ready", name, version).result())

    def load_model(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._call("load_model", name, *args, **kwargs).result()

    def unload_model(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._call("unload_model", name, *args, **kwargs).result()

    def resolve(self, call: int, ok: bool, value: Any) -> None:
        with self._lock:
            future = self._calls.pop(call, None)
            self._streams.pop(call, None)
            self._requests.pop(call, None)
        if future is None:
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def stream(self, call: int, response: Any, final: bool) -> None:
        with self._lock:
            sender = self._streams.get(call)
        if sender is not None:
            sender(response, final)

    def fail_all(self, error: BaseException) -> None:
        with self._lock:
            calls, self._calls = self._calls, {}
            self._streams.clear()
            self._requests.clear()
        for future in calls.values():
            future.set_exception(error)


class _MetricsToServer:
    """Mirrors the model's ``pb_utils.MetricFamily`` / ``Metric`` on the server (a
    ``MetricsObserver`` of this process's registry): families and series are created there too,
    under the model's server scope, and every change follows. The checks and Triton's errors stay
    here, where the model gets them."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self._ids = itertools.count(1)

    def _send(self, message: tuple) -> None:
        with contextlib.suppress(OSError):
            self._channel.send(message)

    def family_registered(self, name: str, description: str, kind: int) -> None:
        self._send(("metric_family", name, description, kind))

    def metric_created(self, family: str, labels: dict[str, str], buckets: list[float] | None) -> Any:
        metric = next(self._ids)
        self._send(("metric_new", metric, family, labels, buckets))

        def changed(operation: str, value: float) -> None:
            self._send(("metric_op", metric, operation, value))

        return changed


class _ChannelLog(logging.Handler):
    """The model's log records, sent to the server's logger for this model."""

    def __init__(self, channel: Any) -> None:
        super().__init__()
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError):
            self._channel.send(("log", record.levelno, record.getMessage()))


def _auto_complete(channel: Any, job: dict[str, Any]) -> int:
    """A one-off process: the model's ``auto_complete_config`` with this interpreter, answered as
    ``("autocompleted", config_json_or_None)`` or ``("autocomplete_failed", error)``."""
    from triton_nb.backends._process_channel import error_to_wire
    from triton_nb.backends.python import complete_config_json
    from triton_nb.errors import InternalError, TritonNBError

    try:
        completed = complete_config_json(job["config"], job["name"], job["version_path"], job["filename"],
                                         job.get("code_dir"))
    except BaseException as exc:
        error = exc if isinstance(exc, TritonNBError) else InternalError(
            f"model '{job['name']}': auto_complete_config failed: {type(exc).__name__}: {exc}")
        channel.send(("autocomplete_failed", error_to_wire(error)))
        return 1
    channel.send(("autocompleted", completed))
    return 0


def main() -> int:
    fds, package_dir = [int(fd) for fd in sys.argv[1].split(",")], sys.argv[2]
    _bare_packages(package_dir)
    from triton_nb.backends._process_channel import Channel, error_from_wire, error_to_wire
    from triton_nb.backends._tensor_arena import ArenaReader, ArenaWriter, pack_batch, unpack_batch
    from triton_nb.backends.base import ModelContext
    from triton_nb.backends.custom_metrics import CUSTOM_METRICS
    from triton_nb.backends.python import PythonBackend, PythonModelSettings
    from triton_nb.errors import InternalError, TritonNBError
    from triton_nb.tensors import InferRequest

    @dataclass
    class _StubRequest(InferRequest):
        """A served request in the model's process: ``is_cancelled()`` asks the server, where the
        request may be cancelled meanwhile; once true, the answer is kept (the flag never clears)."""

        probe: Any = field(default=None, repr=False, compare=False)

        def is_cancelled(self) -> bool:
            if not self.cancelled and self.probe is not None:
                self.cancelled = self.probe()
            return self.cancelled

    channel = Channel(socket.socket(fileno=fds[0]))
    message = channel.recv()
    if message is not None and message[0] == "autocomplete":
        return _auto_complete(channel, message[1])
    if message is None or message[0] != "init":
        return 1
    init: dict[str, Any] = message[1]
    proxy = _ServerProxy(channel, init["model_control_mode"])
    CUSTOM_METRICS.observe_with(_MetricsToServer(channel))
    handler = _ChannelLog(channel)
    logger = logging.getLogger(f"triton_nb.python_backend.{init['name']}")
    logger.addHandler(handler)
    logger.setLevel(init["log_level"])  # the server's level for this model: nothing sent only to be dropped
    logger.propagate = False
    context = ModelContext(name=init["name"], version=init["version"], config=None, model_path=init["model_path"],
                           version_path=init["version_path"], repository_path=init["repository_path"],
                           instance_name=init["instance_name"], instance_kind=init["instance_kind"],
                           device_id=init["device_id"], server=proxy)
    # Two sockets, a thread each: batches come and go on the data socket, read by the thread that
    # runs them (no hand-off between threads on the way in), while the channel's thread reads what
    # comes meanwhile — the answers to the model's BLS calls, which the batch may be waiting for.
    if len(fds) < 2:
        return 1
    data = Channel(socket.socket(fileno=fds[1]))
    # a decoupled model's answers follow its responses on the channel, in the order they were sent
    replies = channel if init["settings"].get("decoupled") else data
    state: dict[str, Any] = {"backend": None}

    def leave(code: int) -> None:
        backend = state["backend"]
        if backend is not None:
            backend.finalize()
        with contextlib.suppress(OSError):
            channel.send(("finalized",))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)  # the other thread may be waiting in recv(): end the process, not just this thread

    def serve(source: Any, handle: Any) -> None:
        """Handle what comes on ``source`` until the server goes (then nothing is left to answer)."""
        while True:
            incoming = source.recv()
            if incoming is None:
                proxy.fail_all(InternalError(f"model '{init['name']}': the server closed the connection"))
                leave(0)  # (it ends the process)
                return
            handle(incoming[0], incoming[1:])

    def on_message(op: str, args: tuple) -> None:
        if op == "server_result":
            call, ok, value = args
            proxy.resolve(call, ok, value if ok else error_from_wire(value))
        elif op == "server_stream":
            proxy.stream(*args)
        elif op == "is_ready":
            # the model's is_ready() may make BLS calls, whose answers this thread reads
            threading.Thread(target=answer_is_ready, args=args, daemon=True, name="triton-nb-stub-is-ready").start()
        elif op == "finalize":
            leave(0)

    def answer_is_ready(query: int) -> None:
        try:
            answer: tuple = ("is_ready_answer", query, True, state["backend"].call_is_ready())
        except TritonNBError as exc:
            answer = ("is_ready_answer", query, False, error_to_wire(exc))
        with contextlib.suppress(OSError):
            channel.send(answer)

    def on_batch(op: str, args: tuple) -> None:
        if op == "execute":
            run_batch(*args)

    def sender_for(batch: int, index: int) -> Any:
        def send(response: Any, final: bool) -> None:
            if response is not None:
                response = replace(response, error=error_to_wire(response.error))
            channel.send(("response", batch, index, response, final))

        return send

    reader, writer = ArenaReader(), ArenaWriter(init["arena_prefix"], init["arena_min_bytes"])

    def run_batch(batch: int, arena: str, specs: list, plan: list, metas: list) -> None:
        backend = state["backend"]
        inputs = unpack_batch(reader.read(arena, specs), plan, len(metas))
        requests = [_StubRequest(
            model_name=meta["model_name"], inputs=tensors, model_version=meta["model_version"],
            requested_outputs=meta["requested_outputs"], request_id=meta["request_id"],
            parameters=meta["parameters"], priority=meta["priority"],
            timeout_microseconds=meta["timeout_microseconds"],
            response_sender=sender_for(batch, index) if meta["stream"] else None,
            cancelled=meta["cancelled"], probe=partial(proxy.request_cancelled, batch, index))
            for index, (meta, tensors) in enumerate(zip(metas, inputs, strict=True))]
        try:
            responses = backend.execute(requests)
        except TritonNBError as exc:
            replies.send(("failed", batch, error_to_wire(exc)))
            return
        except BaseException as exc:
            replies.send(("failed", batch, error_to_wire(
                InternalError(f"model '{init['name']}': {type(exc).__name__}: {exc}"))))
            return
        if responses is None:
            replies.send(("done", batch, None, None))
            return
        tensors, plan = pack_batch([response.outputs or {} for response in responses])
        specs = writer.write(tensors)
        answers = [{"error": error_to_wire(response.error), "parameters": response.parameters}
                   for response in responses]
        replies.send(("done", batch, writer.name, (specs, plan, answers)))

    # the channel's thread reads while the model initializes (its initialize may call the server)
    threading.Thread(target=serve, args=(channel, on_message), name="triton-nb-stub-channel", daemon=True).start()
    try:
        backend = PythonBackend(context, backend_folder=init["backend_folder"],
                                settings=PythonModelSettings(**init["settings"]))
    except BaseException as exc:
        channel.send(("init_failed", str(exc) if isinstance(exc, TritonNBError) else f"{type(exc).__name__}: {exc}"))
        return 1
    # as the server does once its models are loaded (triton_nb.server.collector): what the model
    # loaded leaves the cyclic collector's full passes, which would otherwise walk it (pandas,
    # encoders) in the middle of batches
    gc.collect()
    gc.freeze()
    state["backend"] = backend
    channel.send(("ready", os.getpid(), backend.has_is_ready))
    serve(data, on_batch)  # never returns: the process ends in leave()
    return 0


if __name__ == "__main__":
    sys.exit(main())
