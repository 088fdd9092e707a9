"""The Python backend: Triton Python-backend model.py files, run unchanged and in-process."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
from concurrent.futures import Future

import numpy as np
import pandas as pd
import pytest

from tests.helpers.python_models import SIMPLE_CONFIG, FakeServer, request, write_model
from triton_nb import fraud
from triton_nb.backends import pb_utils
from triton_nb.backends.base import ModelContext
from triton_nb.backends.python import PythonBackend, auto_complete
from triton_nb.errors import InternalError, InvalidArgumentError, NotFoundError
from triton_nb.repository import export_fraud_repository, load_config
from triton_nb.repository.config import effective_config, parse_config
from triton_nb.tensors import InferRequest, InferResponse

# --------------------------------------------------------------------------- real-Triton-style models


PANDAS_MODEL = """
import json

import numpy as np
import pandas as pd
import triton_python_backend_utils as pb_utils
from sklearn.preprocessing import LabelEncoder


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output_config = pb_utils.get_output_config_by_name(model_config, "FEATURES")
        self.output_dtype = pb_utils.triton_string_to_numpy(output_config["data_type"])
        self.encoder = LabelEncoder().fit(["Berlin", "Lima", "Oslo"])

    def execute(self, requests):
        responses = []
        for request in requests:
            city = pb_utils.get_input_tensor_by_name(request, "CITY").as_numpy()
            amount = pb_utils.get_input_tensor_by_name(request, "AMOUNT").as_numpy()
            frame = pd.DataFrame({
                "city": [c.decode("utf-8") for c in city[:, 0]],
                "amount": amount[:, 0],
            })
            frame["code"] = self.encoder.transform(frame["city"])
            frame["double"] = frame["amount"] * 2
            features = frame[["code", "double"]].to_numpy().astype(self.output_dtype)
            out = pb_utils.Tensor("FEATURES", features)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("Cleaning up...")
