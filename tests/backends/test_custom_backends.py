"""Custom backends: ``backend: "NAME"`` resolved to a registered class, an installed entry point or a
Python-based backend folder (``--backend-directory``), each served in process, over HTTP and over
gRPC; the search order; and an unknown name failing the load with what was searched."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.custom_backends import (
    SCALED,
    Negate,
    X,
    write_entry_point_distribution,
    write_model,
    write_scaled_models,
    write_scaler_backend,
)
from tests.helpers.serve_cli import start_serve
from triton_nb import serve
from triton_nb.backends import register_backend, registered_backends, unregister_backend
from triton_nb.backends.base import Backend
from triton_nb.backends.registry import backend_factory
from triton_nb.errors import InvalidArgumentError
from triton_nb.tensors import InferResponse

PROTOCOLS = ["inprocess", "http", "grpc"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("custom")
    repo, backends, site = root / "repo", root / "backends", root / "site"
    repo.mkdir()
    site.mkdir()
    write_scaler_backend(backends)
    write_scaled_models(repo)
    write_model(repo, "negated", "test_negate")
    write_model(repo, "doubled", "test_doubling")
    write_entry_point_distribution(site, "test_doubling")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    register_backend("test_negate", Negate)
    try:
        with serve(repo, http_port=0, grpc_port=0, backend_directory=backends) as server:
            yield server
    finally:
        unregister_backend("test_negate")
        sys.path.remove(str(site))
        sys.modules.pop("doubling_backend", None)


def infer(server, protocol: str, model: str) -> np.ndarray:
    if protocol == "inprocess":
        return server.client().infer(model, {"X": X}).as_numpy("Y")
    tc = httpclient if protocol == "http" else grpcclient
    url = f"127.0.0.1:{server.http_port if protocol == 'http' else server.grpc_port}"
    client = tc.InferenceServerClient(url)
    tensor = tc.InferInput("X", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    try:
        return client.infer(model, [tensor]).as_numpy("Y")
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_registered_backend_class_serves_its_models(served, protocol):
    np.testing.assert_array_equal(infer(served, protocol, "negated"), -X)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_entry_point_of_an_installed_distribution_serves_its_models(served, protocol):
    np.testing.assert_array_equal(infer(served, protocol, "doubled"), 2 * X)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", list(SCALED))
def test_a_python_based_backend_runs_for_each_model_with_its_own_parameters_and_files(served, protocol, model):
    factor, offset = SCALED[model]
    np.testing.assert_allclose(infer(served, protocol, model), X * factor + offset)


def test_the_models_metadata_names_their_backend(served):
    assert served.model_metadata("scaled_a")["platform"] == "scaler"


def test_an_unknown_backend_fails_the_load_naming_what_was_searched(tmp_path):
    write_model(tmp_path, "mystery", "no_such_backend")
    with (serve(tmp_path, model_control_mode="explicit", load_models=[], backend_directory=tmp_path) as server,
          pytest.raises(InvalidArgumentError) as caught):
        server.load_model("mystery")
    message = str(caught.value)
    assert "model 'mystery': backend 'no_such_backend' was not found" in message
    for searched in ("registered backends", "entry points in group 'triton_nb.backends'",
                     str(tmp_path / "no_such_backend" / "model.py"), "built-ins (fil, python, onnxruntime"):
        assert searched in message


def test_registration_comes_first_then_entry_points_then_the_directory_then_built_ins(tmp_path):
    write_scaler_backend(tmp_path)
    (tmp_path / "python").mkdir()
    (tmp_path / "python" / "model.py").write_text("")
    directory_factory = backend_factory("scaler", model="m", backend_directory=tmp_path)
    assert directory_factory is not None and not isinstance(directory_factory, type)  # the folder's model.py
    register_backend("scaler", Negate)
    try:
        assert backend_factory("scaler", model="m", backend_directory=tmp_path) is Negate
        assert "scaler" in registered_backends()
    finally:
        unregister_backend("scaler")
    # a backend folder named like a built-in wins over it, as Triton's backend directory does
    assert backend_factory("python", model="m", backend_directory=tmp_path).__name__ == "factory"
    from triton_nb.backends.registry import python_instance

    assert backend_factory("python", model="m") is python_instance


def test_registering_twice_needs_replace_and_bad_factories_are_refused():
    class Other(Backend):
        def execute(self, requests):
            return [InferResponse("m", 1, {}) for _ in requests]

    register_backend("test_twice", Negate)
    try:
        register_backend("test_twice", Negate)  # the same factory again: nothing changes
        with pytest.raises(InvalidArgumentError, match="already registered"):
            register_backend("test_twice", Other)
        register_backend("test_twice", Other, replace=True)
        assert registered_backends()["test_twice"] is Other
    finally:
        unregister_backend("test_twice")
    with pytest.raises(InvalidArgumentError, match="must be callable"):
        register_backend("test_bad", "not a factory")
    with pytest.raises(InvalidArgumentError, match="non-empty name"):
        register_backend("", Negate)


def test_a_factory_that_returns_no_backend_fails_the_load_clearly(tmp_path):
    write_model(tmp_path, "odd", "test_not_a_backend")
    register_backend("test_not_a_backend", lambda context: object())
    try:
        with (serve(tmp_path, model_control_mode="explicit", load_models=[]) as server,
              pytest.raises(InvalidArgumentError, match="model 'odd': backend 'test_not_a_backend' gave a object")):
            server.load_model("odd")
    finally:
        unregister_backend("test_not_a_backend")


def test_validate_warns_about_a_backend_that_is_not_built_in(tmp_path):
    from triton_nb.repository.validate import validate_repository

    write_model(tmp_path, "negated", "test_negate")
    (warning,) = [p for p in validate_repository(tmp_path) if p.field == "backend"]
    assert warning.severity == "warning" and "register_backend" in warning.message
    assert "test_negate/model.py in its backend directory" in warning.message


def test_triton_nb_serve_takes_a_backend_directory(tmp_path):
    repo, backends = tmp_path / "repo", tmp_path / "backends"
    repo.mkdir()
    write_scaler_backend(backends)
    write_scaled_models(repo)
    process, ports, _ = start_serve(repo, "--backend-directory", str(backends))
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['HTTPService']}")
        tensor = httpclient.InferInput("X", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        np.testing.assert_allclose(client.infer("scaled_b", [tensor]).as_numpy("Y"), X * 10.0)
        client.close()
    finally:
        process.terminate()
        process.communicate(timeout=60)
