"""Model warm-up (``model_warmup``): samples run on every instance before the version serves.

The model here logs every batch it executes to ``events.log`` in its folder (one JSON line:
its factor, instance, whether the batch is a warm-up, the requests and their X); warm-up samples
carry X rows starting with 0 (``zero_data``) or 7 (the file sample), user requests never do. A
``gate`` parameter holds each warm-up until the test creates the file ``open``, so "the old
version serves while the new one warms" is checked by order of events, not by timing.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.waiting import wait_until
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError

WAIT_S = 60  # the longest any wait may take: it only keeps a broken server from hanging the suite

WARM_MODEL = '''
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X * factor; logs each batch to events.log; warm-ups may be gated or fail."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.factor = float(params.get("factor", "2"))
        self.fail = params.get("fail_warmup", "")
        self.gate = params.get("gate", "") == "true"
        self.instance = args["model_instance_name"]
        self.folder = args["model_repository"]

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        warmup = all(float(x.flat[0]) in (0.0, 7.0) for x in xs)
        event = {"factor": self.factor, "instance": self.instance, "warmup": warmup, "requests": len(requests),
                 "x": xs[0].tolist(), "names": sorted(t.name() for t in requests[0].inputs())}
        with open(os.path.join(self.folder, "events.log"), "a") as log:
            log.write(json.dumps(event) + "\\n")
        if warmup and self.gate:
            open(os.path.join(self.folder, "warming"), "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(self.folder, "open")) and time.monotonic() < deadline:
                time.sleep(0.005)
        if warmup and self.fail == "raise":
            raise RuntimeError("warm-up exploded")
        if warmup and self.fail == "error":
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("bad warm-up data"))
                    for _ in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * self.factor).astype(np.float32))]) for x in xs]
'''

ZERO_SAMPLE = """{{ name: "zeros" batch_size: {batch_size} count: {count}
    inputs {{ key: "X" value: {{ data_type: TYPE_FP32 dims: [ 2 ] zero_data: true }} }} }}"""
FILE_SAMPLE = """{ name: "from_file" batch_size: 1
    inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "x.bin" } } }"""


def write_warm_model(repo: Path, name: str = "warm", *, count: int = 1, max_batch_size: int = 8, factor: float = 2.0,
                     samples: str | None = None, parameters: dict[str, str] | None = None) -> Path:
    """The logging model with two samples by default: 'zeros' (3 requests, twice) and 'from_file'
    (X = [7, 8] from warmup/x.bin)."""
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(WARM_MODEL)
    (folder / "warmup").mkdir(exist_ok=True)
    (folder / "warmup" / "x.bin").write_bytes(np.array([7, 8], "<f4").tobytes())
    if samples is None:
        samples = ZERO_SAMPLE.format(batch_size=3 if max_batch_size else 1, count=2) + ", " + FILE_SAMPLE
    params = {"factor": str(factor), **(parameters or {})}
    parameter_text = "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
                               for k, v in params.items())
    (folder / "config.pbtxt").write_text(f"""
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{"dynamic_batching { max_queue_delay_microseconds: 1000 }" if max_batch_size else ""}
{parameter_text}
model_warmup [ {samples} ]
""")
    return folder


def events(folder: Path) -> list[dict]:
    path = folder / "events.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def user_x(rows: int = 1) -> np.ndarray:
    return np.arange(1, rows * 2 + 1, dtype=np.float32).reshape(rows, 2)  # never starts with 0 or 7


# --------------------------------------------------------------------------- load


def test_every_instance_runs_every_sample_at_load_before_ready(tmp_path):
    folder = write_warm_model(tmp_path, count=2)
    with serve(tmp_path) as server:
        assert server.is_model_ready("warm")
        log = events(folder)
        for instance in ("warm_0_0", "warm_0_1"):
            mine = [(e["requests"], e["x"]) for e in log if e["instance"] == instance]
            # 'zeros': 3 one-row requests in one execute, twice; then 'from_file' once
            assert mine == [(3, [[0.0, 0.0]]), (3, [[0.0, 0.0]]), (1, [[7.0, 8.0]])]
        assert all(e["warmup"] for e in log)
        np.testing.assert_array_equal(server.client().infer("warm", {"X": user_x()}).as_numpy("Y"), user_x() * 2)
        assert [e["warmup"] for e in events(folder)][-1] is False


def test_warm_up_executions_count_in_the_statistics_as_in_triton(tmp_path):
    write_warm_model(tmp_path, count=2)
    with serve(tmp_path) as server:
        (stats,) = server.statistics("warm")["model_stats"]
        # per instance: 'zeros' 2 x 3 rows in 2 executions, 'from_file' 1 row in 1 (Triton 2.51: the same)
        assert stats["inference_count"] == 2 * 7
        assert stats["execution_count"] == 2 * 3
        assert stats["inference_stats"]["success"]["count"] == 14
        assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {1: 2, 3: 4}


def test_batch_size_zero_is_skipped_and_count_zero_runs_once(tmp_path):
    samples = (ZERO_SAMPLE.format(batch_size=0, count=5) + ", "
               + FILE_SAMPLE.replace("batch_size: 1", "batch_size: 1 count: 0"))
    folder = write_warm_model(tmp_path, samples=samples)
    with serve(tmp_path):
        assert [(e["requests"], e["x"]) for e in events(folder)] == [(1, [[7.0, 8.0]])]


def test_a_model_without_batching_gets_the_dims_as_the_shape(tmp_path):
    folder = write_warm_model(tmp_path, max_batch_size=0)
    with serve(tmp_path):
        assert [(e["requests"], e["x"]) for e in events(folder)] == [(1, [0.0, 0.0]), (1, [0.0, 0.0]),
                                                                     (1, [7.0, 8.0])]


def test_an_input_the_model_does_not_declare_is_handed_over_as_triton_does(tmp_path):
    extra = ZERO_SAMPLE.format(batch_size=1, count=1).replace(
        "} } }", '} } inputs { key: "CONTROL" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } }')
    folder = write_warm_model(tmp_path, samples=extra)
    with serve(tmp_path):
        assert events(folder)[0]["names"] == ["CONTROL", "X"]


PROBE_MODEL = '''
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        seen = {t.name(): [str(t.as_numpy().dtype), list(t.as_numpy().shape),
                           [v.decode() if isinstance(v, bytes) else float(v) for v in t.as_numpy().ravel()]]
                for t in requests[0].inputs()}
        with open(os.path.join(self.folder, "events.log"), "a") as log:
            log.write(json.dumps(seen) + "\\n")
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]) for _ in requests]
'''


def write_probe(repo: Path, samples: str, files: dict[str, bytes] | None = None) -> Path:
    folder = repo / "probe"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(PROBE_MODEL)
    for filename, data in (files or {}).items():
        (folder / "warmup").mkdir(exist_ok=True)
        (folder / "warmup" / filename).write_bytes(data)
    (folder / "config.pbtxt").write_text(f"""
