"""An ensemble carries a formed batch into its next step as one request where that changes
nothing a user sees: the answers, each request's error, and the statistics' request counts.

The two-step ensemble here is a chain, so the scheduler takes its chain's road; every test of the
pipeline runs on the general road too (``road="general"``), which other shapes of DAG take."""

from __future__ import annotations

import time
from concurrent.futures import Future, wait

import numpy as np
import pytest
from google.protobuf import text_format

from triton_nb.errors import InternalError, UnavailableError
from triton_nb.repository.config import ModelConfig
from triton_nb.server.observability.stats import ModelStats
from triton_nb.server.scheduling.batcher import Scheduler, SchedulerSettings
from triton_nb.server.scheduling.ensemble import EnsembleScheduler
from triton_nb.server.scheduling.together import after_batch
from triton_nb.tensors import InferRequest, InferResponse

WAIT_S = 30

TWO_STEPS = """
name: "pair"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Z" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "first" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "mid" } },
  { model_name: "second" model_version: -1 input_map { key: "X" value: "mid" } output_map { key: "Y" value: "Z" } }
] }
"""


def doubled(instance, requests):
    """X * 2; a request with a negative X fails alone (its response carries the error)."""
    return [InferResponse("first", 1, {"Y": r.inputs["X"] * 2}, r.request_id) if (r.inputs["X"] >= 0).all()
            else InferResponse.failed(r, InternalError("negative input"), 1) for r in requests]


class Second:
    """The second step, answered by hand: what it was sent, and a future per request."""

    def __init__(self) -> None:
        self.requests: list[InferRequest] = []
        self.futures: list[Future] = []

    def __call__(self, request: InferRequest) -> Future:
        self.requests.append(request)
        self.futures.append(Future())
        return self.futures[-1]


ROADS = ["chain", "general"]


def pipeline(carry: bool, road: str = "chain", inputs: list[np.ndarray] | None = None, start: bool = True):
    """'first' on a real scheduler (its batch of three is answered together), 'second' by hand;
    ``start=False`` leaves 'first' without its instance (the caller adds it)."""
    first = Scheduler("first", 1, SchedulerSettings(max_batch_size=8, dynamic_batching=True,
                                                    max_queue_delay_microseconds=10_000_000,
                                                    preferred_batch_size=(6,)), doubled)
    second = Second()

    def submit(request: InferRequest) -> Future:
        if request.model_name == "second":
            return second(request)
        future: Future = Future()
        first.enqueue(request, future)
        return future

    config = text_format.Parse(TWO_STEPS, ModelConfig())
    stats = ModelStats("pair", 1)
    ensemble = EnsembleScheduler("pair", 1, config, submit, stats=stats,
                                 carry=(lambda name, version, rows: rows <= 8) if carry else None)
    assert ensemble.chain == (0, 1)
    if road == "general":
        ensemble.chain = None
    if inputs is None:
        inputs = [np.full((rows, 2), i, np.float32) for i, rows in enumerate((1, 2, 3))]  # 6 rows: one batch
    runs = [ensemble.run(InferRequest("pair", {"X": x}, request_id=str(i))) for i, x in enumerate(inputs)]
    if start:
        first.add_instance(object(), "w0")
    return first, second, stats, inputs, runs


def finish(first: Scheduler) -> None:
    first.stop()


def sent_to_second(second: Second, count: int) -> None:
    """Wait until the second step has been sent ``count`` requests (it gets them after the
    first step's batch is answered, on the first step's worker)."""
    deadline = time.monotonic() + WAIT_S
    while len(second.requests) < count:
        assert time.monotonic() < deadline, f"the second step got {len(second.requests)} of {count} requests"
        time.sleep(0.005)


@pytest.mark.parametrize("road", ROADS)
def test_the_batch_goes_on_as_one_request_and_each_run_gets_its_rows(road):
    first, second, stats, inputs, runs = pipeline(carry=True, road=road)
    try:
        sent_to_second(second, 1)
        assert len(second.requests) == 1, "the three runs' second step was not carried as one request"
        carried = second.requests[0]
        assert carried.carried_rows == (1, 2, 3) and carried.counted_requests() == 3
        np.testing.assert_array_equal(carried.inputs["X"], np.concatenate(inputs) * 2)
        second.futures[0].set_result(InferResponse("second", 1, {"Y": carried.inputs["X"] + 1}, ""))
        for run, x in zip(runs, inputs, strict=True):
            np.testing.assert_array_equal(run.result(timeout=WAIT_S).outputs["Z"], x * 2 + 1)
        view = stats.to_json()
        assert view["inference_stats"]["success"]["count"] == 3  # each ensemble request, once
        assert view["inference_count"] == 6 and stats.pending == 0
    finally:
        finish(first)


