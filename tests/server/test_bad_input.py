"""Bad input, one table, three paths: every case is sent in-process (``server.infer``), over HTTP
(tritonclient.http, binary tensors) and over gRPC (tritonclient.grpc) to the exported fraud
repository, and must fail the same way on each — the same message, naming the model and tensor,
and the HTTP status and gRPC code that the in-process error class maps to (``wire_status``).

Cases only the wire can express (malformed JSON, binary sizes that do not add up, oversize and
gzip-bomb bodies) are in test_network_fuzz.py; the ones only Python can express (a list where an
array belongs) are at the end of this file. Also here: what is *accepted* on purpose (NaN into
the FIL model is XGBoost's "missing"), and that logs never carry tensor contents.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_nb import serve
from triton_nb.errors import InvalidArgumentError, NotFoundError, TritonNBError, wire_status
from triton_nb.fraud.encoding import RAW_INPUT_COLUMNS
from triton_nb.repository import export_fraud_repository
from triton_nb.server.models.checks import check_request
from triton_nb.tensors import InferRequest, numpy_to_triton_dtype, text_to_bytes

MAX_STRING_BYTES = 4096
SECRET = "Zebra-Quokka-7731"  # a value no log line may ever show


def _ensemble_inputs(frame, rows: int = 2) -> dict[str, np.ndarray]:
    """The raw TabFormer columns as the ensemble's tensors: numbers FP32, the rest BYTES."""
    sample = frame.head(rows)
    tensors = {}
    for column in RAW_INPUT_COLUMNS:
        if column in ("User", "Card", "Year", "Month", "Day"):
            tensors[column] = sample[column].to_numpy(np.float32).reshape(-1, 1)
        else:
            tensors[column] = text_to_bytes(sample[column]).reshape(-1, 1)
    return tensors


@dataclass
class Case:
    """One bad request: which model, how to spoil good inputs, and the error every path gives."""

    id: str
    model: str
    spoil: object  # callable(frame) -> dict of tensors
    error: type[TritonNBError]
    message: str  # a regex the message (the same on all three paths) must match
    version: str = ""
    extra: dict = field(default_factory=dict)


def _with(frame, **changes) -> dict[str, np.ndarray]:
    tensors = _ensemble_inputs(frame)
    for name, value in changes.items():
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    return tensors


def _features(rows: int = 2, width: int = 15, dtype=np.float32) -> dict[str, np.ndarray]:
    return {"input__0": np.ones((rows, width), dtype)}


def _spoiled(name: str, value) -> object:
    """The ensemble's good inputs with one FP32 value replaced in the second row."""
    def spoil(frame):
        tensors = _ensemble_inputs(frame)
        tensors[name] = tensors[name].copy()
        tensors[name][1, 0] = value
        return tensors
    return spoil


