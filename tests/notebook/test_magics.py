"""The IPython magics, on a real InteractiveShell (its magics raise, so errors fail the test)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import triton_nb
from tests.helpers.scale_models import write_scale_model
from triton_nb import fraud
from triton_nb.fraud import label_predictions
from triton_nb.notebook.magics import TritonMagics

ROOT = Path(__file__).resolve().parents[2]
CSV = "X_0,X_1\n1,2\n3,4\n"


@pytest.fixture(scope="module")
def shell():
    shell = InteractiveShell.instance()
    triton_nb.load_ipython_extension(shell)
    yield shell
    triton_nb.notebook.magics.unload_ipython_extension(shell)


@pytest.fixture(scope="module")
def magics(shell) -> TritonMagics:
    return shell.magics_manager.registry["TritonMagics"]


@pytest.fixture(scope="module")
def started(shell, magics, tmp_path_factory):
    repo = tmp_path_factory.mktemp("magics-repo")
    write_scale_model(repo)
    write_scale_model(repo, name="triple", factor=3.0)
    with (repo / "triple" / "config.pbtxt").open("a") as config:  # a knob Triton ignores on CPU
        config.write("optimization { cuda { graphs: true } }\n")
    shell.run_line_magic("triton", f"start {repo} --http-port 0 --grpc-port 0")
    yield magics.server
    if magics.server is not None:
        shell.run_line_magic("triton", "stop")


@pytest.fixture
def settings(magics):
    yield magics
    magics.protocol, magics.url, magics.server_variable = "inprocess", "", ""


def one_line_usage(call, pattern: str) -> str:
    with pytest.raises(UsageError, match=pattern) as caught:
        call()
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_loading_twice_registers_once(shell, magics):
    triton_nb.load_ipython_extension(shell)
    shell.run_line_magic("load_ext", "triton_nb")
    assert sum(isinstance(c, TritonMagics) for c in shell.configurables) == 1
    assert shell.magics_manager.registry["TritonMagics"] is magics
    assert {"triton", "triton_perf"} <= set(shell.magics_manager.magics["line"])
    assert "triton_infer" in shell.magics_manager.magics["cell"]
    assert "--protocol" in TritonMagics.triton_infer.__doc__  # what %%triton_infer? shows


def test_start_status_config_and_model_control(shell, started, capsys):
    assert shell.user_ns["triton_server"] is started and started.http_port and started.grpc_port
    status = shell.run_line_magic("triton", "status")
    assert list(status.columns) == ["model", "version", "state", "reason", "queue_depth", "requests_served",
                                    "cache_hit_ratio", "warnings"]
    assert status["cache_hit_ratio"].isna().all()  # a server without a response cache looks nothing up
    assert set(status["model"]) == {"scale", "triple"} and (status["state"] == "READY").all()
    warnings = status.set_index("model")["warnings"]
    assert warnings["scale"] == "" and warnings["triple"].startswith("optimization.cuda: has no effect here")
    shell.run_line_magic("triton", "config scale")
    assert 'name: "scale"' in capsys.readouterr().out
    status = shell.run_line_magic("triton", "unload triple")
    assert status.set_index("model").loc["triple", "state"] == "UNAVAILABLE"
    status = shell.run_line_magic("triton", "load triple")
    assert status.set_index("model").loc["triple", "state"] == "READY"
    shell.user_ns["new_config"] = {**started.model_config_json("triple"), "max_batch_size": 4}
    shell.run_line_magic("triton", "reload triple --config new_config")
    assert started.model_config("triple").max_batch_size == 4
    literal = json.dumps({**started.model_config_json("triple"), "max_batch_size": 6}, separators=(",", ":"))
    shell.run_line_magic("triton", f"reload triple --config '{literal}'")
    assert started.model_config("triple").max_batch_size == 6
    one_line_usage(lambda: shell.run_line_magic("triton", "start"), r"already running")
    one_line_usage(lambda: shell.run_line_magic("triton", "load tripel"), r"did you mean 'triple'")
    one_line_usage(lambda: shell.run_line_magic("triton", "reload triple --config '{bad'"), r"not valid JSON")
    one_line_usage(lambda: shell.run_line_magic("triton", "frobnicate"), r"invalid choice")


@pytest.mark.parametrize("protocol", ["inprocess", "http", "grpc"])
def test_csv_over_each_protocol(shell, started, protocol, capsys):
    frame = shell.run_cell_magic("triton_infer", f"scale --protocol {protocol} --version 1", CSV)
    assert frame[["X_0", "X_1", "Y_0", "Y_1"]].to_numpy().tolist() == [[1, 2, 2, 4], [3, 4, 6, 8]]
    out = capsys.readouterr().out
    assert f"via {protocol}" in out and "latency" in out and "queue" in out and "compute" in out
    assert frame.attrs["triton"]["protocol"] == protocol and frame.attrs["triton"]["server_compute_infer_ms"] > 0


def test_http_binary_and_json_formats(shell, started):
    records = json.dumps([{"X": [1, 2]}, {"X": [5, 6]}])
    frame = shell.run_cell_magic("triton_infer", "scale --protocol http --binary --format json", records)
    assert frame["Y_1"].tolist() == [4.0, 12.0]
    body = {"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32", "data": [5, 6]}]}
    frame = shell.run_cell_magic("triton_infer", "triple", json.dumps(body))
    assert frame[["X_0", "Y_0", "Y_1"]].to_numpy().tolist() == [[5, 15, 18]]
    frame = shell.run_cell_magic("triton_infer", "scale --format csv", CSV)
    assert frame["Y_0"].tolist() == [2.0, 6.0]


def test_python_expressions_out_and_underscore(shell, started):
    shell.user_ns.update(np=np, pd=pd, frame_in=pd.DataFrame({"X_0": [1.0], "X_1": [2.0]}))
    frame = shell.run_cell_magic("triton_infer", "scale --out answer --format python", "frame_in")
    assert frame["Y_1"].tolist() == [4.0] and shell.user_ns["answer"] is frame
    result = shell.run_cell('%%triton_infer scale\n{"X": np.ones((2, 2), dtype="float32") * 3}')
    assert result.error_in_exec is None and result.error_before_exec is None
    assert shell.user_ns["_"]["Y_0"].tolist() == [6.0, 6.0]


def test_config_traits(shell, started, settings, capsys):
    shell.run_line_magic("config", 'TritonMagics.protocol = "grpc"')
    assert settings.protocol == "grpc"
    shell.run_cell_magic("triton_infer", "scale", CSV)
    assert "via grpc" in capsys.readouterr().out
    shell.run_line_magic("config", f'TritonMagics.url = "{started.endpoints["http"]}"')
    shell.run_line_magic("config", 'TritonMagics.protocol = "http"')
    frame = shell.run_cell_magic("triton_infer", "triple", CSV)
    assert frame["Y_0"].tolist() == [3.0, 9.0]
    frame = shell.run_cell_magic("triton_infer", f"scale --url {started.endpoints['grpc']} --protocol grpc", CSV)
    assert frame["Y_0"].tolist() == [2.0, 6.0]


def test_bad_input_is_one_line_usage_error(shell, started):
    def infer(line: str, cell: str):
        return lambda: shell.run_cell_magic("triton_infer", line, cell)

    one_line_usage(infer("scael", CSV), r"unknown model 'scael' \(did you mean 'scale'\?\)")
    one_line_usage(infer("scael --protocol http", CSV), r"did you mean 'scale'")
    one_line_usage(infer("scale", 'X_0,X_1\n1,2,3,4\n"5'), r"not valid CSV")
    one_line_usage(infer("scale", "X_0,X_1\nabc,2"), r"must be numbers")
    one_line_usage(infer("scale", "Z_0,Z_1\n1,2"), r"model 'scale': the DataFrame has no column\(s\) 'X'")
    one_line_usage(infer("scale", '[{"X": [1, 2]},'), r"not valid JSON")
    one_line_usage(infer("scale --format json", "{'X': 1"), r"not valid JSON")
    one_line_usage(infer("scale", "undefined_name_xyz"), r"NameError")
    one_line_usage(infer("scale", "1 / 0"), r"ZeroDivisionError")
    one_line_usage(infer("scale --format python", "frame_in +"), r"not a Python expression")
    one_line_usage(infer("scale", "42"), r"DataFrame or a dict")
    one_line_usage(infer("scale", '{"X": np.ones((2, 3))}'), r"expects|shape")
    one_line_usage(infer("scale --protocol carrier-pigeon", CSV), r"invalid choice")
    one_line_usage(infer("scale", "  "), r"empty")
    result = shell.run_cell("%%triton_infer scale\nX_0,X_1\nabc,2")
    assert isinstance(result.error_in_exec, UsageError)


def test_perf(shell, started):
    results = shell.run_line_magic(
        "triton_perf", "scale --concurrency-range 1:2:1 --measurement-interval 200 --out perf_results")
    assert results["concurrency"].tolist() == [1, 2] and (results["throughput_infer_per_sec"] > 0).all()
    assert shell.user_ns["perf_results"] is results
    results = shell.run_line_magic(
        "triton_perf", "scale --protocol grpc --concurrency-range 1 --measurement-interval 200")
    assert (results["protocol"] == "grpc").all()
    one_line_usage(lambda: shell.run_line_magic("triton_perf", "scale --concurrency-range 1:x"), r"concurrency")
    one_line_usage(lambda: shell.run_line_magic("triton_perf", "sacle"), r"did you mean 'scale'")


def test_perf_payload_flags(shell, started):
    results = shell.run_line_magic(
        "triton_perf", "scale --protocol http --concurrency-range 2 --measurement-interval 200 --input-tensor-format "
                       "json --request-compression gzip --rows-per-request 1,4 --rows-per-request-weights 3,1")
    row = results.iloc[0]
    assert (row["input_tensor_format"], row["request_compression"]) == ("json", "gzip")
    assert row["rows_per_request_mix"] == "1:75%,4:25%" and row["request_bytes"] > 0 and row["errors"] == 0
    one_line_usage(lambda: shell.run_line_magic("triton_perf", "scale --concurrency-range 1 --input-tensor-format "
                                                               "json"), r"--input-tensor-format.*'inprocess'")
    one_line_usage(lambda: shell.run_line_magic("triton_perf", "scale --rows-per-request 1,x"),
                   r"--rows-per-request must be comma-separated numbers")


@pytest.fixture(scope="module")
def fraud_server(shell):
    server = triton_nb.serve(ROOT / "model_repository")
    shell.user_ns["fraud_server"] = server
    yield server
    server.stop()
    shell.user_ns.pop("fraud_server", None)


def _model_labels(rows: pd.DataFrame) -> np.ndarray:
    """What the served repository's model says of ``rows``, computed from its files without a
    server: the preprocessing model's encoders, then its XGBoost trees with the FIL threshold."""
    import xgboost as xgb

    from triton_nb.repository import load_config

    repository = ROOT / "model_repository"
    preprocessor = fraud.FraudPreprocessor.load_encoders(repository / "preprocessing" / "1")
    booster = xgb.Booster(model_file=str(repository / "fil" / "1" / "xgboost.json"))
    threshold = float(load_config(repository / "fil").parameters["threshold"].string_value)
    proba = booster.inplace_predict(preprocessor.transform(rows))
    # FIL sums the trees in float32: no row may sit so near the threshold that the sum decides
    assert (np.abs(proba - threshold) > 1e-4).all()
    return np.where(proba > threshold, "FRAUD", "NOT FRAUD")


