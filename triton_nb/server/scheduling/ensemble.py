"""Running an ensemble: the DAG of ``ensemble_scheduling`` steps, driven by futures.

A step fires as soon as every tensor it reads exists; independent steps run in parallel; each
step is an ordinary request to its model, so it goes through that model's own scheduler and a
composing model's dynamic batcher batches across ensemble requests. Nothing blocks a thread
while steps run: completions call back into :class:`_EnsembleRun`, which submits what became
ready. The first failing step fails the ensemble request, with the step named.

Carrying a batch through: when a composing model's batch is answered, the runs it readies for
the same next step are submitted together once the whole batch is answered (the batcher's
:func:`~triton_nb.server.scheduling.together.after_batch`), and where that step's model accepts it (see
``Carry``) as *one* request carrying all their rows. That saves splitting the batch into
requests, queueing each and forming them into a batch again. The model still counts each carried
ensemble request as a request (``InferRequest.carried_rows``); a Python model is handed them apart,
each with its rows and id, and answers or fails each alone (``CarriedResponses``), in a thread or
a process instance; a step with dynamic batching off, a bounded queue, or instances that cannot
take a carried request (a decoupled model's) gets the requests one by one. Runs started together, as the server
takes a burst of requests a front end read at once (``Server.infer_together``), start their first
step the same way.

A chain (each step readies exactly the next, as the fraud ensemble's preprocessing -> fil) of
requests that give every input and no parameters takes a leaner road, :class:`_ChainRun`: the
same submissions, carries, errors and counts, with the bookkeeping done per answered batch
instead of per request — a step's answers are taken up together once the batch that holds them
is answered, the next step submitted for all of them at once, and the finished ones counted in
one call. Anything else (parallel steps, optional inputs left out, sequence parameters) runs
through the general :class:`_EnsembleRun`.

``ensemble_scheduling.max_inflight_requests`` (Triton 2.63; 0, the default, is no limit) bounds
the step requests in flight at each step, across all the ensemble's requests: a step request
holds a slot of its step from its submission until its answer, so a fast step cannot run ahead
of a slow one behind it. Triton blocks the thread that would schedule the step until a slot
frees (at most 300 s, then it proceeds); here the step waits in its step's queue, in order, and
no thread blocks (the next step is often readied on a composing model's worker or the front
ends' loop). A request whose caller gave up is not started from the queue. With a limit, every
request takes the general road, one step request per ensemble request (no carried batches),
so that each holds its own slot.

The scheduler counts its own requests in the ensemble's statistics, as the batcher counts a
composing model's: pending while they run, then one success or failure each (``CANCELED`` when
the caller gave up, ``REJECTED`` otherwise); its steps are counted by their own models.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from functools import partial

import numpy as np

from triton_nb.errors import InternalError, TritonNBError, UnavailableError
from triton_nb.repository.config import ModelConfig
from triton_nb.server.models.checks import CheckedVersion, TensorSpec, passes_as_given
from triton_nb.server.observability.stats import ModelStats
from triton_nb.server.scheduling.futures import ResponseFuture
from triton_nb.server.scheduling.together import after_batch
from triton_nb.tensors import CarriedResponses, InferRequest, InferResponse

__all__ = ["EnsembleScheduler"]

#: A step's request -> its future; ``given`` (a step whose inputs are the ensemble's own) tells the
#: server whether the model version it resolves checks them as the ensemble already did.
Submit = Callable[..., Future]
_SEQUENCE_KEYS = frozenset(("sequence_id", "sequence_start", "sequence_end"))
#: Whether model (name, version) takes one request carrying ``rows`` rows of several ensemble requests.
Carry = Callable[[str, int, int], bool]
#: A step's answer for one ensemble request on the chain's road: its outputs, or its error.
_Answer = dict[str, np.ndarray] | BaseException


class _StepLimiter:
    """One step's in-flight limit (``max_inflight_requests``, Triton's
    ``StepInflightRequestLimiter``): a slot per step request from its submission to its answer;
    a request finding none waits in order and takes the slot the next answer frees."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self._waiting: deque[Callable[[], None]] = deque()
        self._lock = threading.Lock()

    def acquire(self, start_later: Callable[[], None]) -> bool:
        """True: a slot is taken, start now. False: ``start_later`` runs once a slot is passed on."""
        with self._lock:
            if self.in_flight < self.limit:
                self.in_flight += 1
                return True
            self._waiting.append(start_later)
            return False

    def release(self) -> None:
        """Free a slot: the longest-waiting request takes it (started on this thread), if any."""
        with self._lock:
            if not self._waiting:
                self.in_flight -= 1
                return
            start = self._waiting.popleft()
        start()


