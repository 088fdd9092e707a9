"""The metrics users ask for: --metrics-config summaries and histograms, custom metrics from Python
models (pb_utils.MetricFamily), Triton's CPU metrics, and pb_utils.load_model / unload_model.

The models (tests/helpers/metrics_models.py) serve tests/test_real_triton_metrics.py too, which compares
them with a real Triton.
"""

from __future__ import annotations

import gc
import math
import time
import urllib.request

import numpy as np
import pytest

from tests.helpers.metrics_models import COUNTED_CONFIG, SUMMARIES, parse_metrics, write_counted, write_loader
from triton_nb import serve
from triton_nb.backends import pb_utils
from triton_nb.cli import main
from triton_nb.errors import InvalidArgumentError, TritonNBError
from triton_nb.server.observability.metrics import (
    DEFAULT_SUMMARY_QUANTILES,
    SlidingQuantiles,
    parse_metrics_config,
    read_memory_bytes,
)
from triton_nb.server.observability.stats import ServerStats
from triton_nb.tensors import InferRequest


def value_of(families: dict[str, dict], family: str, sample: str | None = None, **labels: str) -> float:
    """The one sample of ``family`` named ``sample`` (the family's name by default) whose labels
    include ``labels``."""
    found = [v for name, have, v in families[family]["samples"]
             if name == (sample or family) and all(have.get(k) == val for k, val in labels.items())]
    assert len(found) == 1, (family, sample, labels, found)
    return found[0]


def metrics_over_http(server) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        return parse_metrics(response.read())


def x(rows: int, value: float = 3.0) -> dict[str, np.ndarray]:
    return {"X": np.full((rows, 2), value, dtype=np.float32)}


# ---------------------------------------------------------------------- --metrics-config
def test_summaries_count_every_success_with_triton_s_quantiles_in_order():
    stats = ServerStats(["summary_latencies=true"])
    model = stats.model("m", 1)
    for i in range(1, 11):
        model.record_request(success=True, request_ns=i * 1_000_000, queue_ns=i * 1000, compute_input_ns=1000,
                             compute_infer_ns=i * 10_000, compute_output_ns=2000)
    model.record_successes([(5_000_000, 3000, 2), (7_000_000, 4000, 1)], compute_input_ns=1000,
                           compute_infer_ns=50_000, compute_output_ns=2000)
    model.record_request(success=False, request_ns=1000, reason="BACKEND")  # failures are not observed, as Triton
    families = parse_metrics(stats.prometheus_text())
    for family in SUMMARIES:
        assert families[family]["type"] == "summary"
        samples = families[family]["samples"]
        assert {name for name, _, _ in samples} == {family, f"{family}_count", f"{family}_sum"}
        assert all(set(labels) == ({"model", "version", "quantile"} if name == family else {"model", "version"})
                   for name, labels, _ in samples)
        assert value_of(families, family, f"{family}_count", model="m", version="1") == 12
        quantiles = [(labels["quantile"], v) for name, labels, v in samples if name == family]
        assert [q for q, _ in quantiles] == ["0.5", "0.9", "0.95", "0.99", "0.999"]  # Triton's defaults
        assert [v for _, v in quantiles] == sorted(v for _, v in quantiles)
    # _sum matches the counter, as Triton's docs say; the median is the value of rank 6 of 12
    for summary, counter in (("nv_inference_request_summary_us", "nv_inference_request_duration_us"),
                             ("nv_inference_queue_summary_us", "nv_inference_queue_duration_us"),
                             ("nv_inference_compute_infer_summary_us", "nv_inference_compute_infer_duration_us")):
        assert value_of(families, summary, f"{summary}_sum") == value_of(families, counter)
    assert value_of(families, "nv_inference_request_summary_us", quantile="0.5") == 5000
    assert value_of(families, "nv_inference_request_summary_us", quantile="0.999") == 9000
    assert parse_metrics_config([]).summary_quantiles == DEFAULT_SUMMARY_QUANTILES
    assert "nv_inference_first_response_histogram_ms" not in families


def test_summary_quantiles_and_counter_latencies_are_configurable():
    stats = ServerStats({"summary_latencies": True, "summary_quantiles": "0.75:0.01,0.25:0.01",
                         "counter_latencies": False})
    stats.model("m", 1).record_request(success=True, request_ns=2_000_000, queue_ns=1000)
    families = parse_metrics(stats.prometheus_text())
    assert [labels["quantile"] for name, labels, _ in families["nv_inference_queue_summary_us"]["samples"]
            if "quantile" in labels] == ["0.25", "0.75"]
    assert "nv_inference_request_duration_us" not in families  # Triton's counter_latencies=false
    assert value_of(families, "nv_inference_request_success") == 1


