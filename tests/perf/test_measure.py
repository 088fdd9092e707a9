"""perf measurement: the arithmetic on known answers, input data, the CSV, and end-to-end runs on
the in-kernel server over all three protocols and on a real Triton."""

from __future__ import annotations

import csv
import json
import threading
from concurrent.futures import Future

import numpy as np
import pandas as pd
import pytest

from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason
from tests.helpers.scale_models import write_picky_model, write_scale_model
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.perf import load as load_module
from triton_nb.perf import measure, write_perf_analyzer_csv
from triton_nb.perf.inputs import request_inputs
from triton_nb.perf.stats import (
    Completions,
    Window,
    is_stable,
    parse_range,
    percentile,
    server_breakdown,
    summarize,
)

MS = 1_000_000


def test_percentile_is_perf_analyzers_nearest_index():
    values = np.arange(1, 101, dtype=float)
    assert [percentile(values, p) for p in (50, 90, 95, 99)] == [51, 90, 95, 99]
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_ranges_as_perf_analyzer_writes_them():
    assert parse_range("1:32:8", "c") == [1, 9, 17, 25]
    assert parse_range("4", "c") == [4]
    assert parse_range("100:300:100", "r") == [100, 200, 300]
    assert parse_range([2, 3], "c") == [2, 3]
    for bad in ("a:b", "8:1", "1:4:0", "1:2:3:4", "0"):
        with pytest.raises(ValueError, match="c"):
            parse_range(bad, "c")


def _completions(count: int, begin_ns: int, span_ns: int, latency_ns: int) -> Completions:
    ends = begin_ns + (np.arange(count) * span_ns) // count
    return Completions(ends - latency_ns, ends, np.ones(count, bool))


def test_a_window_counts_what_finished_inside_it():
    done = _completions(200, 0, 2_000 * MS, 2 * MS)  # 100/s over two seconds, 2 ms each
    done.extend([500 * MS], [500 * MS + 1], [False])  # one failure
    window = summarize(done, 0, 1_000 * MS, rows_per_request=4)
    assert window.completed == 100 and window.errors == 1
    assert window.throughput_infer_per_sec == pytest.approx(400.0)  # 100 requests x 4 rows in 1 s
    assert window.latency_avg_us == pytest.approx(2000.0)
    assert window.latency_percentiles_us[99] == pytest.approx(2000.0)


def _window(throughput: float, latency_us: float, p99: float | None = None) -> Window:
    return Window(0, 1, 1, 0, throughput, latency_us, {50: latency_us, 90: latency_us, 95: latency_us,
                                                        99: p99 or latency_us})


def test_stability_needs_three_windows_within_the_percentage():
    steady = [_window(1000, 500), _window(1040, 510), _window(980, 495)]
    assert is_stable(steady, 10)
    assert not is_stable(steady[:2], 10)
    assert not is_stable([*steady[:2], _window(1300, 500)], 10)  # throughput moved
    assert not is_stable([*steady[:2], _window(1000, 700)], 10)  # latency moved
    wobbly_tail = [_window(1000, 500, 900), _window(1000, 500, 1500), _window(1000, 500, 900)]
    assert is_stable(wobbly_tail, 10) and not is_stable(wobbly_tail, 10, latency_percentile=99)


def _stats(entries: dict[str, dict[str, int]], batches: dict[str, dict[int, int]] | None = None) -> dict:
    models = []
    for name, values in entries.items():
        inference = {key: {"count": values.get("count", 0), "ns": values.get(key, 0)}
                     for key in ("success", "queue", "compute_input", "compute_infer", "compute_output")}
        batch_stats = [{"batch_size": size, "compute_infer": {"count": count, "ns": 0}}
                       for size, count in (batches or {}).get(name, {}).items()]
        models.append({"name": name, "version": "1", "inference_stats": inference, "batch_stats": batch_stats})
    return {"model_stats": models}


def test_server_breakdown_from_two_statistics_snapshots():
    before = _stats({"m": {"count": 10, "success": 10_000_000, "queue": 1_000_000, "compute_infer": 5_000_000}},
                    {"m": {1: 10}})
    after = _stats({"m": {"count": 110, "success": 210_000_000, "queue": 11_000_000, "compute_input": 2_000_000,
                          "compute_infer": 105_000_000, "compute_output": 3_000_000}}, {"m": {1: 30, 4: 20}})
    breakdown = server_breakdown(before, after, "m")
    assert breakdown.requests == 100
    assert breakdown.request_us == pytest.approx(2000.0)
    assert (breakdown.queue_us, breakdown.compute_input_us, breakdown.compute_infer_us,
            breakdown.compute_output_us) == pytest.approx((100.0, 20.0, 1000.0, 30.0))
    assert breakdown.batch_sizes == {1: 20, 4: 20}


