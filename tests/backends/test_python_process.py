"""Python-model instances in processes of their own (``python_instances="process"``, and always for
``EXECUTION_ENV_PATH``): the same answers as thread instances over each protocol, tensors of every
kind through shared memory, BLS and decoupled models, the model's log, crashes and kills that fail
one batch and restart the process, a start that times out, and a packed environment with a package
this interpreter does not have."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_nb import serve
from triton_nb.backends import python_process
from triton_nb.errors import InternalError, InvalidArgumentError
from triton_nb.tensors import InferRequest

PROTOCOLS = ["inprocess", "http", "grpc"]

WORKER = '''
import json
import os
import sys
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X * 2 and the PID that computed it; TEXT echoed upper-cased. X[0] of -1 exits the
    process, -2 sleeps (for a kill; a file "sleeping" in the model folder says it has begun), -3
    raises; -4 answers that one request with an error."""

    def initialize(self, args):
        self.folder = args["model_repository"]
        self.logger = pb_utils.Logger
        self.logger.log_info(f"worker {args['model_instance_name']} starting in {os.getpid()}")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            first = float(x.reshape(-1)[0])
            if first == -1.0:
                os._exit(3)
            if first == -2.0:
                open(os.path.join(self.folder, "sleeping"), "w").close()
                time.sleep(60)
            if first == -3.0:
                raise ValueError("asked to fail")
            if first == -4.0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("not this one")))
                continue
            upper = np.array([[v.upper() for v in row] for row in text], dtype=object)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", (x * 2).astype(np.float32)),
                pb_utils.Tensor("PID", np.full((x.shape[0], 1), os.getpid(), np.int64)),
                pb_utils.Tensor("UPPER", upper)]))
        return responses
'''

WORKER_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 3 ] }}, {{ name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }}, {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }},
         {{ name: "UPPER" data_type: TYPE_STRING dims: [ 2 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{extra}
"""

CALLER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BLS from a process: calls "worker" (exec and async_exec) and the decoupled "counter"."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            text = np.array([[b"a", b"b"]] * x.shape[0], dtype=object)
            call = pb_utils.InferenceRequest(model_name="worker", requested_output_names=["Y"],
                                             inputs=[pb_utils.Tensor("X", x), pb_utils.Tensor("TEXT", text)])
            first = call.exec()
            second = await call.async_exec()
            counts = [pb_utils.get_output_tensor_by_name(r, "N").as_numpy()[0] for r in pb_utils.InferenceRequest(
                model_name="counter", requested_output_names=["N"],
                inputs=[pb_utils.Tensor("COUNT", np.array([3], np.int32))]).exec(decoupled=True)
                if pb_utils.get_output_tensor_by_name(r, "N") is not None]
            total = (pb_utils.get_output_tensor_by_name(first, "Y").as_numpy()
                     + pb_utils.get_output_tensor_by_name(second, "Y").as_numpy())
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", total), pb_utils.Tensor("COUNTS", np.array([counts], np.int32))]))
        return responses
'''

CALLER_CONFIG = """
name: "caller"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "COUNTS" data_type: TYPE_INT32 dims: [ 3 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

COUNTER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: COUNT responses N = 1..COUNT, then the final flag alone."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            for n in range(1, count + 1):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("N", np.array([n], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

COUNTER_CONFIG = """
name: "counter"
backend: "python"
max_batch_size: 0
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def write_model(repo: Path, name: str, config: str, code: str) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    (folder / "1" / "model.py").write_text(textwrap.dedent(code))
    return folder


def write_repository(repo: Path, count: int = 2) -> None:
    write_model(repo, "worker", WORKER_CONFIG.format(name="worker", count=count, extra=""), WORKER)
    write_model(repo, "caller", CALLER_CONFIG, CALLER)
    write_model(repo, "counter", COUNTER_CONFIG, COUNTER)


def inputs(first: float = 1.0, rows: int = 1) -> dict[str, np.ndarray]:
    x = np.tile(np.array([[first, 2.0, 3.0]], np.float32), (rows, 1))
    return {"X": x, "TEXT": np.array([[b"ab", "cé".encode()]] * rows, dtype=object)}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("process")
    write_repository(repo)
    with serve(repo, http_port=0, grpc_port=0, python_instances="process") as server:
        yield server


