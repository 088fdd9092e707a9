"""The batcher and the ensemble scheduler count their own requests as Triton does: successes of
a batch in one call (the same sums as one record per request), failures with their reason, the
pending gauge back at zero whichever way a request ends."""

from __future__ import annotations

import threading
from concurrent.futures import Future, wait

import numpy as np
import pytest

from triton_nb.errors import InternalError, UnavailableError
from triton_nb.server.observability.stats import ModelStats
from triton_nb.server.scheduling.batcher import QueuePolicy, Scheduler, SchedulerSettings
from triton_nb.tensors import InferRequest, InferResponse

WAIT_S = 30  # only keeps a broken scheduler from hanging the suite


def request(rid: str, rows: int = 1, timeout_us: int = 0) -> InferRequest:
    return InferRequest("m", {"x": np.ones((rows, 2), np.float32)}, request_id=rid, timeout_microseconds=timeout_us)


def enqueue(scheduler: Scheduler, req: InferRequest) -> Future:
    future: Future = Future()
    scheduler.enqueue(req, future)
    return future


def test_record_successes_sums_as_one_record_per_request():
    one_by_one, batched = ModelStats("m", 1), ModelStats("m", 1)
    requests = [(12_345, 2_001, 1), (9_999, 1_500, 4), (1_000_000, 0, 2)]
    for request_ns, queue_ns, rows in requests:
        one_by_one.record_request(success=True, request_ns=request_ns, queue_ns=queue_ns, compute_input_ns=1_234,
                                  compute_infer_ns=56_789, compute_output_ns=999, batch_size=rows)
    batched.record_successes(requests, compute_input_ns=1_234, compute_infer_ns=56_789, compute_output_ns=999)
    assert batched.to_json() == one_by_one.to_json()
    assert batched.inference_count == 7
    assert batched._request_us == one_by_one._request_us  # the metrics' truncation per request is kept
    with pytest.raises(ValueError, match="must be >= 0"):
        batched.record_successes([(-1, 0, 1)], compute_input_ns=0, compute_infer_ns=0, compute_output_ns=0)


class Answers:
    """A fake backend that fails request ``bad`` of a batch, or the whole batch, and can be held."""

    def __init__(self, bad: str | None = None, raise_all: bool = False) -> None:
        self.bad = bad
        self.raise_all = raise_all
        self.release = threading.Event()
        self.release.set()
        self.started = threading.Event()

    def __call__(self, instance, requests):
        self.started.set()
        self.release.wait(WAIT_S)
        if self.raise_all:
            raise InternalError("the model fell over")
        for r in requests:
            r.timing.update({"queue": 5, "compute_input": 10, "compute_infer": 20, "compute_output": 30})
        return [InferResponse("m", 1, {}, r.request_id, error=InternalError("bad row") if r.request_id == self.bad
                              else None) for r in requests]


def scheduler_with(answers: Answers, settings: SchedulerSettings | None = None) -> tuple[Scheduler, ModelStats]:
    stats = ModelStats("m", 1)
    settings = settings or SchedulerSettings(max_batch_size=8, dynamic_batching=True,
                                             max_queue_delay_microseconds=200_000)
    scheduler = Scheduler("m", 1, settings, answers, stats=stats)
    return scheduler, stats


def test_a_batch_counts_its_successes_and_a_failed_response_as_backend():
    answers = Answers(bad="b")
    scheduler, stats = scheduler_with(answers)
    futures = [enqueue(scheduler, request(rid, rows=2)) for rid in "abc"]
    assert stats.pending == 3
    scheduler.add_instance(object(), "w0")
    wait(futures, timeout=WAIT_S)
    scheduler.stop()
    assert [f.exception() is None for f in futures] == [True, False, True]
    view = stats.to_json()["inference_stats"]
    assert view["success"]["count"] == 2 and view["fail"]["count"] == 1
    assert view["compute_infer"] == {"count": 2, "ns": 40}  # the batch's compute, once per request
    assert stats.inference_count == 4  # the failed request's rows are not counted
    assert stats._failures["BACKEND"] == 1
    assert stats.pending == 3  # taken off by the instance's run_batch, not by the scheduler


def test_a_batch_that_raises_fails_every_request_as_backend():
    scheduler, stats = scheduler_with(Answers(raise_all=True))
    futures = [enqueue(scheduler, request(rid)) for rid in "ab"]
    scheduler.add_instance(object(), "w0")
    wait(futures, timeout=WAIT_S)
    scheduler.stop()
    assert all(isinstance(f.exception(), InternalError) for f in futures)
    assert stats._failures["BACKEND"] == 2 and stats.to_json()["inference_stats"]["success"]["count"] == 0