CASES = [
    Case("missing input", "ensemble", lambda f: _with(f, MCC=None), InvalidArgumentError,
         r"expected 14 inputs but got 13 inputs for model 'ensemble'.*missing required input\(s\) \['MCC'\]"),
    Case("extra input", "ensemble", lambda f: _with(f, Bogus=np.ones((2, 1), np.float32)), InvalidArgumentError,
         r"expected 14 inputs but got 15 inputs for model 'ensemble'"),
    Case("wrong datatype", "fil", lambda f: _features(dtype=np.float64), InvalidArgumentError,
         r"inference input 'input__0' data-type is 'FP64', but model 'fil' expects 'FP32'"),
    Case("BYTES into a numeric input", "ensemble",
         lambda f: _with(f, User=np.array([[b"12"], [b"13"]], dtype=object)), InvalidArgumentError,
         r"inference input 'User' data-type is 'BYTES', but model 'ensemble' expects 'FP32'"),
    Case("numbers into a BYTES input", "ensemble", lambda f: _with(f, MCC=np.ones((2, 1), np.int64)),
         InvalidArgumentError, r"inference input 'MCC' data-type is 'INT64', but model 'ensemble' expects 'BYTES'"),
    Case("wrong shape", "fil", lambda f: _features(width=14), InvalidArgumentError,
         r"unexpected shape for input 'input__0' for model 'fil'\. Expected \[-1,15\], got \[2,14\]"),
    Case("missing batch dimension", "ensemble", lambda f: _with(f, User=np.ones(2, np.float32)), InvalidArgumentError,
         r"unexpected shape for input 'User' for model 'ensemble'\. Expected \[-1,1\], got \[2\]"),
    Case("inputs of different batch sizes", "ensemble", lambda f: _with(f, User=np.ones((3, 1), np.float32)),
         InvalidArgumentError, r"model 'ensemble': inputs have different batch sizes"),
    Case("batch over max_batch_size", "fil", lambda f: _features(rows=4097), InvalidArgumentError,
         r"inference request batch-size must be <= 4096 for 'fil'"),
    Case("empty batch", "fil", lambda f: _features(rows=0), InvalidArgumentError,
         r"inference request batch-size must be <= 4096 for 'fil'"),
    Case("unknown model", "frod", lambda f: _features(), NotFoundError,
         r"Request for unknown model: 'frod' is not found"),
    Case("unknown version", "fil", lambda f: _features(), NotFoundError,
         r"Request for unknown model: 'fil' version 7 is not found", version="7"),
    Case("unknown output", "fil", lambda f: _features(), InvalidArgumentError,
         r"unexpected inference output 'nope' for model 'fil'", extra={"outputs": ["nope"]}),
    Case("NaN in an FP32 feature", "ensemble", _spoiled("User", np.nan), InvalidArgumentError,
         r"model 'preprocessing': column 'User' has missing or non-finite value\(s\): 'nan'"),
    Case("+inf in an FP32 feature", "ensemble", _spoiled("Year", np.inf), InvalidArgumentError,
         r"model 'preprocessing': column 'Year' has missing or non-finite value\(s\): 'inf'"),
    Case("-inf in an FP32 feature", "ensemble", _spoiled("Card", -np.inf), InvalidArgumentError,
         r"model 'preprocessing': column 'Card' has missing or non-finite value\(s\): '-inf'"),
    Case("enormous string", "ensemble",
         lambda f: _with(f, **{"Merchant City": np.array([[b"x" * 100_000], [b"Ames"]], dtype=object)}),
         InvalidArgumentError,
         rf"input 'Merchant City' for model 'ensemble' has a 100000-byte element, over the {MAX_STRING_BYTES}-byte "
         r"limit \(max_string_bytes\)"),
    Case("an amount that is not money", "ensemble",
         lambda f: _with(f, Amount=np.array([[b"$1.00"], [b"twelve"]], dtype=object)), InvalidArgumentError,
         r"ensemble 'ensemble', step 0 \('preprocessing'\).*'Amount'"),
]


@pytest.fixture(scope="module")
def server(trained, tmp_path_factory):
    root = export_fraud_repository(trained, tmp_path_factory.mktemp("bad-input") / "repo")
    with serve(root, http_port=0, grpc_port=0, max_string_bytes=MAX_STRING_BYTES) as running:
        yield running


@pytest.fixture(scope="module")
def clients(server):
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield http, grpc
    http.close()
    grpc.close()


def _wire_inputs(module, tensors: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, array in tensors.items():
        tensor = module.InferInput(name, list(array.shape), numpy_to_triton_dtype(array.dtype))
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=True)
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _send_in_process(server, case: Case, tensors) -> BaseException:
    request = InferRequest(case.model, tensors, model_version=int(case.version or -1),
                           requested_outputs=case.extra.get("outputs"))
    with pytest.raises(TritonNBError) as caught:
        server.infer(request, timeout_s=60)
    return caught.value


def _send_wire(module, client, case: Case, tensors) -> InferenceServerException:
    outputs = [module.InferRequestedOutput(o) for o in case.extra.get("outputs", [])] or None
    with pytest.raises(InferenceServerException) as caught:
        client.infer(case.model, _wire_inputs(module, tensors), model_version=case.version, outputs=outputs)
    return caught.value


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_bad_input_fails_alike_on_all_three_paths(server, clients, fraud_frame, case):
    tensors = case.spoil(fraud_frame)
    http, grpc = clients
    in_process = _send_in_process(server, case, tensors)
    assert isinstance(in_process, case.error), in_process
    http_status, grpc_code = wire_status(in_process)
    over_http = _send_wire(httpclient, http, case, tensors)
    over_grpc = _send_wire(grpcclient, grpc, case, tensors)
    messages = {"in-process": str(in_process), "http": over_http.message(), "grpc": over_grpc.message()}
    assert len(set(messages.values())) == 1, messages  # one message, word for word, on every path
    assert re.search(case.message, messages["in-process"]), messages["in-process"]
    assert over_http.status() == str(http_status)
    assert over_grpc.status() == f"StatusCode.{grpc_code}"
    assert 400 <= http_status < 500  # bad input is the client's error, never the server's