"""

PANDAS_CONFIG = """
name: "pandas_prep"
backend: "python"
max_batch_size: 16
input [
  { name: "CITY" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "AMOUNT" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [{ name: "FEATURES" data_type: TYPE_FP32 dims: [ 2 ] }]
instance_group [{ kind: KIND_CPU count: 1 }]
"""


def test_real_triton_style_model_with_pandas_and_sklearn(tmp_path, backends):
    backend = backends(write_model(tmp_path, "pandas_prep", PANDAS_MODEL, PANDAS_CONFIG))
    assert backend.decoupled is False
    first = request("pandas_prep", CITY=np.array([[b"Oslo"], [b"Berlin"]], dtype=object),
                    AMOUNT=np.array([[1.5], [2.0]], np.float32))
    second = request("pandas_prep", CITY=np.array([[b"Lima"]], dtype=object), AMOUNT=np.array([[10.0]], np.float32))
    responses = backend.execute([first, second])
    assert [r.error for r in responses] == [None, None]
    np.testing.assert_array_equal(responses[0].outputs["FEATURES"], np.array([[2, 3.0], [0, 4.0]], np.float32))
    np.testing.assert_array_equal(responses[1].outputs["FEATURES"], np.array([[1, 20.0]], np.float32))
    assert responses[0].outputs["FEATURES"].dtype == np.float32
    assert responses[0].model_name == "pandas_prep"


def test_initialize_gets_tritons_args(tmp_path, backends):
    source = """
    import json
    import triton_python_backend_utils as pb_utils

    SEEN = {}

    class TritonPythonModel:
        def initialize(self, args):
            SEEN.update(args)
            self.args = args

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy())]) for r in requests]
    """
    folder = write_model(tmp_path, "argsy", source, SIMPLE_CONFIG.format(name="argsy"), version=3)
    backend = backends(folder, version=3, instance_name="argsy_0_1", device_id=2)
    args = backend._model.args
    assert set(args) == {"model_config", "model_instance_kind", "model_instance_name", "model_instance_device_id",
                         "model_repository", "model_version", "model_name"}
    assert all(isinstance(value, str) for value in args.values())
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_name"] == "argsy_0_1"
    assert args["model_instance_device_id"] == "2"
    assert args["model_repository"] == str(folder)
    assert args["model_version"] == "3"
    assert args["model_name"] == "argsy"
    config = json.loads(args["model_config"])
    assert config["name"] == "argsy" and config["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_FP32" and config["input"][0]["dims"] == [1]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"


def test_pb_utils_is_the_triton_module(tmp_path, backends):
    backends(write_model(tmp_path, "alias", """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([]) for _ in requests]
    """, SIMPLE_CONFIG.format(name="alias")))
    import triton_python_backend_utils

    assert triton_python_backend_utils is pb_utils


def test_input_tensors_by_name_on_server_and_model_made_requests():
    x, names = np.ones((2, 1), np.float32), np.array([[b"a"], [b"b"]], dtype=object)
    served = pb_utils.InferenceRequest._from_server(InferRequest("m", {"X": x, "NAME": names}), decoupled=False,
                                                    output_names=["Y"])
    made = pb_utils.InferenceRequest(model_name="m", inputs=[pb_utils.Tensor("X", x), pb_utils.Tensor("NAME", names)],
                                     requested_output_names=["Y"])
    for each in (served, made):
        assert pb_utils.get_input_tensor_by_name(each, "X").as_numpy() is not None
        np.testing.assert_array_equal(pb_utils.get_input_tensor_by_name(each, "X").as_numpy(), x)
        assert pb_utils.get_input_tensor_by_name(each, "NAME").as_numpy().tolist() == [[b"a"], [b"b"]]
        assert pb_utils.get_input_tensor_by_name(each, "nope") is None
    # the server's arrays are handed over as they are, by name as by position
    assert pb_utils.get_input_tensor_by_name(served, "X").as_numpy() is served.inputs()[0].as_numpy()


# --------------------------------------------------------------------------- the exported fraud repository


@pytest.fixture(scope="module")
def fraud_setup(tmp_path_factory):
    frame = fraud.generate_transactions(4000, seed=1)
    model = fraud.train_fraud_model(frame, num_boost_round=5, progress=False)
    repo = export_fraud_repository(model, tmp_path_factory.mktemp("fraud") / "repo", model_backend="python")
    return frame, model, repo




def fraud_inputs(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    return fraud.request_tensors(rows)


def test_exported_preprocessing_model_matches_the_preprocessor(fraud_setup, backends):
    frame, model, repo = fraud_setup
    path_before = list(sys.path)
    backend = backends(repo / "preprocessing")
    # Its siblings (fraud_encoding, fraud_safe_pickle) stay private to the instance.
    assert "fraud_encoding" not in sys.modules and "fraud_safe_pickle" not in sys.modules
    assert sys.path == path_before
    rows = frame.head(60)
    requests = [InferRequest("preprocessing", fraud_inputs(rows.iloc[i:i + 20])) for i in range(0, 60, 20)]
    responses = backend.execute(requests)
    assert [r.error for r in responses] == [None, None, None]
    got = np.concatenate([r.outputs["OUTPUT"] for r in responses])
    np.testing.assert_array_equal(got, model.preprocessor.transform(rows))
    assert got.dtype == np.float32


def test_exported_preprocessing_fails_one_bad_request_alone(fraud_setup, backends):
    frame, model, repo = fraud_setup
    backend = backends(repo / "preprocessing")
    rows = frame.iloc[100:109]
    bad = fraud_inputs(rows.iloc[3:6])
    bad["Amount"][1, 0] = b"twelve"
    requests = [InferRequest("preprocessing", fraud_inputs(rows.iloc[0:3])), InferRequest("preprocessing", bad),
                InferRequest("preprocessing", fraud_inputs(rows.iloc[6:9]))]
    first, middle, last = backend.execute(requests)
    assert isinstance(middle.error, InvalidArgumentError)  # the template sends INVALID_ARG
    message = str(middle.error)
    assert "'Amount'" in message and "twelve" in message
    assert message.startswith("model 'preprocessing'") and message.count("model 'preprocessing'") == 1
    assert middle.outputs == {}
    np.testing.assert_array_equal(first.outputs["OUTPUT"], model.preprocessor.transform(rows.iloc[0:3]))
    np.testing.assert_array_equal(last.outputs["OUTPUT"], model.preprocessor.transform(rows.iloc[6:9]))


def test_exported_python_tree_twin_matches_the_booster(fraud_setup, backends):
    frame, model, repo = fraud_setup
    backend = backends(repo / "fil")
    rows = frame.sample(300, random_state=3)
    features = model.features(rows)
    responses = backend.execute([InferRequest("fil", {"input__0": features[:120]}),
                                 InferRequest("fil", {"input__0": features[120:]})])
    got = np.concatenate([r.outputs["output__0"] for r in responses])
    assert got.shape == (300,)  # the twin answers in FIL's squeezed shape
    np.testing.assert_array_equal(got, model.predict(rows))


# --------------------------------------------------------------------------- errors

ERROR_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            value = float(x[0, 0])
            if value == 99:
                raise ValueError("boom 99")
            if value == 7:
                responses.append("not a response")
            elif value < 0:
                error = pb_utils.TritonError("X must be >= 0", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            elif value == 404:
                error = pb_utils.TritonError("no such thing", pb_utils.TritonError.NOT_FOUND)
                responses.append(pb_utils.InferenceResponse(error=error))
            elif value == 500:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("oops")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        if len(requests) == 4:
            responses.pop()
        return responses
"""


