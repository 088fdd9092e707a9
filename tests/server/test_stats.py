"""ServerStats / ModelStats: Triton's statistics JSON and /metrics text, field for field."""

from __future__ import annotations

import re
import threading
import time

import pytest
from google.protobuf import json_format
from tritonclient.grpc import service_pb2

from triton_nb.errors import InvalidArgumentError
from triton_nb.server.observability.stats import (
    BATCH_COUNT_FAMILY,
    BATCH_REASONS,
    BATCH_REASONS_KEY,
    BATCH_SIZE_FAMILY,
    FAILURE_REASONS,
    ModelStats,
    ServerStats,
    exposition,
)

TRITON_FAMILIES = {
    "nv_inference_request_success": "counter",
    "nv_inference_request_failure": "counter",
    "nv_inference_count": "counter",
    "nv_inference_exec_count": "counter",
    "nv_inference_request_duration_us": "counter",
    "nv_inference_queue_duration_us": "counter",
    "nv_inference_compute_input_duration_us": "counter",
    "nv_inference_compute_infer_duration_us": "counter",
    "nv_inference_compute_output_duration_us": "counter",
    "nv_inference_pending_request_count": "gauge",
    "nv_model_load_duration_secs": "gauge",
}


def _scripted(stats: ModelStats) -> None:
    """Two batches: [req a (2 rows), req b (1 row)] and [req c (4 rows)]; one failure; one rejection."""
    batch1 = {"compute_input_ns": 1_500, "compute_infer_ns": 20_000, "compute_output_ns": 700}
    stats.record_execution(batch_rows=3, **batch1)
    stats.record_request(success=True, request_ns=50_000, queue_ns=10_000, batch_size=2, **batch1)
    stats.record_request(success=True, request_ns=40_000, queue_ns=5_000, batch_size=1, **batch1)
    batch2 = {"compute_input_ns": 2_000, "compute_infer_ns": 30_000, "compute_output_ns": 1_000}
    stats.record_execution(batch_rows=4, **batch2)
    stats.record_request(success=True, request_ns=60_000, queue_ns=2_000, batch_size=4, **batch2)
    stats.record_execution(batch_rows=3, compute_input_ns=100, compute_infer_ns=200, compute_output_ns=300)
    stats.record_request(success=False, request_ns=9_000, reason="BACKEND")
    stats.record_request(success=False, request_ns=1_000, reason="REJECTED")