def test_with_the_response_cache_the_summaries_are_triton_s():
    stats = ServerStats(["summary_latencies=true"])
    stats.cache_series = lambda name, version: name == "cached"
    cached, plain = stats.model("cached", 1), stats.model("plain", 1)
    cached.record_cache_hit(request_ns=30_000, queue_ns=10_000, hit_ns=5_000)
    cached.record_request(success=True, request_ns=90_000, queue_ns=1000, compute_infer_ns=50_000)
    cached.record_cache_miss(7_000)
    plain.record_request(success=True, request_ns=80_000)
    families = parse_metrics(stats.prometheus_text())

    def models(family: str) -> dict[str, float]:
        return {labels["model"]: v for name, labels, v in families[family]["samples"] if name == f"{family}_count"}

    assert models("nv_inference_request_summary_us") == {"plain": 1}  # Triton's FIXME: none with a cache
    assert models("nv_inference_queue_summary_us") == {"cached": 2, "plain": 1}  # hits wait in the queue too
    assert models("nv_inference_compute_infer_summary_us") == {"cached": 1, "plain": 1}
    assert models("nv_cache_hit_summary_per_model") == {"cached": 1}
    assert models("nv_cache_miss_summary_per_model") == {"cached": 1}
    assert value_of(families, "nv_cache_hit_summary_per_model", "nv_cache_hit_summary_per_model_sum") == 5


def test_a_summary_window_forgets_old_observations_and_stays_bounded():
    summary = SlidingQuantiles(max_age_s=60.0, age_buckets=5, capacity=100)
    for i in range(1000):
        summary.observe(float(i), now_s=1.0)
    assert len(summary.window(1.0)) == 100 and summary.count == 1000  # a sample of the bucket, all counted
    summary.observe(5000.0, now_s=50.0)
    assert summary.quantiles([0.5], 50.0)[0][1] < 1000
    assert summary.window(65.0) == [5000.0]  # the first age bucket left the 60 s window
    assert math.isnan(summary.quantiles([0.5], 200.0)[0][1]) and summary.count == 1001


def test_unknown_metrics_config_keys_and_bad_values_are_named(tmp_path, capsys):
    with pytest.raises(InvalidArgumentError, match="unknown setting 'summary_latency'"):
        parse_metrics_config(["summary_latency=true"])
    with pytest.raises(InvalidArgumentError, match="summary_latencies: expected true or false"):
        parse_metrics_config(["summary_latencies=yes"])
    with pytest.raises(InvalidArgumentError, match=r"summary_quantiles: invalid option \[0.5\]"):
        parse_metrics_config(["summary_quantiles=0.5"])
    with pytest.raises(InvalidArgumentError, match="format is <setting>=<value>"):
        parse_metrics_config(["summary_latencies"])
    write_counted(tmp_path)
    with pytest.raises(InvalidArgumentError, match="unknown setting 'nope'"):
        serve(tmp_path, metrics_config=["nope=1"])
    assert main(["serve", "--model-repository", str(tmp_path), "--metrics-config", "nope=1"]) == 2
    assert "nope" in capsys.readouterr().err


HISTOGRAM_BUCKETS = ('model_metrics { metric_control [ { metric_identifier { family: '
                     '"nv_inference_first_response_histogram_ms" } histogram_options { buckets: [ 1, 2, 4 ] } } ] }')


def test_the_first_response_histogram_takes_the_model_s_buckets(tmp_path):
    write_counted(tmp_path, "custom", extra=HISTOGRAM_BUCKETS)
    write_counted(tmp_path, "plain")
    with serve(tmp_path, metrics_config=["histogram_latencies=true"], freeze_gc=False) as server:
        for _ in range(3):
            server.infer(InferRequest("custom", x(1)), timeout_s=30)
        server.infer(InferRequest("plain", x(1)), timeout_s=30)
        families = parse_metrics(server.metrics_text())
    family = "nv_inference_first_response_histogram_ms"
    assert families[family]["type"] == "histogram"
    for model, bounds, count in (("custom", ["1", "2", "4", "+Inf"], 3), ("plain", ["100", "500", "2000", "5000",
                                                                                    "+Inf"], 1)):
        buckets = [(labels["le"], v) for name, labels, v in families[family]["samples"]
                   if name == f"{family}_bucket" and labels["model"] == model]
        assert [le for le, _ in buckets] == bounds
        assert buckets[-1][1] == count == value_of(families, family, f"{family}_count", model=model)
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert not any(name in families for name in SUMMARIES)