def infer(server, protocol: str, model: str, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if protocol == "inprocess":
        result = server.client().infer(model, tensors)
        return dict(result.response.outputs)
    tc = httpclient if protocol == "http" else grpcclient
    client = tc.InferenceServerClient(f"127.0.0.1:{server.http_port if protocol == 'http' else server.grpc_port}")
    wire = []
    for name, array in tensors.items():
        tensor = tc.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "FP32")
        tensor.set_data_from_numpy(array)
        wire.append(tensor)
    try:
        result = client.infer(model, wire)
        outputs = result.get_response()["outputs"] if protocol == "http" else result.get_response().outputs
        names = [o["name"] if protocol == "http" else o.name for o in outputs]
        return {name: result.as_numpy(name) for name in names}
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_process_instance_answers_as_a_thread_instance_over_each_protocol(served, protocol):
    out = infer(served, protocol, "worker", inputs(rows=2))
    np.testing.assert_array_equal(out["Y"], inputs(rows=2)["X"] * 2)
    assert out["UPPER"].tolist() == [[b"AB", "cé".encode().upper()]] * 2  # bytes.upper: ASCII letters only
    assert int(out["PID"][0, 0]) not in (os.getpid(), 0)  # computed in another process


def test_each_instance_has_its_own_process(served):
    pids = set()
    futures = [served.infer_async(InferRequest("worker", inputs())) for _ in range(64)]
    for future in futures:
        pids.add(int(future.result(timeout=60).outputs["PID"][0, 0]))
    assert len(pids) == 2 and os.getpid() not in pids


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_and_decoupled_calls_work_from_a_process_instance(served, protocol):
    out = infer(served, protocol, "caller", {"X": np.array([[1.0, 2.0, 3.0]], np.float32)})
    np.testing.assert_array_equal(out["Y"], [[4.0, 8.0, 12.0]])  # two BLS calls of Y = 2X
    assert out["COUNTS"].tolist() == [[1, 2, 3]]  # the decoupled model's streamed responses, in order


def test_a_decoupled_model_streams_from_its_process_over_grpc(served):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    received: list = []
    done = threading.Event()

    def callback(result, error):
        received.append(error if error is not None else result)
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    client.start_stream(callback=callback)
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([4], np.int32))
    client.async_stream_infer("counter", [tensor], enable_empty_final_response=True)
    assert done.wait(60)
    client.stop_stream()
    client.close()
    counts = [int(r.as_numpy("N")[0]) for r in received if r.as_numpy("N") is not None]
    assert counts == [1, 2, 3, 4]


def test_a_batch_is_answered_to_the_worker_that_waits_for_it_and_a_decoupled_one_after_its_responses(
        served, monkeypatch):
    """A batch's answer is read by the worker that sent the batch, not handed over by the reader
    thread (one thread hop less per batch); a decoupled model's answer comes on the channel after
    the responses it sent, so a BLS caller's stream never ends before its responses."""
    received: list[tuple[str, str]] = []  # (thread, message op), what the server side read
    real_recv = python_process.Channel.recv

    def recv(self):
        message = real_recv(self)
        if message is not None:
            received.append((threading.current_thread().name, message[0]))
        return message

    monkeypatch.setattr(python_process.Channel, "recv", recv)
    served.client().infer("worker", inputs())
    infer(served, "inprocess", "caller", {"X": np.array([[1.0, 2.0, 3.0]], np.float32)})
    done_on = {thread for thread, op in received if op == "done"}
    assert any(thread.startswith("triton-nb-worker-") and not thread.endswith("-stub") for thread in done_on)
    assert not any(thread.startswith("triton-nb-worker_") and thread.endswith("-stub") for thread in done_on)
    counter = [op for thread, op in received if thread.startswith("triton-nb-counter_")]
    assert counter == ["response"] * 3 + ["done"]  # the 3 counts (the last one final), then the batch


def test_a_model_error_and_a_raising_batch_are_reported_as_in_threads(served):
    client = served.client()
    with pytest.raises(Exception, match="not this one"):
        client.infer("worker", inputs(-4.0))
    with pytest.raises(Exception, match="asked to fail"):
        client.infer("worker", inputs(-3.0))
    np.testing.assert_array_equal(client.infer("worker", inputs()).as_numpy("Y"), inputs()["X"] * 2)


def test_the_models_log_reaches_the_servers_logger(tmp_path, caplog):
    write_model(tmp_path, "worker", WORKER_CONFIG.format(name="worker", count=1, extra=""), WORKER)
    with caplog.at_level(logging.INFO, logger="triton_nb.python_backend.worker"), \
            serve(tmp_path, python_instances="process"):
        pass
    assert any("worker worker_0_0 starting in" in r.getMessage() for r in caplog.records)