def x(value: float) -> InferRequest:
    return request("errs", X=np.array([[value]], np.float32))


def test_per_request_errors_keep_their_code(tmp_path, backends):
    backend = backends(write_model(tmp_path, "errs", ERROR_MODEL, SIMPLE_CONFIG.format(name="errs")))
    ok, invalid, missing = backend.execute([x(1), x(-1), x(404)])
    (internal,) = backend.execute([x(500)])
    np.testing.assert_array_equal(ok.outputs["Y"], [[2.0]])
    assert type(invalid.error) is InvalidArgumentError
    assert str(invalid.error) == "X must be >= 0"  # the model's words, unchanged, as in Triton
    assert type(missing.error) is NotFoundError
    assert type(internal.error) is InternalError and str(internal.error) == "oops"


def test_exception_in_execute_fails_the_whole_batch(tmp_path, backends):
    backend = backends(write_model(tmp_path, "errs", ERROR_MODEL, SIMPLE_CONFIG.format(name="errs")))
    with pytest.raises(InternalError, match=r"model 'errs'.*ValueError: boom 99"):
        backend.execute([x(1), x(99)])
    assert backend.execute([x(2)])[0].error is None  # the instance keeps serving


def test_wrong_response_count_or_type_fails_the_batch(tmp_path, backends):
    backend = backends(write_model(tmp_path, "errs", ERROR_MODEL, SIMPLE_CONFIG.format(name="errs")))
    with pytest.raises(InternalError, match=r"model 'errs': execute\(\) returned 3 response\(s\) for 4 request"):
        backend.execute([x(1), x(2), x(3), x(4)])
    with pytest.raises(InternalError, match=r"model 'errs': execute\(\) returned a str for request 1"):
        backend.execute([x(1), x(7)])


def test_initialize_failure_names_the_model(tmp_path):
    folder = write_model(tmp_path, "broken", """
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("no weights here")

        def execute(self, requests):
            return []
    """, SIMPLE_CONFIG.format(name="broken"))
    config = effective_config(load_config(folder), folder_name="broken")
    context = ModelContext("broken", 1, config, folder, folder / "1", tmp_path, "broken_0")
    with pytest.raises(InternalError, match=r"^model 'broken' initialize failed: RuntimeError: no weights here$"):
        PythonBackend(context)
    assert not [name for name in sys.modules if "_triton_nb_python_models.broken" in name]


def test_missing_model_file(tmp_path):
    folder = write_model(tmp_path, "nofile", "", SIMPLE_CONFIG.format(name="nofile"))
    (folder / "1" / "model.py").unlink()
    config = effective_config(load_config(folder), folder_name="nofile")
    with pytest.raises(NotFoundError, match="no Python model file"):
        PythonBackend(ModelContext("nofile", 1, config, folder, folder / "1", tmp_path, "nofile_0"))


# --------------------------------------------------------------------------- BLS

