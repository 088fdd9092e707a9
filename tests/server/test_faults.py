"""Faults have one defined outcome on every client path (in-process, tritonclient.http, tritonclient.grpc):
a model.py that raises in initialize, execute or finalize; corrupt or inconsistent repositories; unloads
and reloads with requests in flight. Each failing model is reported with its name (and file, where there
is one) while the healthy models beside it keep serving."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import textwrap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.scale_models import SCALE_CONFIG, write_gated_model, write_python_model, write_scale_model
from tests.helpers.waiting import wait_until
from triton_nb import InferenceServer, serve
from triton_nb.errors import TritonNBError, wire_status
from triton_nb.repository import export_fraud_repository, export_tree_model

PATHS = ("in-process", "http", "grpc")
# How each path reports a status: the in-process error's gRPC code name, the HTTP status, the gRPC status.
NOT_FOUND = {"in-process": "NOT_FOUND", "http": "404", "grpc": "StatusCode.NOT_FOUND"}
INTERNAL = {"in-process": "INTERNAL", "http": "500", "grpc": "StatusCode.INTERNAL"}
WAIT_S = 60  # the longest any single wait may take: it only keeps a broken server from hanging the suite


def x(rows: int = 1, value: float = 1.0) -> np.ndarray:
    return np.full((rows, 2), value, np.float32)


class Paths:
    """The same calls over the three client paths of one server."""

    def __init__(self, server: InferenceServer) -> None:
        self.server = server
        self.local = server.client()
        self.http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=WAIT_S)
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")

    def close(self) -> None:
        self.http.close()
        self.grpc.close()

    def infer(self, path: str, model: str, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
        if path == "in-process":  # with a timeout too: a model that never answers fails the test, not hangs it
            return self.local.async_infer(model, inputs).get_result(timeout=WAIT_S).as_numpy(output)
        module = httpclient if path == "http" else grpcclient
        tensors = []
        for name, array in inputs.items():
            tensor = module.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        if path == "http":
            return self.http.infer(model, tensors).as_numpy(output)
        return self.grpc.infer(model, tensors, client_timeout=WAIT_S).as_numpy(output)

    def failure(self, path: str, model: str, inputs: dict[str, np.ndarray]) -> tuple[str, str]:
        """``(status, message)`` of an inference that must fail, as the path reports them."""
        try:
            self.infer(path, model, inputs, "Y")
        except TritonNBError as exc:
            assert path == "in-process", f"{path} raised a server-side exception: {exc!r}"
            return wire_status(exc)[1], str(exc)
        except InferenceServerException as exc:
            return str(exc.status()), exc.message()
        raise AssertionError(f"inference on model '{model}' over {path} succeeded; it should have failed")

    def ready(self, path: str, model: str) -> bool:
        client = {"in-process": self.local, "http": self.http, "grpc": self.grpc}[path]
        return client.is_model_ready(model)

    def index(self, path: str) -> dict[str, dict[str, str]]:
        if path == "in-process":
            entries = self.server.repository_index()
        elif path == "http":
            entries = self.http.get_model_repository_index()
        else:
            entries = self.grpc.get_model_repository_index(as_json=True).get("models", [])
        return {entry["name"]: entry for entry in entries}


@contextlib.contextmanager
def paths_of(repository: Path) -> Iterator[Paths]:
    # model control over the network is on: these tests load and unload through tritonclient
    with serve(repository, http_port=0, grpc_port=0, network_model_control=True) as server:
        paths = Paths(server)
        try:
            yield paths
        finally:
            paths.close()


def write_model(repo: Path, name: str, code: str, extra: str = "") -> None:
    config = SCALE_CONFIG.format(name=name, factor=1.0, max_batch_size=8, count=1, extra=extra)
    write_python_model(repo, name, config, textwrap.dedent(code))


def assert_serves(paths: Paths) -> None:
    """The healthy model 'good' (Y = 2 X) answers on every path."""
    for path in PATHS:
        np.testing.assert_array_equal(paths.infer(path, "good", {"X": x(2, 3.0)}, "Y"), x(2, 6.0), err_msg=path)


# ---------------------------------------------------------------------- model.py raising


INIT_FAILS = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("the weights of init_fails are missing")

    def execute(self, requests):
        return []
'''


def test_a_model_raising_in_initialize_is_unavailable_with_its_reason_and_others_serve(tmp_path):
    write_scale_model(tmp_path, name="good")
    write_model(tmp_path, "init_fails", INIT_FAILS)
    reason = "model 'init_fails' initialize failed: RuntimeError: the weights of init_fails are missing"
    with paths_of(tmp_path) as paths:
        for path in PATHS:
            assert not paths.ready(path, "init_fails"), path
            assert paths.index(path)["init_fails"] == {"name": "init_fails", "state": "UNAVAILABLE",
                                                       "reason": reason}, path
            assert paths.index(path)["good"]["state"] == "READY", path
            status, message = paths.failure(path, "init_fails", {"X": x()})
            # Triton's status and words for a model with no ready version, then why it has none
            assert status == NOT_FOUND[path], path
            assert message == f"Request for unknown model: 'init_fails' has no available versions (UNAVAILABLE: " \
                              f"{reason})", path
        assert_serves(paths)
        # asking again fails again, with the model's own message, and leaves the others serving
        with pytest.raises(InferenceServerException, match=re.escape(reason)) as caught:
            paths.http.load_model("init_fails")
        assert caught.value.status() == "500"
        with pytest.raises(InferenceServerException, match=re.escape(reason)) as caught:
            paths.grpc.load_model("init_fails")
        assert caught.value.status() == "StatusCode.INTERNAL"
        assert paths.index("http")["init_fails"]["reason"] == reason
        assert_serves(paths)


def test_a_reload_whose_initialize_raises_leaves_the_old_version_serving_and_ready(tmp_path):
    write_scale_model(tmp_path, name="good")
    with paths_of(tmp_path) as paths:
        config = paths.http.get_model_config("good")
        config["parameters"]["factor"]["string_value"] = "not-a-number"  # the model's float() raises
        reason = "model 'good' initialize failed: ValueError: could not convert string to float: 'not-a-number'"
        with pytest.raises(InferenceServerException, match=re.escape(reason)):
            paths.http.load_model("good", config=json.dumps(config))
        with pytest.raises(InferenceServerException, match=re.escape(reason)):
            paths.grpc.load_model("good", config=json.dumps(config))
        for path in PATHS:
            # the attempt marked version 1 LOADING; it must read READY again, and the server ready
            assert paths.index(path)["good"] == {"name": "good", "version": "1", "state": "READY"}, path
            assert paths.ready(path, "good"), path
        assert paths.server.is_server_ready() and paths.http.is_server_ready() and paths.grpc.is_server_ready()
        assert_serves(paths)


EXECUTE_FAILS = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                raise ValueError(f"execute_fails takes no negative X (got {x.min()})")
            if x[0, 0] == 13 and self.calls % 2:
                raise pb_utils.TritonModelException("execute_fails fails on odd calls with 13")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return responses
'''


def test_a_model_raising_in_execute_fails_that_batch_with_its_message_and_then_serves(tmp_path):
    write_scale_model(tmp_path, name="good")
    write_model(tmp_path, "execute_fails", EXECUTE_FAILS)
    with paths_of(tmp_path) as paths:
        for path in PATHS:
            status, message = paths.failure(path, "execute_fails", {"X": x(1, -1.0)})
            # python_backend's words (Stub::ProcessRequests) and status: INTERNAL, the exception's type and text
            assert status == INTERNAL[path], path
            assert message == ("Failed to process the request(s) for model 'execute_fails', message: ValueError: "
                               "execute_fails takes no negative X (got -1.0)"), path
            np.testing.assert_array_equal(paths.infer(path, "execute_fails", {"X": x(1, 2.0)}, "Y"), x(1, 4.0))
        for path in PATHS:  # each request is one batch here: calls alternate odd (fails) and even (serves)
            status, message = paths.failure(path, "execute_fails", {"X": x(1, 13.0)})
            assert status == INTERNAL[path], path
            assert message == ("Failed to process the request(s) for model 'execute_fails', message: execute_fails "
                               "fails on odd calls with 13"), path  # a TritonModelException's text alone, as Triton
            np.testing.assert_array_equal(paths.infer(path, "execute_fails", {"X": x(1, 13.0)}, "Y"), x(1, 26.0))
        stats = paths.local.get_inference_statistics("execute_fails")["model_stats"][0]["inference_stats"]
        assert (stats["fail"]["count"], stats["success"]["count"]) == (6, 6)
        assert paths.ready("http", "execute_fails")
        assert_serves(paths)


def test_an_exception_in_execute_fails_every_request_of_its_batch_and_only_that_batch(tmp_path):
    # batches of exactly two: the first request waits (up to 10 s) for a second, then the pair runs
    write_model(tmp_path, "execute_fails", EXECUTE_FAILS, extra="dynamic_batching { preferred_batch_size: [ 2 ] "
                "max_queue_delay_microseconds: 10000000 }")
    with serve(tmp_path) as server:
        client = server.client()
        pair = [client.async_infer("execute_fails", {"X": x(1, value)}) for value in (5.0, -1.0)]
        for request in pair:  # the request with a good X fails with its batch, as in Triton
            with pytest.raises(TritonNBError, match=r"^Failed to process the request\(s\) for model 'execute_fails', "
                               r"message: ValueError: execute_fails takes no negative X \(got -1\.0\)$"):
                request.get_result(timeout=WAIT_S)
        pair = [client.async_infer("execute_fails", {"X": x(1, value)}) for value in (5.0, 6.0)]
        assert [request.get_result(timeout=WAIT_S).as_numpy("Y")[0, 0] for request in pair] == [10.0, 12.0]
        stats = client.get_inference_statistics("execute_fails")["model_stats"][0]
        assert (stats["inference_stats"]["fail"]["count"], stats["inference_stats"]["success"]["count"]) == (2, 2)
        assert stats["execution_count"] == 1  # Triton counts successful executions: the good pair ran as one batch


SYS_EXIT_MODELS = {
    "exits_at_import": "import sys\nsys.exit('exits_at_import cannot start')\n",
    "exits_in_initialize": '''
import sys


class TritonPythonModel:
    def initialize(self, args):
        sys.exit("exits_in_initialize gives up")

    def execute(self, requests):
        return []
''',
    "exits_in_execute": '''
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        if (x < 0).any():
            sys.exit("exits_in_execute: negative X is fatal")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)])]
''',
    "exits_in_async_execute": '''
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        if (x < 0).any():
            sys.exit(3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)])]
''',
}


def test_sys_exit_in_a_model_is_that_models_error_not_a_dead_instance(tmp_path):
    # sys.exit() in model code ends a Triton stub, whose requests fail; here it must not end the
    # instance's thread (or its asyncio loop) and leave requests waiting forever
    write_scale_model(tmp_path, name="good")
    for name, code in SYS_EXIT_MODELS.items():
        write_model(tmp_path, name, code)
    with paths_of(tmp_path) as paths:
        index = paths.index("grpc")
        assert re.fullmatch(r"model 'exits_at_import': failed to load \S*exits_at_import/1/model\.py: SystemExit: "
                            r"exits_at_import cannot start", index["exits_at_import"]["reason"])
        assert index["exits_in_initialize"]["reason"] == ("model 'exits_in_initialize' initialize failed: SystemExit: "
                                                          "exits_in_initialize gives up")
        for model, said in (("exits_in_execute", "SystemExit: exits_in_execute: negative X is fatal"),
                            ("exits_in_async_execute", "SystemExit: 3")):
            for path in PATHS:
                assert paths.failure(path, model, {"X": x(1, -1.0)}) == (
                    INTERNAL[path], f"Failed to process the request(s) for model '{model}', message: {said}"), path
                np.testing.assert_array_equal(paths.infer(path, model, {"X": x()}, "Y"), x(1, 2.0))
        assert_serves(paths)


FINALIZE_FAILS = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                            .as_numpy() * 2)]) for r in requests]

    def finalize(self):
        raise OSError("finalize_fails could not close its cache")
'''


def test_a_model_raising_in_finalize_still_unloads_and_loads_again(tmp_path, caplog):
    write_scale_model(tmp_path, name="good")
    write_model(tmp_path, "finalize_fails", FINALIZE_FAILS)

    def finalize_errors() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno >= logging.ERROR and "finalize_fails" in r.getMessage()
                and r.exc_info and "could not close its cache" in str(r.exc_info[1])]

    caplog.set_level(logging.WARNING)
    with paths_of(tmp_path) as paths:
        paths.local.unload_model("finalize_fails")
        assert finalize_errors() and "finalize raised" in finalize_errors()[0].getMessage()
        for path in PATHS:
            assert not paths.ready(path, "finalize_fails"), path
            assert paths.index(path)["finalize_fails"]["state"] == "UNAVAILABLE", path
            assert paths.failure(path, "finalize_fails", {"X": x()}) == (
                NOT_FOUND[path], "Request for unknown model: 'finalize_fails' has no available versions"), path
        paths.http.load_model("finalize_fails")
        np.testing.assert_array_equal(paths.infer("grpc", "finalize_fails", {"X": x()}, "Y"), x(1, 2.0))
        paths.grpc.unload_model("finalize_fails")  # over the network the unload answers OK, and logs
        assert len(finalize_errors()) == 2
        assert not paths.ready("http", "finalize_fails")
        paths.grpc.load_model("finalize_fails")
        assert all(paths.ready(path, "finalize_fails") for path in PATHS)
        assert_serves(paths)
    assert len(finalize_errors()) == 3  # the server's stop finalized it too, and stopped


# ---------------------------------------------------------------------- corrupt repositories


ENSEMBLE_MISSING_STEP = """
name: "ensemble_missing_step"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Z" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "good" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "mid" } },
  { model_name: "no_such_model" model_version: -1 input_map { key: "X" value: "mid" }
    output_map { key: "Y" value: "Z" } }
] }
"""


# the fraud model's 15 features into the truncated copy of its FIL model
ENSEMBLE_OVER_TRUNCATED = """
name: "ensemble_over_truncated"
platform: "ensemble"
max_batch_size: 8
input [ { name: "features" data_type: TYPE_FP32 dims: [ 15 ] } ]
output [ { name: "predictions" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "fil_truncated" model_version: -1 input_map { key: "input__0" value: "features" }
    output_map { key: "output__0" value: "predictions" } }
] }
"""


def _set_model_type(folder: Path, model_type: str) -> None:
    config = folder / "config.pbtxt"
    text = config.read_text()
    changed = re.sub(r'(key: "model_type"\s*value \{\s*string_value: ")xgboost_json"', rf'\g<1>{model_type}"', text)
    assert changed != text, "the exported config has no model_type parameter to change"
    config.write_text(changed)


@pytest.fixture(scope="module")
def corrupt_repository(trained, tmp_path_factory) -> Path:
    """The fraud repository without its label encoders, beside broken FIL models (truncated; model_type and
    file at odds), an ensemble over the truncated one, a config that does not parse, an ensemble with a
    missing step, and two healthy models ('good', and the fraud repository's 'fil')."""
    repo = export_fraud_repository(trained, tmp_path_factory.mktemp("corrupt") / "repo")
    (repo / "preprocessing" / "1" / "label_encoders.pkl").unlink()
    write_scale_model(repo, name="good")
    for name in ("fil_truncated", "fil_ubj_named_json", "fil_ubj_holding_json", "fil_lightgbm_holding_json",
                 "fil_json_holding_ubj"):
        export_tree_model(trained.booster, repo, name=name)
    model_file = repo / "fil_truncated" / "1" / "xgboost.json"
    model_file.write_bytes(model_file.read_bytes()[:-1000])
    # model_type says UBJSON; the folder holds the JSON file the exporter wrote
    _set_model_type(repo / "fil_ubj_named_json", "xgboost_ubj")
    # model_type and file name agree, but the content is another format
    for name, model_type, filename in (("fil_ubj_holding_json", "xgboost_ubj", "xgboost.ubj"),
                                       ("fil_lightgbm_holding_json", "lightgbm", "model.txt")):
        _set_model_type(repo / name, model_type)
        (repo / name / "1" / "xgboost.json").rename(repo / name / "1" / filename)
    (repo / "fil_json_holding_ubj" / "1" / "xgboost.json").write_bytes(bytes(trained.booster.save_raw("ubj")))
    (repo / "bad_config" / "1").mkdir(parents=True)
    (repo / "bad_config" / "config.pbtxt").write_text('name: "bad_config"\nbackend: "python"\nmax_batch_size: [8\n')
    (repo / "ensemble_missing_step" / "1").mkdir(parents=True)
    (repo / "ensemble_missing_step" / "config.pbtxt").write_text(ENSEMBLE_MISSING_STEP)
    (repo / "ensemble_over_truncated" / "1").mkdir(parents=True)
    (repo / "ensemble_over_truncated" / "config.pbtxt").write_text(ENSEMBLE_OVER_TRUNCATED)
    return repo


# model -> what its reason must say (regular expressions, all of them), beyond naming the model
CORRUPT = {
    "fil_truncated": [r"cannot load FIL model file '[^']*fil_truncated/1/xgboost\.json' as model_type 'xgboost_json'",
                      r"Parsing error", r"is the file truncated\?"],
    "fil_ubj_named_json": [r"FIL model file '[^']*fil_ubj_named_json/1/xgboost\.ubj' is missing",
                           r"the version folder holds 'xgboost\.json' \(model_type 'xgboost_json'\)"],
    "fil_ubj_holding_json": [r"cannot load FIL model file '[^']*fil_ubj_holding_json/1/xgboost\.ubj'",
                             r"the file looks like model_type 'xgboost_json', not 'xgboost_ubj'"],
    "fil_lightgbm_holding_json": [r"cannot load FIL model file '[^']*fil_lightgbm_holding_json/1/model\.txt'",
                                  r"the file looks like model_type 'xgboost_json', not 'lightgbm'"],
    "fil_json_holding_ubj": [r"cannot load FIL model file '[^']*fil_json_holding_ubj/1/xgboost\.json'",
                             r"the file looks like model_type 'xgboost_ubj', not 'xgboost_json'"],
    "preprocessing": [r"initialize failed: FileNotFoundError: .*preprocessing/1/label_encoders\.pkl"],
    "ensemble": [r"composing model 'preprocessing' failed to load", r"label_encoders\.pkl"],
    "bad_config": [r"bad_config/config\.pbtxt: 3:17 : 'max_batch_size: \[8': Couldn't parse integer"],
    "ensemble_over_truncated": [r"composing model 'fil_truncated' failed to load",
                                r"fil_truncated/1/xgboost\.json", r"is the file truncated\?"],
    "ensemble_missing_step": [r"composing model 'no_such_model' failed to load: no model 'no_such_model'"],
}


def test_corrupt_models_are_unavailable_with_a_reason_naming_model_and_file(corrupt_repository, trained,
                                                                           fraud_frame):
    with paths_of(corrupt_repository) as paths:
        for path in PATHS:
            index = paths.index(path)
            for model, patterns in CORRUPT.items():
                entry = index[model]
                assert entry["state"] == "UNAVAILABLE", (path, entry)
                assert f"'{model}'" in entry["reason"] or f"/{model}/" in entry["reason"], (path, entry)
                for pattern in patterns:
                    assert re.search(pattern, entry["reason"]), (path, pattern, entry)
                assert not paths.ready(path, model), (path, model)
                status, message = paths.failure(path, model, {"X": x()})
                assert status == NOT_FOUND[path], (path, model)
                assert message == (f"Request for unknown model: '{model}' has no available versions (UNAVAILABLE: "
                                   f"{entry['reason']})"), (path, model)
            assert index["good"]["state"] == index["fil"]["state"] == "READY", path
        assert_serves(paths)
        rows = fraud_frame.head(64)
        features = trained.features(rows).astype(np.float32)
        answers = [paths.infer(path, "fil", {"input__0": features}, "output__0") for path in PATHS]
        clear = np.abs(trained.predict_proba(rows)[:, 1] - trained.threshold) > 1e-4  # FIL sums in float32
        np.testing.assert_array_equal(answers[0][clear], trained.predict(rows)[clear])
        for answer in answers[1:]:
            np.testing.assert_array_equal(answer, answers[0])


# ---------------------------------------------------------------------- unload and reload under load


@contextlib.contextmanager
def gated_repository(repo: Path) -> Iterator[Callable[[], None]]:
    """A repository with 'good' and 'gated'; yields the function that opens the gate (opened at the
    end in any case, so that a failing test cannot leave a batch held)."""
    write_scale_model(repo, name="good")
    write_gated_model(repo)
    gate = repo / "gated" / "open"
    try:
        yield gate.touch
    finally:
        gate.touch()


def unload_while_held(unload: Callable[[], None], is_ready: Callable[[], bool]) -> Future:
    """Start an unload (it waits for the held requests) on a thread; return its outcome, once the model
    has left the serving set."""
    outcome: Future = Future()

    def run() -> None:
        try:
            outcome.set_result(unload())
        except BaseException as exc:
            outcome.set_exception(exc)

    threading.Thread(target=run, name="unload-gated", daemon=True).start()
    wait_until(lambda: not is_ready(), "the unload to take 'gated' out of service")
    return outcome


def test_unload_in_process_answers_every_request_in_flight(tmp_path):
    with gated_repository(tmp_path) as open_gate, serve(tmp_path) as server:
        client = server.client()
        in_flight = [client.async_infer("gated", {"X": x(1, float(i))}) for i in range(32)]
        assert server.pending_requests == 32  # accepted, none answered: the gate holds the first batch
        unloading = unload_while_held(lambda: client.unload_model("gated"), lambda: server.is_model_ready("gated"))
        # while the unload waits for the 32, a new request is refused at once, naming the model
        with pytest.raises(TritonNBError, match=r"^Request for unknown model: 'gated' has no available versions$"):
            client.infer("gated", {"X": x()})
        open_gate()
        unloading.result(timeout=WAIT_S)  # returns once the requests it had accepted are answered
        for i, request in enumerate(in_flight):
            np.testing.assert_array_equal(request.get_result(timeout=WAIT_S).as_numpy("Y"), x(1, 2.0 * i))
        assert server.pending_requests == 0 and not client.is_model_ready("gated")
        assert client.infer("good", {"X": x()}).as_numpy("Y") is not None
        client.load_model("gated")
        np.testing.assert_array_equal(client.infer("gated", {"X": x()}).as_numpy("Y"), x(1, 2.0))


def test_unload_over_http_answers_every_request_in_flight(tmp_path):
    with gated_repository(tmp_path) as open_gate, paths_of(tmp_path) as paths:
        clients: list[httpclient.InferenceServerClient] = []
        local = threading.local()

        def infer(i: int) -> np.ndarray:
            if not hasattr(local, "client"):  # tritonclient.http clients are not thread-safe: one per thread
                local.client = httpclient.InferenceServerClient(f"127.0.0.1:{paths.server.http_port}",
                                                                network_timeout=WAIT_S)
                clients.append(local.client)
            tensor = httpclient.InferInput("X", [1, 2], "FP32")
            tensor.set_data_from_numpy(x(1, float(i)))
            return local.client.infer("gated", [tensor]).as_numpy("Y")

        unloader = httpclient.InferenceServerClient(f"127.0.0.1:{paths.server.http_port}", network_timeout=WAIT_S)
        try:
            with ThreadPoolExecutor(32) as pool:
                in_flight = [pool.submit(infer, i) for i in range(32)]
                wait_until(lambda: paths.server.pending_requests == 32, "32 HTTP requests to reach 'gated'")
                unloading = unload_while_held(lambda: unloader.unload_model("gated"),
                                              lambda: paths.server.is_model_ready("gated"))
                for path in PATHS:  # refused at once while the unload waits for the 32
                    assert not paths.ready(path, "gated"), path
                    assert paths.failure(path, "gated", {"X": x()}) == (
                        NOT_FOUND[path], "Request for unknown model: 'gated' has no available versions"), path
                open_gate()
                for i, future in enumerate(in_flight):
                    np.testing.assert_array_equal(future.result(timeout=WAIT_S), x(1, 2.0 * i))
                unloading.result(timeout=WAIT_S)
        finally:
            for client in [*clients, unloader]:
                client.close()
        assert paths.index("http")["gated"] == {"name": "gated", "version": "1", "state": "UNAVAILABLE",
                                                "reason": "unloaded"}
        assert_serves(paths)


def test_reload_over_http_and_grpc_under_load_has_zero_failures(tmp_path):
    # a little compute time, so that some requests are always in flight when the reload swaps versions
    write_scale_model(tmp_path, name="good", extra='parameters { key: "sleep_s" value: { string_value: "0.002" } }')
    with paths_of(tmp_path) as paths:
        stop = threading.Event()
        seen: list[float] = []
        errors: list[BaseException] = []

        def answered() -> int:  # failures count too: a failing server must not make the waits below time out
            return len(seen) + len(errors)

        def hammer(path: str) -> None:
            # one client per thread: neither tritonclient is meant to be shared by threads doing blocking calls
            own = Paths(paths.server)
            try:
                while not stop.is_set():
                    try:
                        seen.append(float(own.infer(path, "good", {"X": x()}, "Y")[0, 0]))
                    except BaseException as exc:
                        errors.append(exc)
            finally:
                own.close()

        workers = [threading.Thread(target=hammer, args=(path,)) for path in ("http", "grpc") * 3]
        for worker in workers:
            worker.start()
        try:
            config = paths.http.get_model_config("good")
            for client, factor in ((paths.http, 7.0), (paths.grpc, 9.0)):
                before = answered()
                wait_until(lambda before=before: answered() > before + 20, "requests before the reload")
                config["parameters"]["factor"]["string_value"] = str(factor)
                client.load_model("good", config=json.dumps(config))
                # every request sent after the load returned is answered by the new version
                for path in PATHS:
                    np.testing.assert_array_equal(paths.infer(path, "good", {"X": x()}, "Y"), x(1, factor))
                before = answered()
                wait_until(lambda before=before: answered() > before + 20, "requests after the reload")
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=WAIT_S)
        assert not any(worker.is_alive() for worker in workers), "a client thread hung"
        assert errors == []
        assert set(seen) == {2.0, 7.0, 9.0}


class _Exploit:
    """Unpickled by a plain ``pickle.load``, this would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"__import__('pathlib').Path({str(self.marker)!r}).write_text('pwned')",))


def test_a_malicious_label_encoders_pickle_is_refused_and_runs_nothing(trained, tmp_path):
    """A repository is data: a pickle dropped into it must not run code in the server. The served
    preprocessing loads its encoders with the same restricted unpickler the SDK uses."""
    import pickle

    repo = export_fraud_repository(trained, tmp_path / "repo")
    marker = tmp_path / "pwned"
    (repo / "preprocessing" / "1" / "label_encoders.pkl").write_bytes(pickle.dumps({"Zip": _Exploit(marker)}))
    with serve(repo) as server:
        index = {m["name"]: m for m in server.repository_index()}
        assert index["preprocessing"]["state"] == "UNAVAILABLE"
        assert re.search(r"model 'preprocessing' initialize failed: .*refusing to load 'builtins\.eval'",
                         index["preprocessing"]["reason"]), index["preprocessing"]
        assert index["ensemble"]["state"] == "UNAVAILABLE"
        assert server.is_model_ready("fil")
    assert not marker.exists()