def test_an_ensembles_breakdown_sums_its_steps():
    before = _stats({"ens": {"count": 0}, "pre": {"count": 0}, "trees": {"count": 0}})
    after = _stats({"ens": {"count": 50, "success": 100_000_000}, "pre": {"count": 50, "queue": 5_000_000,
                                                                          "compute_infer": 10_000_000},
                    "trees": {"count": 50, "queue": 2_500_000, "compute_infer": 5_000_000}}, {"trees": {8: 6}})
    breakdown = server_breakdown(before, after, "ens", composing=["pre", "trees"])
    assert breakdown.queue_us == pytest.approx(150.0) and breakdown.compute_infer_us == pytest.approx(300.0)
    assert breakdown.batch_sizes == {8: 6}
    with pytest.raises(ValueError, match="no model 'other'"):
        server_breakdown(before, after, "other")


CONFIG = {"name": "m", "max_batch_size": 8, "input": [
    {"name": "X", "data_type": "TYPE_FP32", "dims": [2]}, {"name": "S", "data_type": "TYPE_STRING", "dims": [1]}]}


def test_input_data_of_every_kind(tmp_path):
    random_requests = request_inputs(CONFIG, "random", rows_per_request=3, count=2)
    assert len(random_requests) == 2 and random_requests[0]["X"].shape == (3, 2)
    assert random_requests[0]["S"].dtype == object and random_requests[0]["S"].shape == (3, 1)
    zero = request_inputs(CONFIG, "zero", count=1)[0]
    assert not zero["X"].any() and zero["S"][0, 0] == b""
    frame = pd.DataFrame({"X": [1.0, 2.0, 3.0, 4.0], "S": ["a", "b", "c", "d"]})
    config = {**CONFIG, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}, CONFIG["input"][1]]}
    from_frame = request_inputs(config, frame, rows_per_request=2)
    assert [r["X"].ravel().tolist() for r in from_frame] == [[1.0, 2.0], [3.0, 4.0]]
    assert from_frame[1]["S"].ravel().tolist() == [b"c", b"d"]
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"data": [{"X": [1, 2], "S": ["x"]}, {"X": {"content": [3, 4], "shape": [2]},
                                                                     "S": ["y"]}]}))
    from_file = request_inputs(CONFIG, path, rows_per_request=2)
    assert from_file[0]["X"].tolist() == [[1, 2], [3, 4]] and from_file[0]["S"].ravel().tolist() == [b"x", b"y"]
    with pytest.raises(InvalidArgumentError, match="no column"):
        request_inputs(CONFIG, pd.DataFrame({"Y": [1]}))
    with pytest.raises(InvalidArgumentError, match="unknown input 'Z'"):
        path.write_text(json.dumps({"data": [{"Z": [1]}]}))
        request_inputs(CONFIG, path)


def test_the_csv_has_perf_analyzers_columns(tmp_path):
    rows = pd.DataFrame([{"concurrency": c, "request_rate": np.nan, "throughput_infer_per_sec": 100.0 * c,
                          "client_send_us": 0.0, "network_server_send_recv_us": 12.4, "server_queue_us": 30.6,
                          "server_compute_input_us": 1.0, "server_compute_infer_us": 200.0,
                          "server_compute_output_us": 2.0, "client_recv_us": 0.0, "latency_p50_us": 250.0,
                          "latency_p90_us": 260.0, "latency_p95_us": 270.0, "latency_p99_us": 300.0,
                          "latency_avg_us": 251.0} for c in (1, 2)])
    with open(write_perf_analyzer_csv(rows, tmp_path / "out.csv")) as stream:
        table = list(csv.reader(stream))
    assert table[0] == ["Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue",
                        "Server Compute Input", "Server Compute Infer", "Server Compute Output", "Client Recv",
                        "p50 latency", "p90 latency", "p95 latency", "p99 latency", "Avg latency"]
    assert table[2][:2] == ["2", "200.0"] and table[1][3:5] == ["12", "31"]
    by_rate = rows.assign(concurrency=np.nan, request_rate=[50.0, 100.0])
    with open(write_perf_analyzer_csv(by_rate, tmp_path / "rate.csv")) as stream:
        assert next(csv.reader(stream))[0] == "Request Rate"