BLS_MODEL = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            bls = pb_utils.InferenceRequest(
                model_name="other",
                inputs=[pb_utils.Tensor("X", x.as_numpy()), pb_utils.Tensor("TAG", np.array([["a"]], dtype=object))],
                requested_output_names=["Y"],
                request_id="bls-1",
                parameters={"mode": "fast"},
                timeout=2500,
            )
            if float(x.as_numpy()[0, 0]) < 0:  # from a thread the model starts itself
                box = []
                worker = threading.Thread(target=lambda: box.append(bls.exec()))
                worker.start()
                worker.join()
                response = box[0]
            else:
                response = bls.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            y = pb_utils.get_output_tensor_by_name(response, "Y")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.as_numpy() + 1)]))
        return responses
"""


def test_bls_exec_reaches_the_instances_server(tmp_path, backends):
    server = FakeServer()
    backend = backends(write_model(tmp_path, "bls", BLS_MODEL, SIMPLE_CONFIG.format(name="bls")), server=server)
    responses = backend.execute([request("bls", X=np.array([[2.0]], np.float32))])
    np.testing.assert_array_equal(responses[0].outputs["Y"], [[21.0]])
    (sent,) = server.requests
    assert sent.model_name == "other" and sent.model_version == -1
    assert sent.requested_outputs == ["Y"] and sent.request_id == "bls-1"
    assert sent.parameters == {"mode": "fast"} and sent.timeout_microseconds == 2500
    np.testing.assert_array_equal(sent.inputs["X"], [[2.0]])
    assert sent.inputs["TAG"].dtype == object and sent.inputs["TAG"][0, 0] == b"a"  # str goes out as bytes


def test_bls_from_a_thread_the_model_starts(tmp_path, backends):
    server = FakeServer()
    backend = backends(write_model(tmp_path, "bls", BLS_MODEL, SIMPLE_CONFIG.format(name="bls")), server=server)
    responses = backend.execute([request("bls", X=np.array([[-1.0]], np.float32))])
    np.testing.assert_array_equal(responses[0].outputs["Y"], [[-9.0]])
    assert len(server.requests) == 1


def test_bls_error_comes_back_in_the_response(tmp_path, backends):
    def answer(r):
        raise NotFoundError("model 'other' is not loaded")

    backend = backends(write_model(tmp_path, "bls", BLS_MODEL, SIMPLE_CONFIG.format(name="bls")),
                       server=FakeServer(answer))
    with pytest.raises(InternalError, match="model 'other' is not loaded"):
        backend.execute([request("bls", X=np.array([[1.0]], np.float32))])


def test_bls_servers_do_not_mix(tmp_path, backends):
    folder_a = write_model(tmp_path / "a", "bls", BLS_MODEL, SIMPLE_CONFIG.format(name="bls"))
    folder_b = write_model(tmp_path / "b", "bls", BLS_MODEL, SIMPLE_CONFIG.format(name="bls"))
    server_a, server_b = FakeServer(), FakeServer()
    backend_a, backend_b = backends(folder_a, server=server_a), backends(folder_b, server=server_b)
    backend_b.execute([request("bls", X=np.array([[1.0]], np.float32))])
    backend_a.execute([request("bls", X=np.array([[-1.0]], np.float32))])
    backend_a.execute([request("bls", X=np.array([[1.0]], np.float32))])
    assert (len(server_a.requests), len(server_b.requests)) == (2, 1)


def test_bls_outside_a_model_is_a_clear_error():
    bls = pb_utils.InferenceRequest(model_name="other", inputs=[], requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException, match="no triton_nb server is reachable"):
        bls.exec()


ASYNC_BLS_MODEL = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        pending = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            bls = pb_utils.InferenceRequest(model_name="other", inputs=[x], requested_output_names=["Y"])
            pending.append(bls.async_exec())
        answers = await asyncio.gather(*pending)
        return [
            pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "Y")])
            for answer in answers
        ]
"""


def test_async_exec_from_an_async_execute(tmp_path, backends):
    server = FakeServer()
    backend = backends(write_model(tmp_path, "abls", ASYNC_BLS_MODEL, SIMPLE_CONFIG.format(name="abls")),
                       server=server)
    responses = backend.execute([request("abls", X=np.array([[1.0]], np.float32)),
                                 request("abls", X=np.array([[3.0]], np.float32))])
    assert [r.outputs["Y"][0, 0] for r in responses] == [10.0, 30.0]
    assert len(server.requests) == 2