def test_the_server_still_serves_after_every_bad_input(server, clients, fraud_frame, trained):
    http, grpc = clients
    tensors = _ensemble_inputs(fraud_frame, rows=8)
    expected = trained.predict(fraud_frame.head(8))
    got_in_process = server.infer(InferRequest("ensemble", tensors), timeout_s=60).as_numpy("predictions")
    got_http = http.infer("ensemble", _wire_inputs(httpclient, tensors)).as_numpy("predictions")
    got_grpc = grpc.infer("ensemble", _wire_inputs(grpcclient, tensors)).as_numpy("predictions")
    for got in (got_in_process, got_http, got_grpc):
        np.testing.assert_array_equal(got, expected)
    assert server.pending_requests == 0


def test_nan_into_the_fil_model_is_xgboosts_missing_value_on_all_paths(server, clients, trained, fraud_frame):
    """Not an error on purpose: Triton's FIL backend, like XGBoost, reads NaN as "missing" and
    follows each split's default branch; the preprocessing is what refuses NaN in raw columns."""
    http, grpc = clients
    features = trained.features(fraud_frame.head(4)).astype(np.float32)
    features[1, 2] = np.nan
    features[3, :] = np.nan
    proba = trained.booster.inplace_predict(features, iteration_range=(0, trained.best_iteration + 1))
    expected = (proba > trained.threshold).astype(np.float32)
    tensors = {"input__0": features}
    got = [
        server.infer(InferRequest("fil", tensors), timeout_s=60).as_numpy("output__0"),
        http.infer("fil", _wire_inputs(httpclient, tensors)).as_numpy("output__0"),
        grpc.infer("fil", _wire_inputs(grpcclient, tensors)).as_numpy("output__0"),
    ]
    for answer in got:
        np.testing.assert_array_equal(answer, expected)


def test_the_string_limit_counts_utf8_bytes_and_refuses_bad_settings(tmp_path, trained, fraud_frame):
    root = export_fraud_repository(trained, tmp_path / "repo")
    with serve(root, max_string_bytes=8) as server:
        target = server._resolve("ensemble")
        tensors = {name: np.array([[b"a"]], dtype=object) if array.dtype.kind == "O" else array
                   for name, array in _ensemble_inputs(fraud_frame, rows=1).items()}
        tensors["Merchant City"] = np.array([["ü" * 4]], dtype=object)  # 4 characters, 8 bytes: fits
        check_request(target, InferRequest("ensemble", tensors), max_string_bytes=8)
        tensors["Merchant City"] = np.array([["ü" * 5]], dtype=object)  # 5 characters, 10 bytes
        with pytest.raises(InvalidArgumentError, match=r"'Merchant City' .* 10-byte element, over the 8-byte"):
            check_request(target, InferRequest("ensemble", tensors), max_string_bytes=8)
        tensors["Merchant City"] = np.array([[b"123456789"]], dtype="S9")  # fixed-width bytes arrays too
        with pytest.raises(InvalidArgumentError, match=r"9-byte element, over the 8-byte"):
            server.infer(InferRequest("ensemble", tensors), timeout_s=60)
    with pytest.raises(InvalidArgumentError, match=r"max_string_bytes must be >= 1, got 0"):
        serve(root, max_string_bytes=0)


# ---------------------------------------------------------------------- in-process only
@pytest.mark.parametrize(("tensors", "message"), [
    ({"input__0": [[1.0] * 15]}, r"model 'fil': input 'input__0' must be a numpy array"),
    ({"input__0": np.ones((1, 15), np.uint64).astype("M8[s]")},
     r"inference input 'input__0' data-type is '<invalid: numpy datetime64\[s\]>', but model 'fil' expects 'FP32'"),
    ({"input__0": np.array([["1.0"] * 15])},
     r"inference input 'input__0' data-type is 'BYTES', but model 'fil' expects 'FP32'"),
], ids=["a list", "datetimes", "numpy unicode"])
def test_python_objects_only_the_in_process_path_can_send(server, tensors, message):
    with pytest.raises(InvalidArgumentError, match=message):
        server.infer(InferRequest("fil", tensors), timeout_s=60)