def test_model_json_has_tritons_fields_and_values():
    before = time.time_ns() // 1_000_000
    stats = ModelStats("fraud", 2)
    _scripted(stats)
    data = stats.to_json()
    assert list(data) == ["name", "version", "last_inference", "inference_count", "execution_count",
                          "inference_stats", "response_stats", "batch_stats", "memory_usage",
                          BATCH_REASONS_KEY]  # Triton's, then ours
    assert data["name"] == "fraud" and data["version"] == "2"
    assert before <= data["last_inference"] <= time.time_ns() // 1_000_000
    assert data["inference_count"] == 7  # successful requests' rows: 2 + 1 + 4
    assert data["execution_count"] == 3
    infer = data["inference_stats"]
    assert list(infer) == ["success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                           "cache_hit", "cache_miss"]
    assert infer["success"] == {"count": 3, "ns": 150_000}
    assert infer["fail"] == {"count": 2, "ns": 10_000}
    assert infer["queue"] == {"count": 3, "ns": 17_000}
    # each request carries its whole batch's compute time, as Triton attributes it
    assert infer["compute_input"] == {"count": 3, "ns": 1_500 * 2 + 2_000}
    assert infer["compute_infer"] == {"count": 3, "ns": 20_000 * 2 + 30_000}
    assert infer["compute_output"] == {"count": 3, "ns": 700 * 2 + 1_000}
    assert infer["cache_hit"] == {"count": 0, "ns": 0} and infer["cache_miss"] == {"count": 0, "ns": 0}
    assert data["response_stats"] == {}
    assert data["batch_stats"] == [
        {"batch_size": 3, "compute_input": {"count": 2, "ns": 1_600}, "compute_infer": {"count": 2, "ns": 20_200},
         "compute_output": {"count": 2, "ns": 1_000}},
        {"batch_size": 4, "compute_input": {"count": 1, "ns": 2_000}, "compute_infer": {"count": 1, "ns": 30_000},
         "compute_output": {"count": 1, "ns": 1_000}},
    ]
    assert data["memory_usage"] == []
    # the batcher counts why batches left; these were recorded by hand, not formed by it
    assert data[BATCH_REASONS_KEY] == {reason: {"count": 0, "rows": 0} for reason in BATCH_REASONS}


def test_json_parses_as_tritons_grpc_model_statistics():
    """The JSON form fits tritonclient's ModelStatistics message with no unknown field but ours,
    which the message has no field for (the gRPC front end leaves it out)."""
    server = ServerStats()
    _scripted(server.model("fraud", 1))
    (stat,) = server.statistics()["model_stats"]
    with pytest.raises(json_format.ParseError, match=BATCH_REASONS_KEY):
        json_format.ParseDict(stat, service_pb2.ModelStatistics())
    del stat[BATCH_REASONS_KEY]
    message = json_format.ParseDict(stat, service_pb2.ModelStatistics())
    assert message.inference_stats.success.count == 3 and message.batch_stats[1].batch_size == 4


def test_a_fresh_model_reports_zeros():
    data = ServerStats().model("m", 1).to_json()
    assert data["last_inference"] == 0 and data["inference_count"] == 0 and data["execution_count"] == 0
    assert all(v == {"count": 0, "ns": 0} for v in data["inference_stats"].values())
    assert data["batch_stats"] == []


def test_statistics_selects_models_and_versions_like_triton():
    server = ServerStats()
    server.model("b", 1)
    server.model("a", 2)
    server.model("a", 1)
    assert server.model("a", 1) is server.model("a", 1)
    everything = server.statistics()["model_stats"]
    assert [(s["name"], s["version"]) for s in everything] == [("a", "1"), ("a", "2"), ("b", "1")]
    assert [s["version"] for s in server.statistics("a")["model_stats"]] == ["1", "2"]
    assert [s["version"] for s in server.statistics("a", -1)["model_stats"]] == ["1", "2"]
    assert [s["version"] for s in server.statistics("a", 2)["model_stats"]] == ["2"]
    with pytest.raises(InvalidArgumentError, match="requested model 'zzz' is not available"):
        server.statistics("zzz")
    with pytest.raises(InvalidArgumentError, match="requested model version is not available for model 'a'"):
        server.statistics("a", 7)
    server.remove("a", 1)
    server.remove("a", 99)  # unknown: ignored
    assert [s["version"] for s in server.statistics("a")["model_stats"]] == ["2"]


def _sample(text: str, name: str, labels: str) -> str:
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.MULTILINE)
    assert match, f"no sample {name}{{{labels}}} in:\n{text}"
    return match.group(1)


def test_prometheus_text_uses_tritons_exact_names_labels_and_values():
    server = ServerStats()
    stats = server.model("fraud", 1)
    _scripted(stats)
    stats.pending_add(3)
    stats.pending_add(-1)
    stats.set_load_duration(1.25)
    text = server.prometheus_text().decode()
    assert "_total" not in text and "_created" not in text
    for name, kind in TRITON_FAMILIES.items():
        assert f"# TYPE {name} {kind}\n" in text
        assert re.search(rf"^# HELP {name} \S", text, re.MULTILINE)
    families = re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE)
    # in Triton's registration order, then ours (beyond Triton), nothing else
    assert families == [*TRITON_FAMILIES, BATCH_COUNT_FAMILY, BATCH_SIZE_FAMILY]
    labels = 'model="fraud",version="1"'
    assert _sample(text, "nv_inference_request_success", labels) == "3"
    assert _sample(text, "nv_inference_count", labels) == "7"
    assert _sample(text, "nv_inference_exec_count", labels) == "3"
    # per-request ns // 1000, summed as Triton's counters are
    assert _sample(text, "nv_inference_request_duration_us", labels) == "150"
    assert _sample(text, "nv_inference_queue_duration_us", labels) == "17"
    assert _sample(text, "nv_inference_compute_input_duration_us", labels) == "4"  # 1 + 1 + 2
    assert _sample(text, "nv_inference_compute_infer_duration_us", labels) == "70"  # 20 + 20 + 30
    assert _sample(text, "nv_inference_compute_output_duration_us", labels) == "1"  # 0 + 0 + 1
    assert _sample(text, "nv_inference_pending_request_count", labels) == "2"
    assert _sample(text, "nv_model_load_duration_secs", labels) == "1.25"
    # the failure counter always carries all four reasons, labels sorted as prometheus-cpp writes them
    for reason in FAILURE_REASONS:
        expected = {"BACKEND": "1", "REJECTED": "1"}.get(reason, "0")
        assert _sample(text, "nv_inference_request_failure", f'model="fraud",reason="{reason}",version="1"') \
            == expected