def test_a_process_that_exits_fails_its_batch_and_the_next_batch_restarts_it(tmp_path):
    write_model(tmp_path, "worker", WORKER_CONFIG.format(name="worker", count=1, extra=""), WORKER)
    with serve(tmp_path, python_instances="process") as server:
        client = server.client()
        before = int(client.infer("worker", inputs()).as_numpy("PID")[0, 0])
        with pytest.raises(InternalError, match=r"model 'worker' instance 'worker_0_0': its Python process ended "
                                                r"\(exit status 3\) while serving"):
            server.infer(InferRequest("worker", inputs(-1.0)))
        after = int(client.infer("worker", inputs()).as_numpy("PID")[0, 0])
        assert after != before  # a new process, initialized again


def test_a_killed_process_fails_its_batch_without_a_hang(tmp_path):
    write_model(tmp_path, "worker", WORKER_CONFIG.format(name="worker", count=1, extra=""), WORKER)
    with serve(tmp_path, python_instances="process") as server:
        client = server.client()
        pid = int(client.infer("worker", inputs()).as_numpy("PID")[0, 0])
        sockets = _open_sockets()
        sleeping = server.infer_async(InferRequest("worker", inputs(-2.0)))
        began = tmp_path / "worker" / "sleeping"  # the batch is in the process: killing it now fails that batch
        deadline = time.monotonic() + 30
        while not began.exists():
            assert time.monotonic() < deadline, "the sleeping batch never reached the process"
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(InternalError, match=r"its Python process ended \(signal SIGKILL\)"):
            sleeping.result(timeout=30)
        np.testing.assert_array_equal(client.infer("worker", inputs()).as_numpy("Y"), inputs()["X"] * 2)
        assert _open_sockets() == sockets  # the dead process's two socket pairs closed, the new one's open


def _open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (the listing's own descriptor, gone by now)
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def test_unloading_ends_the_process(tmp_path):
    write_model(tmp_path, "worker", WORKER_CONFIG.format(name="worker", count=1, extra=""), WORKER)
    with serve(tmp_path, python_instances="process") as server:
        pid = int(server.client().infer("worker", inputs()).as_numpy("PID")[0, 0])
        server.unload_model("worker")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


SLOW_START = '''
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(30)

    def execute(self, requests):
        return []
'''

FAILING_START = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no licence file")

    def execute(self, requests):
        return []
'''


def test_a_process_that_does_not_start_in_time_fails_the_load(tmp_path, monkeypatch):
    monkeypatch.setattr(python_process, "STUB_START_TIMEOUT_S", 1.0)
    write_model(tmp_path, "slow", WORKER_CONFIG.format(name="slow", count=1, extra=""), SLOW_START)
    with serve(tmp_path, model_control_mode="explicit", load_models=[], python_instances="process") as server, \
            pytest.raises(InternalError, match="model 'slow' instance 'slow_0_0': its Python process did not start "
                                               "within 1 s"):
        server.load_model("slow")


def test_an_initialize_that_raises_fails_the_load_with_its_message(tmp_path):
    write_model(tmp_path, "failing", WORKER_CONFIG.format(name="failing", count=1, extra=""), FAILING_START)
    with serve(tmp_path, model_control_mode="explicit", load_models=[], python_instances="process") as server, \
            pytest.raises(InternalError, match="model 'failing' initialize failed: RuntimeError: no licence file"):
        server.load_model("failing")


def test_an_unknown_instance_kind_is_refused(tmp_path):
    with pytest.raises(InvalidArgumentError, match="python_instances must be one of thread, process"):
        serve(tmp_path, python_instances="fork")


# ---------------------------------------------------------------------- EXECUTION_ENV_PATH

ENV_MODEL = '''
import sys

import cardtools
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("Y", cardtools.mask(pb_utils.get_input_tensor_by_name(r, "X").as_numpy())),
            pb_utils.Tensor("PREFIX", np.array([[sys.prefix.encode()]], dtype=object))]) for r in requests]