@pytest.fixture(scope="module")
def scale_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("perf-repo")
    write_scale_model(repo, extra="dynamic_batching { max_queue_delay_microseconds: 500 }")
    with serve(repo, http_port=0, grpc_port=0) as server:
        yield server


@pytest.fixture(scope="module")
def picky_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("perf-picky")
    write_picky_model(repo)
    with serve(repo, http_port=0, grpc_port=0) as server:
        yield server


@pytest.mark.parametrize("protocol", ["inprocess", "http", "grpc"])
def test_a_level_whose_requests_fail_keeps_the_first_message(picky_server, tmp_path, protocol):
    """Failed requests are counted and the first one's message is kept, over every protocol."""
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"X": [-1.0, 2.0]}]}))
    row = measure(picky_server, "picky", concurrency_range=1, protocol=protocol, input_data=str(data),
                  measurement_interval_ms=200, warmup_ms=50, max_trials=2).iloc[0]
    assert row["errors"] > 0 and row["completed_requests"] == 0
    assert "input 'X' must not be negative" in row["first_error"], row["first_error"]
    clean = measure(picky_server, "picky", concurrency_range=1, protocol=protocol, input_data="zero",
                    measurement_interval_ms=200, warmup_ms=50, max_trials=2).iloc[0]
    assert clean["errors"] == 0 and clean["completed_requests"] > 0 and clean["first_error"] == ""


@pytest.mark.parametrize("protocol", ["inprocess", "http", "grpc"])
def test_measuring_the_in_kernel_server(scale_server, protocol):
    results = measure(scale_server, "scale", concurrency_range="1:4:3", protocol=protocol, input_data="random",
                      measurement_interval_ms=300, warmup_ms=100, max_trials=4)
    assert results["concurrency"].tolist() == [1, 4]
    assert (results["protocol"] == protocol).all() and (results["errors"] == 0).all()
    assert (results["throughput_infer_per_sec"] > 0).all() and (results["completed_requests"] > 0).all()
    assert (results["latency_p99_us"] >= results["latency_p50_us"]).all()
    assert (results["server_compute_infer_us"] > 0).all() and (results["server_requests"] > 0).all()
    assert results["server_requests"].iloc[1] >= results["completed_requests"].iloc[1] * 0.5
    assert sum(results["batch_sizes"].iloc[1].values()) > 0
    assert 1 <= results["trials"].max() <= 4


def test_measuring_at_a_request_rate(scale_server):
    results = measure(scale_server, "scale", request_rate_range=[200], protocol="inprocess",
                      measurement_interval_ms=500, warmup_ms=100, max_trials=3)
    assert results["request_rate"].tolist() == [200.0] and results["concurrency"].isna().all()
    assert (results["errors"] == 0).all() and (results["completed_requests"] > 0).all()
    assert (results["throughput_infer_per_sec"] > 0).all()


class _FakeTime:
    """``time`` as triton_nb.perf.load reads it: a clock that moves only when the test or the load
    (by waiting) moves it."""

    def __init__(self) -> None:
        self.now_ns = 0

    def monotonic(self) -> float:
        return self.now_ns / 1e9

    def monotonic_ns(self) -> int:
        return self.now_ns


class _PacedStop(threading.Event):
    """The load's stop event: a wait passes at once, moving the fake clock by the time asked for;
    the load stops once the clock reaches ``stop_ns``."""

    def __init__(self, clock: _FakeTime, stop_ns: int) -> None:
        super().__init__()
        self.clock = clock
        self.stop_ns = stop_ns
        self.reached = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.clock.now_ns += round(timeout * 1e9)
        if self.clock.now_ns >= self.stop_ns:
            self.reached.set()
            self.set()
        return self.is_set()


class _Unanswered:
    """A server that accepts every request and answers none until the test does; sending request
    ``slow`` takes ``slow_ns`` on the fake clock."""

    def __init__(self, clock: _FakeTime, slow: int, slow_ns: int) -> None:
        self.clock, self.slow, self.slow_ns = clock, slow, slow_ns
        self.futures: list[Future] = []

    def infer_async(self, request) -> Future:
        if len(self.futures) == self.slow:
            self.clock.now_ns += self.slow_ns
        future: Future = Future()
        self.futures.append(future)
        return future