def test_unloading_removes_the_series_and_a_reload_starts_from_zero():
    server = ServerStats()
    server.model("m", 1).record_request(success=True, request_ns=5_000)
    server.model("other", 1)
    server.remove("m", 1)
    text = server.prometheus_text().decode()
    assert 'model="m"' not in text and 'model="other"' in text
    assert "# TYPE nv_inference_count counter" in text
    assert server.model("m", 1).to_json()["inference_stats"]["success"]["count"] == 0


def test_no_models_still_lists_the_families_without_samples():
    text = ServerStats().prometheus_text().decode()
    assert [line for line in text.splitlines() if not line.startswith("#")] == []
    assert text.count("# TYPE ") == len(TRITON_FAMILIES)


def test_two_servers_do_not_share_metrics():
    first, second = ServerStats(), ServerStats()
    assert first.registry is not second.registry
    first.model("m", 1).record_request(success=True, request_ns=1_000, batch_size=5)
    assert 'nv_inference_count{model="m",version="1"} 5' in first.prometheus_text().decode()
    assert 'model="m"' not in second.prometheus_text().decode()
    assert second.statistics()["model_stats"] == []


def test_label_values_are_escaped():
    server = ServerStats()
    server.model('we"ird\\name', 3)
    text = server.prometheus_text().decode()
    assert 'nv_inference_count{model="we\\"ird\\\\name",version="3"} 0' in text


def test_bad_arguments_are_rejected():
    stats = ModelStats("m", 1)
    with pytest.raises(InvalidArgumentError, match="failure reason"):
        stats.record_request(success=False, request_ns=1, reason="TIMEOUT")
    with pytest.raises(InvalidArgumentError, match="request_ns"):
        stats.record_request(success=True, request_ns=-5)
    with pytest.raises(InvalidArgumentError, match="batch_rows"):
        stats.record_execution(batch_rows=-1, compute_input_ns=0, compute_infer_ns=0, compute_output_ns=0)


def test_many_threads_recording_give_exact_totals():
    server = ServerStats()
    stats = server.model("busy", 1)
    threads, per_thread = 16, 500
    barrier = threading.Barrier(threads + 1)
    stop = threading.Event()

    def work(worker: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            stats.pending_add(1)
            stats.record_execution(batch_rows=1 + (i % 4), compute_input_ns=1_000, compute_infer_ns=2_000,
                                   compute_output_ns=3_000)
            stats.pending_add(-1)
            if i % 10 == 0:
                stats.record_request(success=False, request_ns=7, reason=FAILURE_REASONS[worker % 4])
            else:
                stats.record_request(success=True, request_ns=10_000, queue_ns=1_000, compute_input_ns=1_000,
                                     compute_infer_ns=2_000, compute_output_ns=3_000, batch_size=2)

    def scrape() -> None:  # readers run alongside the writers
        barrier.wait()
        while not stop.is_set():
            server.prometheus_text()
            server.statistics("busy")

    workers = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    reader = threading.Thread(target=scrape)
    for thread in [*workers, reader]:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    reader.join()

    total = threads * per_thread
    failures = threads * (per_thread // 10)
    successes = total - failures
    data = stats.to_json()
    assert data["execution_count"] == total
    assert data["inference_count"] == 2 * successes
    assert data["inference_stats"]["success"] == {"count": successes, "ns": 10_000 * successes}
    assert data["inference_stats"]["fail"] == {"count": failures, "ns": 7 * failures}
    assert data["inference_stats"]["compute_infer"] == {"count": successes, "ns": 2_000 * successes}
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in data["batch_stats"]} == {
        size: total // 4 for size in (1, 2, 3, 4)}
    text = server.prometheus_text().decode()
    assert _sample(text, "nv_inference_pending_request_count", 'model="busy",version="1"') == "0"
    assert _sample(text, "nv_inference_request_duration_us", 'model="busy",version="1"') == str(10 * successes)
    per_reason = failures // 4
    for reason in FAILURE_REASONS:
        assert _sample(text, "nv_inference_request_failure", f'model="busy",reason="{reason}",version="1"') \
            == str(per_reason)


def test_exposition_works_on_any_registry():
    """exposition() keeps counter names as given, unlike prometheus_client's generate_latest."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    Counter("nv_custom", "help", ["model"], registry=registry).labels(model="x").inc(2)
    assert b"nv_custom_total" in generate_latest(registry)
    text = exposition(registry)
    assert b"# TYPE nv_custom_total counter" in text and b'nv_custom_total{model="x"} 2' in text
    assert b"_created" not in text