name: "probe"
backend: "python"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 3 ] }}, {{ name: "S" data_type: TYPE_STRING dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }} ]
model_warmup [ {samples} ]
""")
    return folder


def _sample(name: str, x: str, s: str) -> str:
    return (f'{{ name: "{name}" batch_size: 1 inputs {{ key: "X" value: {{ data_type: TYPE_FP32 dims: [ 3 ] {x} }} }}'
            f' inputs {{ key: "S" value: {{ data_type: TYPE_STRING dims: [ 2 ] {s} }} }} }}')


def test_zero_random_and_file_data_as_triton_makes_them(tmp_path):
    strings = b"".join(struct.pack("<I", len(v)) + v for v in (b"hello", b"wo"))
    samples = ", ".join([_sample("zeros", "zero_data: true", "zero_data: true"),
                         _sample("random", "random_data: true", "random_data: true"),
                         _sample("files", 'input_data_file: "x.bin"', 'input_data_file: "s.bin"')])
    folder = write_probe(tmp_path, samples, {"x.bin": np.array([1.5, 2, 3, 99], "<f4").tobytes(), "s.bin": strings})
    with serve(tmp_path):
        zeros, random, files = events(folder)
    assert zeros == {"X": ["float32", [1, 3], [0.0, 0.0, 0.0]], "S": ["object", [1, 2], ["", ""]]}
    assert random["X"][:2] == ["float32", [1, 3]] and random["S"] == ["object", [1, 2], ["", ""]]  # Triton: empty
    # a longer file is fine: only the first 12 bytes are read
    assert files == {"X": ["float32", [1, 3], [1.5, 2.0, 3.0]], "S": ["object", [1, 2], ["hello", "wo"]]}


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("fail, words", [("error", "bad warm-up data"), ("raise", "RuntimeError: warm-up exploded")])
def test_a_failing_sample_fails_the_load_naming_model_version_and_sample(tmp_path, fail, words):
    write_warm_model(tmp_path, parameters={"fail_warmup": fail})
    with serve(tmp_path, model_control_mode="explicit", load_models=[]) as server:
        with pytest.raises(InvalidArgumentError) as caught:
            server.load_model("warm")
        message = str(caught.value)
        assert "model 'warm' version 1 instance 'warm_0_0'" in message
        assert "failed to run warmup sample 'zeros'" in message and words in message
        assert not server.is_model_ready("warm")
        (entry,) = [e for e in server.repository_index() if e["name"] == "warm"]
        assert entry["state"] == "UNAVAILABLE" and "failed to run warmup sample 'zeros'" in entry["reason"]


BAD_SAMPLES = [
    ('{ name: "big" batch_size: 9 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } }',
     "warmup sample 'big': batch_size 9 is above the model's max_batch_size 8"),
    ('{ name: "lacking" batch_size: 1 inputs { key: "Y" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } '
     '} }',
     "warmup sample 'lacking': [request id: <id_unknown>] expected 1 inputs but got 0 inputs for model 'warm'. "
     "Got input(s) [], but missing required input(s) ['X']"),
    ('{ name: "short" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] '
     'input_data_file: "short.bin" } } }',
     "warmup sample 'short' input 'X': warmup setting expects 8 bytes, but the data provided from short.bin only has "
     "4 bytes"),
    ('{ name: "absent" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] '
     'input_data_file: "absent.bin" } } }',
     "warmup sample 'absent' input 'X': failed to open text file for read"),
    ('{ name: "escape" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] '
     'input_data_file: "../config.pbtxt" } } }',
     "warmup sample 'escape' input 'X': input_data_file '../config.pbtxt' must be a file name inside"),
    ('{ name: "wild" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ -1 ] zero_data: true } } }',
     "warmup sample 'wild': warmup setting expects all variable-size dimensions are specified for input 'X'"),
    ('{ name: "nodata" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] } } }',
     "warmup sample 'nodata': warmup setting expects input 'X' to have input_data_type set"),
    ('{ name: "wide" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } }',
     "warmup sample 'wide': [request id: <id_unknown>] unexpected shape for input 'X' for model 'warm'. "
     "Expected [-1,2], got [1,3]"),
    ('{ name: "ints" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true } } }',
     "warmup sample 'ints': [request id: <id_unknown>] inference input 'X' data-type is 'INT32', but model 'warm' "
     "expects 'FP32'"),
]


@pytest.mark.parametrize("sample, words", BAD_SAMPLES, ids=[s[1].split("'")[1] for s in BAD_SAMPLES])
def test_a_bad_sample_fails_the_load_with_a_clear_error(tmp_path, sample, words):
    folder = write_warm_model(tmp_path, samples=sample)
    (folder / "warmup" / "short.bin").write_bytes(b"\0" * 4)
    with serve(tmp_path, model_control_mode="explicit", load_models=[]) as server:
        with pytest.raises(InvalidArgumentError) as caught:
            server.load_model("warm")
        assert str(caught.value).startswith("model 'warm' version 1: ")
        assert words in str(caught.value)
        assert events(folder) == []  # nothing ran
        assert not server.is_model_ready("warm")


def test_a_model_without_batching_refuses_a_batch_size_above_one(tmp_path):
    write_warm_model(tmp_path, max_batch_size=0, samples=ZERO_SAMPLE.format(batch_size=2, count=1))
    refused = r"model 'warm' version 1: warmup sample 'zeros': batch_size must be 1 for a model that does not batch"
    with serve(tmp_path, model_control_mode="explicit", load_models=[]) as server, \
            pytest.raises(InvalidArgumentError, match=refused):
        server.load_model("warm")


def test_a_load_with_file_overrides_reads_its_warm_up_data_from_the_overrides(tmp_path):
    from triton_nb.repository.config import config_to_json, load_config

    folder = write_warm_model(tmp_path / "source", samples=FILE_SAMPLE)
    (tmp_path / "repo" / "warm").mkdir(parents=True)
    files = {"file:1/model.py": WARM_MODEL.encode(), "file:warmup/x.bin": np.array([7, 5], "<f4").tobytes()}
    with serve(tmp_path / "repo", model_control_mode="explicit", load_models=[]) as server:
        server.load_model("warm", config=json.dumps(config_to_json(load_config(folder))), files=files)
        assert server.is_model_ready("warm")
        override = server._models["warm"].override_dir
        assert [e["x"] for e in events(override)] == [[[7.0, 5.0]]]


# --------------------------------------------------------------------------- reload


def test_reload_under_load_serves_the_old_version_until_the_new_one_is_warm(tmp_path):
    folder = write_warm_model(tmp_path, count=2)
    with serve(tmp_path, model_control_mode="explicit") as server:
        client = server.client()
        stop = threading.Event()
        answers: list[float] = []
        errors: list[BaseException] = []

        def hammer() -> None:
            while not stop.is_set():
                try:
                    answers.append(float(client.infer("warm", {"X": np.ones((1, 2), np.float32)}).as_numpy("Y")[0, 0]))
                except BaseException as exc:
                    errors.append(exc)

        workers = [threading.Thread(target=hammer) for _ in range(4)]
        for worker in workers:
            worker.start()
        reload_errors: list[BaseException] = []
        try:
            wait_until(lambda: len(answers) >= 20 or errors, "answers from the first version")
            write_warm_model(tmp_path, count=2, factor=5.0, parameters={"gate": "true"})
            reloading = threading.Thread(target=lambda: _capture(reload_errors, server.load_model, "warm"))
            reloading.start()
            wait_until(lambda: (folder / "warming").exists(), "the new version's warm-up to start")
            before = len(answers)
            wait_until(lambda: len(answers) >= before + 20 or errors, "answers while the new version warms")
            assert set(answers[before:before + 20]) == {2.0}  # the old version serves while the new one warms
            assert server.is_model_ready("warm")
            (folder / "open").touch()
            reloading.join(WAIT_S)
            assert not reloading.is_alive()
            wait_until(lambda: answers[-1] == 5.0 or errors, "answers from the new version")
        finally:
            (folder / "open").touch()
            stop.set()
            for worker in workers:
                worker.join()
        assert errors == [] and reload_errors == []
        log = events(folder)
        new = [e for e in log if e["factor"] == 5.0]
        for instance in ("warm_0_0", "warm_0_1"):  # each new instance warmed (3 executions) before it served
            assert [e["warmup"] for e in new if e["instance"] == instance][:3] == [True, True, True]
        first_new_answer = next(i for i, e in enumerate(log) if e["factor"] == 5.0 and not e["warmup"])
        assert sum(1 for e in log[:first_new_answer] if e["factor"] == 5.0 and e["warmup"]) == 6


def _capture(errors: list[BaseException], call: Callable[..., object], *args: object) -> None:
    try:
        call(*args)
    except BaseException as exc:
        errors.append(exc)


def test_a_failed_warm_up_on_reload_keeps_the_old_version_serving(tmp_path):
    write_warm_model(tmp_path)
    with serve(tmp_path, model_control_mode="explicit") as server:
        write_warm_model(tmp_path, factor=9.0, parameters={"fail_warmup": "error"})
        with pytest.raises(InvalidArgumentError, match="failed to run warmup sample 'zeros': bad warm-up data"):
            server.load_model("warm")
        assert server.is_model_ready("warm")
        assert server.client().infer("warm", {"X": user_x()}).as_numpy("Y")[0, 0] == 2.0


def test_poll_mode_reloads_a_model_whose_warm_up_data_changed(tmp_path):
    folder = write_warm_model(tmp_path)
    with serve(tmp_path, model_control_mode="poll", repository_poll_secs=3600) as server:
        assert server.poll_once() == []
        (folder / "warmup" / "x.bin").write_bytes(np.array([7, 9], "<f4").tobytes())
        assert server.poll_once() == ["warm"]
        assert [e["x"] for e in events(folder)][-1] == [[7.0, 9.0]]
        assert server.is_model_ready("warm")


# --------------------------------------------------------------------------- instances added live


def test_instances_added_live_warm_up_before_they_serve(tmp_path):
    folder = write_warm_model(tmp_path, count=1)
    with serve(tmp_path) as server:
        server.update_batching("warm", instance_count=3)
        log = events(folder)
        for instance in ("warm_0_1", "warm_0_2"):
            assert [e["requests"] for e in log if e["instance"] == instance] == [3, 3, 1]
        client = server.client()
        for _ in range(200):  # enough requests to reach every instance
            client.infer("warm", {"X": user_x()})
        log = events(folder)
        served = {e["instance"] for e in log if not e["warmup"]}
        assert served == {"warm_0_0", "warm_0_1", "warm_0_2"}
        for instance in served:
            mine = [e["warmup"] for e in log if e["instance"] == instance]
            assert mine[:3] == [True, True, True] and not any(mine[3:]), instance


def test_an_instance_that_fails_to_warm_is_not_added(tmp_path):
    folder = write_warm_model(tmp_path, count=1)
    with serve(tmp_path) as server:
        (folder / "warmup" / "x.bin").write_bytes(b"\0")  # the next instance's file sample is short
        with pytest.raises(InvalidArgumentError, match="warmup sample 'from_file' input 'X'"):
            server.update_batching("warm", instance_count=2)
        assert server.update_batching("warm")["instance_count"] == 1
        assert server.client().infer("warm", {"X": user_x()}).as_numpy("Y")[0, 0] == 2.0


# --------------------------------------------------------------------------- decoupled


DECOUPLED_WARM_MODEL = '''
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.fail = config.get("parameters", {}).get("fail", {}).get("string_value", "") == "true"
        self.folder = args["model_repository"]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            with open(os.path.join(self.folder, "events.log"), "a") as log:
                log.write(json.dumps({"n": n}) + "\\n")
            if self.fail:
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("no stream")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([n], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


@pytest.mark.parametrize("fail", [False, True])
def test_a_decoupled_model_warms_up_through_its_response_sender(tmp_path, fail):
    folder = tmp_path / "stream"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(DECOUPLED_WARM_MODEL)
    (folder / "config.pbtxt").write_text(f"""
