"""Scheduling for one model version: Triton's dynamic batcher, and one-by-one without it.

Contract
--------
:meth:`Scheduler.enqueue` takes a checked request and a ``Future``; the future is always
resolved — with an :class:`~triton_nb.tensors.InferResponse`, or an exception (queue full,
timeout, stop, a failed batch) — never left hanging.

Each model instance has a worker thread that owns its backend object and runs one batch at a
time, so at most ``instance count`` batches are in flight. Free workers take turns forming
batches — one holds the forming turn (``_former``) at a time — the way Triton's scheduler hands
the next batch to the next free instance. Everything is guarded by one condition, ``_cond``;
waiting releases it, so ``enqueue``, live updates and retirement never block on a batch.

Batch forming follows Triton's dynamic batcher:

* batch size counts rows (the first dim of each request), never above ``max_batch_size``;
* requests whose non-batch shapes differ from the first queued request are not batched with it;
* a batch whose rows reach a preferred size (by default ``max_batch_size``) leaves at once —
  the largest such size that the queue can fill;
* otherwise the batcher waits until ``max_queue_delay_microseconds`` after the *oldest* queued
  request, then sends what it has;
* priority levels (1 is the highest) are served in order, FIFO within a level;
* queue policy per level: ``max_queue_size`` (beyond it a request is rejected at once with
  Triton's "Exceeds maximum queue size"), a default timeout, ``allow_timeout_override``, and
  ``timeout_action`` REJECT (the request fails) or DELAY (it waits behind every on-time request);
* ``preserve_ordering``: responses are released in the order requests were dispatched.

Without ``dynamic_batching`` every request runs alone, as Triton's default scheduler does.
Settings can change while serving (:meth:`Scheduler.update`) and apply from the next batch.

Given the version's :class:`~triton_nb.server.observability.stats.ModelStats`, the scheduler counts every
request it accepted the way Triton does, itself and once per batch where it can: the pending
gauge (+1 queued, -1 when it runs or leaves the queue), a batch's successes in one call, and each
failure with its reason (``REJECTED``: it never ran — a timeout, a stop, a lowered
``max_batch_size``; ``BACKEND``: the model failed it; ``CANCELED``: the caller gave up, or the
request was cancelled while queued, and it fails with RequestCancelledError). No
per-request callback is needed for that.

Why a batch left (beyond Triton)
--------------------------------
Each batch the forming worker takes is counted with its rows (as formed: a request cancelled
while queued still counts in it) and one :class:`~triton_nb.server.observability.stats.BatchReason`, decided in
:meth:`Scheduler._form` where the batch is chosen, the first that holds in this order:

* ``no_dynamic_batching`` — no dynamic batching (or ``max_batch_size`` 0): the request runs alone;
* ``preferred_batch_size`` — the rows reached a preferred size (with ``preferred_batch_size``
  set; without it, reaching ``max_batch_size`` is the one target and counts as the next reason);
* ``max_batch_size`` — the batch holds ``max_batch_size`` rows, or the next queued request has the
  batch's shapes but its rows would not fit;
* ``different_shape`` — the next queued request has other non-batch dims (or inputs), so it
  cannot join, and nothing is left to wait for;
* ``draining`` — the model is unloading and its queue drains without waiting for the delay;
* ``max_queue_delay`` — the batch was held open for ``max_queue_delay_microseconds`` after its
  oldest request, and that ran out: the delay fell due after this worker took the forming turn;
* ``instance_free`` — an instance took the queue as it was, short of a batch, with nothing to wait
  for: the delay is 0, or it fell due before the worker came to form the batch, while every
  instance was busy (those requests waited for an instance, not for the delay).

A request rejected in the queue (a timeout, a lowered ``max_batch_size``) forms no batch and is
not counted. The sequence batcher forms its batches its own way and counts none here.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import itertools
import logging
import operator
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace

from tritonclient.grpc import model_config_pb2 as mc

from triton_nb._locks import YieldingLock
from triton_nb.errors import (
    InternalError,
    InvalidArgumentError,
    RequestCancelledError,
    TritonNBError,
    UnavailableError,
)
from triton_nb.repository.config import ModelConfig
from triton_nb.server.observability.stats import BatchReason, ModelStats
from triton_nb.server.scheduling.together import Together
from triton_nb.tensors import CarriedResponses, InferRequest, InferResponse

__all__ = ["BatchRunner", "Scheduler", "SchedulerSettings"]

log = logging.getLogger(__name__)

# Linux lets a timed wait end up to the thread's "timer slack" late, 50 µs by default: on top of
# a max_queue_delay_microseconds of 100 that is half as much again, on every batch, in every step
# of an ensemble. The batcher's workers ask for 1 µs (measured: the fraud ensemble at one request
# in flight, p50 586 -> 486 µs).
WORKER_TIMER_SLACK_NS = 1_000
_PR_SET_TIMERSLACK = 29


@functools.cache
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _tighten_timer_slack() -> None:
    """Ask the OS to end this thread's timed waits on time (Linux; elsewhere nothing to do)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_TIMERSLACK, WORKER_TIMER_SLACK_NS, 0, 0, 0)  # a refusal leaves the default: later, never wrong