def test_decoupled_bls_exec_iterates_the_stream(tmp_path, backends):
    class StreamingServer(FakeServer):
        def infer_async(self, request):
            self.requests.append(request)
            future: Future = Future()

            def stream():
                for i in range(3):
                    request.response_sender(InferResponse("other", 1, outputs={"Y": np.array([i], np.int32)}), False)
                request.response_sender(None, True)
                future.set_result(None)

            threading.Thread(target=stream).start()
            return future

    source = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                bls = pb_utils.InferenceRequest(model_name="other", inputs=request.inputs(),
                                                requested_output_names=["Y"])
                values = []
                for response in bls.exec(decoupled=True):
                    if response.has_error():
                        raise pb_utils.TritonModelException(response.error().message())
                    if response.output_tensors():
                        values.append(int(pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()[0]))
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([[sum(values)]], np.float32))]))
            return out
    """
    server = StreamingServer()
    backend = backends(write_model(tmp_path, "dbls", source, SIMPLE_CONFIG.format(name="dbls")), server=server)
    (response,) = backend.execute([request("dbls", X=np.array([[1.0]], np.float32))])
    assert response.outputs["Y"][0, 0] == 0 + 1 + 2


# --------------------------------------------------------------------------- auto-complete

AUTO_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(32)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
"""


def test_auto_complete_config_fills_tensors_and_batching(tmp_path, backends):
    folder = write_model(tmp_path, "auto", AUTO_MODEL, 'backend: "python"\n')
    config = parse_config((folder / "config.pbtxt").read_text())
    completed = auto_complete(config, folder / "1")
    assert len(config.input) == 0  # the argument is left alone
    assert [(t.name, list(t.dims)) for t in completed.input] == [("IN", [4])]
    assert [(t.name, list(t.dims)) for t in completed.output] == [("OUT", [4])]
    assert completed.max_batch_size == 32
    assert completed.HasField("dynamic_batching")
    assert completed.backend == "python"
    assert not [name for name in sys.modules if name.startswith("_triton_nb_python_models.auto_")]


def test_auto_complete_refuses_contradictions(tmp_path):
    folder = write_model(tmp_path, "auto", AUTO_MODEL, """
    backend: "python"
    max_batch_size: 64
    input [{ name: "IN" data_type: TYPE_INT32 dims: [ 4 ] }]
    """)
    config = parse_config((folder / "config.pbtxt").read_text())
    with pytest.raises(InvalidArgumentError, match="configuration expects datatype TYPE_INT32 for input 'IN'"):
        auto_complete(config, folder / "1")


def test_auto_complete_without_the_hook_returns_the_config(tmp_path):
    folder = write_model(tmp_path, "plain", ERROR_MODEL, SIMPLE_CONFIG.format(name="plain"))
    config = parse_config((folder / "config.pbtxt").read_text())
    assert auto_complete(config, folder / "1") == config