def test_fraud_ensemble_from_tabformer_csv(shell, fraud_server, settings, tmp_path):
    rows = fraud.generate_transactions(200, seed=1)
    path = fraud.write_tabformer_csv(rows, tmp_path / "rows.csv")
    expected = _model_labels(rows)
    assert set(expected) == {"FRAUD", "NOT FRAUD"}  # both answers are there to get right
    shell.run_line_magic("config", 'TritonMagics.server_variable = "fraud_server"')
    frame = shell.run_cell_magic("triton_infer", "ensemble", path.read_text())
    assert len(frame) == 200
    np.testing.assert_array_equal(frame["label"].to_numpy(), expected)
    # the cell's text reached the ensemble as written: Zip as the file's text, numbers as numbers
    written = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert frame["Zip"].fillna("").tolist() == written["Zip"].tolist() and frame["User"].dtype.kind == "i"
    assert "30927.0" in set(frame["Zip"])
    shell.user_ns["rows"] = fraud.generate_transactions(40, seed=2)
    answer = shell.run_cell_magic("triton_infer", "ensemble", "rows")
    np.testing.assert_array_equal(answer["label"].to_numpy(), _model_labels(shell.user_ns["rows"]))
    one_line_usage(lambda: shell.run_cell_magic("triton_infer", "ensembel", "rows"), r"did you mean 'ensemble'")
    shell.run_line_magic("config", 'TritonMagics.server_variable = "nothing_here"')
    one_line_usage(lambda: shell.run_cell_magic("triton_infer", "ensemble", "rows"), r"not defined")


