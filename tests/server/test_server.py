"""The in-kernel server: lifecycle, model control, live updates, bad input, statistics."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import triton_nb
from tests.helpers.scale_models import (
    DECOUPLED_CONFIG,
    DECOUPLED_MODEL,
    write_gated_model,
    write_python_model,
    write_scale_model,
)
from tests.helpers.waiting import wait_until
from triton_nb.errors import InvalidArgumentError, NotFoundError, UnavailableError
from triton_nb.server.core import Server
from triton_nb.server.service import InferenceService
from triton_nb.serving import InferenceServer, serve


def x(rows: int = 1) -> np.ndarray:
    return np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)


def threads_now() -> set[str]:
    return {t.name for t in threading.enumerate()}


WAIT_S = 60  # the longest any wait may take: it only keeps a broken server from hanging the suite


def test_serve_returns_at_once_and_stop_joins_everything(repo):
    before = threads_now()
    server = serve(repo)
    assert server.is_server_live() and server.is_server_ready()
    client = server.client()
    np.testing.assert_array_equal(client.infer("scale", {"X": x(3)}).as_numpy("Y"), x(3) * 2)
    assert any(name.startswith("triton-nb-scale") for name in threads_now())
    server.stop()
    server.stop()  # idempotent
    assert threads_now() <= before
    assert not server.is_server_live()
    with pytest.raises(UnavailableError, match="stopped"):
        client.infer("scale", {"X": x()})


def test_context_manager_and_two_servers_in_one_process(repo, tmp_path_factory):
    other = tmp_path_factory.mktemp("other")
    write_scale_model(other, factor=10.0)
    with serve(repo) as first, serve(other) as second:
        assert first.client().infer("scale", {"X": x()}).as_numpy("Y")[0, 1] == 2.0
        assert second.client().infer("scale", {"X": x()}).as_numpy("Y")[0, 1] == 10.0


def test_dynamic_batching_across_concurrent_requests(tmp_path):
    write_scale_model(tmp_path, extra='dynamic_batching { max_queue_delay_microseconds: 20000 }\n'
                      'parameters { key: "sleep_s" value: { string_value: "0.02" } }')
    with serve(tmp_path) as server:
        client = server.client()
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda i: client.infer("scale", {"X": x() + i}).as_numpy("Y"), range(64)))
        for i, result in enumerate(results):
            np.testing.assert_array_equal(result, (x() + i) * 2)
        stats = client.get_inference_statistics("scale")["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 64
        assert stats["inference_count"] == 64
        assert stats["execution_count"] < 64  # requests were batched together
        assert max(int(b["batch_size"]) for b in stats["batch_stats"]) > 1


def test_model_control_modes(tmp_path):
    write_scale_model(tmp_path, name="a")
    write_scale_model(tmp_path, name="b")
    with serve(tmp_path, model_control_mode="explicit", load_models=["a"]) as server:
        assert server.is_model_ready("a") and not server.is_model_ready("b")
        server.load_model("b")
        assert server.is_model_ready("b")
        server.unload_model("b")
        assert not server.is_model_ready("b")
        index = {(e["name"], e.get("state")) for e in server.repository_index()}
        assert ("a", "READY") in index and ("b", "UNAVAILABLE") in index
    with serve(tmp_path, model_control_mode="none") as server:
        assert server.is_model_ready("a") and server.is_model_ready("b")
        with pytest.raises(UnavailableError, match="not allowed if model control mode is NONE"):
            server.load_model("a")
    with serve(tmp_path, model_control_mode="poll", repository_poll_secs=3600) as server:
        with pytest.raises(UnavailableError, match="not allowed if polling is enabled"):
            server.unload_model("a")
        write_scale_model(tmp_path, name="c", factor=3.0)
        config = (tmp_path / "a" / "config.pbtxt").read_text().replace('"2.0"', '"5.0"')
        (tmp_path / "a" / "config.pbtxt").write_text(config)
        assert sorted(server.poll_once()) == ["a", "c"]
        assert server.client().infer("a", {"X": x()}).as_numpy("Y")[0, 1] == 5.0
        assert server.client().infer("c", {"X": x()}).as_numpy("Y")[0, 1] == 3.0
        assert server.poll_once() == []
    with pytest.raises(InvalidArgumentError, match="model_control_mode"):
        InferenceServer(tmp_path, model_control_mode="sometimes")


def test_a_model_that_fails_to_load_reports_why_and_others_serve(tmp_path):
    write_scale_model(tmp_path, name="good")
    bad = write_scale_model(tmp_path, name="bad")
    (bad / "1" / "model.py").write_text("raise RuntimeError('cannot initialize: missing weights')\n")
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text("name: [unterminated")
    with serve(tmp_path) as server:
        assert server.is_model_ready("good") and not server.is_server_ready()
        index = {e["name"]: e for e in server.repository_index()}
        assert index["bad"]["state"] == "UNAVAILABLE" and "missing weights" in index["bad"]["reason"]
        assert index["broken"]["state"] == "UNAVAILABLE" and "config.pbtxt" in index["broken"]["reason"]
        with pytest.raises(NotFoundError, match=r"no available versions.*missing weights"):
            server.client().infer("bad", {"X": x()})
        assert server.client().infer("good", {"X": x()}).as_numpy("Y") is not None


def test_reload_under_load_has_zero_failures_and_switches(repo):
    with serve(repo) as server:
        client = server.client()
        stop = threading.Event()
        seen: list[float] = []
        errors: list[BaseException] = []

        def hammer():
            while not stop.is_set():
                try:
                    seen.append(float(client.infer("scale", {"X": np.ones((1, 2), np.float32)}).as_numpy("Y")[0, 0]))
                except BaseException as exc:
                    errors.append(exc)

        workers = [threading.Thread(target=hammer) for _ in range(6)]
        for worker in workers:
            worker.start()
        try:
            # the reload lands in the middle of the load: answers from the old version before it,
            # from the new one after it
            wait_until(lambda: seen.count(2.0) >= 30 or errors, "30 answers from the old version")
            new_config = client.get_model_config("scale")
            new_config["parameters"]["factor"]["string_value"] = "7.0"
            client.load_model("scale", config=json.dumps(new_config))
            wait_until(lambda: seen.count(7.0) >= 30 or errors, "30 answers from the new version")
        finally:
            stop.set()
            for worker in workers:
                worker.join()
        assert errors == []
        assert seen[0] == 2.0 and seen[-1] == 7.0
        assert set(seen) == {2.0, 7.0}


def test_failed_reload_leaves_the_old_version_serving(repo):
    with serve(repo) as server:
        with pytest.raises(InvalidArgumentError):
            server.load_model("scale", config={"name": "scale", "backend": "python", "max_batch_size": -3})
        assert server.client().infer("scale", {"X": x()}).as_numpy("Y")[0, 1] == 2.0


def test_file_overrides_are_confined_to_the_model_folder(repo):
    model_py = (repo / "scale" / "1" / "model.py").read_bytes()
    config = (repo / "scale" / "config.pbtxt").read_text()
    with serve(repo) as server:
        for bad in ("file:../escape.py", "file:/etc/passwd", "file:1/../../x"):
            with pytest.raises(InvalidArgumentError, match="relative path inside the model folder"):
                server.load_model("scale", config=_json(config), files={bad: b"x"})
        server.load_model("scale", config=_json(config.replace('"2.0"', '"4.0"')), files={"file:1/model.py": model_py})
        assert server.client().infer("scale", {"X": x()}).as_numpy("Y")[0, 1] == 4.0
        with pytest.raises(InvalidArgumentError, match="need a config override"):
            server.load_model("scale", files={"file:1/model.py": model_py})
        escaping = config + 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "/opt/env.tar.gz" } }'
        with pytest.raises(InvalidArgumentError, match=r"model 'scale'.*EXECUTION_ENV_PATH.*inside the model folder"):
            server.load_model("scale", config=_json(escaping))
        assert server.client().infer("scale", {"X": x()}).as_numpy("Y")[0, 1] == 4.0  # the loaded one serves on


def _json(pbtxt: str) -> str:
    from triton_nb.repository.config import config_to_json, parse_config

    return json.dumps(config_to_json(parse_config(pbtxt)))


def test_live_batching_knobs(repo):
    with serve(repo) as server:
        knobs = server.update_batching("scale", max_queue_delay_microseconds=500, preferred_batch_size=[2, 4],
                                       max_batch_size=4, instance_count=3)
        assert knobs == {"max_batch_size": 4, "max_queue_delay_microseconds": 500, "preferred_batch_size": [2, 4],
                         "preserve_ordering": False, "dynamic_batching": True, "instance_count": 3}
        config = server.client().get_model_config("scale")
        assert config["dynamic_batching"]["preferred_batch_size"] == [2, 4]
        assert config["instance_group"][0]["count"] == 3
        assert sum(name.startswith("triton-nb-scale") for name in threads_now()) == 3
        with pytest.raises(InvalidArgumentError, match="between 1 and the model's limit 8"):
            server.update_batching("scale", max_batch_size=64)
        with pytest.raises(InvalidArgumentError, match="unknown batching knob"):
            server.update_batching("scale", batch=3)
        server.update_batching("scale", instance_count=1)
        assert sum(name.startswith("triton-nb-scale") for name in threads_now()) == 1
        assert server.client().infer("scale", {"X": x(4)}).as_numpy("Y").shape == (4, 2)
        with pytest.raises(InvalidArgumentError, match="batch-size must be <= 4 for 'scale'"):
            server.client().infer("scale", {"X": x(5)})  # the live max_batch_size is 4 now... and the config's 8


def _batch_sizes_of(server, model: str, requests: int) -> dict[int, int]:
    """Executions by batch size for ``requests`` one-row requests sent together."""
    before = {b["batch_size"]: b["compute_infer"]["count"]
              for b in server.statistics(model)["model_stats"][0]["batch_stats"]}
    futures = [server.client().async_infer(model, {"X": x()}) for _ in range(requests)]
    for future in futures:
        future.get_result(timeout=30)
    after = {b["batch_size"]: b["compute_infer"]["count"]
             for b in server.statistics(model)["model_stats"][0]["batch_stats"]}
    return {size: count - before.get(size, 0) for size, count in after.items() if count - before.get(size, 0)}


def test_dynamic_batching_turns_off_and_on_live(tmp_path):
    # a long delay and a preferred size of 4: with the batcher on, 4 requests sent together leave as one batch
    write_scale_model(tmp_path, extra="dynamic_batching { max_queue_delay_microseconds: 2000000 "
                                      "preferred_batch_size: [ 4 ] }")
    with serve(tmp_path) as server:
        assert _batch_sizes_of(server, "scale", 4) == {4: 1}
        knobs = server.update_batching("scale", dynamic_batching=False)
        assert knobs["dynamic_batching"] is False
        assert not server.model_config("scale").HasField("dynamic_batching")  # as Triton shows a config without it
        assert _batch_sizes_of(server, "scale", 4) == {1: 4}  # the default scheduler: one request per execution
        server.update_batching("scale", dynamic_batching=True)
        assert server.model_config("scale").dynamic_batching.preferred_batch_size == [4]  # the knobs it had
        assert _batch_sizes_of(server, "scale", 4) == {4: 1}


def test_dynamic_batching_cannot_be_turned_on_for_a_model_that_does_not_batch(tmp_path):
    write_scale_model(tmp_path, max_batch_size=0, extra="")
    with serve(tmp_path) as server, pytest.raises(InvalidArgumentError, match="'scale' does not batch"):
        server.update_batching("scale", dynamic_batching=True)


def test_wait_warm_of_a_python_model_is_immediate(tmp_path):
    write_scale_model(tmp_path, count=2)
    with serve(tmp_path) as server:
        assert server.wait_warm("scale", timeout_s=10)
        with pytest.raises(NotFoundError, match="'nope' is not found"):
            server.wait_warm("nope")


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda c: c.infer("scael", {"X": x()}), NotFoundError,
         "unknown model: 'scael' is not found \\(did you mean 'scale'\\?\\)"),
        (lambda c: c.infer("scale", {"X": x()}, model_version="9"), NotFoundError, "version 9 is not found"),
        (lambda c: c.infer("scale", {}), InvalidArgumentError,
         "expected 1 inputs but got 0 inputs for model 'scale'.* missing required input\\(s\\) \\['X'\\]"),
        (lambda c: c.infer("scale", {"X": x(), "Z": x()}), InvalidArgumentError,
         "expected 1 inputs but got 2 inputs for model 'scale'"),
        (lambda c: c.infer("scale", {"X": x().astype(np.float64)}), InvalidArgumentError,
         "inference input 'X' data-type is 'FP64', but model 'scale' expects 'FP32'"),
        (lambda c: c.infer("scale", {"X": np.ones((1, 3), np.float32)}), InvalidArgumentError,
         "unexpected shape for input 'X' for model 'scale'. Expected \\[-1,2\\], got \\[1,3\\]"),
        (lambda c: c.infer("scale", {"X": x(9)}), InvalidArgumentError, "batch-size must be <= 8 for 'scale'"),
        (lambda c: c.infer("scale", {"X": np.array([["a", "b"]], dtype=object)}), InvalidArgumentError,
         "data-type is 'BYTES', but model 'scale' expects 'FP32'"),
        (lambda c: c.infer("scale", {"X": x()}, outputs=["W"]), InvalidArgumentError,
         "unexpected inference output 'W' for model 'scale'"),
        (lambda c: c.infer("scale", {"X": np.full((1, 2), np.nan, np.float32)}), InvalidArgumentError,
         "X has NaN"),
    ],
)
def test_bad_input_is_named_counted_and_the_server_keeps_serving(repo, call, error, message):
    with serve(repo) as server:
        client = server.client()
        with pytest.raises(error, match=message):
            call(client)
        assert client.infer("scale", {"X": x()}).as_numpy("Y") is not None
        stats = client.get_inference_statistics("scale")["model_stats"][0]["inference_stats"]
        if error is InvalidArgumentError:
            assert stats["fail"]["count"] == 1
        assert stats["success"]["count"] == 1


def test_statistics_and_prometheus_metrics(repo):
    with serve(repo) as server:
        client = server.client()
        for rows in (1, 2, 3):
            client.infer("scale", {"X": x(rows)})
        stats = client.get_inference_statistics("scale")["model_stats"][0]
        assert stats["name"] == "scale" and stats["version"] == "1"
        assert stats["inference_count"] == 6
        assert stats["inference_stats"]["success"]["count"] == 3
        assert stats["inference_stats"]["queue"]["ns"] > 0
        text = server.stats.prometheus_text().decode()
        assert 'nv_inference_request_success{model="scale",version="1"} 3' in text
        assert 'nv_inference_count{model="scale",version="1"} 6' in text


def test_metadata_and_config(repo):
    with serve(repo) as server:
        client = server.client()
        metadata = client.get_model_metadata("scale")
        assert metadata == {"name": "scale", "versions": ["1"], "platform": "python",
                            "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 2]}],
                            "outputs": [{"name": "Y", "datatype": "FP32", "shape": [-1, 2]}]}
        assert client.get_model_config("scale")["max_batch_size"] == 8
        assert client.is_model_ready("scale") and client.is_server_ready()


def test_stop_answers_or_fails_in_flight_requests_promptly(tmp_path):
    gate = write_gated_model(tmp_path)
    server = serve(tmp_path)
    stopping = threading.Thread(target=server.stop, name="stopping", daemon=True)
    try:
        client = server.client()
        running = client.async_infer("gated", {"X": x()})
        wait_until((gate / "running").exists, "the first batch to start")
        queued = [client.async_infer("gated", {"X": x()}) for _ in range(4)]  # behind it: one instance
        stopping.start()
        for request in queued:  # failed at once: the stop does not wait for the batch that is running
            with pytest.raises(UnavailableError, match="unloaded before the request ran"):
                request.get_result(timeout=WAIT_S)
        assert server.pending_requests == 1 and stopping.is_alive()  # the running batch is still held
    finally:
        (gate / "open").touch()
        if stopping.ident is None:  # the test failed before the stop began
            server.stop()
    np.testing.assert_array_equal(running.get_result(timeout=WAIT_S).as_numpy("Y"), x() * 2)  # answered
    stopping.join(timeout=WAIT_S)
    assert not stopping.is_alive(), "stop() did not end once the running batch had"


def test_public_api():
    assert callable(triton_nb.serve)
    assert triton_nb.InferenceServer is InferenceServer
    assert issubclass(InferenceServer, Server)


def test_the_public_server_is_the_engine_behind_the_service_interface(repo):
    with serve(repo) as server:
        assert isinstance(server, InferenceServer) and isinstance(server, InferenceService)
        assert server.client().is_model_ready("scale")
        assert b"nv_inference_request_success" in server.metrics_text()


BLS_CONFIG = """
name: "caller"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Z" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""