@dataclass(frozen=True)
class _Step:
    """One step of the schedule, read out of the protobuf once (its maps are slow to read per request)."""

    index: int
    model_name: str
    model_version: int
    inputs: tuple[tuple[str, str], ...]  # (the model's input, the ensemble tensor it reads)
    outputs: tuple[tuple[str, str], ...]  # (the model's output, the ensemble tensor it writes)
    needs: frozenset[str]
    requested: tuple[str, ...]


class EnsembleScheduler:
    """Runs requests of one ensemble version through its steps."""

    def __init__(self, name: str, version: int, config: ModelConfig, submit: Submit, *,
                 stats: ModelStats | None = None, carry: Carry | None = None,
                 input_specs: Mapping[str, TensorSpec] | None = None) -> None:
        self.name = name
        self.stats = stats
        self.batching = config.max_batch_size > 0
        self.version = version
        self.steps = list(config.ensemble_scheduling.step)
        self.plan = tuple(
            _Step(i, step.model_name, int(step.model_version), tuple(step.input_map.items()),
                  tuple(step.output_map.items()), frozenset(step.input_map.values()), tuple(step.output_map.keys()))
            for i, step in enumerate(self.steps))
        self.outputs = [tensor.name for tensor in config.output]
        # Which steps read each tensor, so a finished step readies its consumers without a scan.
        self.consumers: dict[str, tuple[int, ...]] = {}
        for step in self.plan:
            for tensor in step.needs:
                self.consumers[tensor] = (*self.consumers.get(tensor, ()), step.index)
        # what a run that has every ensemble input starts with (the common case): no set work per request
        given = frozenset(tensor.name for tensor in config.input)
        self.all_inputs = given
        self.missing_at_start = tuple(len(step.needs - given) for step in self.plan)
        self.ready_at_start = tuple(step.index for step in self.plan if not step.needs - given)
        self._submit = submit
        limit = int(config.ensemble_scheduling.max_inflight_requests)
        self.limiters = tuple(_StepLimiter(limit) for _ in self.plan) if limit else None
        # a limit counts step requests, one per ensemble request: no carried batches then
        self._carry = carry if self.limiters is None else None
        self._deferred = threading.local()  # step requests readied inside a batch being answered
        # None: the general road (see the module docstring)
        self.chain = self._chain_order() if self.limiters is None else None
        # The ensemble's input specs, as its requests were checked: a chain's first step, whose inputs
        # they are, is not checked tensor by tensor again where its model's specs are the same.
        self._input_specs = input_specs
        self._given_verdict: tuple[object, bool] | None = None  # (the step's version, its verdict)
        self._submit_first = partial(submit, given=self._first_step_given) if input_specs else submit

    def _chain_order(self) -> tuple[int, ...] | None:
        """The steps in order when, from every input, each step readies exactly the next one."""
        produced, order = set(self.all_inputs), []
        remaining = set(range(len(self.plan)))
        while remaining:
            ready = [index for index in remaining if self.plan[index].needs <= produced]
            if len(ready) != 1:
                return None
            order.append(ready[0])
            remaining.discard(ready[0])
            produced.update(tensor for _, tensor in self.plan[ready[0]].outputs)
        return tuple(order) if order else None

    def _first_step_given(self, target: CheckedVersion) -> bool:
        """Whether the chain's first step, resolved to ``target``, checks its inputs as the ensemble
        did (see ``checks.passes_as_given``); worked out once per loaded version of that model."""
        verdict = self._given_verdict
        if verdict is None or verdict[0] is not target:
            step = self.plan[self.chain[0]]
            same = passes_as_given(target, self._input_specs or {}, self.batching, step.inputs, step.requested)
            verdict = self._given_verdict = (target, same)
        return verdict[1]

    def _defer(self, slot: str, item: object, flush: Callable[[], None]) -> bool:
        """Inside a batch being answered, keep ``item`` in this thread's list ``slot`` for
        ``flush``, which runs once the whole batch is answered, and return True; else False."""
        if not after_batch(flush):
            return False
        waiting = getattr(self._deferred, slot, None)
        if waiting is None:
            waiting = []
            setattr(self._deferred, slot, waiting)
        waiting.append(item)
        return True

    def _take_deferred(self, slot: str) -> list:
        waiting = getattr(self._deferred, slot)
        setattr(self._deferred, slot, [])
        return waiting

    def _submit_step(self, run: _EnsembleRun, index: int, request: InferRequest) -> None:
        """Submit now, or, inside a batch being answered, once that whole batch is answered."""
        if self._carry is None or not self._defer("steps", (run, index, request), self._submit_deferred):
            run._submit_one(index, request)

    def _submit_deferred(self) -> None:
        waiting = self._take_deferred("steps")
        groups: dict[tuple[int, int, int], list[tuple[_EnsembleRun, InferRequest]]] = {}
        for run, index, request in waiting:
            groups.setdefault((index, request.priority, request.timeout_microseconds), []).append((run, request))
        for (index, _, _), group in groups.items():
            step = self.plan[index]
            rows = [next(iter(r.inputs.values())).shape[0] if r.inputs else 1 for _, r in group]
            if len(group) > 1 and self.batching and self._carry(step.model_name, step.model_version, sum(rows)):
                self._submit_carried(index, group, tuple(int(n) for n in rows))
            else:
                for run, request in group:
                    run._submit_one(index, request)

    def _submit_carried(self, index: int, group: list[tuple[_EnsembleRun, InferRequest]],
                        rows: tuple[int, ...]) -> None:
        first = group[0][1]
        requests = [request for _, request in group]
        try:
            inputs = {name: np.concatenate([r.inputs[name] for r in requests]) for name in first.inputs}
        except (ValueError, KeyError):  # shapes that cannot join: one by one, as the batcher would
            for run, request in group:
                run._submit_one(index, request)
            return
        carried = _carried_request(self.plan[index], requests, inputs, rows)
        runs = [run for run, _ in group]
        try:
            future = self._submit(carried)
        except Exception as exc:  # refused at once: each ensemble request fails as it would alone
            for run in runs:
                run._fail(index, exc)
            return
        future.add_done_callback(partial(_answer_carried, runs, index, rows))

    def run(self, request: InferRequest) -> Future:
        future = ResponseFuture()
        if self.stats is not None:
            self.stats.pending_add(1)
        if self.chain is not None and not request.parameters and request.inputs.keys() == self.all_inputs:
            self._chain_start(_ChainRun(request, future, self.batching))
        else:
            _EnsembleRun(self, request, future).start()
        return future

    def takes_carried(self, request: InferRequest) -> bool:
        """Whether :meth:`run_carried` takes ``request``: the chain's road applies to each request it
        carries (every input given, no parameters) and the ensemble batches, so their rows join."""
        return (self.chain is not None and self.batching and not request.parameters
                and request.inputs.keys() == self.all_inputs)

    def run_carried(self, request: InferRequest) -> list[Future]:
        """Run the requests ``request`` carries (``carried_rows``, ``carried_request_ids``: requests a
        front end decoded together, their inputs joined; see :meth:`takes_carried`) as that many
        ensemble requests: one future each, each counted, answered or failed alone. Their first
        step is submitted with the joined inputs as they are, as one carried request where its
        model takes one, without joining them again."""
        runs = [_ChainRun(one, ResponseFuture(), True) for one in request.carried_apart()]
        if self.stats is not None:
            self.stats.pending_add(len(runs))
        self._chain_send(0, runs, request.inputs)
        return [run.future for run in runs]

    # ------------------------------------------------------------------ the chain's road
    def _chain_start(self, run: _ChainRun) -> None:
        """Submit the first step; inside a batch being answered (a caller resubmitting from its
        done-callback), once that batch is answered, together with the others it started."""
        if not self._defer("chain_starts", run, self._chain_start_deferred):
            self._chain_send(0, [run])

    def _chain_start_deferred(self) -> None:
        for group in _by_priority_and_timeout(self._take_deferred("chain_starts")):
            self._chain_send(0, group)

    def _chain_send(self, position: int, runs: list[_ChainRun], joined: dict[str, np.ndarray] | None = None) -> None:
        """Submit chain step ``position`` for ``runs``: as one carried request where its model
        takes one, else one request each. ``joined``: the runs' tensors already joined, in order
        (the ensemble's inputs of :meth:`run_carried`)."""
        index = self.chain[position]
        step = self.plan[index]
        submit = self._submit_first if position == 0 else self._submit
        if len(runs) > 1 and self.batching and step.inputs:
            first_tensor = step.inputs[0][1]
            rows = tuple(len(run.tensors[first_tensor]) for run in runs)
            if self._carry is not None and self._carry(step.model_name, step.model_version, sum(rows)):
                try:
                    inputs = {name: joined[tensor] if joined is not None else
                              np.concatenate([run.tensors[tensor] for run in runs]) for name, tensor in step.inputs}
                except ValueError:  # shapes that cannot join: one by one, as the batcher would
                    pass
                else:
                    carried = _carried_request(step, [run.request for run in runs], inputs, rows)
                    try:
                        future = submit(carried)
                    except Exception as exc:  # refused at once: each fails as it would alone
                        for run in runs:
                            self._chain_fail(run, index, exc)
                        return
                    future.add_done_callback(partial(self._chain_carried_done, position, runs, rows))
                    return
        for run in runs:
            request = run.request
            step_request = InferRequest(
                model_name=step.model_name, model_version=step.model_version,
                inputs={name: run.tensors[tensor] for name, tensor in step.inputs},
                requested_outputs=list(step.requested), request_id=request.request_id, priority=request.priority,
                timeout_microseconds=request.timeout_microseconds, cancelled=request.cancelled)
            try:
                future = submit(step_request)
            except Exception as exc:  # refused at once (unknown, not ready, queue full)
                self._chain_fail(run, index, exc)
                continue
            future.add_done_callback(partial(self._chain_one_done, position, run))

    def _chain_one_done(self, position: int, run: _ChainRun, future: Future) -> None:
        # Inside the step's batch being answered: taken up with the rest of the batch after it
        if not self._defer("chain_answers", (position, run, future), self._chain_answered_deferred):
            self._chain_advance(position, [(run, _outputs_or_error(future))])

    def _chain_answered_deferred(self) -> None:
        groups: dict[tuple[int, int, int], list[tuple[_ChainRun, _Answer]]] = {}
        for position, run, future in self._take_deferred("chain_answers"):
            key = (position, run.request.priority, run.request.timeout_microseconds)
            groups.setdefault(key, []).append((run, _outputs_or_error(future)))
        for (position, _, _), items in groups.items():
            self._chain_advance(position, items)

    def _chain_carried_done(self, position: int, runs: list[_ChainRun], rows: tuple[int, ...],
                            future: Future) -> None:
        """Hand each run its rows of a carried step's answer (views, no copies), or its error."""
        outcome = _outputs_or_error(future)
        if isinstance(outcome, CarriedResponses):  # answered apart: each run its own outputs or error
            items: list[tuple[_ChainRun, _Answer]] = [
                (run, response.error if response.error is not None else response.outputs)
                for run, response in zip(runs, outcome.responses, strict=True)]
        elif isinstance(outcome, BaseException):
            items = [(run, outcome) for run in runs]
        else:
            items, start = [], 0
            for run, count in zip(runs, rows, strict=True):
                items.append((run, {name: array[start:start + count] for name, array in outcome.items()}))
                start += count
        self._chain_advance(position, items)

    def _chain_advance(self, position: int, items: list[tuple[_ChainRun, _Answer]]) -> None:
        """Take up step ``position``'s answers: keep their tensors, then submit the next step
        for every run still going, or finish them all."""
        index = self.chain[position]
        step = self.plan[index]
        going: list[_ChainRun] = []
        for run, outputs in items:
            if isinstance(outputs, BaseException):
                self._chain_fail(run, index, outputs)
                continue
            missing = next((output for output, _ in step.outputs if output not in outputs), None)
            if missing is not None:
                self._chain_fail(run, index, _no_output_error(self, index, missing))
                continue
            if run.future.cancelled():  # the caller gave up: what still runs is left to finish
                self._chain_count(run, False, "CANCELED")
                continue
            for output, tensor in step.outputs:
                run.tensors[tensor] = outputs[output]
            going.append(run)
        if not going:
            return
        if position + 1 < len(self.chain):
            self._chain_send(position + 1, going)
        else:
            self._chain_finish(going)

    def _chain_finish(self, runs: list[_ChainRun]) -> None:
        answers = []
        for run in runs:
            missing = [name for name in self.outputs if name not in run.tensors]
            if missing:
                self._chain_count(run, False)
                with contextlib.suppress(InvalidStateError):
                    run.future.set_exception(_no_outputs_error(self, missing))
                continue
            answers.append((run, _response(self, run.request, run.tensors)))
        # counted in one call, before any caller has its answer (as _EnsembleRun._count)
        if self.stats is not None and answers:
            finished_ns = time.monotonic_ns()
            self.stats.pending_add(-len(answers))
            self.stats.record_successes(
                [(max(0, finished_ns - run.request.arrival_ns), 0, run.rows) for run, _ in answers],
                compute_input_ns=0, compute_infer_ns=0, compute_output_ns=0)
        for run, response in answers:
            run.counted = True
            try:  # noqa: SIM105 (contextlib.suppress costs more, and this runs for every request)
                run.future.set_result(response)
            except InvalidStateError:  # the caller gave up just now
                pass

    def _chain_count(self, run: _ChainRun, success: bool, reason: str = "REJECTED") -> None:
        if run.counted or self.stats is None:
            run.counted = True
            return
        run.counted = True
        self.stats.pending_add(-1)
        self.stats.record_request(success=success, request_ns=max(0, time.monotonic_ns() - run.request.arrival_ns),
                                  reason=reason, batch_size=run.rows)

    def _chain_fail(self, run: _ChainRun, index: int, error: BaseException) -> None:
        if run.future.done():  # the caller gave up
            if run.future.cancelled():
                self._chain_count(run, False, "CANCELED")
            return
        self._chain_count(run, False)
        with contextlib.suppress(InvalidStateError):
            run.future.set_exception(_step_error(self, index, error))