def test_unsorted_histogram_buckets_are_refused_at_load():
    from triton_nb.repository.config import parse_config
    from triton_nb.repository.fields import check_fields

    config = parse_config(COUNTED_CONFIG.format(name="m", extra=HISTOGRAM_BUCKETS.replace("1, 2, 4", "4, 2")))
    assert [(f.severity, f.field) for f in check_fields(config)] == [
        ("error", "model_metrics.metric_control[0].histogram_options.buckets")]
    other = parse_config(COUNTED_CONFIG.format(name="m", extra=HISTOGRAM_BUCKETS.replace(
        "nv_inference_first_response_histogram_ms", "nv_inference_count")))
    assert [f.severity for f in check_fields(other)] == ["warning"]  # Triton ignores it, with a warning
    assert check_fields(parse_config(COUNTED_CONFIG.format(name="m", extra=HISTOGRAM_BUCKETS))) == []


# ---------------------------------------------------------------------- custom metrics
@pytest.mark.parametrize("python_instances", ["thread", "process"])
def test_custom_metrics_of_a_python_model_are_on_metrics_over_http_and_outlive_its_unload(tmp_path,
                                                                                          python_instances):
    write_counted(tmp_path)
    with serve(tmp_path, metrics_port=0, freeze_gc=False, python_instances=python_instances) as server:
        for rows in (1, 2, 3):
            server.infer(InferRequest("counted", x(rows)), timeout_s=30)
        families = metrics_over_http(server)
        labels = {"model": "counted", "version": "1"}
        assert families["custom_requests_total"]["type"] == "counter"
        assert value_of(families, "custom_requests_total", **labels) == 3
        assert families["custom_last_rows"]["type"] == "gauge"
        assert value_of(families, "custom_last_rows", **labels) == 3
        assert families["custom_input_sum"]["type"] == "histogram"
        assert value_of(families, "custom_input_sum", "custom_input_sum_count", **labels) == 3
        assert value_of(families, "custom_input_sum", "custom_input_sum_sum", **labels) == 6 + 12 + 18
        assert [(labels["le"], v) for name, labels, v in families["custom_input_sum"]["samples"]
                if name == "custom_input_sum_bucket"] == [("1", 0), ("10", 1), ("100", 3), ("+Inf", 3)]
        # Triton 2.51 keeps a model's custom series through an unload, and a reload continues them
        server.unload_model("counted")
        assert value_of(metrics_over_http(server), "custom_requests_total", **labels) == 3
        server.load_model("counted")
        server.infer(InferRequest("counted", x(1)), timeout_s=30)
        assert value_of(metrics_over_http(server), "custom_requests_total", **labels) == 4


def test_custom_metric_rules_and_errors_are_triton_s():
    counter = pb_utils.MetricFamily("test_rules_total", "rules", pb_utils.MetricFamily.COUNTER)
    again = pb_utils.MetricFamily("test_rules_total", "another description", pb_utils.MetricFamily.COUNTER)
    with pytest.raises(pb_utils.TritonModelException, match="Family name already exists with different type"):
        pb_utils.MetricFamily("test_rules_total", "rules", pb_utils.MetricFamily.GAUGE)
    metric = counter.Metric(labels={"k": "v"})
    metric.increment(2)
    assert again.Metric(labels={"k": "v"}).value() == 2  # the same name and labels: the same series
    with pytest.raises(pb_utils.TritonModelException, match="incremented monotonically by non-negative"):
        metric.increment(-1)
    with pytest.raises(pb_utils.TritonModelException, match="COUNTER does not support Set"):
        metric.set(1)
    with pytest.raises(pb_utils.TritonModelException, match="Unexpected buckets found"):
        counter.Metric(buckets=[1.0])
    histogram = pb_utils.MetricFamily("test_rules_seconds", "h", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException, match="Missing required buckets"):
        histogram.Metric()
    with pytest.raises(pb_utils.TritonModelException, match="Bucket Boundaries must be strictly sorted"):
        histogram.Metric(buckets=[2.0, 1.0])
    observed = histogram.Metric(buckets=[1.0, 2.0])
    observed.observe(1.5)
    with pytest.raises(pb_utils.TritonModelException, match="HISTOGRAM does not support Value"):
        observed.value()
    with pytest.raises(pb_utils.TritonModelException, match="Invalid metric name"):
        pb_utils.MetricFamily("bad name", "x", pb_utils.MetricFamily.GAUGE)
    with pytest.raises(pb_utils.TritonModelException, match="server's own metric families"):
        pb_utils.MetricFamily("nv_inference_count", "x", pb_utils.MetricFamily.COUNTER)
    # a family deleted before its metrics clears them, as Triton's stub does
    orphan = pb_utils.MetricFamily("test_rules_orphan", "o", pb_utils.MetricFamily.GAUGE).Metric(labels={})
    gc.collect()
    with pytest.raises(pb_utils.TritonModelException, match="'MetricFamily' has been deleted"):
        orphan.set(1)


