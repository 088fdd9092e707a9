"""Running an ensemble: the DAG of ``ensemble_scheduling`` steps, driven by futures.

A step fires as soon as every tensor it reads exists; independent steps run in parallel; each
step is an ordinary request to its model, so it goes through that model's own scheduler and a
composing model's dynamic batcher batches across ensemble requests. Nothing blocks a thread
while steps run: completions call back into :class:`_EnsembleRun`, which submits what became
ready. The first failing step fails the ensemble request, with the step named.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from functools import partial

import numpy as np

from triton_nb.errors import InternalError, TritonNBError
from triton_nb.repository.config import ModelConfig
from triton_nb.server.futures import ResponseFuture
from triton_nb.server.types import InferRequest, InferResponse

__all__ = ["EnsembleScheduler"]

Submit = Callable[[InferRequest], Future]


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

    def __init__(self, name: str, version: int, config: ModelConfig, submit: Submit) -> None:
        self.name = name
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

    def run(self, request: InferRequest) -> Future:
        future = ResponseFuture()
        _EnsembleRun(self, request, future).start()
        return future


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
            if self.future.done():
                return
            ready, self.ready = sorted(self.ready), []
            self.running += len(ready)
            finished = not ready and self.running == 0
            inputs = [{name: self.tensors[tensor] for name, tensor in plan[i].inputs} for i in ready]
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
            )
            try:
                step_future = self.scheduler._submit(step_request)
            except Exception as exc:  # refused at once (unknown, not ready, queue full)
                self._fail(index, exc)
                return
            step_future.add_done_callback(partial(self._step_done, index))

    def _step_done(self, index: int, step_future: Future) -> None:
        error = step_future.exception()
        if error is not None:
            self._fail(index, error)
            return
        response: InferResponse = step_future.result()
        step = self.scheduler.plan[index]
        with self.lock:
            for output, tensor in step.outputs:
                if output not in response.outputs:
                    missing = InternalError(f"ensemble '{self.scheduler.name}': step {index} "
                                            f"('{step.model_name}') gave no output '{output}'")
                    self.running -= 1
                    self._fail(index, missing)
                    return
                if tensor not in self.tensors:
                    self._produced(tensor)
                self.tensors[tensor] = response.outputs[output]
            self.running -= 1
        self._advance()

    def _fail(self, index: int, error: BaseException) -> None:
        if self.future.done():
            return
        step = self.scheduler.steps[index]
        message = f"in ensemble '{self.scheduler.name}', step {index} ('{step.model_name}'): {error}"
        try:  # keep the error's class (so its status maps the same), with the step named
            wrapped = type(error)(message) if isinstance(error, TritonNBError) else InternalError(message)
        except TypeError:
            wrapped = InternalError(message)
        with contextlib.suppress(InvalidStateError):  # a parallel step failed first
            self.future.set_exception(wrapped)

    def _finish(self) -> None:
        missing = [name for name in self.scheduler.outputs if name not in self.tensors]
        if missing:
            self.future.set_exception(InternalError(
                f"ensemble '{self.scheduler.name}' produced no {', '.join(missing)}"))
            return
        wanted = self.request.requested_outputs or self.scheduler.outputs
        self.future.set_result(InferResponse(
            model_name=self.scheduler.name,
            model_version=self.scheduler.version,
            outputs={name: self.tensors[name] for name in wanted},
            request_id=self.request.request_id,
        ))