# ---------------------------------------------------------------------- logs
def test_logs_never_carry_tensor_contents(server, clients, fraud_frame, caplog, capfd):
    """Served and refused requests on all three paths, with every logger at DEBUG: the value
    sent (which the refusal's message does quote back to its client) appears in no log line."""
    http, grpc = clients
    caplog.set_level(logging.DEBUG)
    secret = np.array([[SECRET.encode()], [b"Ames"]], dtype=object)
    good = _with(fraud_frame, **{"Merchant City": secret})
    bad = _with(fraud_frame, **{"Merchant City": secret, "Amount": np.array([[b"$1"], [SECRET.encode()]], object)})
    server.infer(InferRequest("ensemble", good), timeout_s=60)
    http.infer("ensemble", _wire_inputs(httpclient, good))
    grpc.infer("ensemble", _wire_inputs(grpcclient, good))
    refusals = []
    for send in (lambda: server.infer(InferRequest("ensemble", bad), timeout_s=60),
                 lambda: http.infer("ensemble", _wire_inputs(httpclient, bad)),
                 lambda: grpc.infer("ensemble", _wire_inputs(grpcclient, bad))):
        with pytest.raises((TritonNBError, InferenceServerException)) as caught:
            send()
        refusals.append(str(caught.value))
    assert all(SECRET in text for text in refusals)  # the client is told what was wrong...
    logged = "\n".join(record.getMessage() for record in caplog.records)
    captured = capfd.readouterr()
    assert SECRET not in logged  # ...the logs are not
    assert SECRET not in captured.out and SECRET not in captured.err



@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_binary_tensors_at_any_offset_of_a_body_are_decoded_aligned(offset):
    """A binary tensor starts wherever the JSON header (or the tensor before it) ends; native code
    such as XGBoost's C API refuses misaligned data, so the decoder copies a misaligned view."""
    from triton_nb.server.frontends.protocol import array_from_buffer

    x = np.arange(6, dtype=np.float32)
    body = bytes(offset) + x.tobytes()
    got = array_from_buffer("fil", "input__0", "FP32", (2, 3), memoryview(body)[offset:])
    assert got.flags.aligned
    np.testing.assert_array_equal(got, x.reshape(2, 3))


def test_the_first_step_checks_only_the_batch_size_it_may_bound_lower(server, fraud_frame):
    # The preprocessing step's inputs are the ensemble's own, already checked against equal specs: the
    # server skips its tensor-by-tensor check, but not a max_batch_size lowered live below the ensemble's.
    ensemble = server._manager.resolve("ensemble", -1).ensemble
    preprocessing = server._manager.resolve("preprocessing", -1)
    assert ensemble._first_step_given(preprocessing)
    client = server.client()
    before = server.update_batching("preprocessing")["max_batch_size"]
    server.update_batching("preprocessing", max_batch_size=1)
    try:
        with pytest.raises(InvalidArgumentError, match=r"step 0 \('preprocessing'\).*batch-size must be <= 1"):
            client.infer("ensemble", _ensemble_inputs(fraud_frame, rows=2))
        assert client.infer("ensemble", _ensemble_inputs(fraud_frame, rows=1)).as_numpy("predictions").shape == (1,)
    finally:
        server.update_batching("preprocessing", max_batch_size=before)


def test_a_step_whose_specs_differ_from_the_ensembles_is_checked_in_full(server):
    from triton_nb.server.models.checks import passes_as_given

    ensemble = server._manager.resolve("ensemble", -1)
    step = ensemble.ensemble.plan[0]
    preprocessing = server._manager.resolve("preprocessing", -1)
    specs = dict(ensemble.inputs)
    assert passes_as_given(preprocessing, specs, True, step.inputs, step.requested)
    assert not passes_as_given(preprocessing, specs, False, step.inputs, step.requested)  # batching differs
    assert not passes_as_given(preprocessing, specs, True, step.inputs[1:], step.requested)  # an input not given
    assert not passes_as_given(preprocessing, specs, True, step.inputs, (*step.requested, "nope"))  # no such output
    other = next(name for name, spec in specs.items() if spec.dtype.kind == "f")
    specs[other] = next(spec for spec in specs.values() if spec.dtype.kind == "O")  # FP32 checked as BYTES
    assert not passes_as_given(preprocessing, specs, True, step.inputs, step.requested)