def test_an_open_loop_keeps_its_rate(monkeypatch):
    # on a fake clock, so that a loaded machine cannot make the load late; the lateness is staged
    # instead: one request takes 12 ms to send, and the load catches up with its schedule after it
    clock = _FakeTime()
    monkeypatch.setattr(load_module, "time", clock)
    server = _Unanswered(clock, slow=9, slow_ns=12 * MS)
    load = load_module.InProcessLoad(server, "scale", [{"X": np.ones((1, 2), np.float32)}], request_rate=200.0)
    paced = load._stopping = _PacedStop(clock, stop_ns=250 * MS)
    load.start()
    assert paced.reached.wait(30), "the load did not reach the end of its 250 ms"
    load.stop()
    due = np.arange(1, 50) * 5 * MS  # one every 5 ms, up to the stop at 250 ms
    # sent while none was answered: an open loop does not wait for answers
    assert len(server.futures) == len(due) and not any(f.done() for f in server.futures)
    for future in server.futures:
        future.set_result(None)
    completions = load.take()
    assert completions.ok.all()
    # the two requests due while the slow one was being sent leave as soon as it is out (62 ms), then
    # the schedule is the one from the start, not one shifted by the 12 ms
    expected = np.where(np.arange(len(due)) >= 10, np.maximum(due, 62 * MS), due)
    np.testing.assert_array_equal(np.sort(completions.start_ns), expected)


class _HeldAnswers:
    """A server whose answers the test gives, one at a time; each request records its index."""

    def __init__(self) -> None:
        self.futures: list[Future] = []
        self.sent: list[int] = []

    def infer_async(self, request) -> Future:
        self.sent.append(int(request.inputs["X"][0, 0]))
        future: Future = Future()
        self.futures.append(future)
        return future


def test_a_closed_loop_keeps_its_requests_in_flight_without_a_thread_each():
    server = _HeldAnswers()
    requests = [{"X": np.full((1, 2), i, np.float32)} for i in range(100)]
    load = load_module.InProcessLoad(server, "m", requests, concurrency=4)
    threads_before = set(threading.enumerate())
    load.start()
    assert not set(threading.enumerate()) - threads_before  # no thread per request, none at all
    assert server.sent == [0, 1, 2, 3]  # the four slots, each with its first request
    server.futures[2].set_result(None)  # an answer sends that slot's next request, and only it
    assert server.sent == [0, 1, 2, 3, 6]
    server.futures[0].set_exception(RuntimeError("a failed request is measured, and the slot goes on"))
    assert server.sent == [0, 1, 2, 3, 6, 4]
    stopper = threading.Thread(target=load.stop)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive()  # stop waits for the requests in flight ...
    for future in server.futures:
        if not future.done():
            future.set_result(None)
    stopper.join(30)
    assert not stopper.is_alive() and len(server.sent) == 6  # ... and sends nothing more
    completions = load.take()
    assert len(completions.ok) == 6 and completions.ok.sum() == 5


class _AnswersAtOnce:
    """A server that answers before the caller can attach a callback."""

    def __init__(self, load_stop_after: int) -> None:
        self.count, self.stop_after, self.load = 0, load_stop_after, None

    def infer_async(self, request) -> Future:
        self.count += 1
        if self.count == self.stop_after:
            self.load._stopping.set()
        future: Future = Future()
        future.set_result(None)
        return future


def test_answers_that_come_at_once_do_not_recurse():
    server = _AnswersAtOnce(load_stop_after=5000)  # beyond Python's recursion limit, were each answer nested
    load = load_module.InProcessLoad(server, "m", [{"X": np.zeros((1, 2), np.float32)}], concurrency=2)
    server.load = load
    load.start()
    load.stop()
    assert server.count == 5000 and len(load.take().ok) == 5000


def test_measure_refuses_what_it_cannot_do(scale_server):
    with pytest.raises(InvalidArgumentError, match="concurrency_range or request_rate_range"):
        measure(scale_server, "scale")
    with serve(scale_server.repository) as bare, pytest.raises(InvalidArgumentError, match=r"has no http endpoint"):
        measure(bare, "scale", concurrency_range=[1], protocol="http")


@pytest.mark.real_triton
def test_measuring_a_real_triton(tmp_path):
    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real Triton cannot run here: {reason}")
    write_scale_model(tmp_path)
    with RealTritonServer(tmp_path) as triton:
        for protocol, url in (("http", triton.http_url), ("grpc", triton.grpc_url)):
            results = measure(url, "scale", concurrency_range=[2], protocol=protocol, measurement_interval_ms=300,
                              warmup_ms=100, max_trials=3)
            assert results["errors"].iloc[0] == 0 and results["throughput_infer_per_sec"].iloc[0] > 0
            assert results["server_compute_infer_us"].iloc[0] > 0  # from Triton's own statistics
