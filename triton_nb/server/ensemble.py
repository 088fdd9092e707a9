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

import numpy as np

from triton_nb.errors import InternalError, TritonNBError
from triton_nb.repository.config import ModelConfig
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
        self._submit = submit

    def run(self, request: InferRequest) -> Future:
        future: Future = Future()
        _EnsembleRun(self, request, future).start()
        return future


class _EnsembleRun:
    def __init__(self, scheduler: EnsembleScheduler, request: InferRequest, future: Future) -> None:
        self.scheduler = scheduler
        self.request = request
        self.future = future
        self.tensors: dict[str, np.ndarray] = dict(request.inputs)
        self.pending = set(range(len(scheduler.steps)))
        self.running = 0
        self.lock = threading.Lock()

    def start(self) -> None:
        self._advance()

    def _ready_steps(self) -> list[int]:
        plan = self.scheduler.plan
        tensors = self.tensors.keys()
        return [i for i in sorted(self.pending) if plan[i].needs <= tensors]

    def _advance(self) -> None:
        with self.lock:
            if self.future.done():
                return
            ready = self._ready_steps()
            for index in ready:
                self.pending.discard(index)
            self.running += len(ready)
            finished = not ready and self.running == 0
            inputs = [{name: self.tensors[tensor] for name, tensor in self.scheduler.plan[i].inputs} for i in ready]
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
            step_future.add_done_callback(lambda f, i=index: self._step_done(i, f))

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