'''

ENV_CONFIG = """
name: "packed"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "PREFIX" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/cards_env.tar.gz" } }
"""


def _packed_environment(work: Path) -> Path:
    """A venv (interpreter copied, not linked) holding the package ``cardtools``, which this test
    interpreter lacks; numpy comes from this interpreter's site-packages through a .pth file."""
    env = work / "cards_env"
    subprocess.run([sys.executable, "-m", "venv", "--copies", "--without-pip", str(env)], check=True, timeout=300)
    (site,) = (env / "lib").glob("python*/site-packages")
    (site / "cardtools").mkdir()
    (site / "cardtools" / "__init__.py").write_text(
        "import numpy as np\n\n\ndef mask(x):\n    return np.where(x > 2, x, 0).astype(np.float32)\n")
    numpy_site = Path(np.__file__).resolve().parents[1]
    (site / "host_numpy.pth").write_text(f"{numpy_site}\n")
    archive = work / "cards_env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(env, arcname=".")
    return archive


def test_a_model_with_an_execution_env_runs_with_its_packages(tmp_path, monkeypatch):
    with pytest.raises(ImportError):
        __import__("cardtools")
    monkeypatch.setenv("TRITON_NB_ENV_CACHE", str(tmp_path / "cache"))
    archive = _packed_environment(tmp_path)
    folder = write_model(tmp_path / "repo", "packed", ENV_CONFIG, ENV_MODEL)
    archive.rename(folder / "cards_env.tar.gz")
    with serve(tmp_path / "repo", http_port=0) as server:  # thread instances: the environment makes a process
        result = server.client().infer("packed", {"X": np.array([[1.0, 3.0, 5.0]], np.float32)})
        np.testing.assert_array_equal(result.as_numpy("Y"), [[0.0, 3.0, 5.0]])
        prefix = result.as_numpy("PREFIX")[0, 0].decode()
    unpacked = list((tmp_path / "cache").iterdir())
    assert prefix in {str(p) for p in unpacked}  # the interpreter of the unpacked archive ran it


AUTO_MODEL = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils
{imports}

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        {check}
        config.add_input({{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}})
        config.add_output({{"name": "Y", "data_type": "TYPE_FP32", "dims": [3]}})
        config.add_output({{"name": "COMPLETED_IN", "data_type": "TYPE_INT64", "dims": [1]}})
        config.set_max_batch_size(4)
        with open(os.path.join(os.path.dirname(__file__), "completed_in"), "w") as stream:
            stream.write(str(os.getpid()))
        return config

    def execute(self, requests):
        with open(os.path.join(os.path.dirname(__file__), "completed_in")) as stream:
            pid = int(stream.read())
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("Y", {transform}(pb_utils.get_input_tensor_by_name(r, "X").as_numpy())),
            pb_utils.Tensor("COMPLETED_IN", np.array([[pid]], dtype=np.int64))]) for r in requests]
'''

AUTO_CONFIG = """
name: "{name}"
backend: "python"
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_auto_complete_config_runs_where_the_instances_run(tmp_path, kind):
    code = AUTO_MODEL.format(imports="", check="pass", transform="np.negative")
    folder = write_model(tmp_path, "auto", AUTO_CONFIG.format(name="auto", extra=""), code)
    with serve(tmp_path, python_instances=kind) as server:
        config = server.model_config_json("auto")
        assert [t["name"] for t in config["input"]] == ["X"] and config["max_batch_size"] == 4
        result = server.client().infer("auto", {"X": np.array([[1.0, -2.0, 3.0]], np.float32)})
    np.testing.assert_array_equal(result.as_numpy("Y"), [[-1.0, 2.0, -3.0]])
    completed_in = int((folder / "1" / "completed_in").read_text())
    assert (completed_in == os.getpid()) == (kind == "thread")  # a process instance's model: in a process


def test_an_auto_complete_error_in_its_process_fails_the_load_naming_the_model(tmp_path):
    code = AUTO_MODEL.format(imports="", check='raise ValueError("no inputs for you")', transform="np.negative")
    write_model(tmp_path, "auto", AUTO_CONFIG.format(name="auto", extra=""), code)
    with serve(tmp_path, python_instances="process") as server:
        (entry,) = [e for e in server.repository_index() if e["name"] == "auto"]
        assert entry["state"] == "UNAVAILABLE"
        assert "model 'auto': auto_complete_config: no inputs for you" in entry["reason"]


def test_auto_complete_of_an_execution_env_model_uses_its_packages(tmp_path, monkeypatch):
    """The hook of a model whose packages only its packed environment has runs with that
    environment: module-level imports included, as Triton's stub runs it."""
    monkeypatch.setenv("TRITON_NB_ENV_CACHE", str(tmp_path / "cache"))
    archive = _packed_environment(tmp_path)
    extra = ('parameters { key: "EXECUTION_ENV_PATH" value: { string_value: '
             '"$$TRITON_MODEL_DIRECTORY/cards_env.tar.gz" } }')
    code = AUTO_MODEL.format(imports="import cardtools", check="assert cardtools.mask", transform="cardtools.mask")
    folder = write_model(tmp_path / "repo", "packed_auto", AUTO_CONFIG.format(name="packed_auto", extra=extra), code)
    archive.rename(folder / "cards_env.tar.gz")
    with serve(tmp_path / "repo") as server:  # thread instances: the environment makes processes
        result = server.client().infer("packed_auto", {"X": np.array([[1.0, 3.0, 5.0]], np.float32)})
    np.testing.assert_array_equal(result.as_numpy("Y"), [[0.0, 3.0, 5.0]])
    assert int((folder / "1" / "completed_in").read_text()) != os.getpid()


