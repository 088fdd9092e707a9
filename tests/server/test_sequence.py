"""The sequence batcher, direct strategy: sequences keep their slot and instance, control inputs
reach the model as Triton builds them, idle sequences are released, and requests outside a
sequence get Triton's errors — in process, over HTTP and over gRPC."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.sequence_models import BY_SLOT, INTERLEAVED, NO_ID, NO_START, error_of, send, write_sequence_models
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.repository.config import check_model_config, parse_config
from triton_nb.repository.fields import check_fields
from triton_nb.server.observability.stats import ModelStats
from triton_nb.server.scheduling.sequence import SequenceScheduler
from triton_nb.tensors import InferRequest, InferResponse

PROTOCOLS = ["inprocess", "http", "grpc"]


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sequence")
    write_sequence_models(repo)
    with serve(repo, http_port=0, grpc_port=0) as server:
        yield server


def connect(server, protocol: str):
    if protocol == "http":
        return httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=60)
    if protocol == "grpc":
        return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    return server.client()


def card_ids(protocol: str, base: int) -> int:
    """Distinct ids per protocol: the tests share one server (and the models' state)."""
    return base + 1000 * PROTOCOLS.index(protocol)


# ---------------------------------------------------------------------- through each front end


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_interleaved_sequences_keep_a_running_count_per_card(running, protocol):
    client = connect(running, protocol)
    for card, amount, start, end, count, total in INTERLEAVED:
        got = send(client, protocol, "card_count", card_ids(protocol, card), amount, start=start, end=end)
        assert got == (count, pytest.approx(total))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_string_sequence_ids_on_a_model_that_does_not_batch(running, protocol):
    client = connect(running, protocol)
    card = f"card-a-{protocol}"
    assert send(client, protocol, "card_count_str", card, 1.0, start=True) == (1, 1.0)
    assert send(client, protocol, "card_count_str", card, 2.0) == (2, 3.0)
    assert send(client, protocol, "card_count_str", card, 3.0, end=True) == (3, 6.0)
    assert f"sequence {card} to model 'card_count_str'" in error_of(
        lambda: send(client, protocol, "card_count_str", card, 1.0))
    assert "data-type is 'UINT64', but model 'card_count_str' expects 'BYTES'" in error_of(
        lambda: send(client, protocol, "card_count_str", 5, 1.0, start=True))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_without_corrid_keeps_state_by_batch_slot(running, protocol):
    client = connect(running, protocol)
    for card, amount, start, end, count, total in BY_SLOT:
        got = send(client, protocol, "card_count_slot", f"{card}-{protocol}", amount, start=start, end=end)
        assert got == (count, pytest.approx(total))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_that_does_not_batch_has_one_slot_per_instance(running, protocol):
    client = connect(running, protocol)
    card = card_ids(protocol, 61)
    assert send(client, protocol, "card_count_flat", card, 1.0, start=True) == (1, 1.0)
    assert send(client, protocol, "card_count_flat", card, 2.0, end=True) == (2, 3.0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_requests_outside_a_sequence_get_tritons_errors(running, protocol):
    client = connect(running, protocol)
    card = card_ids(protocol, 41)
    assert NO_START in error_of(lambda: send(client, protocol, "card_count", card, 1.0))
    assert f"sequence {card} to model 'card_count'" in error_of(lambda: send(client, protocol, "card_count", card,
                                                                             1.0))
    assert NO_ID in error_of(lambda: send(client, protocol, "card_count", 0, 1.0, start=True))
    assert "data-type is 'BYTES', but model 'card_count' expects 'UINT64'" in error_of(
        lambda: send(client, protocol, "card_count", "text", 1.0, start=True))
    assert send(client, protocol, "card_count", card, 1.0, start=True, end=True) == (1, 1.0)
    assert NO_START in error_of(lambda: send(client, protocol, "card_count", card, 1.0))  # it ended


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_sequence_waits_for_a_free_slot(running, protocol):
    client = connect(running, protocol)
    first, second = card_ids(protocol, 21), card_ids(protocol, 22)
    assert send(client, protocol, "card_count_one", first, 1.0, start=True) == (1, 1.0)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(send, connect(running, protocol), protocol, "card_count_one", second, 4.0, start=True,
                              end=True)
        assert send(client, protocol, "card_count_one", first, 2.0) == (2, 3.0)
        assert not waiting.done()  # the only slot is the first sequence's until it ends
        assert send(client, protocol, "card_count_one", first, 3.0, end=True) == (3, 6.0)
        assert waiting.result(timeout=60) == (1, 4.0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_idle_sequence_is_released(running, protocol):
    client = connect(running, protocol)
    card = card_ids(protocol, 31)
    assert send(client, protocol, "card_count_idle", card, 1.0, start=True) == (1, 1.0)
    time.sleep(1.0)  # max_sequence_idle_microseconds is 0.2 s
    assert NO_START in error_of(lambda: send(client, protocol, "card_count_idle", card, 1.0))
    assert send(client, protocol, "card_count_idle", card, 5.0, start=True, end=True) == (1, 5.0)


def test_concurrent_sequences_batch_together_and_keep_their_counts(running):
    client = running.client()

    def card(number: int) -> tuple[int, float]:
        got = None
        for step in range(6):
            got = send(client, "inprocess", "card_count", 500 + number, 1.0 + number, start=step == 0, end=step == 5)
        return got

    with ThreadPoolExecutor(6) as pool:  # six cards on four slots: two wait in the backlog
        results = list(pool.map(card, range(6)))
    assert results == [(6, pytest.approx(6 * (1.0 + n))) for n in range(6)]


def test_sequence_requests_are_counted_in_the_statistics(tmp_path):
    write_sequence_models(tmp_path)
    with serve(tmp_path) as server:
        client = server.client()
        for card, amount, start, end, _, _ in INTERLEAVED:
            send(client, "inprocess", "card_count", card, amount, start=start, end=end)
        (stats,) = server.statistics("card_count")["model_stats"]
        assert stats["inference_stats"]["success"]["count"] == len(INTERLEAVED)
        assert stats["inference_count"] == len(INTERLEAVED)
        assert server.queue_depth("card_count") == 0


# ---------------------------------------------------------------------- the scheduler itself

CONFIG = """
name: "m"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  {direct}
  control_input [
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ -1, 2.5 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT32 }} ] }}
  ]
}}
"""


class Recorder:
    """A run_batch that records each batch and, when gated, holds it until released."""

    def __init__(self, gated: bool = False) -> None:
        self.batches: list[list[InferRequest]] = []
        self.gated = gated
        self.release = threading.Semaphore(0)
        self.started = threading.Semaphore(0)

    def __call__(self, _instance: object, requests: list[InferRequest]) -> list[InferResponse]:
        self.batches.append(requests)
        self.started.release()
        if self.gated:
            assert self.release.acquire(timeout=30)
        return [InferResponse("m", 1, {"Y": r.inputs["X"]}) for r in requests]

    def column(self, batch: int, name: str) -> list:
        return [r.inputs[name].reshape(-1)[0].item() for r in self.batches[batch]]


def scheduler(mbs: int = 4, direct: str = "", gated: bool = False, stats: ModelStats | None = None):
    recorder = Recorder(gated)
    sched = SequenceScheduler("m", 1, parse_config(CONFIG.format(mbs=mbs, direct=direct)), recorder, stats=stats)
    sched.add_instance(object(), "m-0")
    return sched, recorder


def request(corrid: int, *, start: bool = False, end: bool = False, x: float = 1.0, rows: int = 1) -> InferRequest:
    return InferRequest("m", {"X": np.full((rows, 1), x, np.float32)},
                        parameters={"sequence_id": corrid, "sequence_start": start, "sequence_end": end})


def test_idle_slots_below_a_busy_one_get_null_requests_that_are_not_ready():
    sched, recorder = scheduler(gated=True)
    try:
        first = Future()
        sched.enqueue(request(7, start=True), first)  # slot 0
        assert recorder.started.acquire(timeout=30)  # batch 1 runs (held): [7]
        later = [Future(), Future()]
        sched.enqueue(request(8, start=True, x=2.0), later[0])  # slot 1
        sched.enqueue(request(9, start=True, x=3.0), later[1])  # slot 2
        recorder.release.release()
        assert recorder.started.acquire(timeout=30)
        recorder.release.release()
        assert [f.result(timeout=30).outputs["Y"].item() for f in (first, *later)] == [1.0, 2.0, 3.0]
        assert recorder.column(0, "READY") == [1] and recorder.column(0, "CORRID") == [7]
        assert recorder.column(0, "START") == [2.5]
        # slot 0 has nothing queued: a null request (zeros, READY false, CORRID 0) keeps 8 and 9 in their slots
        assert recorder.column(1, "READY") == [0, 1, 1]
        assert recorder.column(1, "CORRID") == [0, 8, 9]
        assert recorder.column(1, "START") == [-1.0, 2.5, 2.5]
        assert recorder.column(1, "X") == [0.0, 2.0, 3.0]
        assert {r.inputs["READY"].shape for r in recorder.batches[1]} == {(1, 1)}  # [1] per request, batch dim first
        assert recorder.batches[1][2].inputs["CORRID"].dtype == np.int32
    finally:
        recorder.gated = False
        recorder.release.release()
        sched.stop()


def test_without_batching_the_controls_have_shape_one_and_one_slot():
    sched, recorder = scheduler(mbs=0)
    try:
        done = Future()
        sched.enqueue(InferRequest("m", {"X": np.ones(1, np.float32)},
                                   parameters={"sequence_id": 3, "sequence_start": True}), done)
        done.result(timeout=30)
        assert recorder.batches[0][0].inputs["READY"].shape == (1,)
        assert recorder.batches[0][0].inputs["CORRID"].tolist() == [3]
    finally:
        sched.stop()


def test_minimum_slot_utilization_holds_the_batch_until_the_slots_fill():
    direct = "direct { max_queue_delay_microseconds: 60000000 minimum_slot_utilization: 0.5 }"
    sched, recorder = scheduler(mbs=4, direct=direct)
    try:
        futures = [Future(), Future()]
        sched.enqueue(request(1, start=True), futures[0])
        sched.enqueue(request(2, start=True), futures[1])
        for future in futures:
            future.result(timeout=30)
        assert len(recorder.batches) == 1 and recorder.column(0, "CORRID") == [1, 2]  # two of four slots: 0.5
    finally:
        sched.stop()


def test_a_request_of_several_rows_is_refused_as_triton_refuses_it():
    sched, _ = scheduler()
    try:
        with pytest.raises(InvalidArgumentError, match="must specify batch-size 1 due to requirements of sequence "
                                                       "batcher"):
            sched.enqueue(request(1, start=True, rows=2), Future())
    finally:
        sched.stop()


def test_queued_requests_fail_when_stopped_without_draining():
    stats = ModelStats("m", 1)
    sched, recorder = scheduler(mbs=1, gated=True, stats=stats)
    held, queued = Future(), Future()
    sched.enqueue(request(1, start=True), held)
    assert recorder.started.acquire(timeout=30)
    sched.enqueue(request(2, start=True), queued)  # backlog: the only slot is held by sequence 1
    assert sched.queue_depth() == 1
    recorder.release.release()
    sched.stop(drain=False)
    with pytest.raises(Exception, match="unloaded before the request ran"):
        queued.result(timeout=30)
    held.result(timeout=30)


# ---------------------------------------------------------------------- what loads


def config_with(sequence: str, backend: str = "python"):
    return parse_config(f'name: "m" backend: "{backend}" max_batch_size: 2 '
                        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] '
                        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ] '
                        f'sequence_batching {{ {sequence} }}')


def test_iterative_sequences_are_refused_and_implicit_state_warns_that_triton_differs():
    assert [(f.severity, f.field) for f in check_fields(config_with("iterative_sequence: true"))] == [
        ("error", "sequence_batching.iterative_sequence")]
    state = config_with('state [ { input_name: "IN" output_name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]')
    (finding,) = check_fields(state)
    assert (finding.severity, finding.field) == ("warning", "sequence_batching.state")
    assert "Python backend" in finding.message and "triton_nb carries it" in finding.message
    assert check_fields(config_with("oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
                                    "max_queue_delay_microseconds: 100 preserve_ordering: true }")) == []


def test_direct_and_controls_are_served_for_python_models_only():
    served = config_with("max_sequence_idle_microseconds: 5 direct { max_queue_delay_microseconds: 10 "
                         "minimum_slot_utilization: 0.5 } control_input [ { name: \"S\" control [ { "
                         "kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] } ]")
    assert check_fields(served) == [] and check_model_config(served, "m") == []
    assert [f.field for f in check_fields(config_with("", backend="onnxruntime"))] == ["sequence_batching"]


@pytest.mark.parametrize(("control", "message"), [
    ('{ name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] }',
     "must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_START"),
    ('{ name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0 ] } ] }', "exactly 2 entries"),
    ('{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] }',
     "unexpected data type for control CONTROL_SEQUENCE_CORRID"),
    ('{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT32 int32_false_true: [ 0, 1 ] } ] }',
     "must not specify either"),
    ('{ name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, '
     '{ name: "S" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }',
     "is specified for multiple control kinds"),
])
def test_control_inputs_are_checked_at_load_in_tritons_words(control, message):
    problems = check_model_config(config_with(f"control_input [ {control} ]"), "m")
    assert [p for p in problems if p.severity == "error" and message in p.message]


def test_the_grpc_stream_carries_the_sequence_parameters(running):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    answers: list = []
    done = threading.Event()

    def callback(result, error):
        answers.append(error if error is not None else int(result.as_numpy("COUNT").reshape(-1)[0]))
        if len(answers) == 3:
            done.set()

    client.start_stream(callback)
    try:
        for step, (start, end) in enumerate([(True, False), (False, False), (False, True)]):
            tensor = grpcclient.InferInput("AMOUNT", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.full((1, 1), float(step), np.float32))
            client.async_stream_infer("card_count", [tensor], sequence_id=777, sequence_start=start,
                                      sequence_end=end)
        assert done.wait(timeout=60)
    finally:
        client.stop_stream()
    assert answers == [1, 2, 3]  # one stream, in order: each request of the sequence in turn


def test_the_config_shows_tritons_default_idle_time(running):
    assert running.model_config_json("card_count")["sequence_batching"]["max_sequence_idle_microseconds"] == 1_000_000
    assert running.model_config_json("card_count_idle")["sequence_batching"][
        "max_sequence_idle_microseconds"] == 200_000


ENSEMBLE_OVER_CARD_COUNT = """
name: "card_ensemble"
platform: "ensemble"
max_batch_size: 4
input [ { name: "AMOUNT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "card_count" model_version: -1 input_map { key: "AMOUNT" value: "AMOUNT" }
  output_map [ { key: "COUNT" value: "COUNT" }, { key: "TOTAL" value: "TOTAL" } ] } ] }
"""


def test_an_ensemble_hands_its_steps_the_sequence(tmp_path):
    """As Triton's ensemble does: the correlation id and flags reach a sequence model in a step."""
    write_sequence_models(tmp_path)
    (tmp_path / "card_ensemble" / "1").mkdir(parents=True)
    (tmp_path / "card_ensemble" / "config.pbtxt").write_text(ENSEMBLE_OVER_CARD_COUNT)
    with serve(tmp_path) as server:
        client = server.client()

        def via_ensemble(card: int, amount: float, **flags: bool) -> tuple[int, float]:
            parameters = {"sequence_id": card, "sequence_start": flags.get("start", False),
                          "sequence_end": flags.get("end", False)}
            result = client.infer("card_ensemble", {"AMOUNT": np.full((1, 1), amount, np.float32)},
                                  parameters=parameters)
            return int(result.as_numpy("COUNT")[0, 0]), float(result.as_numpy("TOTAL")[0, 0])

        assert via_ensemble(7, 1.5, start=True) == (1, 1.5)
        assert via_ensemble(7, 2.0) == (2, 3.5)
        assert via_ensemble(7, 0.5, end=True) == (3, 4.0)
        assert NO_START in error_of(lambda: via_ensemble(7, 1.0))  # ended: the next needs START