@pytest.mark.parametrize("road", ROADS)
def test_a_failed_carried_step_fails_every_run_it_carried_with_the_step_named(road):
    first, second, stats, _, runs = pipeline(carry=True, road=road)
    try:
        sent_to_second(second, 1)
        second.futures[0].set_exception(UnavailableError("the tree model was unloaded"))
        for run in runs:
            with pytest.raises(UnavailableError, match=r"in ensemble 'pair', step 1 \('second'\): the tree model"):
                run.result(timeout=WAIT_S)
        assert stats.to_json()["inference_stats"]["fail"]["count"] == 3
    finally:
        finish(first)


@pytest.mark.parametrize("road", ROADS)
def test_without_carry_each_run_sends_its_own_request(road):
    first, second, _, inputs, runs = pipeline(carry=False, road=road)
    try:
        sent_to_second(second, 3)
        assert [r.carried_rows for r in second.requests] == [(), (), ()]
        assert [r.inputs["X"].shape[0] for r in second.requests] == [1, 2, 3]
        for request, future in zip(second.requests, second.futures, strict=True):
            future.set_result(InferResponse("second", 1, {"Y": request.inputs["X"]}, request.request_id))
        for run, x in zip(runs, inputs, strict=True):
            np.testing.assert_array_equal(run.result(timeout=WAIT_S).outputs["Z"], x * 2)
    finally:
        finish(first)


@pytest.mark.parametrize("road", ROADS)
def test_a_request_that_fails_in_the_first_step_fails_alone(road):
    inputs = [np.full((1, 2), 1, np.float32), np.full((2, 2), -1, np.float32), np.full((3, 2), 3, np.float32)]
    first, second, stats, _, runs = pipeline(carry=True, road=road, inputs=inputs)
    try:
        sent_to_second(second, 1)
        assert len(second.requests) == 1 and second.requests[0].carried_rows == (1, 3)  # the others, carried
        carried = second.requests[0]
        second.futures[0].set_result(InferResponse("second", 1, {"Y": carried.inputs["X"] + 1}, ""))
        with pytest.raises(InternalError, match=r"in ensemble 'pair', step 0 \('first'\): negative input"):
            runs[1].result(timeout=WAIT_S)
        for index in (0, 2):
            np.testing.assert_array_equal(runs[index].result(timeout=WAIT_S).outputs["Z"], inputs[index] * 2 + 1)
        view = stats.to_json()["inference_stats"]
        assert (view["success"]["count"], view["fail"]["count"], stats.pending) == (2, 1, 0)
    finally:
        finish(first)


@pytest.mark.parametrize("road", ROADS)
def test_a_request_its_caller_gave_up_on_is_counted_canceled_and_the_rest_go_on(road):
    first, second, stats, inputs, runs = pipeline(carry=True, road=road, start=False)
    try:
        assert runs[0].cancel()  # before the first step's worker starts: the run is at its first step
        first.add_instance(object(), "w0")
        sent_to_second(second, 1)
        carried = second.requests[0]
        assert carried.carried_rows == (2, 3)
        second.futures[0].set_result(InferResponse("second", 1, {"Y": carried.inputs["X"]}, ""))
        for index in (1, 2):
            np.testing.assert_array_equal(runs[index].result(timeout=WAIT_S).outputs["Z"], inputs[index] * 2)
        assert stats._failures["CANCELED"] == 1 and stats.pending == 0
        assert stats.to_json()["inference_stats"]["success"]["count"] == 2
    finally:
        finish(first)


@pytest.mark.parametrize("road", ROADS)
def test_requests_started_while_a_batch_is_answered_go_on_after_it(road):
    """A caller that sends its next request from a done-callback (as perf's in-process load does)
    runs on the worker answering a batch: the new requests wait for that batch to be answered,
    then go through both steps and are answered."""
    settings = SchedulerSettings(max_batch_size=8, dynamic_batching=True, max_queue_delay_microseconds=1000)
    steps = {"first": Scheduler("first", 1, settings, doubled),
             "second": Scheduler("second", 1, settings, lambda instance, requests: [
                 InferResponse("second", 1, {"Y": r.inputs["X"] + 1}, r.request_id) for r in requests])}

    def submit(request: InferRequest) -> Future:
        future: Future = Future()
        steps[request.model_name].enqueue(request, future)
        return future

    stats = ModelStats("pair", 1)
    ensemble = EnsembleScheduler("pair", 1, text_format.Parse(TWO_STEPS, ModelConfig()), submit, stats=stats,
                                 carry=lambda name, version, rows: rows <= 8)
    if road == "general":
        ensemble.chain = None
    inside: list[bool] = []
    resent: list[Future] = []

    def resend(_future: Future) -> None:
        inside.append(after_batch(lambda: None))  # True: on a worker, answering a batch
        resent.append(ensemble.run(InferRequest("pair", {"X": np.ones((1, 2), np.float32)})))

    runs = [ensemble.run(InferRequest("pair", {"X": np.full((1, 2), i, np.float32)})) for i in range(3)]
    for run in runs:
        run.add_done_callback(resend)
    for scheduler in steps.values():
        scheduler.add_instance(object(), "w0")
    try:
        for i, run in enumerate(runs):
            np.testing.assert_array_equal(run.result(timeout=WAIT_S).outputs["Z"], np.full((1, 2), i * 2 + 1))
        deadline = time.monotonic() + WAIT_S
        while len(resent) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        for run in resent:
            np.testing.assert_array_equal(run.result(timeout=WAIT_S).outputs["Z"], np.full((1, 2), 3.0))
        assert inside == [True, True, True]
        assert stats.to_json()["inference_stats"]["success"]["count"] == 6 and stats.pending == 0
    finally:
        for scheduler in steps.values():
            scheduler.stop()