def test_metrics_made_outside_any_model_are_exported_by_every_server(tmp_path):
    write_counted(tmp_path)
    family = pb_utils.MetricFamily("test_notebook_gauge", "set from a cell", pb_utils.MetricFamily.GAUGE)
    gauge = family.Metric(labels={"where": "notebook"})
    gauge.set(7)
    with serve(tmp_path, freeze_gc=False) as one, serve(tmp_path, freeze_gc=False) as two:
        one.infer(InferRequest("counted", x(1)), timeout_s=30)
        first, second = parse_metrics(one.metrics_text()), parse_metrics(two.metrics_text())
        for families in (first, second):
            assert value_of(families, "test_notebook_gauge", where="notebook") == 7
        # a model's series belong to its server
        assert value_of(first, "custom_requests_total", model="counted") == 1
        assert value_of(second, "custom_requests_total", model="counted") == 0
        del gauge
        gc.collect()
        assert "test_notebook_gauge" not in one.metrics_text().decode()  # it went with its last Metric


# ---------------------------------------------------------------------- CPU metrics
def test_cpu_metrics_are_triton_s_system_wide_values(tmp_path):
    write_counted(tmp_path)
    with serve(tmp_path, freeze_gc=False) as server:
        families = parse_metrics(server.metrics_text())
    for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
        assert families[name]["type"] == "gauge" and [labels for _, labels, _ in families[name]["samples"]] == [{}]
    assert 0.0 <= value_of(families, "nv_cpu_utilization") <= 1.0
    total, _ = read_memory_bytes()
    assert value_of(families, "nv_cpu_memory_total_bytes") == total
    assert 0 < value_of(families, "nv_cpu_memory_used_bytes") < total
    with serve(tmp_path, cpu_metrics=False, freeze_gc=False) as bare:
        assert "nv_cpu_" not in bare.metrics_text().decode()


def test_cpu_utilization_is_measured_between_samples():
    from triton_nb.server.observability.metrics import CpuMetricsCollector

    collector = CpuMetricsCollector()
    collector._last_s -= 10.0  # as if the last sample were old
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # some busy time to measure
        pass
    utilization = collector.utilization()
    assert 0.0 < utilization <= 1.0
    assert collector.utilization() == utilization  # within the interval: the same sample


# ---------------------------------------------------------------------- load_model / unload_model
def act(server, action: int) -> int:
    response = server.infer(InferRequest("loader", {"ACTION": np.array([action], dtype=np.int32)}), timeout_s=60)
    return int(response.outputs["READY"][0])


@pytest.mark.parametrize("python_instances", ["thread", "process"])
def test_load_and_unload_from_a_python_model_in_explicit_mode(tmp_path, python_instances):
    write_loader(tmp_path)
    with serve(tmp_path, model_control_mode="explicit", load_models=["loader"], freeze_gc=False,
               python_instances=python_instances) as server:
        assert act(server, 0) == 0
        assert act(server, 1) == 1 and server.is_model_ready("target")
        assert server.infer(InferRequest("target", x(1)), timeout_s=30).outputs["Y"][0, 0] == 6
        assert act(server, 2) == 0 and not server.is_model_ready("target")
        assert act(server, 3) == 1  # config and model.py given as overrides: Y = 3 X
        assert server.infer(InferRequest("target", x(1)), timeout_s=30).outputs["Y"][0, 0] == 9
        with pytest.raises(TritonNBError, match=r"Failed to load model: .*missing"):
            act(server, 4)


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_load_and_unload_from_a_python_model_need_explicit_mode(tmp_path, mode):
    write_loader(tmp_path)
    with serve(tmp_path, model_control_mode=mode, freeze_gc=False) as server:
        for action, verb in ((1, "load"), (2, "unload")):
            with pytest.raises(TritonNBError, match=f"Failed to {verb} model: Failed to process the request for "
                                                    "model 'loader_0', message: explicit model load / unload is not "
                                                    "allowed if polling is enabled"):
                act(server, action)
        assert server.is_model_ready("target")


def test_the_model_loading_api_needs_a_served_model():
    with pytest.raises(pb_utils.TritonModelException, match="load_model"):
        pb_utils.load_model("anything")
