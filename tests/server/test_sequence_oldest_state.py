"""The sequence batcher's oldest strategy and implicit state: batches formed from the oldest request
of each candidate sequence (never two of one sequence), candidates per instance with a backlog,
preferred sizes and the queue delay; state tensors carried from one request of a sequence to the
next, initial states from zeros or a file, Triton's load errors — scheduler first, then a served
model in process, over HTTP and over gRPC."""

from __future__ import annotations

import struct
import threading
from concurrent.futures import Future

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.scale_models import write_python_model
from tests.helpers.sequence_models import (
    ACCUMULATOR,
    ACCUMULATOR_CONFIG,
    ACCUMULATORS,
    CARD_TOTALS,
    total,
    write_accumulators,
)
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.repository.config import parse_config
from triton_nb.repository.validate import validate_repository
from triton_nb.server.scheduling.sequence import SequenceScheduler
from triton_nb.tensors import InferRequest, InferResponse

CONFIG = """
name: "m"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} {outputs} ]
sequence_batching {{
  {strategy}
  control_input [
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  {state}
}}
"""

STATE = 'state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_FP32 dims: [ 1 ] %s } ]'


class Model:
    """A run_batch that records each batch, holds it while gated, and answers Y = X and, when the
    config has a state, ACC_OUT = ACC_IN + X (START resets it to X)."""

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
        responses = []
        for r in requests:
            outputs = {"Y": r.inputs["X"]}
            if "ACC_IN" in r.inputs:
                start = r.inputs["START"].reshape(-1)[0]
                outputs["ACC_OUT"] = r.inputs["X"] if start else r.inputs["ACC_IN"] + r.inputs["X"]
            responses.append(InferResponse("m", 1, outputs))
        return responses

    def column(self, batch: int, name: str) -> list:
        return [r.inputs[name].reshape(-1)[0].item() for r in self.batches[batch]]


def scheduler(strategy: str = "", *, mbs: int = 4, state: str = "", outputs: str = "", gated: bool = False,
              model_path=None):
    model = Model(gated)
    config = parse_config(CONFIG.format(mbs=mbs, strategy=strategy, state=state, outputs=outputs))
    sched = SequenceScheduler("m", 1, config, model, model_path=model_path)
    sched.add_instance(object(), "m-0")
    return sched, model


def request(corrid: int, *, start: bool = False, end: bool = False, x: float = 1.0,
            outputs: list[str] | None = None) -> InferRequest:
    return InferRequest("m", {"X": np.full((1, 1), x, np.float32)}, requested_outputs=outputs,
                        parameters={"sequence_id": corrid, "sequence_start": start, "sequence_end": end})


def send(sched: SequenceScheduler, *requests: InferRequest) -> list[Future]:
    futures = []
    for r in requests:
        futures.append(Future())
        sched.enqueue(r, futures[-1])
    return futures


# ---------------------------------------------------------------------- oldest: the scheduler


def test_oldest_batches_the_oldest_request_of_each_sequence_never_two_of_one():
    sched, model = scheduler("oldest { max_candidate_sequences: 4 }", gated=True)
    try:
        (first,) = send(sched, request(1, start=True))
        assert model.started.acquire(timeout=30)  # batch 0: [1], held
        later = send(sched, request(1, x=2.0), request(2, start=True), request(1, x=3.0), request(3, start=True))
        model.gated = False
        model.release.release()
        for future in (first, *later):
            future.result(timeout=30)
        assert model.column(1, "CORRID") == [1, 2, 3]  # sequence 1's third request waits for its second
        assert model.column(1, "X") == [2.0, 1.0, 1.0]
        assert model.column(2, "CORRID") == [1] and model.column(2, "X") == [3.0]
        assert model.column(1, "READY") == [1, 1, 1]  # no null requests: every request is ready
        assert model.column(1, "START") == [0, 1, 1]
    finally:
        model.gated = False
        model.release.release()
        sched.stop()


