"""Triton's sequence batcher: stateful models, the direct and the oldest strategies, implicit state.

A model with ``sequence_batching`` is scheduled the way Triton's ``DirectSequenceBatch`` and
``OldestSequenceBatch`` schedule it (core ``src/sequence_batch_scheduler``):

* each instance has sequence slots — ``max(1, max_batch_size)`` of them, or with the oldest
  strategy ``oldest.max_candidate_sequences`` when set; a request that starts a sequence
  (``sequence_start``) takes the free slot with the lowest index (over all instances), or waits
  in a backlog (the whole sequence, in order) until a slot is released; every later request of
  that sequence id goes to the same slot, so to the same instance, in order;
* **direct**: a batch for an instance holds at most one request per slot: slot ``i`` of the
  batch is request ``i`` handed to the model, slots below the highest busy one that have nothing
  queued are filled with *null requests* — copies of a real request's inputs (zeros here; Triton
  leaves the memory uninitialised) with READY false and CORRID 0 — so that a model keeping state
  by batch slot sees every sequence at the same position; their responses are dropped.
  ``direct.max_queue_delay_microseconds`` with ``direct.minimum_slot_utilization``: a batch
  waits until that share of the slots is busy or the oldest request has waited that long
  (Triton waits only when both are non-zero, and so does this);
* **oldest**: the instance's candidate sequences feed a dynamic batcher: a batch takes the
  oldest next request of each sequence (never two of one sequence), up to ``max_batch_size``; it
  leaves at once on reaching one of ``oldest.preferred_batch_size`` (or ``max_batch_size``),
  else when its oldest request has waited ``oldest.max_queue_delay_microseconds``;
  ``oldest.preserve_ordering`` answers in the order the batches left. No null requests: every
  request in the batch is READY, and the model tells sequences apart by CORRID;
* the request with ``sequence_end`` releases its slot once it is in a batch; a sequence without a
  request for ``max_sequence_idle_microseconds`` (default 1 s) is released too, and its next
  request, lacking the START flag, fails as one that never started.

Control inputs (``control_input``) are added to every request as input tensors, as Triton adds
them: shape ``[1]`` per request, ``[1, 1]`` with the batch dim when the model batches; START,
END and READY carry the configured false/true values (``int32_false_true``, ``fp32_false_true``,
``bool_false_true``), CORRID the sequence id in its ``data_type``.

Implicit state (``sequence_batching.state``, :mod:`triton_nb.repository.sequence_state`): each
slot keeps the state of the sequence it holds. A request gets it as the input ``input_name`` —
the initial state on START — and the model's output ``output_name`` becomes the state the
sequence's next request gets; the client sees that output only when the config lists it as an
output. Null requests get the initial state and leave the slot's state alone. (Real Triton
carries state only for backends that call ``TRITONBACKEND_StateUpdate`` — onnxruntime,
tensorrt, pytorch; its Python backend hands the model the state input but never updates it, so
every request sees the initial state. triton_nb carries it for Python models, and says so at load.)

Sequence ids and flags come from ``InferRequest.parameters`` — ``sequence_id`` (a non-zero int or
a non-empty str), ``sequence_start``, ``sequence_end`` — which the in-process client, HTTP and
gRPC (also streaming) fill from their request parameters, as Triton's front ends do.

Not here: iterative sequences (refused at load), request timeouts in the backlog, and fewer
instances while serving. Counting follows :class:`~triton_nb.server.scheduling.batcher.Scheduler`, which
this class extends: it runs the batches, answers and counts them; only queueing and batch
forming differ.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.errors import InternalError, InvalidArgumentError, UnavailableError
from triton_nb.repository.config import ModelConfig
from triton_nb.repository.sequence_state import StateSpec, state_specs
from triton_nb.server.observability.stats import ModelStats
from triton_nb.server.scheduling.batcher import (
    BatchRunner,
    InstanceWorker,
    PendingRequest,
    Scheduler,
    SchedulerSettings,
)
from triton_nb.tensors import InferRequest, InferResponse

__all__ = ["DEFAULT_MAX_SEQUENCE_IDLE_MICROSECONDS", "SequenceControls", "SequenceScheduler"]

log = logging.getLogger(__name__)

#: Triton's default when ``max_sequence_idle_microseconds`` is 0 or unset (SEQUENCE_IDLE_DEFAULT_MICROSECONDS).
DEFAULT_MAX_SEQUENCE_IDLE_MICROSECONDS = 1_000_000

_Control = mc.ModelSequenceBatching.Control
_CORRID_TYPES = {mc.TYPE_UINT64: np.uint64, mc.TYPE_INT64: np.int64, mc.TYPE_UINT32: np.uint32,
                 mc.TYPE_INT32: np.int32, mc.TYPE_STRING: np.object_}
_PROTOCOL_NAMES = {mc.TYPE_UINT64: "UINT64", mc.TYPE_INT64: "INT64", mc.TYPE_UINT32: "UINT32",
                   mc.TYPE_INT32: "INT32", mc.TYPE_STRING: "BYTES"}


@dataclass(frozen=True)
class SequenceControls:
    """The control tensors a model asked for: per boolean kind (START, END, READY) the tensor
    name with its false and true values, and the CORRID tensor's name and numpy dtype."""

    booleans: tuple[tuple[int, str, np.ndarray, np.ndarray], ...] = ()  # (kind, name, false, true)
    corrid: tuple[str, int] | None = None  # (name, config data_type)
    batching: bool = False

    @classmethod
    def from_config(cls, config: ModelConfig) -> SequenceControls:
        """Read ``sequence_batching.control_input`` (checked at load by the config checks)."""
        booleans = []
        corrid = None
        for control_input in config.sequence_batching.control_input:
            for control in control_input.control:
                if control.kind == _Control.CONTROL_SEQUENCE_CORRID:
                    corrid = (control_input.name, control.data_type)
                    continue
                if control.int32_false_true:
                    values, dtype = control.int32_false_true, np.int32
                elif control.fp32_false_true:
                    values, dtype = control.fp32_false_true, np.float32
                else:
                    values, dtype = control.bool_false_true, np.bool_
                booleans.append((control.kind, control_input.name, np.array(values[0], dtype=dtype),
                                 np.array(values[1], dtype=dtype)))
        return cls(tuple(booleans), corrid, config.max_batch_size > 0)

    def tensors(self, corrid: int | str, start: bool, end: bool, ready: bool) -> dict[str, np.ndarray]:
        """The control inputs of one request (``ready`` False: a null request's)."""
        shape = (1, 1) if self.batching else (1,)
        out: dict[str, np.ndarray] = {}
        for kind, name, false, true in self.booleans:
            on = ready and (kind == _Control.CONTROL_SEQUENCE_READY or (kind == _Control.CONTROL_SEQUENCE_START
                                                                         and start) or
                            (kind == _Control.CONTROL_SEQUENCE_END and end))
            out[name] = np.full(shape, true if on else false, dtype=false.dtype)
        if self.corrid is not None:
            name, data_type = self.corrid
            if data_type == mc.TYPE_STRING:
                text = corrid if isinstance(corrid, str) else ""
                out[name] = np.full(shape, text.encode("utf-8"), dtype=object)
            else:
                value = corrid if isinstance(corrid, int) else 0
                # Triton copies the id's low bytes into the tensor: a C cast of the uint64
                out[name] = np.full(shape, value, dtype=np.uint64).astype(_CORRID_TYPES[data_type])
        return out

    def check_id(self, model: str, corrid: int | str) -> None:
        """Triton's check that the id's type fits the CORRID tensor (infer_request.cc ValidateCorrelationId)."""
        if self.corrid is None:
            return
        name, data_type = self.corrid
        given = "BYTES" if isinstance(corrid, str) else "UINT64"
        if (given == "BYTES") != (data_type == mc.TYPE_STRING):
            raise InvalidArgumentError(f"sequence batching control '{name}' data-type is '{given}', but model "
                                       f"'{model}' expects '{_PROTOCOL_NAMES.get(data_type, 'INVALID')}'")