# ---------------------------------------------------------------------- the batch layout


def test_a_batch_travels_joined_by_name_and_comes_back_per_request():
    from triton_nb.backends._tensor_arena import ArenaReader, ArenaWriter, pack_batch, unpack_batch

    same = [{"X": np.full((1, 3), i, np.float32), "TEXT": np.array([[b"a%d" % i, "é".encode()]], dtype=object)}
            for i in range(4)]
    mixed = [{"X": np.ones((1, 3), np.float32)}, {"X": np.ones((2, 4), np.float32)},
             {"X": np.ones((1, 3), np.float64), "EXTRA": np.array(7)}]
    rows = [{"X": np.arange(n * 3, dtype=np.int32).reshape(n, 3) + n} for n in (1, 3, 1, 2)]  # joined, split by rows
    missing = [{"X": np.ones((1, 3), np.float32), "Y": np.zeros((1, 1), np.float32)},
               {"X": np.full((1, 3), 2, np.float32)}]  # Y one each; X joined
    writer, reader = ArenaWriter(f"triton_nb_test_{os.getpid()}"), ArenaReader()
    try:
        for batch, joined in ((same, True), (mixed, False), (rows, True), (missing, None)):
            tensors, plan = pack_batch(batch)
            kinds = {key.startswith("b:") for key, _ in tensors}
            assert kinds == ({True, False} if joined is None else {joined})  # 2 copies for 4 requests, or 1 each
            specs = writer.write(tensors)
            back = unpack_batch(reader.read(writer.name, specs), plan, len(batch))
            for sent, got in zip(batch, back, strict=True):
                assert sent.keys() == got.keys()
                for name, array in sent.items():
                    assert got[name].dtype == array.dtype and got[name].shape == array.shape
                    assert got[name].tolist() == array.tolist()
    finally:
        reader.close()
        writer.close()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"triton_nb_test_{os.getpid()}")]


def test_the_models_process_needs_only_the_standard_library_and_numpy(tmp_path):
    """What the stub imports of triton_nb stays free of protobuf, tritonclient, ml_dtypes, pandas and
    prometheus_client: a packed environment (EXECUTION_ENV_PATH) may have numpy and nothing else.
    A model's custom metrics and its auto_complete_config work there too."""
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(textwrap.dedent('''
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1]})
                config.set_max_batch_size(2)
                return config
    '''))
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(f'''
        import sys, types
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("google", "tritonclient", "grpc", "ml_dtypes", "pandas", "sklearn",
                                          "xgboost", "prometheus_client"):
                    raise ImportError("not in the packed environment: " + name)
        sys.meta_path.insert(0, Block())
        sys.argv = ["stub", "0", {str(Path(python_process.__file__).parents[1])!r}]
        import runpy
        stub = runpy.run_path({python_process._python_stub.__file__!r})
        stub["_bare_packages"](sys.argv[2])
        import triton_nb.backends._process_channel, triton_nb.backends._tensor_arena, triton_nb.backends.python
        # custom metrics work there too, and go to the server as messages
        from triton_nb.backends import pb_utils
        from triton_nb.backends.custom_metrics import CUSTOM_METRICS
        class Channel:
            sent = []
            def send(self, message):
                self.sent.append(message)
        CUSTOM_METRICS.observe_with(stub["_MetricsToServer"](Channel()))
        family = pb_utils.MetricFamily("stub_rows_total", "rows", pb_utils.MetricFamily.COUNTER)
        metric = family.Metric(labels={{"model": "m"}})
        metric.increment(2)
        assert metric.value() == 2.0
        assert Channel.sent == [("metric_family", "stub_rows_total", "rows", 0),
                                ("metric_new", 1, "stub_rows_total", {{"model": "m"}}, None),
                                ("metric_op", 1, "increment", 2.0)], Channel.sent
        # and so does a model's auto_complete_config
        from triton_nb.backends.python import complete_config_json
        completed = complete_config_json({{"name": "m", "backend": "python"}}, "m", {str(version)!r}, "model.py")
        assert completed["input"][0]["name"] == "X" and completed["max_batch_size"] == 2, completed
        print("ok")
    '''))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