name: "stream"
backend: "python"
max_batch_size: 0
input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "I" data_type: TYPE_INT32 dims: [ 1 ] }} ]
model_transaction_policy {{ decoupled: true }}
parameters {{ key: "fail" value: {{ string_value: "{str(fail).lower()}" }} }}
model_warmup [ {{ name: "one" batch_size: 1 count: 2
  inputs {{ key: "N" value: {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }} }} }} ]
""")
    with serve(tmp_path, model_control_mode="explicit", load_models=[]) as server:
        if fail:
            with pytest.raises(InvalidArgumentError, match="failed to run warmup sample 'one': no stream"):
                server.load_model("stream")
            assert len(events(folder)) == 1  # the first failing iteration ends the warm-up
        else:
            server.load_model("stream")
            assert server.is_model_ready("stream") and events(folder) == [{"n": 0}, {"n": 0}]


# --------------------------------------------------------------------------- over the network


@pytest.fixture
def network_server(tmp_path):
    with serve(tmp_path, model_control_mode="explicit", load_models=[], http_port=0, grpc_port=0,
               network_model_control=True) as server:
        yield server


def test_an_http_load_returns_after_the_warm_up_and_not_before(tmp_path, network_server):
    folder = write_warm_model(tmp_path, count=2, parameters={"gate": "true"})
    url = f"127.0.0.1:{network_server.http_port}"
    loader = httpclient.InferenceServerClient(url, network_timeout=WAIT_S)
    watcher = httpclient.InferenceServerClient(url)
    errors: list[BaseException] = []
    loading = threading.Thread(target=lambda: _capture(errors, loader.load_model, "warm"))
    loading.start()
    try:
        wait_until(lambda: (folder / "warming").exists(), "the warm-up to start")
        assert loading.is_alive() and not watcher.is_model_ready("warm")
    finally:
        (folder / "open").touch()
        loading.join(WAIT_S)
    assert errors == [] and not loading.is_alive()
    assert watcher.is_model_ready("warm")
    assert sum(1 for e in events(folder) if e["warmup"]) == 6  # 3 executions on each of the 2 instances


def test_a_failing_warm_up_reaches_http_and_grpc_clients(tmp_path, network_server):
    write_warm_model(tmp_path, parameters={"fail_warmup": "error"})
    http = httpclient.InferenceServerClient(f"127.0.0.1:{network_server.http_port}")
    with pytest.raises(InferenceServerException, match="failed to run warmup sample 'zeros': bad warm-up data"):
        http.load_model("warm")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{network_server.grpc_port}")
    with pytest.raises(InferenceServerException, match="failed to run warmup sample 'zeros': bad warm-up data"):
        grpc.load_model("warm")
    assert not grpc.is_model_ready("warm")


def test_a_grpc_load_returns_a_warm_ready_model(tmp_path, network_server):
    folder = write_warm_model(tmp_path)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{network_server.grpc_port}")
    grpc.load_model("warm")
    assert grpc.is_model_ready("warm")
    assert [e["requests"] for e in events(folder)] == [3, 3, 1]
