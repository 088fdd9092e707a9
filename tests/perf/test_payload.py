"""The payload as a measured knob: tensor formats and compression on known bodies, the bytes the
load generator counts, the server answering every format alike, and mixes of rows per request."""

from __future__ import annotations

import gzip
import json
import os
import socket
import zlib
from http.client import HTTPResponse

import numpy as np
import pytest

from tests.helpers.scale_models import SCALE_MODEL
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.perf import Wire, measure
from triton_nb.perf._loadgen import compress, grpc_message_bytes, http_request
from triton_nb.perf.inputs import encode_grpc, encode_http, mix_label, request_inputs, row_mix
from triton_nb.perf.stats import Completions, summarize

WIDE_CONFIG = """
name: "wide"
backend: "python"
max_batch_size: 64
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "factor" value: { string_value: "2.0" } }
dynamic_batching { }
"""


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("payload-repo")
    for name in ("wide", "wide_copy"):  # the copy: a model SageMaker's /invocations does not serve
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(WIDE_CONFIG.replace('name: "wide"', f'name: "{name}"'))
        (repo / name / "1" / "model.py").write_text(SCALE_MODEL)
    os.environ["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = "wide"  # what SageMaker's /invocations serves
    try:
        server = serve(repo, http_port=0, grpc_port=0, allow_sagemaker=True, sagemaker_port=0)
    finally:
        del os.environ["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"]
    with server:
        yield server


def test_a_known_body_in_each_format():
    x = np.array([[1.5, -2.0]], np.float32)
    body, header = encode_http("m", {"X": x})
    assert body[header:] == x.tobytes() and len(body) == header + 8
    assert json.loads(body[:header]) == {"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32",
                                                     "parameters": {"binary_data_size": 8}}],
                                         "parameters": {"binary_data_output": True}}
    text, length = encode_http("m", {"X": x, "S": np.array([[b"ab"]], dtype=object)}, input_format="json",
                               output_format="json")
    assert length == len(text)  # all JSON: no binary part
    assert json.loads(text) == {"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32", "data": [1.5, -2.0]},
                                           {"name": "S", "shape": [1, 1], "datatype": "BYTES", "data": ["ab"]}],
                                "parameters": {"binary_data_output": False}}
    with pytest.raises(InvalidArgumentError, match="tensor formats"):
        encode_http("m", {"X": x}, input_format="csv")


def test_json_is_larger_than_binary_for_float_rows_and_smaller_for_the_fraud_rows_short_strings():
    from triton_nb.fraud import generate_transactions, request_tensors

    floats = {"X": np.random.default_rng(0).random((8, 16)).astype(np.float32)}
    assert len(encode_http("m", floats, input_format="json")[0]) > 2 * len(encode_http("m", floats)[0])
    # the fraud rows are mostly short strings: a 4-byte length each in binary, 2 quotes and a comma in JSON
    for rows in (1, 64):
        tensors = request_tensors(generate_transactions(rows, seed=0))
        binary, as_json = len(encode_http("e", tensors)[0]), len(encode_http("e", tensors, input_format="json")[0])
        assert as_json < binary


def test_compression_of_a_repeated_body_and_the_bytes_counted():
    body = b'{"inputs":[]}' + bytes(4096)
    for algorithm, opened in (("gzip", gzip.decompress), ("deflate", zlib.decompress)):
        packed = compress(body, algorithm)
        assert len(packed) < len(body) / 10 and opened(packed) == body
    request = http_request("h:1", "m", body, 13, "gzip", "deflate")
    head, _, sent = request.partition(b"\r\n\r\n")
    assert gzip.decompress(sent) == body
    assert b"Content-Encoding: gzip" in head and b"Accept-Encoding: deflate" in head
    assert b"Inference-Header-Content-Length: 13" in head and b"Content-Length: %d" % len(sent) in head
    assert b"Inference-Header-Content-Length" not in http_request("h:1", "m", b"{}", 2)  # all JSON
    assert grpc_message_bytes(body) == len(body) + 5
    assert grpc_message_bytes(body, "gzip") == len(compress(body, "gzip")) + 5
    assert grpc_message_bytes(b"\x01", "gzip") == 6  # not smaller compressed: sent as it is