def test_fraud_labels():
    classes = label_predictions({"predictions": np.array([[0.0], [1.0]], dtype=np.float32)})
    assert classes.to_dict("list") == {"label": ["NOT FRAUD", "FRAUD"]}
    probabilities = label_predictions({"predictions": np.array([[0.9, 0.1], [0.2, 0.8]], dtype=np.float32)})
    assert probabilities["label"].tolist() == ["NOT FRAUD", "FRAUD"]
    assert probabilities["fraud_probability"].round(2).tolist() == [0.1, 0.8]
    assert label_predictions({"Y": np.zeros(2)}) is None


def test_stop_and_unload(shell, magics, tmp_path):
    write_scale_model(tmp_path)
    if magics.server is not None:
        shell.run_line_magic("triton", "stop")
    shell.run_line_magic("triton", f"start {tmp_path}")
    server = magics.server
    triton_nb.notebook.magics.unload_ipython_extension(shell)
    assert magics.server is None and not server.is_server_live() and "triton_server" not in shell.user_ns
    one_line_usage(lambda: shell.run_line_magic("triton", "stop"), r"no server")
    one_line_usage(lambda: shell.run_line_magic("triton", "status"), r"%triton start")
    one_line_usage(lambda: shell.run_line_magic("triton", f"start {tmp_path / 'nowhere'}"), r"does not exist")


def test_status_shows_each_models_cache_hit_ratio(magics, tmp_path):
    write_scale_model(tmp_path)
    with (tmp_path / "scale" / "config.pbtxt").open("a") as config:
        config.write("response_cache { enable: true }\n")
    with triton_nb.serve(tmp_path, cache_size_bytes=1 << 20) as server:
        client = server.client()
        for value in (1.0, 1.0, 1.0, 2.0):  # a miss, two hits, a miss
            client.infer("scale", {"X": np.full((1, 2), value, np.float32)})
        status = magics._status(server).set_index("model")
    assert status.loc["scale", "cache_hit_ratio"] == pytest.approx(0.5)