@dataclass(eq=False)
class _SequencePending(PendingRequest):
    corrid: int | str = 0
    start: bool = False
    end: bool = False


@dataclass(eq=False)
class _Slot:
    """One sequence slot of one instance: the queue of the sequence it holds (``None`` entries are
    the idle reaper's release marks)."""

    worker: InstanceWorker
    index: int
    order: int  # breaks ties between instances' slots of the same index: the older instance first
    queue: deque[_SequencePending | None] = field(default_factory=deque)
    state: dict[str, np.ndarray] | None = None  # implicit state of the sequence it holds (None: initial)


@dataclass(eq=False)
class _Backlog:
    """A started sequence waiting for a slot, with every request it sent since."""

    corrid: int | str
    queue: deque[_SequencePending] = field(default_factory=deque)


def _sequence_flags(model: str, request: InferRequest) -> tuple[int | str, bool, bool]:
    """The request's sequence id, start and end flags, checked as Triton's front ends check them."""
    params = request.parameters or {}
    corrid = params.get("sequence_id", 0)
    if isinstance(corrid, bool) or not isinstance(corrid, (int, str)):
        raise InvalidArgumentError(f"model '{model}': request parameter 'sequence_id' must be an integer or a "
                                   f"string, got {type(corrid).__name__}")
    if isinstance(corrid, int):
        corrid &= (1 << 64) - 1  # Triton keeps it as a uint64
    return corrid, bool(params.get("sequence_start", False)), bool(params.get("sequence_end", False))