class _EnsembleRun:
    def __init__(self, scheduler: EnsembleScheduler, request: InferRequest, future: Future) -> None:
        self.scheduler = scheduler
        self.request = request
        self.future = future
        self.tensors: dict[str, np.ndarray] = dict(request.inputs)
        # tensors each step still waits for; a step whose count reaches 0 is ready
        if self.tensors.keys() == scheduler.all_inputs:
            self.missing = list(scheduler.missing_at_start)
            self.ready = list(scheduler.ready_at_start)
        else:  # optional inputs left out
            self.missing = [len(step.needs - self.tensors.keys()) for step in scheduler.plan]
            self.ready = [step.index for step in scheduler.plan if not self.missing[step.index]]
        self.running = 0
        self.lock = threading.Lock()
        self.uncounted = [True]  # popped (atomically) by the one call that counts the run

    def _count(self, success: bool, reason: str = "REJECTED") -> None:
        """Count the run in the ensemble's statistics, once whichever way and from however many
        threads its end is reached; before its caller has the answer (a caller that reads the
        statistics then must find the request there)."""
        stats = self.scheduler.stats
        if stats is None:
            return
        try:
            self.uncounted.pop()  # atomic: only one caller gets past
        except IndexError:
            return
        stats.pending_add(-1)
        elapsed = time.monotonic_ns() - self.request.arrival_ns
        stats.record_request(success=success, request_ns=max(0, elapsed), reason=reason,
                             batch_size=self.request.batch_size(self.scheduler.batching))

    def start(self) -> None:
        self._advance()

    def _produced(self, tensor: str) -> None:
        """Count a new tensor against the steps that read it (under lock)."""
        for index in self.scheduler.consumers.get(tensor, ()):
            self.missing[index] -= 1
            if not self.missing[index]:
                self.ready.append(index)

    def _advance(self) -> None:
        plan = self.scheduler.plan
        with self.lock:
            done = self.future.done()
            if not done:
                ready, self.ready = sorted(self.ready), []
                self.running += len(ready)
                finished = not ready and self.running == 0
                inputs = [{name: self.tensors[tensor] for name, tensor in plan[i].inputs} for i in ready]
        if done:
            if self.future.cancelled():  # the caller gave up: what still runs is left to finish
                self._count(False, "CANCELED")
            return
        if finished:
            self._finish()
            return
        for index, step_inputs in zip(ready, inputs, strict=True):
            step = self.scheduler.plan[index]
            step_request = InferRequest(
                model_name=step.model_name,
                model_version=step.model_version,
                inputs=step_inputs,
                requested_outputs=list(step.requested),
                request_id=self.request.request_id,
                priority=self.request.priority,
                timeout_microseconds=self.request.timeout_microseconds,
                # Triton hands each step the request's correlation id and flags: a step may be a
                # sequence model
                parameters={key: value for key, value in self.request.parameters.items() if key in _SEQUENCE_KEYS}
                if self.request.parameters else {},
                # Triton cancels the step requests of a cancelled ensemble request as it schedules them
                cancelled=self.request.cancelled,
            )
            self.scheduler._submit_step(self, index, step_request)

    def _submit_one(self, index: int, request: InferRequest) -> None:
        limiters = self.scheduler.limiters
        if limiters is None:
            try:
                step_future = self.scheduler._submit(request)
            except Exception as exc:  # refused at once (unknown, not ready, queue full)
                self._fail(index, exc)
                return
            step_future.add_done_callback(partial(self._step_done, index))
            return
        # a cancelled request does not wait for a slot (Triton's limiter lets it through)
        if request.cancelled or limiters[index].acquire(partial(self._submit_limited, index, request)):
            self._submit_limited(index, request)

    def _submit_limited(self, index: int, request: InferRequest) -> None:
        """Submit with a slot of the step's limiter held, released when the step is answered."""
        limiter = self.scheduler.limiters[index]  # type: ignore[index]
        if self.future.done():  # the caller gave up, or a parallel step failed, while this one waited
            limiter.release()
            self._fail(index, UnavailableError(f"ensemble '{self.scheduler.name}': the request ended while "
                                               f"step {index} waited for max_inflight_requests"))
            return
        try:
            step_future = self.scheduler._submit(request)
        except Exception as exc:  # refused at once (unknown, not ready, queue full)
            limiter.release()
            self._fail(index, exc)
            return
        step_future.add_done_callback(partial(self._limited_step_done, limiter, index))

    def _limited_step_done(self, limiter: _StepLimiter, index: int, step_future: Future) -> None:
        limiter.release()  # first, as Triton's UpdateEnsembleState: the answer frees the slot
        self._step_done(index, step_future)

    def _step_done(self, index: int, step_future: Future) -> None:
        error = step_future.exception()
        if error is not None:
            self._fail(index, error)
            return
        self._step_answered(index, step_future.result())

    def _step_answered(self, index: int, response: InferResponse) -> None:
        step = self.scheduler.plan[index]
        with self.lock:
            for output, tensor in step.outputs:
                if output not in response.outputs:
                    self.running -= 1
                    self._fail(index, _no_output_error(self.scheduler, index, output))
                    return
                if tensor not in self.tensors:
                    self._produced(tensor)
                self.tensors[tensor] = response.outputs[output]
            self.running -= 1
        self._advance()

    def _fail(self, index: int, error: BaseException) -> None:
        """Fail the run at step ``index`` (callers may hold ``lock``: this takes no lock of the run)."""
        if self.future.done():  # a parallel step failed first, or the caller gave up (counted once)
            if self.future.cancelled():
                self._count(False, "CANCELED")
            return
        self._count(False)
        with contextlib.suppress(InvalidStateError):  # a parallel step failed first, or the caller gave up
            self.future.set_exception(_step_error(self.scheduler, index, error))

    def _finish(self) -> None:
        missing = [name for name in self.scheduler.outputs if name not in self.tensors]
        if missing:
            self._count(False)
            with contextlib.suppress(InvalidStateError):
                self.future.set_exception(_no_outputs_error(self.scheduler, missing))
            return
        if self.future.cancelled():
            self._count(False, "CANCELED")
            return
        self._count(True)
        with contextlib.suppress(InvalidStateError):  # the caller gave up just now
            self.future.set_result(_response(self.scheduler, self.request, self.tensors))


