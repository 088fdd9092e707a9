"""Why a batch left (beyond Triton), through a served model: the in-process statistics, stock
tritonclient over HTTP (the extra key) and gRPC (no field for it), and /metrics.

The batcher's decisions themselves are tested one reason at a time in test_batcher.py; here a
gated model forces three batches whose reasons do not depend on timing."""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.metrics_models import parse_metrics
from tests.helpers.scale_models import write_gated_model
from tests.helpers.waiting import WAIT_S, wait_until
from triton_nb.server.observability.stats import BATCH_COUNT_FAMILY, BATCH_REASONS, BATCH_REASONS_KEY, BATCH_SIZE_FAMILY
from triton_nb.serving import serve
from triton_nb.tensors import InferRequest

# The three batches: 8 rows (full); then 3 rows that 6 more cannot join (max_batch_size: the
# rows would not fit); then those 6, whose delay ran out while the one instance was busy.
EXPECTED = {reason: {"count": 0, "rows": 0} for reason in BATCH_REASONS} | {
    "max_batch_size": {"count": 2, "rows": 11}, "instance_free": {"count": 1, "rows": 6}}


def _rows(n: int) -> np.ndarray:
    return np.ones((n, 2), np.float32)


def test_reasons_in_the_statistics_over_http_and_grpc_and_in_metrics(tmp_path):
    gate = write_gated_model(tmp_path)  # one instance, max_batch_size 8, a queue delay
    # with the latency options on and the counters off: the batch families do not depend on them
    with serve(tmp_path, http_port=0, grpc_port=0, metrics_port=0,
               metrics_config=["counter_latencies=false", "histogram_latencies=true"]) as server:
        try:
            full = server.infer_async(InferRequest("gated", {"X": _rows(8)}))
            wait_until(lambda: (gate / "running").exists(), "the first batch to run")
            queued = [server.infer_async(InferRequest("gated", {"X": _rows(n)})) for n in (3, 6)]
            wait_until(lambda: server.queue_depth("gated") == 2, "two requests queued behind the running batch")
            queued_ns = time.monotonic_ns()  # after both arrived
            delay_ns = server.model_config("gated").dynamic_batching.max_queue_delay_microseconds * 1000
            assert delay_ns > 0  # (with none, the last batch would be instance_free whatever the timing)
            wait_until(lambda: time.monotonic_ns() > queued_ns + delay_ns,
                       "their delay to run out while the instance is busy")
        finally:
            (gate / "open").touch()
        for future in (full, *queued):
            future.result(timeout=WAIT_S)

        ours = server.statistics("gated")["model_stats"][0]
        assert ours[BATCH_REASONS_KEY] == EXPECTED
        assert sorted(b["batch_size"] for b in ours["batch_stats"]) == [3, 6, 8]  # Triton's view agrees

        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            over_http = http.get_inference_statistics("gated")["model_stats"][0]
            over_grpc = grpc.get_inference_statistics("gated", as_json=True)["model_stats"][0]
        finally:
            http.close()
            grpc.close()
        assert over_http[BATCH_REASONS_KEY] == EXPECTED
        assert over_http["execution_count"] == 3
        assert BATCH_REASONS_KEY not in over_grpc  # ModelStatistics has no field for it
        assert int(over_grpc["execution_count"]) == 3

        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
            families = parse_metrics(response.read())

    counts = families[BATCH_COUNT_FAMILY]
    assert counts["type"] == "counter"
    assert {labels["reason"]: value for _, labels, value in counts["samples"]} == {
        reason: float(entry["count"]) for reason, entry in EXPECTED.items()}
    assert all(labels["model"] == "gated" and labels["version"] == "1" for _, labels, _ in counts["samples"])
    sizes = families[BATCH_SIZE_FAMILY]
    assert sizes["type"] == "histogram"
    values = {(name, labels.get("le")): value for name, labels, value in sizes["samples"]}
    assert values[(f"{BATCH_SIZE_FAMILY}_count", None)] == 3
    assert values[(f"{BATCH_SIZE_FAMILY}_sum", None)] == 17
    buckets = {le: value for (name, le), value in values.items() if name.endswith("_bucket")}
    # cumulative: 3 rows under le=4, 6 and 8 rows under le=8; powers of two up to 4096, then +Inf
    assert buckets == {"1": 0, "2": 0, "4": 1} | {str(2 ** i): 3 for i in range(3, 13)} | {"+Inf": 3}
    # the metrics config still applies to Triton's families beside ours
    assert "nv_inference_request_duration_us" not in families
    assert "nv_inference_first_response_histogram_ms" in families