def test_oldest_candidates_are_bounded_and_a_further_sequence_waits_in_the_backlog():
    sched, model = scheduler("oldest { max_candidate_sequences: 2 }", mbs=4, gated=True)
    try:
        (first,) = send(sched, request(1, start=True))
        assert model.started.acquire(timeout=30)
        later = send(sched, request(2, start=True), request(3, start=True), request(1, end=True, x=5.0))
        model.release.release()
        assert model.started.acquire(timeout=30)  # batch 1: the two candidates, 3 waits for a free one
        assert model.column(1, "CORRID") == [2, 1]
        model.gated = False
        model.release.release()
        for future in (first, *later):
            future.result(timeout=30)
        assert model.column(2, "CORRID") == [3]  # took the slot sequence 1 released with its END
    finally:
        model.gated = False
        model.release.release()
        sched.stop()


def test_oldest_waits_its_delay_for_a_preferred_size_and_leaves_when_reached():
    sched, model = scheduler("oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
                             "max_queue_delay_microseconds: 60000000 }")
    try:
        (alone,) = send(sched, request(1, start=True))
        assert not model.started.acquire(timeout=0.3)  # one request: below the preferred size, within the delay
        (pair,) = send(sched, request(2, start=True))
        alone.result(timeout=30)
        pair.result(timeout=30)
        assert len(model.batches) == 1 and model.column(0, "CORRID") == [1, 2]
    finally:
        sched.stop()


def test_oldest_sends_at_once_without_a_delay():
    sched, model = scheduler("oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] }")
    try:
        (only,) = send(sched, request(1, start=True))
        only.result(timeout=30)
        assert model.column(0, "CORRID") == [1]
    finally:
        sched.stop()


# ---------------------------------------------------------------------- implicit state: the scheduler


@pytest.mark.parametrize("strategy", ["", "oldest { max_candidate_sequences: 4 }"])
def test_the_state_output_of_one_request_is_the_state_input_of_the_next(strategy):
    sched, model = scheduler(strategy, state=STATE % "")
    try:
        seen = []
        for corrid, x, start in [(1, 1.0, True), (2, 10.0, True), (1, 2.0, False), (2, 20.0, False),
                                 (1, 3.0, False), (1, 4.0, True)]:  # the last restarts sequence 1
            (future,) = send(sched, request(corrid, start=start, x=x))
            response = future.result(timeout=30)
            assert "ACC_OUT" not in response.outputs  # not a config output: the client does not see it
            seen.append(model.batches[-1][-1].inputs["ACC_IN"].reshape(-1)[0].item())
        # the first request of each sequence gets the initial state (zeros); START resets it
        assert seen == [0.0, 0.0, 1.0, 10.0, 3.0, 0.0]
        assert model.batches[0][0].inputs["ACC_IN"].shape == (1, 1)  # [1] with the batch dimension
    finally:
        sched.stop()


def test_null_requests_get_the_initial_state_and_leave_the_slots_state_alone():
    sched, model = scheduler(state=STATE % 'initial_state: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true '
                                          'name: "zero" }', gated=True)
    try:
        futures = send(sched, request(1, start=True, x=1.0))
        assert model.started.acquire(timeout=30)
        futures += send(sched, request(2, start=True, x=5.0))  # slot 1; slot 0 idle in the next batch
        model.release.release()
        assert model.started.acquire(timeout=30)
        assert model.column(1, "READY") == [0, 1] and model.column(1, "ACC_IN") == [0.0, 0.0]
        futures += send(sched, request(1, x=2.0))
        model.gated = False
        model.release.release()
        for future in futures:
            future.result(timeout=30)
        assert model.column(2, "ACC_IN") == [1.0]  # sequence 1's own state, not the null request's
    finally:
        model.gated = False
        model.release.release()
        sched.stop()


def test_a_state_output_listed_in_the_config_reaches_the_client_when_asked_for():
    outputs = ', { name: "ACC_OUT" data_type: TYPE_FP32 dims: [ 1 ] }'
    sched, _ = scheduler(state=STATE % "", outputs=outputs)
    try:
        first, second, third = send(sched, request(1, start=True, x=2.0), request(1, x=3.0, outputs=["Y"]),
                                    request(1, x=4.0, outputs=["ACC_OUT"]))
        assert sorted(first.result(timeout=30).outputs) == ["ACC_OUT", "Y"]
        assert sorted(second.result(timeout=30).outputs) == ["Y"]  # not asked for, and still carried:
        assert third.result(timeout=30).outputs["ACC_OUT"].item() == 9.0
    finally:
        sched.stop()