def _answer_carried(runs: list[_EnsembleRun], index: int, rows: tuple[int, ...], future: Future) -> None:
    """Hand each run its rows of a carried step's response (views, no copies), or its error."""
    error = future.exception()
    if isinstance(error, CarriedResponses):  # answered apart: each run its own response
        for run, response in zip(runs, error.responses, strict=True):
            if response.error is not None:
                run._fail(index, response.error)
            else:
                run._step_answered(index, response)
        return
    if error is not None:
        for run in runs:
            run._fail(index, error)
        return
    response: InferResponse = future.result()
    start = 0
    for run, count in zip(runs, rows, strict=True):
        outputs = {name: array[start:start + count] for name, array in response.outputs.items()}
        start += count
        run._step_answered(index, InferResponse(response.model_name, response.model_version, outputs,
                                                run.request.request_id))


class _ChainRun:
    """One ensemble request on the chain's road: its request, future and tensors so far."""

    __slots__ = ("counted", "future", "request", "rows", "tensors")

    def __init__(self, request: InferRequest, future: Future, batching: bool) -> None:
        self.request = request
        self.future = future
        self.tensors: dict[str, np.ndarray] = dict(request.inputs)
        self.rows = request.batch_size(batching)  # what the ensemble's statistics count
        self.counted = False