def test_a_signature_that_passed_before_still_has_each_requests_own_values_checked(server, fraud_frame):
    # The check keeps the signatures (names, types, datatypes, shapes) that passed, per version; what
    # varies from one request to the next is still checked every time: string lengths, batch size
    # against the live limit, requested outputs, and a datatype or shape that differs is a new signature.
    target = server._manager.resolve("ensemble", -1)
    target.conforming.clear()
    good = _ensemble_inputs(fraud_frame, rows=1)
    check_request(target, InferRequest("ensemble", good), max_string_bytes=64)
    assert len(target.conforming) == 1
    check_request(target, InferRequest("ensemble", dict(good)), max_string_bytes=64)
    assert len(target.conforming) == 1  # the same signature, looked up

    def with_city(value) -> dict[str, np.ndarray]:
        return {**good, "Merchant City": np.array([[value]], dtype=object)}

    with pytest.raises(InvalidArgumentError, match=r"'Merchant City' for model 'ensemble' has a 65-byte element"):
        check_request(target, InferRequest("ensemble", with_city(b"x" * 65)), max_string_bytes=64)
    check_request(target, InferRequest("ensemble", with_city("ü" * 32)), max_string_bytes=64)  # 64 bytes: fits
    with pytest.raises(InvalidArgumentError, match=r"'Merchant City' .* has a 66-byte element, over the 64-byte limit"):
        check_request(target, InferRequest("ensemble", with_city("ü" * 33)), max_string_bytes=64)
    check_request(target, InferRequest("ensemble", with_city(5)), max_string_bytes=64)  # not a string: not ours
    assert len(target.conforming) == 1

    two = _ensemble_inputs(fraud_frame, rows=2)
    check_request(target, InferRequest("ensemble", two), max_string_bytes=64)
    with pytest.raises(InvalidArgumentError, match=r"batch-size must be <= 1 for 'ensemble'"):
        check_request(target, InferRequest("ensemble", two), live_max_batch_size=1)
    with pytest.raises(InvalidArgumentError, match=r"unexpected inference output 'nope' for model 'ensemble'"):
        check_request(target, InferRequest("ensemble", good, requested_outputs=["nope"]))
    with pytest.raises(InvalidArgumentError, match=r"inference input 'User' data-type is 'FP64'"):
        check_request(target, InferRequest("ensemble", {**good, "User": good["User"].astype(np.float64)}))
    with pytest.raises(InvalidArgumentError, match=r"unexpected shape for input 'User'"):
        check_request(target, InferRequest("ensemble", {**good, "User": good["User"].reshape(1, 1, 1)}))
    with pytest.raises(InvalidArgumentError, match=r"input 'User' must be a numpy array"):
        check_request(target, InferRequest("ensemble", {**good, "User": [[1.0]]}))
    assert len(target.conforming) == 2  # rows 1 and rows 2; what failed is not kept

    class Tagged(np.ndarray):  # a subclass passes, as before, by the full check, and is not kept
        pass

    check_request(target, InferRequest("ensemble", {**good, "User": good["User"].view(Tagged)}))
    assert len(target.conforming) == 2


def test_the_table_of_signatures_that_passed_stays_bounded(server, fraud_frame):
    from triton_nb.server.models.checks import _MAX_SIGNATURES

    target = server._manager.resolve("ensemble", -1)
    target.conforming.clear()
    many = _ensemble_inputs(fraud_frame, rows=_MAX_SIGNATURES + 20)
    for rows in range(1, _MAX_SIGNATURES + 21):
        check_request(target, InferRequest("ensemble", {name: array[:rows] for name, array in many.items()}))
        assert 1 <= len(target.conforming) <= _MAX_SIGNATURES


def test_a_batching_models_request_without_inputs_is_left_to_the_full_check():
    # no tensor to read a batch size from: the table keeps nothing, and the full check judges it
    from types import SimpleNamespace

    from triton_nb.repository.config import ModelConfig
    from triton_nb.server.models.checks import _conforms

    target = SimpleNamespace(name="m", version=1, config=ModelConfig(name="m", max_batch_size=8), inputs={},
                             required=frozenset(), outputs=frozenset({"y"}), conforming={})
    assert not _conforms(target, InferRequest("m", {}), 8, None)
    assert not target.conforming
    check_request(target, InferRequest("m", {}))  # what the full check makes of it: no input, nothing wrong