def test_after_batch_runs_once_after_the_batch_and_only_inside_one():
    assert after_batch(lambda: None) is False  # not answering a batch: nothing deferred
    seen: list[str] = []

    def later() -> None:
        seen.append(f"after {len(answered)}")

    answered: list[str] = []

    def on_answer(future: Future) -> None:
        answered.append(future.result().request_id)
        assert after_batch(later)  # asked for by every response: run once

    scheduler = Scheduler("m", 1, SchedulerSettings(max_batch_size=8, dynamic_batching=True,
                                                    max_queue_delay_microseconds=10_000_000,
                                                    preferred_batch_size=(3,)),
                          lambda instance, requests: [InferResponse("m", 1, {}, r.request_id) for r in requests])
    futures = []
    for rid in "abc":
        future: Future = Future()
        future.add_done_callback(on_answer)
        scheduler.enqueue(InferRequest("m", {"x": np.ones((1, 1), np.float32)}, request_id=rid), future)
        futures.append(future)
    scheduler.add_instance(object(), "w0")
    wait(futures, timeout=WAIT_S)
    scheduler.stop()
    assert answered == ["a", "b", "c"] and seen == ["after 3"]


def test_a_carried_request_is_counted_as_the_requests_it_carries():
    stats = ModelStats("second", 1)
    scheduler = Scheduler("second", 1, SchedulerSettings(max_batch_size=8, dynamic_batching=True),
                          lambda instance, requests: [InferResponse("second", 1, {}, r.request_id) for r in requests],
                          stats=stats)
    future: Future = Future()
    scheduler.enqueue(InferRequest("second", {"x": np.ones((5, 1), np.float32)}, carried_rows=(2, 3)), future)
    assert stats.pending == 2
    scheduler.add_instance(object(), "w0")
    future.result(timeout=WAIT_S)
    scheduler.stop()
    view = stats.to_json()
    assert view["inference_stats"]["success"]["count"] == 2 and view["inference_count"] == 5
    failing: Future = Future()
    broken = Scheduler("second", 1, SchedulerSettings(max_batch_size=8, dynamic_batching=True),
                       lambda instance, requests: (_ for _ in ()).throw(InternalError("boom")), stats=stats)
    broken.enqueue(InferRequest("second", {"x": np.ones((3, 1), np.float32)}, carried_rows=(1, 1, 1)), failing)
    broken.add_instance(object(), "w0")
    assert isinstance(failing.exception(timeout=WAIT_S), InternalError)
    broken.stop()
    assert stats._failures["BACKEND"] == 3


DIAMOND = """
name: "diamond"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Z" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "left" input_map { key: "X" value: "X" } output_map { key: "Y" value: "l" } },
  { model_name: "right" input_map { key: "X" value: "X" } output_map { key: "Y" value: "r" } },
  { model_name: "join" input_map [ { key: "A" value: "l" }, { key: "B" value: "r" } ]
    output_map { key: "Y" value: "Z" } }
] }
"""


def test_a_dag_with_parallel_steps_takes_the_general_road():
    """Steps that may run side by side are no chain: both start at once, the join waits for
    both, and a failing branch fails the request with its step named."""
    sent: list[str] = []

    def submit(request: InferRequest) -> Future:
        sent.append(request.model_name)
        future: Future = Future()
        x = request.inputs
        if request.model_name == "join":
            future.set_result(InferResponse("join", 1, {"Y": x["A"] + x["B"]}))
        elif request.model_name == "right" and (x["X"] < 0).any():
            future.set_exception(InternalError("right refuses negatives"))
        else:
            future.set_result(InferResponse(request.model_name, 1, {"Y": x["X"] * (2 if request.model_name == "left"
                                                                                     else 3)}))
        return future

    stats = ModelStats("diamond", 1)
    ensemble = EnsembleScheduler("diamond", 1, text_format.Parse(DIAMOND, ModelConfig()), submit, stats=stats,
                                 carry=lambda name, version, rows: True)
    assert ensemble.chain is None
    x = np.ones((1, 2), np.float32)
    np.testing.assert_array_equal(ensemble.run(InferRequest("diamond", {"X": x})).result(WAIT_S).outputs["Z"], x * 5)
    assert sorted(sent[:2]) == ["left", "right"] and sent[2] == "join"
    with pytest.raises(InternalError, match=r"in ensemble 'diamond', step 1 \('right'\): right refuses"):
        ensemble.run(InferRequest("diamond", {"X": -x})).result(WAIT_S)
    view = stats.to_json()["inference_stats"]
    assert (view["success"]["count"], view["fail"]["count"], stats.pending) == (1, 1, 0)
