"""perf on sequence (stateful) models: perf_analyzer's sequences — lengths, ids, flags in order —
in process, over HTTP and over gRPC, at a concurrency and at a request rate, and the options'
checks."""

from __future__ import annotations

import json
import random
import time
from collections import Counter

import numpy as np
import pytest

from tests.helpers.scale_models import write_python_model, write_scale_model
from tests.helpers.sequence_models import write_sequence_models
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.perf import Sequences, Wire, measure
from triton_nb.perf import load as load_module
from triton_nb.perf._loadgen import SequencePlan, grpc_sequence_parameters, http_sequence_parameters
from triton_nb.perf.options import parse_sequence_id_range
from triton_nb.perf.stats import Completions

PROTOCOLS = ["inprocess", "http", "grpc"]
SHORT = {"measurement_interval_ms": 300, "warmup_ms": 100, "max_trials": 3}

# A sequence model that checks the order it is sent: a request that goes on with a sequence that
# did not start, or a start for a sequence still active (two sequences sharing an id), fails; each
# sequence that ends is logged as "<id> <length>".
CHECKER_CONFIG = """
name: "seq_check"
backend: "python"
max_batch_size: 4
input [ {{ name: "AMOUNT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "POSITION" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "log" value: {{ string_value: "{log}" }} }}
sequence_batching {{
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
"""

CHECKER_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = json.loads(args["model_config"])["parameters"]["log"]["string_value"]
        self.positions = {}  # sequence id -> requests it sent so far

    def execute(self, requests):
        responses = []
        for request in requests:
            def one(name):
                return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])

            position = 0
            if one("READY"):  # else a null request padding an idle slot
                corrid, start, end = one("CORRID"), one("START"), one("END")
                if start and corrid in self.positions:
                    problem = f"sequence {corrid} started again while active"
                elif not start and corrid not in self.positions:
                    problem = f"sequence {corrid} went on without a start"
                else:
                    problem = None
                if problem:
                    with open(self.log, "a") as stream:
                        stream.write(f"error {problem}\\n")
                    responses.append(pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(problem)))
                    continue
                position = 1 if start else self.positions[corrid] + 1
                self.positions[corrid] = position
                if end:
                    del self.positions[corrid]
                    with open(self.log, "a") as stream:
                        stream.write(f"{corrid} {position}\\n")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("POSITION", np.full((1, 1), position,
                                                                                              np.int32))]))
        return responses