_MAX_SIGNATURES = 1024

#: Runs one batch on one instance; returns one response per request (or raises).
BatchRunner = Callable[[object, list[InferRequest]], list[InferResponse]]


@dataclass(frozen=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0: unbounded
    default_timeout_microseconds: int = 0  # 0: no timeout
    allow_timeout_override: bool = False
    delay_on_timeout: bool = False  # timeout_action DELAY instead of REJECT

    @classmethod
    def from_proto(cls, policy: mc.ModelQueuePolicy) -> QueuePolicy:
        return cls(
            max_queue_size=policy.max_queue_size,
            default_timeout_microseconds=policy.default_timeout_microseconds,
            allow_timeout_override=policy.allow_timeout_override,
            delay_on_timeout=policy.timeout_action == mc.ModelQueuePolicy.DELAY,
        )


@dataclass(frozen=True)
class SchedulerSettings:
    """The knobs of one model version's scheduler (live-changeable)."""

    max_batch_size: int = 0
    dynamic_batching: bool = False
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    priority_queue_policy: tuple[tuple[int, QueuePolicy], ...] = ()

    @classmethod
    def from_config(cls, config: ModelConfig) -> SchedulerSettings:
        if not config.HasField("dynamic_batching"):
            return cls(max_batch_size=config.max_batch_size)
        batching = config.dynamic_batching
        return cls(
            max_batch_size=config.max_batch_size,
            dynamic_batching=True,
            max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
            preferred_batch_size=tuple(sorted(batching.preferred_batch_size)),
            preserve_ordering=batching.preserve_ordering,
            priority_levels=batching.priority_levels,
            default_priority_level=batching.default_priority_level,
            default_queue_policy=QueuePolicy.from_proto(batching.default_queue_policy),
            priority_queue_policy=tuple(
                (level, QueuePolicy.from_proto(policy)) for level, policy in batching.priority_queue_policy.items()
            ),
        )

    def policy(self, level: int) -> QueuePolicy:
        return self._policies.get(level, self.default_queue_policy)

    def targets(self) -> tuple[int, ...]:
        """Batch sizes that leave at once: the preferred sizes, else max_batch_size."""
        return self._targets

    # Read per request: worked out once per settings object (a live update makes a new one).
    @functools.cached_property
    def _policies(self) -> dict[int, QueuePolicy]:
        return dict(self.priority_queue_policy)

    @functools.cached_property
    def _targets(self) -> tuple[int, ...]:
        return self.preferred_batch_size or ((self.max_batch_size,) if self.max_batch_size > 0 else (1,))

    @functools.cached_property
    def smallest_target(self) -> int:
        """The smallest batch size that leaves at once."""
        return min(self._targets)


@dataclass
class PendingRequest:
    request: InferRequest
    future: Future
    rows: int
    shapes: tuple
    deadline_ns: int  # 0: none
    sequence: int
    delayed: bool = False


class InstanceWorker:
    """One model instance: a thread that owns the backend object and runs one batch at a time."""

    def __init__(self, scheduler: Scheduler, instance: object, name: str,
                 gate: contextlib.AbstractContextManager | None = None) -> None:
        self.instance = instance
        self.gate = gate  # held around each batch: the rate limiter's (None: no rate limiting)
        self.retire = False
        self.running: list[PendingRequest] = []  # the batch it executes now (failed by a stop that times out)
        self.thread = threading.Thread(target=scheduler._work, args=(self,), name=name, daemon=True)


class Scheduler:
    """The queue and the instance workers of one model version."""

    def __init__(
        self,
        model_name: str,
        version: int,
        settings: SchedulerSettings,
        run_batch: BatchRunner,
        *,
        stats: ModelStats | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """``clock_ns`` is the clock that queue delays and request timeouts are measured on, the
        one ``InferRequest.arrival_ns`` is read from; it exists so that tests can drive time.
        ``stats``: where the requests are counted (none: not counted, for tests of batching alone)."""
        self.model_name = model_name
        self._answers_label = f"model '{model_name}': a batch's answers"  # (for the log)
        self._stats = stats
        self.version = version
        self._settings = settings
        self._run_batch = run_batch
        self._clock_ns = clock_ns
        # _cond's lock, reentrant as the condition's default is (a request failed under it may have
        # a callback that sends the next one here); enqueue takes it bare, for every request, from
        # whichever thread sends it — often a worker answering its batch, while another worker
        # answers its own: a lock that yields the GIL when taken, else the two make a convoy
        # (triton_nb._locks)
        self._lock = YieldingLock(reentrant=True)
        self._cond = threading.Condition(self._lock)
        self._former: InstanceWorker | None = None  # the worker whose turn it is to form a batch
        self._queues: dict[int, deque[PendingRequest]] = {}
        self._delayed: deque[PendingRequest] = deque()
        # Kept with the queues so that enqueue decides in O(1) whether a batch may be full, and a
        # worker skips the timeout scan when no queued request has a deadline.
        self._queued_rows = 0
        self._signatures: dict[tuple, tuple] = {}
        self._signature_of: dict[tuple, tuple[int, tuple]] = {}  # (batching, names, shapes) -> (rows, signature)
        self._with_deadline = 0
        self._workers: list[InstanceWorker] = []
        self._sequence = itertools.count()
        self._stopping = False
        # preserve_ordering: responses wait here until every earlier dispatch has answered.
        self._release_lock = threading.Lock()
        self._next_release = 0
        self._held: dict[int, tuple[list[PendingRequest], list[InferResponse] | BaseException]] = {}
        self._dispatch_counter = itertools.count()

    # ------------------------------------------------------------------ instances
    def add_instance(self, instance: object, name: str, gate: contextlib.AbstractContextManager | None = None) -> None:
        """Serve with one more instance; ``gate`` (the rate limiter's) is held around each of its batches."""
        worker = InstanceWorker(self, instance, name, gate)
        with self._cond:
            self._workers.append(worker)
        worker.thread.start()

    def retire_instances(self, count: int) -> list[object]:
        """Stop ``count`` workers after their current batch; returns their instances to finalize."""
        with self._cond:
            leaving = [w for w in self._workers if not w.retire][-count:] if count else []
            for worker in leaving:
                worker.retire = True
            self._cond.notify_all()
        for worker in leaving:
            worker.thread.join()
            _close_gate(worker)
        with self._cond:
            self._workers = [w for w in self._workers if w not in leaving]
        return [w.instance for w in leaving]

    def instances(self) -> list[object]:
        """The backend objects of the instances serving now."""
        with self._cond:
            return [w.instance for w in self._workers if not w.retire]

    @property
    def instance_count(self) -> int:
        with self._cond:
            return sum(not w.retire for w in self._workers)

    @property
    def settings(self) -> SchedulerSettings:
        return self._settings

    def queue_depth(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values()) + len(self._delayed)

    # ------------------------------------------------------------------ live knobs
    def update(self, **changes: object) -> SchedulerSettings:
        """Change batching knobs; they apply from the next batch formed."""
        with self._cond:
            settings = replace(self._settings, **changes)
            if settings.preferred_batch_size:
                settings = replace(settings, preferred_batch_size=tuple(sorted(settings.preferred_batch_size)))
            self._settings = settings
            self._cond.notify_all()
        return settings

    # ------------------------------------------------------------------ queueing
    def _level(self, request: InferRequest, settings: SchedulerSettings) -> int:
        if settings.priority_levels <= 0:
            return 0
        if request.priority == 0:
            return settings.default_priority_level or settings.priority_levels
        if not 1 <= request.priority <= settings.priority_levels:
            raise InvalidArgumentError(
                f"model '{self.model_name}': priority {request.priority} is outside 1..{settings.priority_levels}"
            )
        return request.priority

    def enqueue(self, request: InferRequest, future: Future) -> None:
        settings = self._settings
        batching = settings.max_batch_size > 0
        inputs = request.inputs
        # The signature of the last requests with these input names and shapes (nearly all of
        # them, under load): a look-up, not a sort of (name, dims) pairs per request. Measured
        # 2026-12-07 against computing it each time (the fraud twin in process, alternated):
        # 1.10x / 1.09x the requests a second at 16 / 64 in flight.
        key = (batching, tuple(inputs), tuple(map(_shape, inputs.values())))
        found = self._signature_of.get(key)
        if found is None:
            if len(self._signature_of) >= _MAX_SIGNATURES:  # batch sizes and dims vary: bounded
                self._signature_of.clear()
                self._signatures.clear()  # (it grows no faster: a new signature comes with a new key)
            rows, shapes = _signature(request, batching)
            # one tuple per distinct signature, so that forming a batch compares by identity
            found = self._signature_of[key] = (rows, self._signatures.setdefault(shapes, shapes))
        rows, shapes = found
        with self._lock:
            if self._stopping:
                raise UnavailableError(f"model '{self.model_name}' is unloading; request not accepted")
            level = self._level(request, settings)
            policy = settings.policy(level)
            queue = self._queues.setdefault(level, deque())
            if policy.max_queue_size and len(queue) >= policy.max_queue_size:
                raise UnavailableError(
                    f"Exceeds maximum queue size: model '{self.model_name}' has {len(queue)} queued request(s) "
                    f"at priority {level or 'default'} (max_queue_size {policy.max_queue_size})"
                )
            timeout = policy.default_timeout_microseconds
            if policy.allow_timeout_override and request.timeout_microseconds:
                timeout = request.timeout_microseconds
            deadline = request.arrival_ns + timeout * 1000 if timeout else 0
            was_empty = self._queued_rows == 0
            head = None if was_empty else self._head()
            queue.append(PendingRequest(request, future, rows, shapes, deadline, next(self._sequence)))
            if self._stats is not None:
                self._stats.pending_add(request.counted_requests())
            self._queued_rows += rows
            if deadline:
                self._with_deadline += 1
            # Wake the worker forming a batch only when this request can change its decision: the
            # first request (it sleeps on an empty queue), a deadline, a request that cannot join
            # the batch being formed (that batch is due), or a batch that may now be full.
            # Otherwise it wakes at its delay anyway, and a wake-up per request costs a thread
            # switch per request under load.
            if (was_empty or deadline or not settings.dynamic_batching or settings.max_batch_size == 0
                    or (head is not None and head.shapes != shapes)
                    or self._queued_rows >= settings.smallest_target):
                self._cond.notify_all()

    def _head(self) -> PendingRequest | None:
        """The request a batch would start with (under _cond)."""
        queues = self._queues
        if len(queues) == 1 and not self._delayed:  # one priority level, the usual case: no sort
            for queue in queues.values():
                return queue[0] if queue else None
        for level in sorted(queues):
            if self._queues[level]:
                return self._queues[level][0]
        return self._delayed[0] if self._delayed else None

    def _expire(self, now: int) -> None:
        """Apply the timeout action to queued requests past their deadline (under _cond)."""
        if not self._with_deadline:
            return
        for level, queue in self._queues.items():
            if not any(p.deadline_ns and p.deadline_ns <= now for p in queue):
                continue
            keep: deque[PendingRequest] = deque()
            for pending in queue:
                if pending.deadline_ns and pending.deadline_ns <= now:
                    self._with_deadline -= 1
                    if self._settings.policy(level).delay_on_timeout:
                        pending.delayed = True
                        pending.deadline_ns = 0
                        self._delayed.append(pending)
                    else:
                        self._queued_rows -= pending.rows
                        self._reject(pending, UnavailableError(
                            f"Request timeout expired: model '{self.model_name}' did not start the request "
                            "within its timeout"))
                else:
                    keep.append(pending)
            self._queues[level] = keep

    def _ordered(self) -> list[PendingRequest]:
        ordered: list[PendingRequest] = []
        for level in sorted(self._queues):
            ordered.extend(self._queues[level])
        ordered.extend(self._delayed)
        return ordered

    def _take(self, chosen: list[PendingRequest]) -> int:
        """Take ``chosen`` off the queues (under _cond); returns its rows."""
        rows = sum(p.rows for p in chosen)
        self._queued_rows -= rows
        self._with_deadline -= sum(1 for p in chosen if p.deadline_ns)
        # A batch is nearly always the front of one queue, in order: pop it. Otherwise (it spans
        # priority levels or the delayed requests) rebuild the queues without it.
        for level in sorted(self._queues):
            queue = self._queues[level]
            if queue:
                if len(queue) >= len(chosen) and all(queue[i] is p for i, p in enumerate(chosen)):
                    for _ in chosen:
                        queue.popleft()
                    return rows
                break
        ids = {id(p) for p in chosen}
        for level in self._queues:
            self._queues[level] = deque(p for p in self._queues[level] if id(p) not in ids)
        self._delayed = deque(p for p in self._delayed if id(p) not in ids)
        return rows

    def _exit_due(self, worker: InstanceWorker) -> bool:
        return worker.retire or (self._stopping and not self._ordered())

    def _next_batch(self, worker: InstanceWorker) -> list[PendingRequest] | None:
        """Block until it is this worker's turn and a batch is due; None when it should exit."""
        with self._cond:
            while self._former is not None:
                if self._exit_due(worker):
                    return None
                self._cond.wait(timeout=0.5)
            self._former = worker
            try:
                return self._form(worker)
            finally:
                self._former = None
                self._cond.notify_all()

    def _form(self, worker: InstanceWorker) -> list[PendingRequest] | None:
        """Form the next batch (this worker holds the turn and ``_cond``) and count why it leaves."""
        # when this worker took the forming turn: a delay that fell due before it held no batch
        # back (the requests waited for an instance), one that fell due after it did
        turn_ns = -1
        while True:
            if self._exit_due(worker):
                return None
            now = self._clock_ns()
            if turn_ns < 0:
                turn_ns = now
            self._expire(now)
            queued = self._ordered()
            if not queued:
                self._cond.wait(timeout=0.5)
                continue
            settings = self._settings
            if not settings.dynamic_batching or settings.max_batch_size == 0:
                chosen = queued[:1]
                self._count_batch(BatchReason.NO_DYNAMIC_BATCHING, self._take(chosen))
                return chosen
            limit = settings.max_batch_size
            first = queued[0]
            if first.rows > limit:  # max_batch_size was lowered after it was queued
                self._take([first])
                self._reject(first, InvalidArgumentError(
                    f"model '{self.model_name}': batch size {first.rows} is above max_batch_size {limit}"))
                continue
            # One pass over the queue (this runs at every wake-up, with the lock held): the
            # prefix that can batch with the first request, the largest preferred size it
            # reaches, and its oldest arrival.
            targets = settings.targets()
            shapes = first.shapes
            rows = count = reached = 0
            oldest = first.request.arrival_ns
            for pending in queued:
                if (pending.shapes is not shapes and pending.shapes != shapes) or rows + pending.rows > limit:
                    break
                rows += pending.rows
                count += 1
                if rows in targets:
                    reached = count
                if pending.request.arrival_ns < oldest:
                    oldest = pending.request.arrival_ns
            blocked = count < len(queued)  # the next request cannot join: nothing to wait for
            # (the three branches after the first send the same batch: their order only picks the reason)
            if reached:
                chosen = queued[:reached]
                reason = (BatchReason.PREFERRED_BATCH_SIZE if settings.preferred_batch_size
                          else BatchReason.MAX_BATCH_SIZE)
            elif rows >= limit:
                chosen = queued[:count]
                reason = BatchReason.MAX_BATCH_SIZE
            elif blocked:
                chosen = queued[:count]
                following = queued[count].shapes
                reason = (BatchReason.DIFFERENT_SHAPE if following is not shapes and following != shapes
                          else BatchReason.MAX_BATCH_SIZE)
            elif self._stopping:
                chosen = queued[:count]
                reason = BatchReason.DRAINING
            else:
                due = oldest + settings.max_queue_delay_microseconds * 1000
                if now >= due:
                    chosen = queued[:count]
                    # held for the delay only if it fell due while this worker was forming
                    reason = (BatchReason.MAX_QUEUE_DELAY if settings.max_queue_delay_microseconds and due > turn_ns
                              else BatchReason.INSTANCE_FREE)
                else:
                    deadlines = [p.deadline_ns for p in queued if p.deadline_ns] if self._with_deadline else []
                    wake = min([due, *deadlines])
                    self._cond.wait(timeout=max(wake - now, 0) / 1e9)
                    continue
            self._count_batch(reason, self._take(chosen))
            return chosen

    def _count_batch(self, reason: str, rows: int) -> None:
        if self._stats is not None:
            self._stats.count_batch(reason, rows)

    # ------------------------------------------------------------------ running
    def _work(self, worker: InstanceWorker) -> None:
        _tighten_timer_slack()
        while True:
            batch = self._next_batch(worker)
            if batch is None:
                return
            self._dispatch(worker, batch)

    def _dispatch(self, worker: InstanceWorker, batch: list[PendingRequest]) -> None:
        worker.running = batch
        try:
            self._execute(worker, batch)
        finally:
            worker.running = []

    def _execute(self, worker: InstanceWorker, batch: list[PendingRequest]) -> None:
        order = next(self._dispatch_counter)
        # the client gave up waiting, or the request was cancelled while queued (a BLS caller's
        # ResponseIterator.cancel()): neither runs, as Triton's batcher skips cancelled requests
        live = [p for p in batch if not p.future.cancelled() and not p.request.cancelled]
        if len(live) < len(batch):
            gone = [p for p in batch if p.future.cancelled() or p.request.cancelled]
            if self._stats is not None:
                self._stats.pending_add(-sum(p.request.counted_requests() for p in gone))
                self._count_failures(gone, "CANCELED")
            for pending in gone:
                _fail(pending, RequestCancelledError(f"model '{self.model_name}': the request was cancelled "
                                                     "before it ran"))
        outcome: list[InferResponse] | BaseException
        try:
            if not live:
                outcome = []
            elif worker.gate is None:
                outcome = self._run_batch(worker.instance, [p.request for p in live])
            else:
                with worker.gate:  # the rate limiter: wait until this instance's resources are free
                    outcome = self._run_batch(worker.instance, [p.request for p in live])
            if outcome is not None and len(outcome) != len(live):
                outcome = InternalError(
                    f"model '{self.model_name}' returned {len(outcome)} responses for {len(live)} requests"
                )
        except TritonNBError as exc:
            outcome = exc
        except BaseException as exc:  # a backend bug (even a SystemExit from model code) fails
            # this batch only: were it to end the worker, every later request would wait forever
            log.exception("model '%s' version %s: batch failed", self.model_name, self.version)
            outcome = InternalError(f"model '{self.model_name}': {type(exc).__name__}: {exc}")
        if self._settings.preserve_ordering:
            self._release_in_order(order, live, outcome)
        else:
            self._settle(live, outcome)

    def _release_in_order(self, order: int, batch: list[PendingRequest], outcome: object) -> None:
        with self._release_lock:
            self._held[order] = (batch, outcome)
            while self._next_release in self._held:
                held_batch, held_outcome = self._held.pop(self._next_release)
                self._settle(held_batch, held_outcome)
                self._next_release += 1

    # ------------------------------------------------------------------ answering and counting
    def _settle(self, batch: list[PendingRequest], outcome: object) -> None:
        """Answer an executed batch's requests and count them: the successes in one call."""
        with Together(self._answers_label):
            self._answer(batch, outcome)

    def _answer(self, batch: list[PendingRequest], outcome: object) -> None:
        stats = self._stats
        if stats is None:
            _resolve(batch, outcome)
            return
        finished_ns = self._clock_ns()  # the batch's end is each request's end in the server
        # Counted before any response is handed over: a caller that reads the statistics as soon
        # as its response arrives (over the network, too) must find its request in them.
        answers: list[tuple[PendingRequest, object, bool]] = []  # (request, what it gets, succeeded)
        successes: list[PendingRequest] = []
        failures: list[PendingRequest] = []
        canceled: list[PendingRequest] = []
        apart: list[tuple[PendingRequest, list[InferResponse]]] = []  # carried requests answered apart
        responses = outcome if isinstance(outcome, list) else [outcome] * len(batch)
        for pending, response in zip(batch, responses, strict=True):
            if pending.future.done():  # cancelled while it ran, or failed by a stop that timed out (counted there)
                if pending.future.cancelled():
                    canceled.append(pending)
                continue
            if isinstance(response, BaseException):
                answers.append((pending, response, False))
                failures.append(pending)
            elif response is not None and response.error is not None:
                answers.append((pending, response.error, False))
                if isinstance(response.error, CarriedResponses):  # counted as the requests it carries
                    apart.append((pending, response.error.responses))
                else:
                    failures.append(pending)
            else:  # a response, or None: a decoupled model answered through its senders
                answers.append((pending, response, True))
                successes.append(pending)
        counted = [(finished_ns - p.request.arrival_ns, p.request.timing.get("queue", 0), rows)
                   for p in successes for rows in (p.request.carried_rows or (p.rows,))]
        for pending, parts in apart:
            for part, rows in zip(parts, pending.request.carried_rows, strict=True):
                if part.error is None:
                    counted.append((finished_ns - pending.request.arrival_ns, pending.request.timing.get("queue", 0),
                                    rows))
                else:
                    stats.record_request(success=False, request_ns=max(0, finished_ns - pending.request.arrival_ns),
                                         reason="BACKEND", first_response=True)
        if counted:
            # the batch's compute phases, the same for each request
            timing = (successes[0] if successes else apart[0][0]).request.timing
            stats.record_successes(
                counted,
                compute_input_ns=timing.get("compute_input", 0), compute_infer_ns=timing.get("compute_infer", 0),
                compute_output_ns=timing.get("compute_output", 0), first_response=outcome is not None)
        self._count_failures(failures, "BACKEND", finished_ns)
        self._count_failures(canceled, "CANCELED", finished_ns)
        for pending, answer, succeeded in answers:
            try:  # (not contextlib.suppress: this runs for every request)
                if succeeded:
                    pending.future.set_result(answer)
                else:
                    pending.future.set_exception(answer)
            except InvalidStateError:  # its caller gave up just now
                pass

    def _count_failures(self, batch: list[PendingRequest], reason: str, now_ns: int | None = None) -> None:
        if self._stats is None or not batch:
            return
        now_ns = self._clock_ns() if now_ns is None else now_ns
        for pending in batch:
            for _ in range(pending.request.counted_requests()):
                # (a decoupled request's first response is observed by its sender, if it sent one)
                self._stats.record_request(success=False, request_ns=max(0, now_ns - pending.request.arrival_ns),
                                           reason=reason, first_response=pending.request.response_sender is None)

    def _reject(self, pending: PendingRequest, error: BaseException) -> None:
        """Fail a queued request that never ran, off the pending gauge: Triton's REJECTED (or
        CANCELED when its caller had already given up)."""
        if self._stats is not None:
            self._stats.pending_add(-pending.request.counted_requests())
            self._count_failures([pending], "CANCELED" if pending.future.cancelled() else "REJECTED")
        _fail(pending, error)

    # ------------------------------------------------------------------ stopping
    def stop(self, drain: bool = True, timeout_s: float | None = None) -> list[object]:
        """Stop accepting requests; answer queued ones (drain) or fail them; join the workers.

        Returns the instances, for the caller to finalize. With ``timeout_s``, a worker still
        executing after it (a model that hangs) has its batch failed and is left behind — a daemon
        thread, its instance not finalized: a stop must end, and every request must be answered.
        """
        with self._cond:
            self._stopping = True
            if not drain or not self._workers:
                for pending in self._ordered():
                    self._reject(pending, UnavailableError(
                        f"model '{self.model_name}' was unloaded before the request ran"))
                self._queues.clear()
                self._delayed.clear()
                self._queued_rows = self._with_deadline = 0
            self._cond.notify_all()
        workers = list(self._workers)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        finished = []
        for worker in workers:
            worker.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not worker.thread.is_alive():
                finished.append(worker)
                _close_gate(worker)
                continue
            log.warning("model '%s' version %s: instance %s still executing after %.1f s; its requests fail and "
                        "it is left behind", self.model_name, self.version, worker.thread.name, timeout_s)
            for pending in list(worker.running):
                if not pending.future.done():
                    self._count_failures([pending], "REJECTED")
                _fail(pending, UnavailableError(
                    f"model '{self.model_name}' did not finish the request before the server stopped"))
        with self._cond:
            self._workers.clear()
        return [w.instance for w in finished]


_shape = operator.attrgetter("shape")


def _signature(request: InferRequest, batching: bool) -> tuple[int, tuple]:
    """A request's rows and the shapes that decide what it may be batched with: names with their
    non-batch dims (all dims without batching), in name order so that input order does not matter."""
    inputs = request.inputs
    if not inputs:
        return 1, ()
    if not batching:
        return 1, tuple(sorted((name, array.shape) for name, array in inputs.items()))
    rows = next(iter(inputs.values())).shape[0]
    return int(rows), tuple(sorted((name, array.shape[1:]) for name, array in inputs.items()))


def _close_gate(worker: InstanceWorker) -> None:
    close = getattr(worker.gate, "close", None)  # a gone instance no longer sizes the rate limiter's pools
    if close is not None:
        close()


def _fail(pending: PendingRequest, error: BaseException) -> None:
    if not pending.future.done():
        pending.future.set_exception(error)


def _resolve(batch: list[PendingRequest], outcome: object) -> None:
    if isinstance(outcome, BaseException):
        for pending in batch:
            _fail(pending, outcome)
        return
    if outcome is None:  # decoupled: responses went through the senders
        for pending in batch:
            if not pending.future.done():
                pending.future.set_result(None)
        return
    for pending, response in zip(batch, outcome, strict=True):
        if pending.future.done():
            continue
        if response.error is not None:
            pending.future.set_exception(response.error)
        else:
            pending.future.set_result(response)