def test_an_initial_state_from_a_file_starts_every_sequence(tmp_path):
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "hundred").write_bytes(struct.pack("<f", 100.0))
    state = STATE % 'initial_state: { data_type: TYPE_FP32 dims: [ 1 ] data_file: "hundred" name: "h" }'
    sched, model = scheduler(state=state, model_path=tmp_path)
    try:
        for future in send(sched, request(1, start=True), request(1, x=2.0)):
            future.result(timeout=30)
        assert [b[0].inputs["ACC_IN"].item() for b in model.batches] == [100.0, 1.0]
    finally:
        sched.stop()


@pytest.mark.parametrize(("initial", "message"), [
    ('initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" }',
     "The data type used for 'initial_state' field of state 'ACC_IN' does not match the state data type."),
    ('initial_state: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true }',
     "Field 'name' must be set when using initial_state for state input 'ACC_IN'."),
    ('initial_state: { data_type: TYPE_FP32 dims: [ 1, 2 ] zero_data: true name: "z" }',
     "Number of dimensions in 'initial_state' doesn't match"),
    ('initial_state: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true name: "z" }',
     "'initial_state' dim for input name 'ACC_IN' doesn't match 'state' dim description. 2 != 1"),
    ('initial_state: { data_type: TYPE_FP32 dims: [ 1 ] data_file: "missing" name: "f" }',
     "cannot read initial_state/missing"),
    ('initial_state: { data_type: TYPE_FP32 dims: [ 1 ] data_file: "../escape" name: "f" }',
     "must be a file name inside the model's 'initial_state/' folder"),
    ('initial_state: [ { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "a" }, '
     '{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "b" } ]',
     "must contain exactly one or zero element. Found '2' elements."),
])
def test_a_bad_initial_state_fails_the_load_in_tritons_words(tmp_path, initial, message):
    with pytest.raises(InvalidArgumentError, match=_literal(message)):
        scheduler(state=STATE % initial, model_path=tmp_path)


def test_a_short_initial_state_file_is_refused(tmp_path):
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "short").write_bytes(b"\x00\x00")
    state = STATE % 'initial_state: { data_type: TYPE_FP32 dims: [ 1 ] data_file: "short" name: "s" }'
    with pytest.raises(InvalidArgumentError, match="initial_state setting expects 4 bytes"):
        scheduler(state=state, model_path=tmp_path)


def _literal(text: str) -> str:
    import re

    return re.escape(text)


# ---------------------------------------------------------------------- served: a per-card running amount

PROTOCOLS = ["inprocess", "http", "grpc"]


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    repo = tmp_path_factory.mktemp("state")
    write_accumulators(repo)
    with serve(repo, http_port=0, grpc_port=0) as server:
        yield server


@pytest.mark.parametrize("model", list(ACCUMULATORS))
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_card_total_is_carried_by_the_server_over_each_protocol(running, protocol, model):
    if protocol == "http":
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}")
    elif protocol == "grpc":
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    else:
        client = running.client()
    base = 100 * PROTOCOLS.index(protocol)
    assert [total(client, protocol, model, base + card, amount, start=start, end=end)
            for card, amount, start, end, _ in CARD_TOTALS] == [expected for *_, expected in CARD_TOTALS]
    warnings = running.config_warnings(model)
    assert any("sequence_batching.state" in w and "Python backend" in w for w in warnings)


def test_validate_names_a_bad_initial_state_file(tmp_path):
    config = ACCUMULATOR_CONFIG.format(name="bad", strategy="").replace(
        'zero_data: true name: "zero"', 'data_file: "nothing" name: "file"')
    write_python_model(tmp_path, "bad", config, ACCUMULATOR)
    problems = [p for p in validate_repository(tmp_path) if p.severity == "error"]
    assert [(p.model, p.field) for p in problems] == [("bad", "sequence_batching.state")]
    assert "cannot read initial_state/nothing" in problems[0].message