def test_a_request_that_times_out_in_the_queue_is_rejected_and_leaves_the_gauge():
    answers = Answers()
    settings = SchedulerSettings(max_batch_size=8, dynamic_batching=True, max_queue_delay_microseconds=0,
                                 default_queue_policy=QueuePolicy(default_timeout_microseconds=1_000))
    scheduler, stats = scheduler_with(answers, settings)
    future = enqueue(scheduler, request("late"))
    assert stats.pending == 1
    threading.Event().wait(0.05)  # past its 1 ms timeout before any instance exists
    scheduler.add_instance(object(), "w0")
    assert isinstance(future.exception(timeout=WAIT_S), UnavailableError)
    scheduler.stop()
    assert stats._failures["REJECTED"] == 1 and stats.pending == 0


def test_a_cancelled_request_counts_as_canceled_once_and_leaves_the_gauge():
    scheduler, stats = scheduler_with(Answers())
    kept, dropped = enqueue(scheduler, request("kept")), enqueue(scheduler, request("dropped"))
    assert dropped.cancel()
    scheduler.add_instance(object(), "w0")
    kept.result(timeout=WAIT_S)
    scheduler.stop()
    assert stats._failures["CANCELED"] == 1
    assert stats.to_json()["inference_stats"]["fail"]["count"] == 1
    assert stats.pending == 1  # +2 queued, -1 cancelled before the batch (the run_batch of a real instance
    # takes the one it runs off; this fake does not)


def test_unloading_without_drain_rejects_what_is_queued():
    scheduler, stats = scheduler_with(Answers())
    futures = [enqueue(scheduler, request(rid)) for rid in "ab"]
    scheduler.stop(drain=False)
    assert all(isinstance(f.exception(timeout=WAIT_S), UnavailableError) for f in futures)
    assert stats._failures["REJECTED"] == 2 and stats.pending == 0


ENSEMBLE_OVER_GATED = """
name: "wrap"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Z" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "gated" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "Z" } }
] }
"""


def test_served_requests_are_counted_once_each_whichever_way_they_end(tmp_path):
    """Through a real server: an ensemble request and a direct one answered, an ensemble request
    cancelled while its step runs; every count lands once and both pending gauges return to 0."""
    import time

    from tests.helpers.scale_models import write_gated_model
    from triton_nb.serving import serve

    gate = write_gated_model(tmp_path)
    (tmp_path / "wrap" / "1").mkdir(parents=True)
    (tmp_path / "wrap" / "config.pbtxt").write_text(ENSEMBLE_OVER_GATED)
    x = np.ones((1, 2), np.float32)
    with serve(tmp_path) as server:
        try:
            client = server.client()
            given_up = server.infer_async(InferRequest("wrap", {"X": x}))
            deadline = time.monotonic() + WAIT_S
            while not (gate / "running").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
            assert given_up.cancel()
            answered = client.async_infer("wrap", {"X": x})
            direct = client.async_infer("gated", {"X": x})
        finally:
            (gate / "open").touch()
        np.testing.assert_array_equal(answered.get_result(timeout=WAIT_S).as_numpy("Z"), x * 2)
        direct.get_result(timeout=WAIT_S)
        deadline = time.monotonic() + WAIT_S  # the cancelled run is counted when its step comes back
        while server.statistics("wrap")["model_stats"][0]["inference_stats"]["fail"]["count"] < 1:
            assert time.monotonic() < deadline, "the cancelled ensemble request was never counted"
            time.sleep(0.01)
        wrap = server.statistics("wrap")["model_stats"][0]
        gated = server.statistics("gated")["model_stats"][0]
        metrics = server.metrics_text().decode()
    assert wrap["inference_stats"]["success"]["count"] == 1 and wrap["inference_stats"]["fail"]["count"] == 1
    assert 'nv_inference_request_failure{model="wrap",reason="CANCELED",version="1"} 1' in metrics
    assert gated["inference_stats"]["success"]["count"] == 3  # its step runs to the end, cancelled or not
    assert gated["inference_count"] == 3 and gated["inference_stats"]["fail"]["count"] == 0
    assert 'nv_inference_pending_request_count{model="wrap",version="1"} 0' in metrics
    assert 'nv_inference_pending_request_count{model="gated",version="1"} 0' in metrics