def _step_error(scheduler: EnsembleScheduler, index: int, error: BaseException) -> BaseException:
    """``error`` of step ``index`` as the ensemble request's: its class kept (so its status maps
    the same), the step named."""
    step = scheduler.steps[index]
    message = f"in ensemble '{scheduler.name}', step {index} ('{step.model_name}'): {error}"
    try:
        return type(error)(message) if isinstance(error, TritonNBError) else InternalError(message)
    except TypeError:
        return InternalError(message)


def _no_output_error(scheduler: EnsembleScheduler, index: int, output: str) -> InternalError:
    step = scheduler.plan[index]
    return InternalError(f"ensemble '{scheduler.name}': step {index} ('{step.model_name}') gave no output '{output}'")


def _no_outputs_error(scheduler: EnsembleScheduler, missing: list[str]) -> InternalError:
    return InternalError(f"ensemble '{scheduler.name}' produced no {', '.join(missing)}")


def _response(scheduler: EnsembleScheduler, request: InferRequest, tensors: dict[str, np.ndarray]) -> InferResponse:
    """The ensemble's answer to ``request``: the outputs it asked for (all by default) and, as
    Triton's ensemble answers, the request's sequence parameters (0 and false outside a sequence)."""
    given = request.parameters
    return InferResponse(
        model_name=scheduler.name, model_version=scheduler.version,
        outputs={name: tensors[name] for name in request.requested_outputs or scheduler.outputs},
        request_id=request.request_id,
        parameters={"sequence_id": given.get("sequence_id", 0),
                    "sequence_start": bool(given.get("sequence_start", False)),
                    "sequence_end": bool(given.get("sequence_end", False))})


def _carried_request(step: _Step, carried: list[InferRequest], inputs: dict[str, np.ndarray],
                     rows: tuple[int, ...]) -> InferRequest:
    """Step ``step``'s one request carrying several ensemble requests' ``rows`` (joined ``inputs``),
    with the first one's priority and timeout (the requests carried together share them) and each one's id."""
    return InferRequest(
        model_name=step.model_name, model_version=step.model_version, inputs=inputs,
        requested_outputs=list(step.requested), request_id=carried[0].request_id, priority=carried[0].priority,
        timeout_microseconds=carried[0].timeout_microseconds, carried_rows=rows,
        carried_request_ids=tuple(request.request_id for request in carried))


def _outputs_or_error(future: Future) -> _Answer:
    error = future.exception()
    return error if error is not None else future.result().outputs


def _by_priority_and_timeout(runs: list[_ChainRun]) -> list[list[_ChainRun]]:
    groups: dict[tuple[int, int], list[_ChainRun]] = {}
    for run in runs:
        groups.setdefault((run.request.priority, run.request.timeout_microseconds), []).append(run)
    return list(groups.values())