class SequenceScheduler(Scheduler):
    """The direct sequence batcher of one model version (see the module docstring)."""

    def __init__(
        self,
        model_name: str,
        version: int,
        config: ModelConfig,
        run_batch: BatchRunner,
        *,
        model_path: str | Path | None = None,
        stats: ModelStats | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """``run_batch`` runs a list of requests on an instance, as for the dynamic batcher; this
        scheduler adds the control tensors, states and null requests around it. ``model_path``:
        the model's folder, where ``initial_state`` data files are read."""
        batching = config.sequence_batching
        self.oldest = batching.HasField("oldest")
        super().__init__(model_name, version, SchedulerSettings(
            max_batch_size=config.max_batch_size, preserve_ordering=self.oldest and batching.oldest.preserve_ordering),
            self._run_slots, stats=stats, clock_ns=clock_ns)
        self.controls = SequenceControls.from_config(config)
        self.states: tuple[StateSpec, ...] = state_specs(config, model_path or ".")
        if self.states and config.model_transaction_policy.decoupled:
            raise InvalidArgumentError(f"model '{model_name}': implicit state (sequence_batching.state) needs the "
                                       "model's response from execute; a decoupled model sends it later")
        self._config_outputs = {t.name for t in config.output}
        self._run_requests = run_batch
        self._batch_limit = max(1, config.max_batch_size)
        idle_us = batching.max_sequence_idle_microseconds or DEFAULT_MAX_SEQUENCE_IDLE_MICROSECONDS
        self._idle_ns = idle_us * 1000
        if self.oldest:
            self._slot_count = batching.oldest.max_candidate_sequences or self._batch_limit
            self._delay_ns = batching.oldest.max_queue_delay_microseconds * 1000
            self._targets = tuple(sorted(batching.oldest.preferred_batch_size)) or (self._batch_limit,)
            self._utilization = 0.0
        else:
            self._slot_count = self._batch_limit
            self._delay_ns = batching.direct.max_queue_delay_microseconds * 1000
            self._targets = ()
            self._utilization = batching.direct.minimum_slot_utilization
        self._slots: dict[InstanceWorker, list[_Slot]] = {}
        self._free: list[tuple[int, int, _Slot]] = []  # heap: the lowest slot index first, as Triton
        self._active: dict[int | str, _Slot] = {}  # sequence id -> its slot, until its END is queued
        self._backlogs: deque[_Backlog] = deque()
        self._backlog_of: dict[int | str, _Backlog] = {}
        self._last_seen: dict[int | str, int] = {}
        self._local = threading.local()  # the slot layout of the batch this worker thread runs
        self._reaper_stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name=f"triton-nb-{model_name}-sequence-reaper",
                                        daemon=True)
        self._reaper.start()

    # ------------------------------------------------------------------ instances and knobs
    def add_instance(self, instance: object, name: str, gate: Any = None) -> None:
        """Serve with one more instance and its sequence slots (a backlogged sequence takes one)."""
        worker = InstanceWorker(self, instance, name, gate)
        with self._cond:
            slots = [_Slot(worker, i, len(self._slots)) for i in range(self._slot_count)]
            self._slots[worker] = slots
            for slot in slots:
                self._release(slot)
            self._workers.append(worker)
            self._cond.notify_all()
        worker.thread.start()

    def retire_instances(self, count: int) -> list[object]:
        """Refused: the sequences an instance holds would have to move with their state."""
        if count:
            raise InvalidArgumentError(f"model '{self.model_name}' uses the sequence batcher: its instance count "
                                       "cannot be lowered while it serves (reload it instead)")
        return []

    def update(self, **changes: object) -> SchedulerSettings:
        """Refused: the live knobs are the dynamic batcher's."""
        if changes:
            raise InvalidArgumentError(f"model '{self.model_name}' uses the sequence batcher: dynamic batching "
                                       "knobs do not apply to it")
        return self._settings

    def queue_depth(self) -> int:
        with self._cond:
            return len(self._ordered())

    # ------------------------------------------------------------------ queueing
    def enqueue(self, request: InferRequest, future: Future) -> None:
        """Queue a request of a sequence on its slot (or the backlog), or raise Triton's error."""
        model = self.model_name
        corrid, start, end = _sequence_flags(model, request)
        self.controls.check_id(model, corrid)
        if request.batch_size(self._settings.max_batch_size > 0) > 1:
            raise InvalidArgumentError(f"inference request to model '{model}' must specify batch-size 1 due to "
                                       "requirements of sequence batcher")
        if corrid in (0, ""):
            raise InvalidArgumentError(f"inference request to model '{model}' must specify a non-zero or "
                                       "non-empty correlation ID")
        with self._cond:
            if self._stopping:
                raise UnavailableError(f"model '{model}' is unloading; request not accepted")
            slot = self._active.get(corrid)
            backlog = self._backlog_of.get(corrid)
            if not start and slot is None and backlog is None:
                raise InvalidArgumentError(f"inference request for sequence {corrid} to model '{model}' must "
                                           "specify the START flag on the first request of the sequence")
            if start and (slot is not None or backlog is not None):
                log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before "
                            "this sequence start. Previous sequence will be terminated early.", corrid, model)
            pending = _SequencePending(request, future, 1, (), 0, next(self._sequence), corrid=corrid,
                                       start=start, end=end)
            if self._stats is not None:
                self._stats.pending_add(request.counted_requests())
            self._last_seen[corrid] = self._clock_ns()
            if slot is None and backlog is None and self._free:
                slot = heapq.heappop(self._free)[2]
                self._active[corrid] = slot
            if slot is not None:
                slot.queue.append(pending)
                if end:
                    self._active.pop(corrid, None)
            else:
                if backlog is None:
                    backlog = _Backlog(corrid)
                    self._backlogs.append(backlog)
                    self._backlog_of[corrid] = backlog
                backlog.queue.append(pending)
                if end:
                    self._backlog_of.pop(corrid, None)
            self._cond.notify_all()

    def _release(self, slot: _Slot) -> None:
        """A slot is free (under ``_cond``): the oldest backlogged sequence takes it, or it waits."""
        while self._backlogs:
            backlog = self._backlogs.popleft()
            if not backlog.queue:
                continue
            if self._backlog_of.get(backlog.corrid) is backlog:  # not ended yet: its next requests go to the slot
                del self._backlog_of[backlog.corrid]
                self._active[backlog.corrid] = slot
            slot.queue.extend(backlog.queue)
            return
        heapq.heappush(self._free, (slot.index, slot.order, slot))

    def _ordered(self) -> list[PendingRequest]:
        queued: list[PendingRequest] = [p for slots in self._slots.values() for s in slots for p in s.queue
                                  if p is not None]
        queued.extend(p for backlog in self._backlogs for p in backlog.queue)
        return queued

    # ------------------------------------------------------------------ the idle reaper
    def _reap(self) -> None:
        """Release the slot of every sequence idle for ``max_sequence_idle_microseconds``, as
        Triton's reaper thread does: a release mark queued behind the sequence's last request."""
        while not self._reaper_stop.is_set():
            with self._cond:
                now = self._clock_ns()
                wait_ns = self._idle_ns
                for corrid, seen in list(self._last_seen.items()):
                    left = self._idle_ns - (now - seen)
                    if left > 0:
                        wait_ns = min(wait_ns, left)
                        continue
                    slot = self._active.pop(corrid, None)
                    if slot is not None:
                        log.debug("model '%s': sequence %s idle too long: its slot is released", self.model_name,
                                  corrid)
                        slot.queue.append(None)
                        del self._last_seen[corrid]
                        self._cond.notify_all()
                    elif corrid in self._backlog_of:  # still waiting for a slot: look again later
                        wait_ns = min(wait_ns, 50_000_000)
                    else:
                        del self._last_seen[corrid]
            self._reaper_stop.wait(max(wait_ns, 1_000_000) / 1e9)

    # ------------------------------------------------------------------ forming batches
    def _next_batch(self, worker: InstanceWorker) -> list[PendingRequest] | None:
        """This worker's next batch from its own slots (see the module docstring); None when it
        should exit. Each worker forms its own: slots belong to one."""
        with self._cond:
            while True:
                if self._exit_due(worker):
                    return None
                slots = self._slots[worker]
                for slot in slots:
                    while slot.queue and slot.queue[0] is None:  # released by the reaper
                        slot.queue.popleft()
                        self._release(slot)
                busy = [slot for slot in slots if slot.queue]
                if not busy:
                    self._cond.wait(timeout=0.5)
                    continue
                chosen = self._oldest_first(busy) if self.oldest else self._by_slot(slots, busy)
                if chosen is None:
                    continue  # waited for more requests: look again
                layout = []
                for slot in chosen:
                    pending = slot.queue.popleft() if slot.queue else None
                    layout.append((slot, pending))
                    if pending is not None and pending.end:
                        self._release(slot)
                self._local.layout = layout
                return [p for _, p in layout if p is not None]

    def _by_slot(self, slots: list[_Slot], busy: list[_Slot]) -> list[_Slot] | None:
        """Direct: every slot up to the highest busy one, in slot order (None: waited, under ``_cond``)."""
        if self._delay_ns and self._utilization and not self._stopping:
            now = self._clock_ns()
            waited = now - min(slot.queue[0].request.arrival_ns for slot in busy)
            if waited <= self._delay_ns and len(busy) / self._slot_count < self._utilization:
                self._cond.wait(timeout=max(self._delay_ns - waited, 1000) / 1e9)
                return None
        return slots[:busy[-1].index + 1]

    def _oldest_first(self, busy: list[_Slot]) -> list[_Slot] | None:
        """Oldest: the busy slots whose next request is oldest, as many as a batch takes, once a
        preferred size is reached or the oldest has waited its delay (None: waited, under ``_cond``)."""
        busy.sort(key=lambda slot: slot.queue[0].request.arrival_ns)
        count = min(len(busy), self._batch_limit)
        reached = max((t for t in self._targets if t <= count), default=0)
        if reached:
            return busy[:reached]
        if self._delay_ns and not self._stopping and count < self._batch_limit:
            waited = self._clock_ns() - busy[0].queue[0].request.arrival_ns
            if waited < self._delay_ns:
                self._cond.wait(timeout=max(self._delay_ns - waited, 1000) / 1e9)
                return None
        return busy[:count]

    def _run_slots(self, instance: object, requests: list[InferRequest]) -> list[InferResponse] | None:
        """Run one batch in its layout's order, with control tensors and states, null requests in
        the idle slots (and in place of a request whose caller gave up), and the null requests'
        responses dropped; the model's output states become the slots' states."""
        layout: list[tuple[_Slot, _SequencePending | None]] = self._local.layout
        live = {id(r) for r in requests}
        template = requests[0]
        batch: list[InferRequest] = []
        real: list[tuple[int, _Slot, InferRequest]] = []
        for slot, pending in layout:
            if pending is not None and id(pending.request) in live:
                request = pending.request
                inputs = {**request.inputs, **self.controls.tensors(pending.corrid, pending.start, pending.end, True)}
                requested = request.requested_outputs
                if self.states:
                    if pending.start:
                        slot.state = None
                    inputs.update(self._state_inputs(slot))
                    requested = None  # the state outputs are needed even when not asked for: filtered after
                real.append((len(batch), slot, request))
                batch.append(replace(request, inputs=inputs, requested_outputs=requested))
            else:
                batch.append(self._null_request(template))
        if len(batch) > len(requests) and self._stats is not None:
            # the runner takes each request it runs off the pending gauge: null ones never were on it
            self._stats.pending_add(len(batch) - len(requests))
        responses = self._run_requests(instance, batch)
        if responses is None:  # decoupled: answered through the senders
            return None
        if len(responses) != len(batch):
            return responses  # the base scheduler reports the mismatch
        if self.states:
            for i, slot, request in real:
                self._keep_state(slot, request, responses[i])
        return [responses[i] for i, _, _ in real]

    def _state_inputs(self, slot: _Slot) -> dict[str, np.ndarray]:
        if slot.state is None:
            return {spec.input_name: spec.initial for spec in self.states}
        return slot.state

    def _keep_state(self, slot: _Slot, request: InferRequest, response: InferResponse) -> None:
        """The response's output states become the slot's state (a state output the model did
        not give keeps the state it had, as in Triton when a backend does not update it). The
        client gets the outputs it asked for — a state output only if the config lists it — as
        the runner's output filter would have given them."""
        if response.error is not None:
            return
        state = dict(self._state_inputs(slot))
        for spec in self.states:
            value = response.outputs.get(spec.output_name)
            if value is not None:
                state[spec.input_name] = value
        slot.state = state
        requested = request.requested_outputs
        if requested is None:
            for spec in self.states:
                if spec.output_name not in self._config_outputs:
                    response.outputs.pop(spec.output_name, None)
            return
        missing = [o for o in requested if o not in response.outputs]
        if missing:
            response.error = InternalError(f"model '{self.model_name}' did not produce output(s) {', '.join(missing)}")
            return
        response.outputs = {o: response.outputs[o] for o in requested}

    def _null_request(self, template: InferRequest) -> InferRequest:
        inputs = {name: (np.full(array.shape, b"", dtype=object) if array.dtype == object else np.zeros_like(array))
                  for name, array in template.inputs.items()}
        inputs.update(self.controls.tensors(0, False, False, False))
        inputs.update({spec.input_name: spec.initial for spec in self.states})
        sender = None if template.response_sender is None else (lambda _response, _final: None)
        return InferRequest(model_name=template.model_name, inputs=inputs, model_version=template.model_version,
                            requested_outputs=template.requested_outputs, response_sender=sender)

    # ------------------------------------------------------------------ stopping
    def stop(self, drain: bool = True, timeout_s: float | None = None) -> list[object]:
        """As :meth:`Scheduler.stop`; also ends the reaper. Without drain, queued and backlogged
        requests fail at once."""
        with self._cond:
            self._stopping = True
            if not drain or not self._workers:
                for pending in self._ordered():
                    self._reject(pending, UnavailableError(
                        f"model '{self.model_name}' was unloaded before the request ran"))
                for slots in self._slots.values():
                    for slot in slots:
                        slot.queue.clear()
                self._backlogs.clear()
                self._backlog_of.clear()
            self._cond.notify_all()
        try:  # the reaper runs on while draining: it frees the slots of sequences that never end
            return super().stop(drain=drain, timeout_s=timeout_s)
        finally:
            self._reaper_stop.set()
