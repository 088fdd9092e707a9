"""Python-backend model instances in processes of their own, as Triton runs every Python model.

``serve(..., python_instances="process")`` (``triton-nb serve --python-instances process``) gives
each Python-model instance its own process — the stub, :mod:`triton_nb.backends._python_stub` —
so that instances run in parallel on several cores and a crashing model cannot take the kernel
down; a model with ``EXECUTION_ENV_PATH`` always runs so, with the interpreter of its packed
environment (:mod:`triton_nb.backends.execution_env`). The stub runs the same Python backend as
the thread instances (:class:`~triton_nb.backends.python.PythonBackend`), so a model behaves the
same in both; only the hand-off differs:

* a batch's input tensors are written into this instance's shared-memory arena, its output
  tensors come back in the stub's (:mod:`triton_nb.backends._tensor_arena`); a message on a Unix
  socket pair of its own (:mod:`triton_nb.backends._process_channel`) carries the rest, sent and
  answered on the worker that runs the batch (no reader thread between the answer and its waiter);
* what the model asks of the server (BLS ``exec``/``async_exec``, also streamed, ``is_model_ready``,
  model loading) comes back over a second socket pair, the channel, read by a thread of its own,
  and runs here; a decoupled model's responses travel there as messages whenever it sends them;
* the model's ``pb_utils.Logger`` records reach the server's logger; what it prints to stdout and
  stderr reaches this process's;
* the process gets this one's environment with ``OMP_WAIT_POLICY=PASSIVE`` unless it is set: an
  OpenMP pool that spins after its work would take the cores the server and the other instances
  need (measured: the fraud ensemble's p90 at one request in flight 18.5 ms -> 1.7 ms);
* a stub that dies (a crash, ``os._exit``, a kill) fails the batch it ran — and closes every
  stream it had open — with a message naming the model, the instance and how it ended; the next
  batch starts a new stub (``initialize`` again), as Triton restarts a stub it finds dead.

A stub that does not answer its start within ``STUB_START_TIMEOUT_S`` (``initialize`` included)
is killed and the load fails, naming the model.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from concurrent.futures import Future, InvalidStateError
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triton_nb._sockets import SCRIPT_BOOTSTRAP
from triton_nb.backends import _python_stub
from triton_nb.backends._process_channel import Channel, error_from_wire, error_to_wire
from triton_nb.backends._tensor_arena import ArenaReader, ArenaWriter, pack_batch, remove_arenas, unpack_batch
from triton_nb.backends.base import Backend, ModelContext, execute_apart
from triton_nb.backends.custom_metrics import CUSTOM_METRICS, CustomMetricError
from triton_nb.backends.python import PythonModelSettings, UserReadiness
from triton_nb.errors import InternalError, TritonNBError
from triton_nb.tensors import InferRequest, InferResponse

if TYPE_CHECKING:
    from triton_nb.repository.config import ModelConfig

__all__ = ["STUB_START_TIMEOUT_S", "ProcessPythonBackend", "auto_complete_in_process"]

log = logging.getLogger(__name__)

#: How long a stub may take to start and initialize its model (Triton's stub-timeout-seconds is
#: 30 s for its handshake; a model's initialize may load much more, so this is longer).
STUB_START_TIMEOUT_S = float(os.environ.get("TRITON_NB_STUB_START_TIMEOUT_S", "120"))
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
# run the stub by path with nothing of ours on sys.path: the stub file's folder holds modules named
# "python", "base"... that would shadow a model's own imports
_SERVER_METHODS = frozenset({"infer", "is_model_ready", "load_model", "unload_model"})


def _stub_env(env: dict[str, str] | None) -> dict[str, str]:
    """The environment of a model's process: ``env`` (this process's by default), with passive
    OpenMP waits unless set. An OpenMP pool (XGBoost's, numpy's BLAS) spins for a while after each
    parallel region; in a process beside the server and the other instances it spins on the cores
    they need (the fraud ensemble at one request in flight: p90 18.5 -> 1.7 ms)."""
    environment = dict(os.environ if env is None else env)
    environment.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return environment


def _start_stub(interpreter: str, theirs: socket.socket, env: dict[str, str], data: socket.socket | None = None,
                **streams: Any) -> subprocess.Popen:
    """The stub process on its end of the socket pair (and of the batches' pair, ``data``); its
    own session, so a Ctrl-C in a terminal reaches the server only."""
    fds = (theirs.fileno(),) if data is None else (theirs.fileno(), data.fileno())
    return subprocess.Popen([interpreter, "-c", SCRIPT_BOOTSTRAP, _python_stub.__file__, ",".join(map(str, fds)),
                             _PACKAGE_DIR], pass_fds=fds, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                            **streams)


@dataclass(eq=False)
class _Batch:
    stub: _Stub
    future: Future = field(default_factory=Future)
    senders: dict[int, Any] = field(default_factory=dict)  # request index -> its response sender (decoupled)
    requests: list[InferRequest] = field(default_factory=list)  # whose cancellation the model may ask about


class _Stub:
    """One running stub process with its channels and reader threads.

    Two socket pairs: ``data`` carries the batches and their answers, read by the instance's worker
    that sent the batch (the answer reaches the thread that waits for it, with no hand-off from a
    reader thread); ``channel`` carries the rest (the model's log, metrics, BLS calls, decoupled
    responses, start and finalize), read by the reader thread, which also sees the process end. A
    decoupled model's batches are answered on ``channel``, after the responses they sent, so that
    their order holds (a BLS caller's stream ends with the batch's answer)."""

    def __init__(self, owner: ProcessPythonBackend, interpreter: str, env: dict[str, str] | None) -> None:
        self.owner = owner
        ours, theirs = socket.socketpair()
        data_ours, data_theirs = socket.socketpair()
        try:
            self.process = _start_stub(interpreter, theirs, env, data_theirs, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
        except OSError as exc:
            ours.close()
            data_ours.close()
            raise InternalError(f"model '{owner.name}': cannot start a Python process with {interpreter}: "
                                f"{exc}") from exc
        finally:
            theirs.close()
            data_theirs.close()
        self.channel = Channel(ours)
        self.data = Channel(data_ours)
        prefix = owner.context.python_backend.shm_region_prefix_name  # --backend-config=python,shm-region-prefix-name
        self.arena_prefix = f"{prefix}{self.process.pid}_{uuid.uuid4().hex[:8]}"
        self.ready: Future = Future()
        self.finalized = threading.Event()
        self.dead = False
        self.has_is_ready = False  # whether the model defines is_ready(), as its process reports
        for stream, target in ((self.process.stdout, sys.stdout), (self.process.stderr, sys.stderr)):
            threading.Thread(target=_forward, args=(stream, target), daemon=True,
                             name=f"triton-nb-{owner.context.instance_name}-output").start()
        self.reader = threading.Thread(target=self._read, daemon=True,
                                       name=f"triton-nb-{owner.context.instance_name}-stub")
        self.reader.start()

    def _dispatch(self, message: tuple) -> None:
        owner = self.owner
        op = message[0]
        if op == "done":  # a decoupled model's batch: answered on the channel, after its responses
            owner._finish(message[1], (message[2], message[3]))
        elif op == "failed":
            owner._finish(message[1], error_from_wire(message[2]))
        elif op == "response":
            batch, index, response, final = message[1:]
            if response is not None:
                response.error = error_from_wire(response.error)
            owner._respond(batch, index, response, final)
        elif op == "server_call":
            owner._serve_call(self, *message[1:])
        elif op == "log":
            owner.logger.log(message[1], "%s", message[2])
        elif op == "is_ready_answer":
            owner._readiness_answer(message[1], message[2], message[3])
        elif op == "ready":
            self.has_is_ready = bool(message[2])
            self.ready.set_result(message[1])
        elif op == "init_failed":
            self.ready.set_exception(InternalError(message[1]))
        elif op == "finalized":
            self.finalized.set()
        elif op.startswith("metric_"):
            owner._metric(self, message)

    def _read(self) -> None:
        while True:
            message = self.channel.recv()
            if message is None:
                break
            self._dispatch(message)
        self.dead = True
        owner = self.owner
        code = self.process.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        if not self.ready.done():
            self.ready.set_exception(InternalError(f"model '{owner.name}': its Python process ended ({how}) "
                                                   "before the model was initialized"))
        remove_arenas(self.arena_prefix)
        if not self.finalized.is_set():
            owner._stub_died(self, how)
            # (a finalized stub's sockets are closed by finalize; a dead one's here, once its batch failed)
            self.data.close()
            self.channel.close()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()


def _forward(stream: Any, target: Any) -> None:
    for line in iter(stream.readline, b""):
        with contextlib.suppress(Exception):
            target.write(line.decode("utf-8", "replace"))
            target.flush()
    stream.close()


class ProcessPythonBackend(Backend):
    """One Python-model instance, run in a process of its own (see the module docstring)."""

    def __init__(self, context: ModelContext, *, backend_folder: Path | None = None, interpreter: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        """``interpreter``: the Python that runs the stub (this one by default; a packed
        environment's for ``EXECUTION_ENV_PATH``); ``env``: its environment (this process's)."""
        super().__init__(context)
        self.name = context.name
        self.settings = PythonModelSettings.from_config(context.config)
        self.decoupled = self.settings.decoupled
        self.accepts_carried = not self.decoupled  # as the thread instances (see execute_apart)
        self.logger = logging.getLogger(f"triton_nb.python_backend.{context.name}")
        self._backend_folder = backend_folder
        self._interpreter = interpreter or sys.executable
        self._env = _stub_env(env)
        self._shm = context.python_backend  # the Python backend's --backend-config settings
        # stub-timeout-seconds, when given, bounds the start (initialize included); else triton_nb's own
        self._start_timeout_s = self._shm.stub_timeout_seconds or STUB_START_TIMEOUT_S
        self._lock = threading.Lock()  # starting a stub and registering a batch
        self._data_lock = threading.Lock()
        self._batches: dict[int, _Batch] = {}
        self._ids = itertools.count(1)
        self._arena: ArenaWriter | None = None
        self._outputs = ArenaReader()
        self._metrics: dict[tuple[int, int], Any] = {}  # (stub, metric id) -> the series' handle here
        self._bls_calls: dict[tuple[int, int], InferRequest] = {}  # (stub, call) -> the model's BLS request running
        self._finalized = False
        self._readiness = UserReadiness(context.instance_name)
        self._readiness_queries: dict[int, Future] = {}  # asked of the model's process, not yet answered
        self._stub = self._start()

    # -- the stub's life -----------------------------------------------------------------
    def _start(self) -> _Stub:
        stub = _Stub(self, self._interpreter, self._env)
        context = self.context
        init = {"name": context.name, "version": context.version, "model_path": str(context.model_path),
                "version_path": str(context.version_path), "repository_path": str(context.repository_path),
                "instance_name": context.instance_name, "instance_kind": context.instance_kind,
                "device_id": context.device_id, "settings": asdict(self.settings),
                "backend_folder": None if self._backend_folder is None else str(self._backend_folder),
                "arena_prefix": stub.arena_prefix + "_out", "arena_min_bytes": self._shm.shm_default_byte_size,
                "log_level": self.logger.getEffectiveLevel(),
                "model_control_mode": getattr(context.server, "model_control_mode", None)}
        try:
            stub.channel.send(("init", init))
            stub.ready.result(timeout=self._start_timeout_s)
        except TimeoutError:
            stub.kill()
            raise InternalError(f"model '{self.name}' instance '{context.instance_name}': its Python process did not "
                                f"start within {self._start_timeout_s:g} s") from None
        except OSError as exc:
            stub.kill()
            raise InternalError(f"model '{self.name}': its Python process ended before it started: {exc}") from exc
        except TritonNBError:
            stub.kill()
            raise
        if self._arena is not None:
            self._arena.close()
        self._arena = ArenaWriter(stub.arena_prefix + "_in", self._shm.shm_default_byte_size)
        return stub

    def _stub_died(self, stub: _Stub, how: str) -> None:
        """Fail what the dead stub held: its batch, and every stream it had open."""
        error = InternalError(f"model '{self.name}' instance '{self.context.instance_name}': its Python process "
                              f"ended ({how}) while serving; the batch failed and the instance restarts")
        log.error("%s", error)
        with self._lock:
            batches = {i: b for i, b in self._batches.items() if b.stub is stub}
            for batch_id in batches:
                del self._batches[batch_id]
            queries, self._readiness_queries = self._readiness_queries, {}
        for query in queries.values():
            with contextlib.suppress(InvalidStateError):
                query.set_exception(InternalError("Stub process is not healthy while waiting for user-defined "
                                                  "is_ready() response"))
        for batch_id, batch in batches.items():
            with contextlib.suppress(InvalidStateError):  # (its answer may have come just before)
                batch.future.set_exception(error)
            for index in list(batch.senders):
                self._respond(batch_id, index, None, True, batch=batch, error=error)

    # -- readiness -----------------------------------------------------------------------
    def check_ready(self) -> None:
        """Python_backend's ``TRITONBACKEND_ModelInstanceReady``: a process that ended is not
        ready (until the next batch restarts it); then the model's ``is_ready()``, asked in its
        process, where it defines one (Triton 2.67)."""
        stub = self._stub
        if stub.dead:
            raise InternalError(f"Stub process '{self.context.instance_name}' is not healthy.")
        if stub.has_is_ready:
            self._readiness.check(partial(self._ask_is_ready, stub))

    def _ask_is_ready(self, stub: _Stub) -> Future:
        future: Future = Future()
        with self._lock:
            query = next(self._ids)
            self._readiness_queries[query] = future
        try:
            stub.channel.send(("is_ready", query))
        except OSError:
            self._readiness_answer(query, False, InternalError(
                "Stub process is not healthy while waiting for user-defined is_ready() response"))
        return future

    def _readiness_answer(self, query: int, ok: bool, value: Any) -> None:
        with self._lock:
            future = self._readiness_queries.pop(query, None)
        if future is None:
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(error_from_wire(value) if not isinstance(value, BaseException) else value)

    # -- executing -----------------------------------------------------------------------
    def execute(self, requests: list[InferRequest]) -> list[InferResponse] | None:
        # a carried request is split here (execute_apart), and packing joins its rows again for the process
        return execute_apart(requests, self._execute)

    def _execute(self, requests: list[InferRequest]) -> list[InferResponse] | None:
        with self._lock:
            if self._finalized:
                raise InternalError(f"model '{self.name}': the instance is unloaded")
            if self._stub.dead:
                self._stub = self._start()
            stub = self._stub
            batch_id = next(self._ids)
            batch = _Batch(stub, requests=requests)
            if self.decoupled:
                batch.senders = {i: r.response_sender for i, r in enumerate(requests) if r.response_sender is not None}
            self._batches[batch_id] = batch
            assert self._arena is not None
            tensors, plan = pack_batch([r.inputs for r in requests])
            specs = self._arena.write(tensors)
            metas = [{"model_name": r.model_name, "model_version": r.model_version, "request_id": r.request_id,
                      "requested_outputs": r.requested_outputs, "parameters": r.parameters, "priority": r.priority,
                      "timeout_microseconds": r.timeout_microseconds, "stream": r.response_sender is not None,
                      "cancelled": r.cancelled}
                     for r in requests]
            arena = self._arena.name
        outcome = self._run_batch(stub, batch_id, batch, ("execute", batch_id, arena, specs, plan, metas))
        if not self.decoupled:
            with self._lock:
                self._batches.pop(batch_id, None)
        if isinstance(outcome, BaseException):
            raise outcome
        out_arena, answers = outcome
        if answers is None:
            return None
        specs, plan, answers = answers
        outputs = unpack_batch(self._outputs.read(out_arena, specs) if specs else {}, plan, len(answers))
        version = self.context.version
        return [InferResponse(model_name=self.name, model_version=version, request_id=request.request_id,
                              outputs=tensors, parameters=answer["parameters"] or {},
                              error=error_from_wire(answer["error"]))
                for request, answer, tensors in zip(requests, answers, outputs, strict=True)]

    def _run_batch(self, stub: _Stub, batch_id: int, batch: _Batch, message: tuple) -> Any:
        """Send the batch on the data channel and read its answer there: (arena, answers) or the
        error. When the process ends first, the reader thread fails the batch (``_stub_died``)."""
        with self._data_lock:  # one batch on the data channel at a time (a worker per instance)
            try:
                stub.data.send(message)
                answer = None if self.decoupled else stub.data.recv()
            except OSError:
                answer = None
        if answer is None:  # decoupled, or the process is gone: the reader thread settles the batch
            return batch.future.result()
        op, answered_id = answer[0], answer[1]
        if answered_id != batch_id:
            raise InternalError(f"model '{self.name}': its Python process answered batch {answered_id}, "
                                f"not {batch_id}")
        outcome = (answer[2], answer[3]) if op == "done" else error_from_wire(answer[2])
        self._finish(batch_id, outcome)
        return outcome

    def _finish(self, batch_id: int, outcome: Any) -> None:
        """Settle the batch's books: a decoupled batch stays while its senders are open."""
        with self._lock:
            batch = self._batches.get(batch_id)
            if batch is not None and (not self.decoupled or not batch.senders):
                self._batches.pop(batch_id, None)
        if batch is not None:
            with contextlib.suppress(InvalidStateError):  # the process ended meanwhile and failed it
                batch.future.set_result(outcome)

    def _respond(self, batch_id: int, index: int, response: InferResponse | None, final: bool, *,
                 batch: _Batch | None = None, error: BaseException | None = None) -> None:
        """A decoupled model's response reaches its request's sender (an error closes the stream)."""
        if batch is None:
            with self._lock:
                batch = self._batches.get(batch_id)
        if batch is None:
            return
        sender = batch.senders.get(index)
        if sender is None:
            return
        if final:
            with self._lock:
                batch.senders.pop(index, None)
                if not batch.senders and batch.future.done():
                    self._batches.pop(batch_id, None)
        if error is not None:
            response = InferResponse(model_name=self.name, model_version=self.context.version, error=error)
        try:
            sender(response, final)
        except Exception:  # a client that went away must not cost the reader thread its life
            log.exception("model '%s': sending a response failed", self.name)

    # -- custom metrics ------------------------------------------------------------------
    def _metric(self, stub: _Stub, message: tuple) -> None:
        """A model's ``pb_utils`` custom metric, mirrored in this process's registry under its
        server's scope, where ``/metrics`` exports it (the model's process checked it already)."""
        op = message[0]
        try:
            if op == "metric_family":
                CUSTOM_METRICS.family(*message[1:])
            elif op == "metric_new":
                metric, name, labels, buckets = message[1:]
                family = CUSTOM_METRICS.family_named(name)
                scope = getattr(getattr(self.context.server, "stats", None), "custom_scope", None)
                owner = None if scope is None else (scope, self.name, self.context.version)
                self._metrics[(id(stub), metric)] = CUSTOM_METRICS.metric(family, labels, buckets, owner)
            elif op == "metric_op":
                metric, operation, value = message[1:]
                handle = self._metrics.get((id(stub), metric))
                if handle is not None:
                    getattr(handle, operation)(value)
        except (CustomMetricError, KeyError, TypeError, ValueError):
            log.debug("model '%s': a custom metric update was refused", self.name, exc_info=True)

    # -- what the model asks of the server -----------------------------------------------
    def _serve_call(self, stub: _Stub, call: int, method: str, args: tuple, kwargs: dict, stream: bool) -> None:
        server = self.context.server

        def answer(ok: bool, value: Any) -> None:
            with contextlib.suppress(OSError):
                stub.channel.send(("server_result", call, ok, value if ok else error_to_wire(value)))

        if method in ("request_cancelled", "cancel_call"):  # the backend's own books, answered at once
            answer(True, self._cancellation(stub, method, *args))
            return
        if server is None or method not in _SERVER_METHODS or not hasattr(server, method):
            answer(False, InternalError(f"model '{self.name}': the server offers no '{method}' to its models here"))
            return
        if method != "infer":
            # model control may wait on this very model's load: off the reader thread
            def run() -> None:
                try:
                    answer(True, getattr(server, method)(*args, **kwargs))
                except Exception as exc:
                    answer(False, exc)

            threading.Thread(target=run, daemon=True, name=f"triton-nb-{self.name}-server-call").start()
            return
        (request,) = args
        with self._lock:
            self._bls_calls[(id(stub), call)] = request
        if stream:
            def forward(response: InferResponse | None, final: bool) -> None:
                with contextlib.suppress(OSError):
                    stub.channel.send(("server_stream", call, response, final))

            request.response_sender = forward
        try:
            future = server.infer_async(request)
        except Exception as exc:
            answer(False, exc)
            return

        def done(f: Future) -> None:
            with self._lock:
                self._bls_calls.pop((id(stub), call), None)
            error = f.exception()
            answer(error is None, f.result() if error is None else error)

        future.add_done_callback(done)

    def _cancellation(self, stub: _Stub, method: str, *args: int) -> bool | None:
        """``request_cancelled`` (batch, index): whether that served request was cancelled;
        ``cancel_call`` (call): cancel the request the model's BLS call ``call`` runs."""
        with self._lock:
            if method == "cancel_call":
                request = self._bls_calls.get((id(stub), args[0]))
                if request is not None:
                    request.cancelled = True
                return None
            batch = self._batches.get(args[0])
            requests = batch.requests if batch is not None else []
            return args[1] < len(requests) and requests[args[1]].is_cancelled()

    # -- unloading -----------------------------------------------------------------------
    def finalize(self) -> None:
        with self._lock:
            if self._finalized:
                return
            self._finalized = True
            stub = self._stub
        if not stub.dead:
            with contextlib.suppress(OSError):
                stub.channel.send(("finalize",))
            if not stub.finalized.wait(30.0):
                log.warning("model '%s': its Python process did not finalize within 30 s; killed", self.name)
            stub.kill()
        stub.process.wait()
        stub.channel.close()
        stub.data.close()
        if self._arena is not None:
            self._arena.close()
        self._outputs.close()
        remove_arenas(stub.arena_prefix)


def _ended(process: subprocess.Popen, grace_s: float = 2.0) -> bool:
    """Whether ``process`` has ended, or ends within ``grace_s`` (its socket closes just before)."""
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def auto_complete_in_process(config: ModelConfig, version_path: Path, *, interpreter: str | None = None,
                             env: dict[str, str] | None = None, code_dir: Path | None = None) -> ModelConfig:
    """:func:`~triton_nb.backends.python.auto_complete` for a model that runs in processes of its
    own: in a one-off stub with ``interpreter`` (a packed environment's for ``EXECUTION_ENV_PATH``),
    so that what its ``model.py`` imports at module level needs only that environment, as on Triton,
    where the stub runs it. The answer travels as Triton's JSON form and becomes a config here.
    ``code_dir``: a Python-based backend's folder, whose ``model.py`` runs for the model."""
    from triton_nb.backends.python import model_filename
    from triton_nb.repository.config import ModelConfig, config_from_json, config_to_json

    name = config.name or Path(version_path).parent.name
    ours, theirs = socket.socketpair()
    try:
        process = _start_stub(interpreter or sys.executable, theirs, _stub_env(env))
    except OSError as exc:
        ours.close()
        raise InternalError(f"model '{name}': cannot start a Python process with {interpreter}: {exc}") from exc
    finally:
        theirs.close()
    channel = Channel(ours)
    try:
        channel.send(("autocomplete", {"config": config_to_json(config), "name": name,
                                       "version_path": str(version_path), "filename": model_filename(config, code_dir),
                                       "code_dir": None if code_dir is None else str(code_dir)}))
        ours.settimeout(STUB_START_TIMEOUT_S)
        answer = channel.recv()  # None when the process ended, or the time ran out (a read that timed out)
        if answer is None and not _ended(process):
            raise InternalError(f"model '{name}': auto_complete_config did not finish within "
                                f"{STUB_START_TIMEOUT_S:g} s in its Python process")
    finally:
        with contextlib.suppress(OSError):
            process.kill()
        process.wait()
        channel.close()
    if answer is None:
        code = process.returncode
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        raise InternalError(f"model '{name}': its Python process ended ({how}) while running auto_complete_config")
    if answer[0] == "autocomplete_failed":
        raise error_from_wire(answer[1])
    if answer[1] is None:
        unchanged = ModelConfig()
        unchanged.CopyFrom(config)
        return unchanged
    return config_from_json(answer[1], source=f"model '{name}': auto_complete_config result")