def test_model_config_helper_rules():
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 8, "input": [], "output": [],
                                              "sequence_batching": {}}))
    with pytest.raises(ValueError, match="max_batch_size 8"):
        config.set_max_batch_size(4)
    with pytest.raises(ValueError, match="sequence_batching"):
        config.set_dynamic_batching()
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_input({"name": "A", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="property other than"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    config.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="trying to change decoupled"):
        config.set_model_transaction_policy({"decoupled": False})
    assert config.as_dict()["model_transaction_policy"] == {"decoupled": True}


# --------------------------------------------------------------------------- logging and finalize


def test_logger_routes_to_python_logging(tmp_path, backends, caplog):
    source = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            pb_utils.Logger.log_info("loaded")

        def execute(self, requests):
            logger = pb_utils.Logger
            logger.log_warn("careful")
            logger.log_error("bad")
            logger.log_verbose("details")
            logger.log("explicit", logger.ERROR)
            pb_utils.Logger.log("default level")
            return [pb_utils.InferenceResponse([]) for _ in requests]
    """
    caplog.set_level(logging.DEBUG, logger="triton_nb.python_backend")
    backend = backends(write_model(tmp_path, "chatty", source, SIMPLE_CONFIG.format(name="chatty")))
    backend.execute([request("chatty", X=np.zeros((1, 1), np.float32))])
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("triton_nb.python")]
    name = "triton_nb.python_backend.chatty"
    assert records == [
        (name, logging.INFO, "loaded"),
        (name, logging.WARNING, "careful"),
        (name, logging.ERROR, "bad"),
        (name, logging.DEBUG, "details"),
        (name, logging.ERROR, "explicit"),
        (name, logging.INFO, "default level"),
    ]


def test_finalize_is_called_and_its_exception_logged(tmp_path, caplog):
    source = """
    import triton_python_backend_utils as pb_utils

    CALLS = []

    class TritonPythonModel:
        def execute(self, requests):
            return []

        def finalize(self):
            CALLS.append("finalize")
            raise RuntimeError("cleanup went wrong")
    """
    folder = write_model(tmp_path, "fin", source, SIMPLE_CONFIG.format(name="fin"))
    config = effective_config(load_config(folder), folder_name="fin")
    backend = PythonBackend(ModelContext("fin", 1, config, folder, folder / "1", tmp_path, "fin_0"))
    module = sys.modules[type(backend._model).__module__]
    with caplog.at_level(logging.ERROR, logger="triton_nb.python_backend.fin"):
        backend.finalize()
    assert module.CALLS == ["finalize"]
    assert any("cleanup went wrong" in (r.exc_text or "") or "cleanup went wrong" in str(r.exc_info)
               for r in caplog.records)
    assert module.__name__ not in sys.modules  # the instance's modules are gone
    backend.finalize()  # twice is harmless
    assert module.CALLS == ["finalize"]


# --------------------------------------------------------------------------- tensors and helpers


def test_serialize_and_deserialize_bytes_round_trip():
    array = np.array([[b"abc", b""], [b"\x00\xff", "h\u00e9llo"]], dtype=object)
    encoded = pb_utils.serialize_byte_tensor(array)
    assert encoded[:7] == b"\x03\x00\x00\x00abc"
    decoded = pb_utils.deserialize_bytes_tensor(encoded)
    assert decoded.dtype == object and decoded.shape == (4,)
    assert list(decoded) == [b"abc", b"", b"\x00\xff", "h\u00e9llo".encode()]
    assert list(pb_utils.deserialize_bytes_tensor(np.frombuffer(encoded, np.uint8))) == list(decoded)
    assert pb_utils.serialize_byte_tensor(np.array([1.0])) is None
    with pytest.raises(pb_utils.TritonModelException, match="beyond buffer"):
        pb_utils.deserialize_bytes_tensor(b"\x09\x00\x00\x00abc")


def test_tensor_dlpack_round_trip():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = pb_utils.Tensor("INPUT0", array)
    capsule = tensor.to_dlpack()
    back = pb_utils.Tensor.from_dlpack("OUT", capsule)
    assert back.name() == "OUT" and back.triton_dtype() == 11 and back.shape() == [3, 4]
    np.testing.assert_array_equal(back.as_numpy(), array)
    assert np.shares_memory(back.as_numpy(), array)  # no copy
    np.testing.assert_array_equal(np.from_dlpack(tensor), array)  # Tensor speaks __dlpack__ too
    readonly = array.copy()
    readonly.flags.writeable = False
    np.testing.assert_array_equal(pb_utils.Tensor.from_dlpack("R", pb_utils.Tensor("R", readonly)).as_numpy(), array)
    with pytest.raises(pb_utils.TritonModelException, match="DLPack"):
        pb_utils.Tensor("S", np.array([b"x"], dtype=object)).to_dlpack()


def test_tensor_types_follow_triton():
    assert pb_utils.Tensor("A", np.zeros(2, np.float32)).triton_dtype() == 11
    assert pb_utils.Tensor("B", np.array([b"x"], dtype=object)).triton_dtype() == 13
    assert pb_utils.Tensor("C", np.array([b"x"], dtype=np.bytes_)).triton_dtype() == 13
    assert pb_utils.Tensor("D", np.zeros(2, np.bool_)).triton_dtype() == 1
    with pytest.raises(pb_utils.TritonModelException, match=r"np\.object_"):
        pb_utils.Tensor("U", np.array(["text"]))
    with pytest.raises(pb_utils.TritonModelException, match="empty"):
        pb_utils.Tensor("", np.zeros(1))
    strided = np.arange(10, dtype=np.int64)[::2]
    assert pb_utils.Tensor("E", strided).as_numpy().flags.c_contiguous
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.dtype("int64")) == 9
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.dtype("<U3")) is None
    assert pb_utils.triton_to_numpy_type(11) is np.float32
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.TritonError.NOT_FOUND == 2 and pb_utils.TritonError.CANCELLED == 7
    error = pb_utils.TritonError("gone", pb_utils.TritonError.NOT_FOUND)
    assert (error.message(), error.code()) == ("gone", pb_utils.TritonError.NOT_FOUND)
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL


def test_string_outputs_reach_the_server_as_bytes(tmp_path, backends):
    source = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                names = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()
                assert names.dtype == np.object_ and isinstance(names[0, 0], bytes)
                greeting = np.array([["hi " + n.decode()] for n in names[:, 0]], dtype=object)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("GREETING", greeting)]))
            return out
    """
    config = """
    name: "greet"
    backend: "python"
    max_batch_size: 4
    input [{ name: "NAME" data_type: TYPE_STRING dims: [ 1 ] }]
    output [{ name: "GREETING" data_type: TYPE_STRING dims: [ 1 ] }]
    """
    backend = backends(write_model(tmp_path, "greet", source, config))
    names = np.array([[b"ana"], [b"b\xc3\xb8"]], dtype=object)
    (response,) = backend.execute([request("greet", NAME=names)])
    greeting = response.outputs["GREETING"]
    assert greeting.dtype == object and greeting.shape == (2, 1)
    assert list(greeting[:, 0]) == [b"hi ana", "hi bø".encode()]


def test_inputs_are_not_copied(tmp_path, backends):
    source = """
    import triton_python_backend_utils as pb_utils

    SEEN = []

    class TritonPythonModel:
        def execute(self, requests):
            SEEN.extend(t.as_numpy() for r in requests for t in r.inputs())
            return [pb_utils.InferenceResponse([]) for _ in requests]
    """
    backend = backends(write_model(tmp_path, "nocopy", source, SIMPLE_CONFIG.format(name="nocopy")))
    data = np.ones((2, 1), np.float32)
    backend.execute([request("nocopy", X=data)])
    assert sys.modules[type(backend._model).__module__].SEEN[0] is data


def test_request_metadata(tmp_path, backends):
    source = """
    import json
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            self.seen = [(r.request_id(), r.correlation_id(), r.flags(), json.loads(r.parameters()),
                          r.requested_output_names(), r.is_cancelled(), r.timeout()) for r in requests]
            return [pb_utils.InferenceResponse([], parameters={"note": "ok"}) for _ in requests]
    """
    backend = backends(write_model(tmp_path, "meta", source, SIMPLE_CONFIG.format(name="meta")))
    req = InferRequest("meta", {"X": np.zeros((1, 1), np.float32)}, request_id="r1", timeout_microseconds=30,
                       parameters={"sequence_id": 42, "sequence_start": True, "custom": "v"})
    (response,) = backend.execute([req])
    assert backend._model.seen == [("r1", 42, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, {"custom": "v"},
                                    ["Y"], False, 30)]
    assert response.parameters == {"note": "ok"} and response.request_id == "r1"


def test_pb_utils_lookups():
    config = {"input": [{"name": "A", "data_type": "TYPE_FP32"}], "output": [{"name": "B", "data_type": "TYPE_STRING"}]}
    assert pb_utils.get_input_config_by_name(config, "A")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_input_config_by_name(config, "B") is None
    assert pb_utils.get_output_config_by_name(config, "B")["data_type"] == "TYPE_STRING"
    assert pb_utils.using_decoupled_model_transaction_policy({"model_transaction_policy": {"decoupled": True}})
    response = pb_utils.InferenceResponse([pb_utils.Tensor("B", np.array([1]))])
    assert pb_utils.get_output_tensor_by_name(response, "B").as_numpy()[0] == 1
    assert pb_utils.get_output_tensor_by_name(response, "C") is None
    assert asyncio.iscoroutinefunction(pb_utils.InferenceRequest.async_exec) is False  # returns an awaitable