BLS_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Z = scale(X) + 1, calling the model 'scale' through the server (BLS)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            inner = pb_utils.InferenceRequest(model_name="scale", inputs=[x], requested_output_names=["Y"])
            answer = inner.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=answer.error()))
                continue
            y = pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Z", y + 1)]))
        return responses
'''


def test_decoupled_model_streams_through_the_client(repo):
    write_python_model(repo, "counter", DECOUPLED_CONFIG, DECOUPLED_MODEL)
    with serve(repo) as server:
        results = list(server.client().stream_infer("counter", {"N": np.array([4], np.int32)}))
        assert [int(r.as_numpy("I")[0]) for r in results] == [0, 1, 2, 3]


def test_bls_calls_another_model_through_the_server(repo):
    write_python_model(repo, "caller", BLS_CONFIG, BLS_MODEL)
    with serve(repo) as server:
        client = server.client()
        np.testing.assert_array_equal(client.infer("caller", {"X": x(3)}).as_numpy("Z"), x(3) * 2 + 1)
        scale_stats = client.get_inference_statistics("scale")["model_stats"][0]
        assert scale_stats["inference_stats"]["success"]["count"] == 1  # the inner call went through 'scale'


def test_a_server_wide_limit_on_pending_requests_refuses_the_excess_at_once(repo):
    gate = write_gated_model(repo)
    with serve(repo, max_pending_requests=3) as server, ThreadPoolExecutor(1) as pool:
        try:
            client = server.client()
            accepted = [client.async_infer("gated", {"X": x()}) for _ in range(3)]
            assert server.pending_requests == 3
            # on a thread, so that a call that waited for room would fail the test, not hang it:
            # no room comes while the gate holds every accepted request
            excess = pool.submit(client.async_infer, "gated", {"X": x()})
            with pytest.raises(UnavailableError, match=r"3 pending requests \(max_pending_requests 3\)"):
                excess.result(timeout=WAIT_S)
            assert server.pending_requests == 3  # refused while none of the accepted had been answered
        finally:
            (gate / "open").touch()
        for request in accepted:
            assert request.get_result(timeout=WAIT_S).as_numpy("Y") is not None
        assert server.pending_requests == 0
        assert client.infer("gated", {"X": x()}).as_numpy("Y") is not None  # room again
    with pytest.raises(InvalidArgumentError, match="max_pending_requests must be >= 1"):
        InferenceServer(repo, max_pending_requests=0)


def test_a_model_that_hangs_answers_with_timeouts_and_the_server_still_stops(repo):
    write_scale_model(repo, name="hang", extra='parameters { key: "sleep_s" value: { string_value: "1000" } }')
    server = serve(repo, exit_timeout_secs=1)
    client = server.client()
    with pytest.raises(UnavailableError, match=r"no response within 0\.3 s"):
        client.infer("hang", {"X": x()}, timeout_microseconds=300_000)
    stuck = client.async_infer("hang", {"X": x()})
    # the executing batch outlives exit_timeout_secs: it is failed and its thread left behind
    stopping = threading.Thread(target=server.stop)
    stopping.start()
    stopping.join(timeout=60)
    assert not stopping.is_alive(), "stop() hung on a model that hangs"
    with pytest.raises(UnavailableError, match=r"did not finish the request|unloaded before the request ran"):
        stuck.get_result(timeout=5)


COUNTED_LOADS_MODEL = '''
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X; every initialize appends a line to the file 'loads' in the model folder."""

    def initialize(self, args):
        with open(os.path.join(args["model_repository"], "loads"), "a") as loads:
            loads.write("loaded\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                            .as_numpy())]) for r in requests]
'''


def test_a_composing_model_loaded_by_its_ensemble_at_start_is_not_loaded_again(tmp_path):
    """The start loads the repository in name order; 'alpha' (an ensemble) loads 'zeta' first."""
    config = ('name: "zeta" backend: "python" max_batch_size: 8 '
              'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ] '
              'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]')
    folder = write_python_model(tmp_path, "zeta", config, COUNTED_LOADS_MODEL)
    (tmp_path / "alpha" / "1").mkdir(parents=True)
    (tmp_path / "alpha" / "config.pbtxt").write_text(
        'name: "alpha" platform: "ensemble" max_batch_size: 8 '
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ] '
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ] '
        'ensemble_scheduling { step [ { model_name: "zeta" model_version: -1 input_map { key: "X" value: "X" } '
        'output_map { key: "Y" value: "Y" } } ] }')
    with serve(tmp_path) as server:
        np.testing.assert_array_equal(server.client().infer("alpha", {"X": x()}).as_numpy("Y"), x())
    assert (folder / "loads").read_text().splitlines() == ["loaded"]
