"""Load generation on a server that a :class:`~triton_nb.transport.Transport` reaches.

:func:`open_load` makes the load a transport's protocol needs; the transport itself answers the
measurement's other questions (the model's config, the statistics).

A load keeps requests going — ``concurrency`` in flight (closed loop) or ``request_rate`` per second
(open loop, constant or Poisson arrivals) — and hands over what completed since it was last asked.
In-process loads use threads in this process (and say so: they share the server's GIL, which is
the point of measuring the in-kernel path); network loads run in a process of their own
(:mod:`triton_nb.perf._loadgen`), so they never compete with an in-kernel server for the GIL.

With a :class:`SequenceSpec`, a load runs perf_analyzer's sequences for a stateful model
(:class:`~triton_nb.perf._loadgen.SequencePlan`): each closed-loop slot, or each of the sequences a
request rate keeps active, sends one sequence after another, every request after the previous one of
its sequence was answered, with the ``sequence_id``/``sequence_start``/``sequence_end`` parameters;
stopping ends the sequences it cut short with one unrecorded END request each.

With :class:`SystemSharedMemory` (perf_analyzer's ``--shared-memory system``), a network load's
requests refer to registered shared-memory regions instead of carrying tensors: the inputs are
written there once, before the load, and the outputs are written there by the server.

With a :class:`~triton_nb.perf.options.Wire`, a network load's requests carry JSON tensors instead of
binary ones, ask for JSON answers, or are compressed (HTTP), or gRPC compresses its messages; every distinct request
is encoded once here and compressed once by the load generator, before the load. Network
completions carry each request's and response's bytes on the wire; in-process ones have none.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import queue
import random
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from triton_nb._locks import YieldingLock
from triton_nb._sockets import SCRIPT_BOOTSTRAP
from triton_nb.errors import InvalidArgumentError
from triton_nb.frames import config_datatype
from triton_nb.perf import _loadgen
from triton_nb.perf.inputs import SharedMemoryPlaces, TensorPlace, encode_grpc, encode_http
from triton_nb.perf.options import DEFAULT_OUTPUT_SHARED_MEMORY_SIZE, Wire
from triton_nb.perf.stats import Completions
from triton_nb.server.frontends.protocol import array_to_buffer
from triton_nb.server.service import InferenceService
from triton_nb.tensors import InferRequest, triton_to_numpy_dtype
from triton_nb.transport import Transport

__all__ = ["InProcessLoad", "NetworkLoad", "SequenceSpec", "SystemSharedMemory", "open_load"]

#: Every region this module creates is named (and keyed, ``/dev/shm/<name>``) with this prefix.
SHARED_MEMORY_PREFIX = "triton_nb_perf_"
# Tensors start on a cache line: concurrent requests never write to a line another one writes.
_ALIGN_BYTES = 64


@dataclass(frozen=True)
class SequenceSpec:
    """How a load runs sequences: perf_analyzer's ``--sequence-length``, ``--sequence-length-variation``
    (percent), ``--sequence-id-range`` (``id_start`` up to ``id_end`` excluded; None: unbounded) and
    ``--num-of-sequences`` (the sequences kept active at a request rate); ``string_ids`` for a model
    whose CORRID control is TYPE_STRING."""

    length: int
    variation_pct: float = 20.0
    id_start: int = 1
    id_end: int | None = None
    num_of_sequences: int = 4
    string_ids: bool = False

    def plan(self, streams: int, seed: int) -> _loadgen.SequencePlan:
        return _loadgen.SequencePlan(streams, self.length, self.variation_pct, self.id_start, self.id_end, seed,
                                     self.string_ids)

    def loadgen_arguments(self) -> list[str]:
        return ["--sequence-length", str(self.length), "--sequence-length-variation", str(self.variation_pct),
                "--sequence-id-start", str(self.id_start), "--sequence-id-end", str(self.id_end or 0),
                "--num-of-sequences", str(self.num_of_sequences), *(["--string-sequence-ids"] * self.string_ids)]


def _sequence_parameters(sequence_id: int | str, start: bool, end: bool) -> dict[str, Any]:
    return {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}


class _Recorder:
    """Completions from many threads, handed over in one piece.

    A deque's appends and pops are atomic: recording takes no lock (it runs once per request),
    and taking pops what is there, leaving any appended meanwhile for the next take."""

    def __init__(self) -> None:
        self._records: collections.deque[tuple[int, int, bool]] = collections.deque()
        self.first_error: str | None = None  # what the first failed request was told

    def answered(self, started: int, future: Any) -> None:
        """``future``'s request finished: a success, or a failure with its message kept if first."""
        if future.cancelled():
            self.failed(started, "the request was cancelled")
        elif (error := future.exception()) is not None:
            self.failed(started, str(error))
        else:
            self._records.append((started, time.monotonic_ns(), True))

    def failed(self, started: int, message: str) -> None:
        if self.first_error is None:  # (a race between two first failures keeps either: both are true)
            self.first_error = message
        self._records.append((started, time.monotonic_ns(), False))

    def take(self) -> Completions:
        pop = self._records.popleft
        records = [pop() for _ in range(len(self._records))]  # those there now; later ones wait
        if not records:
            return Completions()
        array = np.array(records, dtype=np.int64)
        return Completions(array[:, 0], array[:, 1], array[:, 2].astype(bool))