'''


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("perf-sequences")
    log = repo / "sequences.log"
    write_python_model(repo, "seq_check", CHECKER_CONFIG.format(log=log), CHECKER_MODEL)
    write_sequence_models(repo)
    write_scale_model(repo)
    with serve(repo, http_port=0, grpc_port=0) as server:
        server.sequence_log = log
        yield server


def _ended(server) -> list[tuple[int, int]]:
    """The sequences the checker saw end, as (id, length), since the log was last cleared; fails
    on any order error it logged."""
    lines = server.sequence_log.read_text().splitlines() if server.sequence_log.exists() else []
    errors = [line for line in lines if line.startswith("error")]
    assert not errors, errors[:5]
    return [(int(number), int(length)) for number, length in (line.split() for line in lines)]


def _successes(server, model: str) -> int:
    entry = next(e for e in server.statistics()["model_stats"] if e["name"] == model)
    return int(entry["inference_stats"]["success"]["count"])


# the payload options with sequences: the patched bodies stay JSON (and are compressed per request)
_PAYLOADS = {"inprocess": {}, "http": {}, "grpc": {},
             "http json gzip": {"input_tensor_format": "json", "output_tensor_format": "json",
                                "request_compression": "gzip", "response_compression": "gzip"},
             "grpc gzip": {"grpc_compression_algorithm": "gzip"}}


@pytest.mark.parametrize("case", list(_PAYLOADS))
def test_sequences_of_three_at_concurrency_two(seq_server, case):
    protocol = case.split()[0]
    seq_server.sequence_log.unlink(missing_ok=True)
    before = _successes(seq_server, "seq_check")
    results = measure(seq_server, "seq_check", concurrency_range=2, protocol=protocol,
                      sequences=Sequences(sequence_length=3), **SHORT, wire=Wire(**_PAYLOADS[case]))
    row = results.iloc[0]
    assert row["errors"] == 0 and row["completed_requests"] > 0
    assert row["sequence_length"] == 3 and row["protocol"] == protocol
    assert _successes(seq_server, "seq_check") - before >= row["completed_requests"]
    assert row["server_requests"] > 0
    ended = _ended(seq_server)
    lengths = Counter(length for _, length in ended)
    # 3 +- 20% truncates to exactly 3; only the two sequences the stop cut short (then ended) are shorter
    assert set(lengths) <= {1, 2, 3} and lengths[3] >= len(ended) - 2 and lengths[3] * 3 >= row["completed_requests"]
    ids = [number for number, _ in ended]
    assert len(ids) == len(set(ids))  # an unbounded range: every sequence a fresh id
    assert min(ids) >= 1


def test_ids_wrap_within_the_range_and_are_never_shared(seq_server):
    seq_server.sequence_log.unlink(missing_ok=True)
    results = measure(seq_server, "seq_check", concurrency_range=2,
                      sequences=Sequences(sequence_length=2, sequence_id_range="10:12"), **SHORT)
    assert results["errors"].iloc[0] == 0 and results["completed_requests"].iloc[0] > 0
    ended = _ended(seq_server)
    assert {number for number, _ in ended} == {10, 11} and len(ended) > 2  # wrapped, and the checker saw no clash


@pytest.mark.parametrize("protocol", ["inprocess", "http"])
def test_sequences_at_a_request_rate(seq_server, protocol):
    seq_server.sequence_log.unlink(missing_ok=True)
    results = measure(seq_server, "seq_check", request_rate_range=150, protocol=protocol,
                      sequences=Sequences(sequence_length=4, sequence_length_variation=0, num_of_sequences=3), **SHORT)
    row = results.iloc[0]
    assert row["errors"] == 0 and row["completed_requests"] > 0 and row["sequence_length"] == 4
    lengths = Counter(length for _, length in _ended(seq_server))
    assert set(lengths) <= {1, 2, 3, 4} and lengths[4] >= sum(lengths.values()) - 3


def test_a_sequence_model_gets_perf_analyzers_default_length(seq_server):
    results = measure(seq_server, "card_count_str", concurrency_range=2, protocol="grpc", **SHORT)
    assert results["sequence_length"].iloc[0] == 20  # string CORRID: the ids go as strings
    assert results["errors"].iloc[0] == 0 and results["completed_requests"].iloc[0] > 0
    stateless = measure(seq_server, "scale", concurrency_range=1, measurement_interval_ms=200, warmup_ms=50,
                        max_trials=1)
    assert stateless["sequence_length"].isna().all()


def test_sequence_order_mistakes_count_as_errors(seq_server, monkeypatch):
    """A plan that never starts its sequences: every request fails, and the results say so."""
    monkeypatch.setattr(SequencePlan, "next", lambda self, stream: (7, False, False))
    results = measure(seq_server, "card_count", concurrency_range=1, sequences=Sequences(sequence_length=3), **SHORT)
    assert results["errors"].iloc[0] > 0 and results["completed_requests"].iloc[0] == 0
    assert "card_count" in results["first_error"].iloc[0]  # the server's words, naming the model



@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_load_generator_reports_refused_sequence_requests(seq_server, protocol):
    """Requests without a sequence id to a sequence model fail over the network too."""
    load = load_module.NetworkLoad(protocol, seq_server.endpoints[protocol], "card_count",
                                   [{"AMOUNT": np.ones((1, 1), np.float32)}], concurrency=1)
    load.start()
    try:
        outcomes = Completions()
        deadline = time.monotonic() + 30
        while len(outcomes.ok) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            fresh = load.take()
            outcomes.extend(fresh.start_ns, fresh.end_ns, fresh.ok)
    finally:
        load.stop()
    assert len(outcomes.ok) > 0 and not outcomes.ok.any()
    assert load.first_error is not None and "card_count" in load.first_error


def test_sequence_lengths_vary_as_perf_analyzers_do():
    plan = SequencePlan(streams=1, length=10, variation_pct=50, seed=3)
    lengths = [plan.draw_length(0) for _ in range(500)]
    assert min(lengths) >= 5 and max(lengths) <= 15 and len(set(lengths)) > 5  # 10 +- 50%, truncated
    again = SequencePlan(streams=1, length=10, variation_pct=50, seed=3)
    assert [again.draw_length(0) for _ in range(500)] == lengths  # seeded: repeatable
    wide = SequencePlan(streams=1, length=2, variation_pct=400, seed=1)
    lengths = [wide.draw_length(0) for _ in range(200)]
    assert min(lengths) == 1 and max(lengths) <= 10  # never below one request


def test_a_plans_flags_and_ids_across_interleaved_streams():
    plan = SequencePlan(streams=3, length=4, variation_pct=60, id_start=5, id_end=8, seed=0)
    active: dict[int, int] = {}  # stream -> its sequence's id
    counts: dict[int, int] = {}
    lengths = []
    chooser = random.Random(1)
    for _ in range(600):
        stream = chooser.randrange(3)
        number, start, end = plan.next(stream)
        assert 5 <= number < 8
        if start:
            assert stream not in active and number not in active.values()  # never shared while active
            active[stream], counts[stream] = number, 0
        assert active[stream] == number
        counts[stream] += 1
        if end:
            lengths.append(counts[stream])
            del active[stream]
    assert lengths and all(1 <= n <= 6 for n in lengths)
    still_open = [plan.close(stream) for stream in range(3)]
    assert sorted(n for n in still_open if n is not None) == sorted(active.values())
    assert plan.next(0)[1]  # after close, a stream starts afresh
    strings = SequencePlan(streams=1, length=1, string_ids=True)
    assert strings.next(0) == ("1", True, True)


def test_sequence_parameters_patched_into_encoded_requests():
    from tritonclient.grpc import service_pb2

    from triton_nb.perf.inputs import encode_grpc, encode_http

    request = encode_grpc("m", {"AMOUNT": np.ones((1, 1), np.float32)}) + grpc_sequence_parameters(9, True, False)
    parsed = service_pb2.ModelInferRequest.FromString(request)
    assert parsed.model_name == "m" and parsed.inputs[0].name == "AMOUNT"
    assert parsed.parameters["sequence_id"].int64_param == 9
    assert parsed.parameters["sequence_start"].bool_param is True
    assert parsed.parameters["sequence_end"].HasField("bool_param") and not parsed.parameters["sequence_end"].bool_param
    text = service_pb2.ModelInferRequest.FromString(grpc_sequence_parameters("card-1", False, True))
    assert text.parameters["sequence_id"].string_param == "card-1"
    body, header = encode_http("m", {"AMOUNT": np.ones((1, 1), np.float32)})
    patched = json.loads(body[:header - 2] + http_sequence_parameters("a", False, True) + body[header - 2:header])
    assert patched["parameters"] == {"binary_data_output": True, "sequence_id": "a", "sequence_start": False,
                                     "sequence_end": True}


@pytest.mark.parametrize(("options", "message"), [
    ({"sequence_length": 0}, r"sequence_length must be a whole number >= 1, got 0"),
    ({"sequence_length": 2.5}, r"sequence_length"),
    ({"sequence_length": 3, "sequence_length_variation": -1}, r"sequence_length_variation"),
    ({"sequence_id_range": "a:b"}, r"sequence_id_range must be start\[:end\]"),
    ({"sequence_id_range": "1:2:3"}, r"sequence_id_range must be start\[:end\]"),
    ({"sequence_id_range": "0:10"}, r"sequence_id_range must start at 1"),
    ({"sequence_id_range": "5:5"}, r"sequence_id_range '5:5': the end is excluded"),
    ({"sequence_id_range": "1:3", "concurrency_range": 4}, r"sequence_id_range '1:3' holds 2 id\(s\), fewer than "
                                                           r"the 4 sequences"),
    ({"num_of_sequences": 0}, r"num_of_sequences"),
    ({"rows_per_request": 2}, r"rows_per_request must be 1"),
])
def test_bad_sequence_options_name_the_option(seq_server, options, message):
    fields = {name: options.pop(name) for name in list(options) if name.startswith(("sequence", "num_of"))}
    options = {"concurrency_range": 2, **options}
    with pytest.raises(InvalidArgumentError, match=message):  # made or used: both name the field
        measure(seq_server, "card_count", sequences=Sequences(**fields), **options)


def test_sequence_id_ranges_as_perf_analyzer_writes_them():
    assert parse_sequence_id_range(None) == (1, None)
    assert parse_sequence_id_range("5") == (5, None)
    assert parse_sequence_id_range("5:9") == (5, 9)
    assert parse_sequence_id_range((3, None)) == (3, None)
    assert parse_sequence_id_range(7) == (7, None)
