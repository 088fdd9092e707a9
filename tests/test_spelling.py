"""One spelling per idea: the new names work without a warning, and every old spelling still works
for a release with a DeprecationWarning that names the new one."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import warnings

import numpy as np
import pytest

from tests.helpers.scale_models import write_scale_model
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.perf import COMPRESSIONS, TENSOR_FORMATS, Sequences, SharedMemory, Wire, measure
from triton_nb.perf.options import flat_options
from triton_nb.transport import connect

X = {"X": np.ones((3, 2), np.float32)}
FAST = {"measurement_interval_ms": 100, "max_trials": 2, "warmup_ms": 20}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_scale_model(repo)
    with serve(repo, http_port=0) as running:
        yield running


# ---------------------------------------------------------------- the latest version: None


def test_version_none_is_the_latest_everywhere_without_a_warning(server):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert server.is_model_ready("scale") and server.is_model_ready("scale", None)
        assert server.model_config("scale", None).name == "scale"
        assert server.model_config_json("scale", version=None)["name"] == "scale"
        assert server.model_metadata("scale", 1)["name"] == "scale"
        client = server.client()
        assert client.get_model_config("scale", model_version=None)["name"] == "scale"
        assert client.infer("scale", X, model_version=None).as_numpy("Y").shape == (3, 2)
        assert client.infer("scale", X, model_version="1").as_numpy("Y").shape == (3, 2)  # tritonclient's text
        for protocol in ("inprocess", "http"):
            with connect(server, protocol) as transport:
                assert transport.model_config_json("scale", model_version=None)["name"] == "scale"
                assert set(transport.infer("scale", X, model_version=1)) == {"Y"}


@pytest.mark.parametrize("old", [-1, ""])
def test_old_spellings_of_the_latest_version_warn_and_still_work(server, old):
    with pytest.warns(DeprecationWarning, match=r"version=.* for the latest version is deprecated: use version=None"):
        assert server.model_config("scale", old).name == "scale"
    with pytest.warns(DeprecationWarning, match=r"use model_version=None") as caught:
        assert server.client().is_model_ready("scale", model_version=old)
    assert caught[0].filename == __file__  # the warning points at the caller's line
    with connect(server, "http") as transport, pytest.warns(DeprecationWarning, match=r"use model_version=None"):
        assert transport.model_config_json("scale", model_version=old)["name"] == "scale"


def test_a_bad_version_is_refused_by_name(server):
    with pytest.raises(InvalidArgumentError, match=r"model_version must be a version number or None, got 'two'"):
        server.client().get_model_config("scale", model_version="two")
    with pytest.raises(InvalidArgumentError, match=r"version must be a version number or None, got -2"):
        server.model_config("scale", -2)


def test_transport_model_config_is_the_json_under_its_one_name(server):
    with connect(server, "inprocess") as transport:
        with pytest.warns(DeprecationWarning, match=r"model_config\(\) is deprecated: call model_config_json\(\)"):
            old = transport.model_config("scale")
        assert old == transport.model_config_json("scale") == server.model_config_json("scale")


def test_client_calls_take_keywords_after_the_inputs(server):
    client = server.client()
    with pytest.raises(TypeError):
        client.infer("scale", X, ["Y"])  # tritonclient's third positional is the version: no silent swap
    with pytest.raises(TypeError, match="unexpected keyword argument 'output'"):
        list(client.stream_infer("scale", X, output=["Y"]))


# ---------------------------------------------------------------- option groups


def test_groups_check_their_values_naming_the_field_and_the_choices():
    assert Wire().as_dict() == dict.fromkeys(["input_tensor_format", "output_tensor_format"], "binary") | dict.fromkeys(
        ["request_compression", "response_compression", "grpc_compression_algorithm"], "none")
    assert COMPRESSIONS == ("none", "gzip", "deflate") and TENSOR_FORMATS == ("binary", "json")
    with pytest.raises(InvalidArgumentError, match=r"^request_compression \(--request-compression\) must be one of "
                                                   r"none, gzip, deflate, got 'zip'$"):
        Wire(request_compression="zip")
    with pytest.raises(InvalidArgumentError, match=r"input_tensor_format .* must be one of binary, json, got 'xml'"):
        Wire(input_tensor_format="xml")
    with pytest.raises(InvalidArgumentError, match=r"sequence_length must be a whole number >= 1, got 0"):
        Sequences(sequence_length=0)
    with pytest.raises(InvalidArgumentError, match=r"sequence_id_range must start at 1"):
        Sequences(sequence_id_range="0:5")
    with pytest.raises(InvalidArgumentError, match=r"shared_memory must be one of none, system, cuda, got 'posix'"):
        SharedMemory(kind="posix")
    assert SharedMemory.of("system") == SharedMemory(kind="system")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Wire().request_compression = "gzip"  # type: ignore[misc]


def test_the_groups_measure_without_a_warning(server):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        row = measure(server, "scale", concurrency_range=1, protocol="http", latency_percentile=95,
                      wire=Wire(request_compression="gzip", response_compression="deflate"),
                      sequences=Sequences(), shared_memory=SharedMemory(), **FAST).iloc[0]
    assert row["errors"] == 0 and row["request_compression"] == "gzip" and row["response_compression"] == "deflate"
    assert row["shared_memory"] == "none"


def test_flat_keywords_warn_naming_their_group(server):
    with pytest.warns(DeprecationWarning, match=r"measure\(request_compression=\) is deprecated: pass "
                                                r"wire=Wire\(request_compression='gzip'\)") as caught:
        row = measure(server, "scale", concurrency_range=1, protocol="http", request_compression="gzip",
                      **FAST).iloc[0]
    assert caught[0].filename == __file__
    assert row["request_compression"] == "gzip"  # the old spelling still does what it did
    with pytest.warns(DeprecationWarning, match=r"percentile= is deprecated, use latency_percentile="):
        measure(server, "scale", concurrency_range=1, percentile=90, **FAST)


def test_flat_keywords_fold_into_their_groups():
    options = {"sequence_length": 3, "num_of_sequences": 2, "output_shared_memory_size": 64,
               "grpc_compression_algorithm": "gzip"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wire, sequences, shared = flat_options("measure", options, None, None, "system")
    assert options == {}  # taken out: what is left is a misspelling
    assert wire == Wire(grpc_compression_algorithm="gzip")
    assert sequences == Sequences(sequence_length=3, num_of_sequences=2)
    assert shared == SharedMemory(kind="system", output_size_bytes=64)
    assert sorted(str(w.message).split(" is ")[0] for w in caught) == [
        "measure(grpc_compression_algorithm=)", "measure(output_shared_memory_size=)",
        "measure(sequence_length=, num_of_sequences=)"]
    with pytest.raises(InvalidArgumentError, match=r"give wire= or request_compression, not both"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flat_options("measure", {"request_compression": "gzip"}, Wire(), None, None)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) 'request_compresion'"):
        measure("localhost:1", "m", concurrency_range=1, request_compresion="gzip")
    # refused before any connection: nothing listens on the URL
    with pytest.raises(InvalidArgumentError, match=r"sequences must be a Sequences, got dict"):
        measure("localhost:1", "m", concurrency_range=1, sequences={"sequence_length": 3})
    with pytest.raises(InvalidArgumentError, match=r"wire: unknown option\(s\) compression"):
        measure("localhost:1", "m", concurrency_range=1, wire={"compression": "gzip"})


# ---------------------------------------------------------------- units in names


def test_plots_take_the_budget_in_ms_and_the_old_us_keyword_warns():
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from triton_nb.perf import plot_throughput_vs_latency

    frame = pd.DataFrame({"config": ["a", "a"], "concurrency": [1, 2], "throughput_infer_per_sec": [10.0, 20.0],
                          "latency_p99_us": [1000.0, 3000.0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        line = plot_throughput_vs_latency(frame, latency_budget_ms=2.5).axes[0].get_lines()[-1]
    assert list(line.get_xdata()) == [2.5, 2.5]
    with pytest.warns(DeprecationWarning, match=r"latency_budget_us= is deprecated, use latency_budget_ms="):
        line = plot_throughput_vs_latency(frame, latency_budget_us=2500).axes[0].get_lines()[-1]
    assert list(line.get_xdata()) == [2.5, 2.5]


# ---------------------------------------------------------------- one path per module


def test_triton_nb_widgets_is_the_panel_under_its_old_path_with_a_warning():
    from triton_nb.notebook.widgets import Tuner

    sys.modules.pop("triton_nb.widgets", None)
    old = importlib.import_module("triton_nb.widgets")
    with pytest.warns(DeprecationWarning, match=r"triton_nb\.widgets is deprecated: import Tuner from "
                                                r"triton_nb\.notebook\.widgets"):
        assert old.Tuner is Tuner