class InProcessLoad:
    """Requests to a server in this process: a closed loop of ``concurrency`` requests kept in
    flight by completion callbacks (no thread per request: the load must not cost the server its
    GIL), or an open loop paced by a scheduler thread.

    With ``sequences``, a request's index says its stream (``index % streams``: the slot, or at a
    request rate the active sequence the arrival goes to, round-robin) and the stream's next request
    is ``index + streams``; an arrival for a sequence whose previous request is still unanswered waits
    for that answer (perf_analyzer's serial sequences)."""

    def __init__(self, server: InferenceService, model: str, requests: list[dict[str, np.ndarray]], *,
                 concurrency: int | None = None, request_rate: float | None = None,
                 distribution: str = "constant", seed: int = 0, sequences: SequenceSpec | None = None) -> None:
        if (concurrency is None) == (request_rate is None):
            raise InvalidArgumentError("give concurrency or request_rate")
        self._server = server
        self._model = model
        self._requests = requests
        self._concurrency = concurrency
        self._rate = request_rate
        self._distribution = distribution
        self._seed = seed
        self._recorder = _Recorder()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._in_flight = threading.Semaphore(10_000)  # an open loop never queues without bound
        self._outstanding = 0  # closed loop: requests sent and not yet answered
        # per request the counter is taken under the bare lock (cheaper than the condition's own
        # methods), from the threads that answer the requests: a lock that yields, so that two of
        # them answering at once make no convoy (triton_nb._locks); the condition is notified only
        # once stop() waits on it
        self._outstanding_lock = YieldingLock()
        self._outstanding_changed = threading.Condition(self._outstanding_lock)
        self._submitting = threading.local()  # a trampoline, so answers that come at once do not recurse
        self._streams = concurrency or (sequences.num_of_sequences if sequences else 1)
        self._plan = sequences.plan(self._streams, seed) if sequences else None
        # request rate with sequences: per sequence, whether a request is in flight and how many
        # arrivals wait for its answer
        self._turns = YieldingLock()
        self._busy = [False] * self._streams
        self._waiting = [0] * self._streams
        # requests whose predecessor was refused at once, sent by a thread of their own (started at
        # the first refusal): a model that refuses everything must not hold start() or a worker
        self._refused: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._retrier: threading.Thread | None = None

    def _request(self, index: int) -> InferRequest:
        inputs = self._requests[index % len(self._requests)]
        if self._plan is None:
            return InferRequest(self._model, inputs)
        return InferRequest(self._model, inputs, parameters=_sequence_parameters(*self._plan.next(
            index % self._streams)))

    def start(self) -> None:
        if self._concurrency is not None:
            for slot in range(self._concurrency):
                self._send(slot)
            return
        thread = threading.Thread(target=self._open_loop, name="triton-nb-perf-load", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _send(self, index: int, counted: bool = False) -> None:
        """Send request ``index`` of one closed-loop slot (or sequence); its answer sends the next one.
        ``counted``: the request takes over the outstanding count of the one it follows.

        Runs on the thread that completed the previous request (a model's worker, usually). A
        request answered before its callback is attached would run the callback here, inside
        this call: those are queued on the thread and sent by the outermost call instead."""
        queued = getattr(self._submitting, "queued", None)
        if queued is not None:
            queued.append((index, counted))
            return
        self._submitting.queued = pending = [(index, counted)]
        try:
            while pending:
                index, counted = pending.pop()
                with self._outstanding_lock:
                    # counted before the request is made, under the lock stop() sets the flag with:
                    # once stop() saw none outstanding, no request (nor sequence step) slips past it
                    if self._stopping.is_set():
                        dropped = counted + sum(taken_over for _, taken_over in pending)
                        if dropped:
                            self._outstanding -= dropped
                            self._outstanding_changed.notify_all()
                        break
                    if not counted:
                        self._outstanding += 1
                started = time.monotonic_ns()
                try:
                    future = self._server.infer_async(self._request(index))
                except Exception as exc:  # refused at once: a measured failure; the slot goes on
                    self._recorder.failed(started, str(exc))
                    self._settle()
                    following = self._following(index)
                    if following is not None:
                        self._after_refusal(following)
                    continue
                future.add_done_callback(functools.partial(self._chained_done, started, index))
        finally:
            self._submitting.queued = None

    def _following(self, index: int) -> int | None:
        """The request its stream sends after ``index``: a closed loop's slot always goes on; a
        sequence at a request rate only when an arrival waits for it (else it goes idle)."""
        if self._concurrency is not None:
            return index + self._concurrency
        stream = index % self._streams
        with self._turns:
            if self._waiting[stream]:
                self._waiting[stream] -= 1
                return index + self._streams
            self._busy[stream] = False
            return None

    def _after_refusal(self, index: int) -> None:
        with self._turns:
            if self._stopping.is_set():
                return
            if self._retrier is None:
                self._retrier = threading.Thread(target=self._send_refused, name="triton-nb-perf-retry", daemon=True)
                self._retrier.start()
                self._threads.append(self._retrier)
        self._refused.put(index)

    def _send_refused(self) -> None:
        while not self._stopping.is_set():
            try:
                index = self._refused.get(timeout=0.1)
            except queue.Empty:
                continue
            self._send(index)

    def _settle(self) -> None:
        with self._outstanding_lock:
            self._outstanding -= 1
            if self._stopping.is_set():  # only stop() waits for the count to change
                self._outstanding_changed.notify_all()

    def _chained_done(self, started: int, index: int, future: Any) -> None:
        self._recorder.answered(started, future)
        if self._concurrency is not None:  # a closed loop's slot goes on, with the answered one's count
            self._send(index + self._concurrency, counted=True)
            return
        self._settle()
        following = self._following(index)
        if following is not None:
            self._send(following)

    def _arrive(self, arrival: int) -> None:
        """An arrival at a request rate with sequences: the next request of sequence ``arrival % streams``,
        now if the sequence is idle, else once its request in flight is answered."""
        stream = arrival % self._streams
        with self._turns:
            if self._busy[stream]:
                self._waiting[stream] += 1
                return
            self._busy[stream] = True
        self._send(arrival)

    def _open_loop(self) -> None:
        rng = random.Random(self._seed)
        due = time.monotonic()
        index = 0
        while not self._stopping.is_set():
            due += rng.expovariate(self._rate) if self._distribution == "poisson" else 1.0 / self._rate
            delay = due - time.monotonic()
            if delay > 0 and self._stopping.wait(delay):
                break
            if self._plan is not None:
                self._arrive(index)
                index += 1
                continue
            if not self._in_flight.acquire(timeout=1.0):
                continue
            started = time.monotonic_ns()
            try:
                future = self._server.infer_async(self._request(index))
            except Exception as exc:
                self._in_flight.release()
                self._recorder.failed(started, str(exc))
            else:
                future.add_done_callback(lambda f, s=started: self._done(s, f))
            index += 1

    def _done(self, started: int, future: Any) -> None:
        self._in_flight.release()
        self._recorder.answered(started, future)

    def take(self) -> Completions:
        return self._recorder.take()

    @property
    def first_error(self) -> str | None:
        """The message of the first request that failed (None while none has)."""
        return self._recorder.first_error

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop sending and wait for the requests in flight (at most ``timeout_s``): the next
        measurement must not start with this one's requests still queued."""
        with self._outstanding_changed:
            self._stopping.set()
        for thread in self._threads:
            thread.join()
        with self._outstanding_changed:
            self._outstanding_changed.wait_for(lambda: self._outstanding == 0, timeout=timeout_s)
        self._close_sequences(timeout_s)

    def _close_sequences(self, timeout_s: float) -> None:
        """One END request for each sequence the stop cut short, so the server frees its slot (and
        its state) before the next measurement; not recorded, failures ignored."""
        if self._plan is None:
            return
        futures = []
        for stream in range(self._streams):
            sequence_id = self._plan.close(stream)
            if sequence_id is None:
                continue
            request = InferRequest(self._model, self._requests[0], parameters=_sequence_parameters(
                sequence_id, False, True))
            with contextlib.suppress(Exception):
                futures.append(self._server.infer_async(request))
        deadline = time.monotonic() + timeout_s
        for future in futures:
            with contextlib.suppress(Exception):
                future.result(timeout=max(0.0, deadline - time.monotonic()))


def _aligned(size_bytes: int) -> int:
    return -(-size_bytes // _ALIGN_BYTES) * _ALIGN_BYTES


def _output_byte_size(spec: dict[str, Any], rows: int, output_shared_memory_size: int) -> int:
    """The bytes an output of one request needs: dims x rows x the datatype's size; for BYTES or a
    variable dimension, ``output_shared_memory_size`` per row (perf_analyzer's rule)."""
    datatype = config_datatype(spec)
    dims = [int(d) for d in spec.get("dims", [])]
    if datatype == "BYTES" or any(d < 0 for d in dims):
        return output_shared_memory_size * rows
    count = rows
    for dim in dims:
        count *= dim
    return count * triton_to_numpy_dtype(spec["data_type"]).itemsize


class SystemSharedMemory:
    """The system shared-memory regions of one measurement (perf_analyzer's ``--shared-memory
    system``): one input region holding every distinct request's inputs one after another, written
    once, and one output region with a slice per distinct request for all its outputs. Requests
    that reuse a payload (a closed loop's slots cycling through the same requests, or repeats for
    a response cache) share its output slice: concurrent requests with the same inputs write the
    same bytes there, and the load generator never reads answers, so the sharing loses nothing.

    :meth:`open` creates the regions (``tritonclient.utils.shared_memory``) and registers them with
    ``client`` (an HTTP or gRPC :class:`~triton_nb.transport.Transport` to the server measured, or a
    ``tritonclient`` client of it); :meth:`close`
    unregisters and destroys them. Names carry a fresh uuid, so parallel measurements never collide.
    ``places[i]`` says where request ``i``'s tensors are (see :func:`~triton_nb.perf.inputs.encode_http`)."""

    def __init__(self, client: Any, config: dict[str, Any], requests: list[dict[str, np.ndarray]],
                 rows_per_request: int = 1, output_shared_memory_size: int = DEFAULT_OUTPUT_SHARED_MEMORY_SIZE) -> None:
        self._client = client
        tag = uuid.uuid4().hex[:16]
        self.input_region = f"{SHARED_MEMORY_PREFIX}{tag}_inputs"
        self.output_region = f"{SHARED_MEMORY_PREFIX}{tag}_outputs"
        rows = rows_per_request if int(config.get("max_batch_size", 0)) > 0 else 1
        outputs = [(spec["name"], _output_byte_size(spec, rows, output_shared_memory_size))
                   for spec in config.get("output", [])]
        self._input_data: list[tuple[int, bytes]] = []  # (offset, bytes) to write into the input region
        self.places: list[SharedMemoryPlaces] = []
        by_request: dict[int, SharedMemoryPlaces] = {}  # id() of a distinct request -> its places
        input_end = output_end = 0
        for request in requests:
            known = by_request.get(id(request))
            if known is not None:  # a repeat: the same object, the same places
                self.places.append(known)
                continue
            inputs = {}
            for name, array in request.items():
                data = array_to_buffer(array)
                inputs[name] = TensorPlace(self.input_region, input_end, len(data))
                self._input_data.append((input_end, data))
                input_end = _aligned(input_end + len(data))
            placed = {}
            for name, size in outputs:
                placed[name] = TensorPlace(self.output_region, output_end, size)
                output_end = _aligned(output_end + size)
            by_request[id(request)] = SharedMemoryPlaces(inputs, placed)
            self.places.append(by_request[id(request)])
        # a region cannot be empty (the server cannot map it): at least one cache line
        self.sizes_bytes = {self.input_region: max(input_end, _ALIGN_BYTES),
                            self.output_region: max(output_end, _ALIGN_BYTES)}
        self._handles: dict[str, Any] = {}
        self._registered: list[str] = []

    @property
    def regions(self) -> list[str]:
        return list(self.sizes_bytes)

    def open(self) -> SystemSharedMemory:
        """Create, fill and register the regions; on a failure, undo what was done and raise."""
        import tritonclient.utils.shared_memory as shm

        try:
            for name, size in self.sizes_bytes.items():
                # create_only: a key that exists already is not ours (the uuid makes that a bug)
                self._handles[name] = shm.create_shared_memory_region(name, f"/{name}", size, create_only=True)
            handle = self._handles[self.input_region]
            for offset, data in self._input_data:
                if data:
                    shm.set_shared_memory_region(handle, [np.frombuffer(data, np.uint8)], offset=offset)
            for name, size in self.sizes_bytes.items():
                self._client.register_system_shared_memory(name, f"/{name}", size)
                self._registered.append(name)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Unregister and destroy every region (idempotent). An unregister that fails (the server
        is gone) does not keep the regions from being destroyed."""
        import tritonclient.utils.shared_memory as shm

        while self._registered:
            with contextlib.suppress(Exception):
                self._client.unregister_system_shared_memory(self._registered.pop())
        for name in list(self._handles):
            with contextlib.suppress(Exception):
                shm.destroy_shared_memory_region(self._handles.pop(name))

    def __enter__(self) -> SystemSharedMemory:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


# _loadgen.RECORD (``<qqBII``) as a packed numpy record
_RECORD_DTYPE = np.dtype([("sent", "<i8"), ("answered", "<i8"), ("ok", "u1"), ("request_bytes", "<u4"),
                          ("response_bytes", "<u4")])


class NetworkLoad:
    """Requests over HTTP or gRPC from a load-generator process (:mod:`triton_nb.perf._loadgen`);
    with ``shared_memory`` (open, for these ``requests``), requests that refer to its regions;
    ``wire``: the tensor formats and compression. Completions carry the bytes each request and
    response took on the wire (see :mod:`~triton_nb.perf._loadgen`)."""

    def __init__(self, protocol: str, url: str, model: str, requests: list[dict[str, np.ndarray]], *,
                 concurrency: int | None = None, request_rate: float | None = None,
                 distribution: str = "constant", seed: int = 0, sequences: SequenceSpec | None = None,
                 shared_memory: SystemSharedMemory | None = None, wire: Wire | None = None) -> None:
        if (concurrency is None) == (request_rate is None):
            raise InvalidArgumentError("give concurrency or request_rate")
        if shared_memory is not None and len(shared_memory.places) != len(requests):
            raise InvalidArgumentError("shared_memory: the regions were laid out for other requests")
        places = shared_memory.places if shared_memory is not None else [None] * len(requests)
        wire = wire or Wire()
        if protocol in ("http", "sagemaker"):  # SageMaker's /invocations takes the same bodies
            encoded: dict[int, tuple[bytes, int]] = {}  # id() of a distinct request -> its payload
            payloads = []
            for request, place in zip(requests, places, strict=True):
                if id(request) not in encoded:
                    encoded[id(request)] = encode_http(model, request, place, input_format=wire.input_tensor_format,
                                                       output_format=wire.output_tensor_format)
                payloads.append(encoded[id(request)])
        else:
            payloads = [(encode_grpc(model, r, p), 0) for r, p in zip(requests, places, strict=True)]
        handle, self._payload_path = tempfile.mkstemp(prefix="triton-nb-perf-", suffix=".bin")
        with os.fdopen(handle, "wb") as stream:
            stream.write(struct.pack("<I", len(payloads)))
            for body, header in payloads:
                stream.write(struct.pack("<II", len(body), header) + body)
        level = ["--concurrency", str(concurrency)] if concurrency else ["--rate", str(request_rate)]
        self._command = [sys.executable, "-c", SCRIPT_BOOTSTRAP, str(Path(_loadgen.__file__)), "--protocol", protocol,
                         "--url", url, "--model", model, "--payloads", self._payload_path, *level,
                         "--distribution", distribution, "--seed", str(seed), *wire.loadgen_arguments(),
                         *(sequences.loadgen_arguments() if sequences else [])]
        self._lock = threading.Lock()
        self._batches: list[np.ndarray] = []  # the generator's records, as read
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self.first_error: str | None = None  # the message of the first request that failed

    def start(self) -> None:
        self._process = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read, name="triton-nb-perf-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        stream = self._process.stdout
        size = _loadgen.RECORD.size
        while True:
            head = stream.read(4)
            if len(head) < 4:
                return
            (count,) = struct.unpack("<I", head)
            if count == _loadgen.ERROR_FRAME:  # the first failed request's message
                (length,) = struct.unpack("<I", stream.read(4))
                self.first_error = stream.read(length).decode("utf-8", "replace")
                continue
            data = stream.read(count * size)
            if len(data) == count * size and count:
                records = np.frombuffer(data, _RECORD_DTYPE)
                with self._lock:
                    self._batches.append(records)

    def take(self) -> Completions:
        if self._process is not None and self._process.poll() not in (None, 0):
            raise RuntimeError(f"the load generator exited with status {self._process.returncode}")
        with self._lock:
            batches, self._batches = self._batches, []
        if not batches:
            return Completions()
        records = np.concatenate(batches)
        return Completions(records["sent"].astype(np.int64), records["answered"].astype(np.int64),
                           records["ok"].astype(bool), records["request_bytes"].astype(np.int64),
                           records["response_bytes"].astype(np.int64))

    def stop(self) -> None:
        if self._process is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self._payload_path)


def open_load(transport: Transport, model: str, requests: list[dict[str, np.ndarray]],
              **level: Any) -> InProcessLoad | NetworkLoad:
    """A load on the server ``transport`` reaches, made the way its protocol needs: in-process calls
    on the server itself, or a load-generator process speaking HTTP or gRPC to ``transport.url``.
    ``level``: ``concurrency`` or ``request_rate`` (and the other keywords of the two loads; ``wire``
    is for network loads only: in-process calls have no wire)."""
    if transport.protocol == "inprocess":
        level.pop("wire", None)
        return InProcessLoad(transport.service, model, requests, **level)
    return NetworkLoad(transport.protocol, transport.url, model, requests, **level)