def test_a_window_reports_the_mean_bytes_of_successful_requests():
    ends = np.arange(1, 5) * 1000
    done = Completions(ends - 10, ends, np.array([True, True, True, False]), np.array([100, 200, 300, 999]),
                       np.array([10, 20, 30, 999]))
    window = summarize(done, 0, 10_000)
    assert window.request_bytes == 200 and window.response_bytes == 20
    unknown = summarize(Completions(ends - 10, ends, np.ones(4, bool)), 0, 10_000)  # in-process: no wire
    assert np.isnan(unknown.request_bytes) and np.isnan(unknown.response_bytes)


def _post(url: str, request: bytes) -> tuple[int, bytes, dict[str, str]]:
    host, _, port = url.rpartition(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(request)
        answer = HTTPResponse(sock)
        answer.begin()
        return answer.status, answer.read(), {k.lower(): v for k, v in answer.getheaders()}


def _outputs(body: bytes, headers: dict[str, str]) -> np.ndarray:
    from tritonclient.http import InferResult

    length = headers.get("inference-header-content-length")
    result = InferResult.from_response_body(body, header_length=int(length) if length else None,
                                            content_encoding=headers.get("content-encoding"))
    return result.as_numpy("Y")


def test_the_server_answers_every_format_and_compression_alike(wide_server):
    url = wide_server.endpoints["http"]
    x = np.random.default_rng(1).random((3, 16)).astype(np.float32)
    answers = {}
    for input_format, output_format, compression in (("binary", "binary", "none"), ("json", "json", "none"),
                                                     ("binary", "binary", "gzip"), ("json", "binary", "deflate")):
        body, header = encode_http("wide", {"X": x}, input_format=input_format, output_format=output_format)
        status, answer, headers = _post(url, http_request(url, "wide", body, header, compression, compression))
        assert status == 200, answer
        assert headers.get("content-encoding", "none") == compression
        answers[input_format, output_format, compression] = _outputs(answer, headers)
    for values in answers.values():
        np.testing.assert_array_equal(values, x * 2)
    from tritonclient.grpc import service_pb2

    parsed = service_pb2.ModelInferRequest.FromString(encode_grpc("wide", {"X": x}))
    assert np.frombuffer(parsed.raw_input_contents[0], np.float32).tolist() == x.ravel().tolist()


def test_measured_bytes_follow_the_format_and_the_compression(wide_server):
    common = {"concurrency_range": [2], "input_data": "zero", "rows_per_request": 16, "measurement_interval_ms": 200,
              "warmup_ms": 100, "max_trials": 2}
    rows = {}
    for name, options in {"binary": {}, "json": {"input_tensor_format": "json", "output_tensor_format": "json"},
                          "gzip": {"request_compression": "gzip", "response_compression": "gzip"}}.items():
        frame = measure(wide_server, "wide", protocol="http", wire=Wire(**options), **common)
        rows[name] = frame.iloc[0]
        assert rows[name]["errors"] == 0 and rows[name]["completed_requests"] > 0
        assert rows[name]["input_tensor_format"] == options.get("input_tensor_format", "binary")
    # zeros: 1024 bytes of binary tensor against "0.0," per value; repeated bytes compress well
    assert rows["json"]["request_bytes"] < rows["binary"]["request_bytes"] < 2000
    assert rows["gzip"]["request_bytes"] < rows["binary"]["request_bytes"] / 2
    assert rows["gzip"]["response_bytes"] < rows["binary"]["response_bytes"] / 2
    grpc = measure(wide_server, "wide", protocol="grpc", wire=Wire(grpc_compression_algorithm="gzip"), **common).iloc[0]
    assert grpc["errors"] == 0 and grpc["request_bytes"] < rows["binary"]["request_bytes"] / 2
    local = measure(wide_server, "wide", protocol="inprocess", **common).iloc[0]
    assert np.isnan(local["request_bytes"]) and np.isnan(local["response_bytes"])


@pytest.mark.parametrize(("protocol", "options", "message"), [
    ("inprocess", {"input_tensor_format": "json"}, r"input_tensor_format \(--input-tensor-format\) 'json' applies "
                                                   r"to protocol 'http' or 'sagemaker', not 'inprocess'"),
    ("sagemaker", {"request_compression": "gzip"}, r"not 'sagemaker': SageMaker's contract takes no compression"),
    ("grpc", {"request_compression": "gzip"}, r"request_compression .* not 'grpc': gRPC requests are protobuf"),
    ("http", {"grpc_compression_algorithm": "gzip"}, r"grpc_compression_algorithm .* applies to protocol 'grpc'"),
    ("http", {"output_tensor_format": "xml"}, r"output_tensor_format \(--output-tensor-format\) must be one of"),
    ("http", {"input_tensor_format": "json", "shared_memory": "system"}, r"does not go with shared_memory"),
    ("http", {"rows_per_request": [1, 1]}, r"lists a size twice"),
    ("http", {"rows_per_request": [1, 4], "rows_per_request_weights": [1]}, r"one weight >= 0 per size"),
])
def test_payload_options_that_do_not_apply_are_refused_by_name(wide_server, protocol, options, message):
    wire = {name: options.pop(name) for name in list(options) if name in Wire.__dataclass_fields__}
    with pytest.raises(InvalidArgumentError, match=message):  # a bad value when the group is made
        measure(wide_server, "wide", concurrency_range=[1], protocol=protocol, wire=Wire(**wire), **options)


def test_a_mix_of_rows_per_request_is_honoured(wide_server):
    sizes = row_mix([1, 8, 64], [0.7, 0.2, 0.1], 100, seed=3)
    assert [sizes.count(v) for v in (1, 8, 64)] == [70, 20, 10] and sizes != sorted(sizes)
    assert row_mix([1, 8], None, 5) .count(1) in (2, 3) and row_mix(4, None, 3) == [4, 4, 4]
    assert mix_label(sizes) == "1:70%,8:20%,64:10%"
    config = wide_server.model_config_json("wide")
    requests = request_inputs(config, "random", [1, 8, 64], count=100, rows_per_request_weights=[0.7, 0.2, 0.1])
    assert sorted({len(r["X"]) for r in requests}) == [1, 8, 64] and len(requests) == 100
    before = wide_server.statistics("wide")["model_stats"][0]
    frame = measure(wide_server, "wide", concurrency_range=[4], rows_per_request=[1, 8, 64],
                    rows_per_request_weights=[0.7, 0.2, 0.1], measurement_interval_ms=300, warmup_ms=100,
                    max_trials=2)
    after = wide_server.statistics("wide")["model_stats"][0]
    row = frame.iloc[0]
    assert row["rows_per_request_mix"] == "1:70%,8:20%,64:10%" and row["rows_per_request"] == pytest.approx(8.7)
    served = after["inference_count"] - before["inference_count"]
    requests_served = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert served / requests_served == pytest.approx(8.7, rel=0.15)  # the server saw the mix's rows
    assert row["throughput_infer_per_sec"] == pytest.approx(
        row["completed_requests"] * 8.7 / row["window_s"], rel=0.01)


def test_tune_crosses_the_payload_format_with_the_servers_knobs(wide_server):
    from triton_nb.perf import tune

    before = wide_server.model_config_json("wide")
    result = tune(wide_server, "wide", {"input_tensor_format": ["binary", "json"],
                                        "max_queue_delay_microseconds": [0, 200]},
                  concurrency_range=[2], protocol="http", input_data="zero", rows_per_request=[1, 16],
                  wire=Wire(response_compression="gzip"), measurement_interval_ms=150, max_trials=2, progress=False)
    assert sorted(result.ranking["config"]) == ["in=binary delay_us=0", "in=binary delay_us=200",
                                                "in=json delay_us=0", "in=json delay_us=200"]
    measured = result.measurements.set_index("config")
    assert measured.loc["in=json delay_us=0", "input_tensor_format"] == "json"
    assert (result.measurements["response_compression"] == "gzip").all()
    assert (result.measurements["rows_per_request_mix"] == "1:50%,16:50%").all()
    assert set(result.recommended) == {"input_tensor_format", "max_queue_delay_microseconds"}
    config = result.recommended_config
    assert "input_tensor_format" not in json.dumps(config)  # the client's knob is not the server's
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == result.recommended[
        "max_queue_delay_microseconds"]
    assert wide_server.model_config_json("wide") == before
    with pytest.raises(InvalidArgumentError, match="wire: unknown option"):
        tune(wide_server, "wide", {"max_queue_delay_microseconds": [0]}, wire={"format": "json"}, progress=False)


def test_the_payload_plot_labels_each_payload():
    import pandas as pd

    from triton_nb.perf import plot_payload_comparison
    from triton_nb.perf.plots import payload_label

    assert payload_label({}) == "binary"
    assert payload_label({"input_tensor_format": "json", "output_tensor_format": "binary"}) == "json in, binary out"
    assert payload_label({"request_compression": "gzip", "response_compression": "gzip"}) == "binary + gzip"
    rows = [{"model": "m", "concurrency": level, "throughput_infer_per_sec": 100.0 * level, "latency_p50_us": 900.0,
             "latency_p99_us": 2000.0, "request_bytes": size, "response_bytes": 300.0, **options}
            for options, size in (({}, 1500.0), ({"input_tensor_format": "json", "output_tensor_format": "json"},
                                                  1100.0))
            for level in (1, 16)]
    figure = plot_payload_comparison(pd.DataFrame(rows))
    throughput, _, sent = figure.axes
    assert [t.get_text() for t in throughput.get_xticklabels()] == ["binary", "json"]
    assert len(throughput.patches) == 4 and len(sent.patches) == 4
    assert sorted(p.get_height() for p in sent.patches)[-2:] == [1100.0, 1500.0]
    with pytest.raises(InvalidArgumentError, match="request_bytes"):
        plot_payload_comparison(pd.DataFrame(rows).drop(columns=["request_bytes"]))


def test_sagemaker_invocations_are_measured_with_the_samples_two_payloads(wide_server):
    """The AWS sample's comparison: JSON and binary+json bodies on SageMaker's /invocations."""
    common = {"concurrency_range": [1], "input_data": "random", "measurement_interval_ms": 200, "warmup_ms": 100,
              "max_trials": 2}
    rows = {}
    for rows_per_request in (1, 64):
        for name in ("json", "binary"):
            frame = measure(wide_server, "wide", protocol="sagemaker",
                            wire=Wire(input_tensor_format=name, output_tensor_format=name),
                            rows_per_request=rows_per_request, **common)
            rows[name, rows_per_request] = frame.iloc[0]
            assert frame.iloc[0]["errors"] == 0 and frame.iloc[0]["protocol"] == "sagemaker"
    # 16 random floats a row: JSON spells out each one's digits, binary+json sends 4 bytes
    assert rows["json", 64]["request_bytes"] > 2 * rows["binary", 64]["request_bytes"]
    assert rows["binary", 64]["request_bytes"] > rows["binary", 1]["request_bytes"]
    # the same bodies over KServe v2 HTTP differ only in the request line and headers
    http = measure(wide_server, "wide", protocol="http", rows_per_request=64, **common).iloc[0]
    assert abs(http["request_bytes"] - rows["binary", 64]["request_bytes"]) < 100


def test_sagemaker_measures_only_the_endpoints_default_model(wide_server):
    with pytest.raises(InvalidArgumentError, match=r"serves model 'wide' \(SAGEMAKER_TRITON_DEFAULT_MODEL_NAME\), "
                                                   r"not 'wide_copy'"):
        measure(wide_server, "wide_copy", concurrency_range=[1], protocol="sagemaker")
