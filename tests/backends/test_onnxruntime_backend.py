"""OnnxRuntimeBackend: exported tree models served with FIL's semantics, batching, load errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import xgboost as xgb
from sklearn.datasets import make_classification
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.backends.base import ModelContext
from triton_nb.backends.onnxruntime import OnnxRuntimeBackend
from triton_nb.errors import InvalidArgumentError, MissingDependencyError, NotFoundError, UnavailableError
from triton_nb.repository import export_tree_model, load_config
from triton_nb.repository.config import effective_config, save_config
from triton_nb.repository.fil_semantics import FilSettings, fil_output
from triton_nb.tensors import InferRequest


def _context(folder: Path, config=None, kind: str = "KIND_CPU") -> ModelContext:
    config = effective_config(config if config is not None else load_config(folder), folder.name)
    return ModelContext(
        name=folder.name,
        version=1,
        config=config,
        model_path=folder,
        version_path=folder / "1",
        repository_path=folder.parent,
        instance_name=f"{folder.name}_0",
        instance_kind=kind,
    )


def _request(name: str, x: np.ndarray, request_id: str = "") -> InferRequest:
    return InferRequest(model_name=name, inputs={"input__0": x}, request_id=request_id)


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=300, n_features=6, n_informative=4, random_state=7)
    return X.astype(np.float32), y


@pytest.fixture(scope="module")
def binary_model(data):
    X, y = data
    return xgb.XGBClassifier(n_estimators=8, max_depth=3, random_state=0).fit(X, y)


@pytest.fixture(scope="module")
def exported(binary_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    proba = export_tree_model(binary_model, root, name="proba", model_backend="onnxruntime",
                              predict_proba=True, proba_width=2)
    label = export_tree_model(binary_model, root, name="label", model_backend="onnxruntime", threshold=0.4)
    return {"proba": proba, "label": label}


def test_probabilities_equal_fil_output_of_the_native_model(exported, binary_model, data):
    X, _ = data
    backend = OnnxRuntimeBackend(_context(exported["proba"]))
    (response,) = backend.execute([_request("proba", X, "r1")])
    assert response.error is None and response.request_id == "r1"
    assert response.model_name == "proba" and response.model_version == 1
    got = response.outputs["output__0"]
    settings = FilSettings("xgboost_json", output_class=True, predict_proba=True)
    expected = fil_output(binary_model.predict_proba(X)[:, 1], settings, proba_width=2)
    assert got.shape == (len(X), 2) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert set(response.outputs) == {"output__0"}


def test_class_output_uses_the_threshold_like_fil(exported, binary_model, data):
    X, _ = data
    backend = OnnxRuntimeBackend(_context(exported["label"]))
    (response,) = backend.execute([_request("label", X)])
    p = binary_model.predict_proba(X)[:, 1]
    expected = fil_output(p, FilSettings("xgboost_json", output_class=True, threshold=0.4))
    clear = np.abs(p - 0.4) > 1e-5  # float rounding may flip a row sitting on the threshold
    got = response.outputs["output__0"]
    assert got.shape == (len(X), 1)
    np.testing.assert_array_equal(got[clear], expected[clear])
    assert 0 < got.sum() < len(X)  # both classes occur, so the threshold matters


def test_a_batch_of_three_requests_is_split_by_rows(exported, data):
    X, _ = data
    backend = OnnxRuntimeBackend(_context(exported["proba"]))
    (whole,) = backend.execute([_request("proba", X[:16])])
    parts = [X[:1], X[1:6], X[6:16]]
    responses = backend.execute([_request("proba", part, f"id{i}") for i, part in enumerate(parts)])
    assert [r.request_id for r in responses] == ["id0", "id1", "id2"]
    assert [r.outputs["output__0"].shape for r in responses] == [(1, 2), (5, 2), (10, 2)]
    np.testing.assert_allclose(np.concatenate([r.outputs["output__0"] for r in responses]),
                               whole.outputs["output__0"], atol=1e-6)
    assert backend.last_execution_ns is not None and all(t >= 0 for t in backend.last_execution_ns)


def test_a_request_with_the_wrong_dtype_fails_alone(exported, data):
    X, _ = data
    backend = OnnxRuntimeBackend(_context(exported["proba"]))
    good, bad = backend.execute([_request("proba", X[:3]), _request("proba", X[:2].astype(np.float64))])
    assert good.error is None and good.outputs["output__0"].shape == (3, 2)
    assert isinstance(bad.error, InvalidArgumentError) and "input__0" in str(bad.error)


def test_corrupt_and_missing_model_files_name_model_and_file(exported, tmp_path):
    folder = tmp_path / "broken"
    (folder / "1").mkdir(parents=True)
    config = load_config(exported["proba"])
    config.name = "broken"
    save_config(config, folder)
    with pytest.raises(NotFoundError, match=r"'broken'.*model\.onnx"):
        OnnxRuntimeBackend(_context(folder))
    (folder / "1" / "model.onnx").write_bytes(b"this is not a protobuf")
    with pytest.raises(InvalidArgumentError, match=r"unable to load model 'broken'.*model\.onnx"):
        OnnxRuntimeBackend(_context(folder))


def test_default_model_filename_is_honoured(exported, tmp_path):
    folder = tmp_path / "renamed"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "trees.onnx").write_bytes((exported["proba"] / "1" / "model.onnx").read_bytes())
    config = load_config(exported["proba"])
    config.name = "renamed"
    config.default_model_filename = "trees.onnx"
    backend = OnnxRuntimeBackend(_context(folder, config))
    assert backend.model_path.name == "trees.onnx"


def _copy_with(exported_folder: Path, tmp_path: Path, name: str, edit) -> tuple[Path, mc.ModelConfig]:
    folder = tmp_path / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes((exported_folder / "1" / "model.onnx").read_bytes())
    config = load_config(exported_folder)
    config.name = name
    edit(config)
    return folder, config


def test_a_config_input_missing_from_the_graph_fails_the_load(exported, tmp_path):
    def rename(config):
        config.input[0].name = "features"

    folder, config = _copy_with(exported["proba"], tmp_path, "renamed_input", rename)
    with pytest.raises(InvalidArgumentError, match=r"'renamed_input'.*input 'features' is not an input.*input__0"):
        OnnxRuntimeBackend(_context(folder, config))


def test_datatype_and_dims_mismatches_fail_the_load(exported, tmp_path):
    def fp64(config):
        config.input[0].data_type = mc.TYPE_FP64

    folder, config = _copy_with(exported["proba"], tmp_path, "fp64", fp64)
    with pytest.raises(InvalidArgumentError, match=r"TYPE_FP64 for input 'input__0'.*TYPE_FP32"):
        OnnxRuntimeBackend(_context(folder, config))

    def wrong_output_dims(config):
        del config.output[0].dims[:]
        config.output[0].dims.append(3)

    folder, config = _copy_with(exported["proba"], tmp_path, "dims", wrong_output_dims)
    with pytest.raises(InvalidArgumentError, match=r"'dims'.*'output__0'"):
        OnnxRuntimeBackend(_context(folder, config))

    def unknown_output(config):
        config.output[0].name = "probabilities"

    folder, config = _copy_with(exported["proba"], tmp_path, "outname", unknown_output)
    with pytest.raises(InvalidArgumentError, match="output 'probabilities' is not an output"):
        OnnxRuntimeBackend(_context(folder, config))


def test_thread_count_parameters_reach_the_session(exported, tmp_path):
    def threads(config):
        config.parameters["intra_op_thread_count"].string_value = "2"
        config.parameters["inter_op_thread_count"].string_value = "1"
        config.parameters["execution_mode"].string_value = "0"

    folder, config = _copy_with(exported["proba"], tmp_path, "threads", threads)
    backend = OnnxRuntimeBackend(_context(folder, config))
    options = backend._session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)

    def bad(config):
        config.parameters["intra_op_thread_count"].string_value = "many"

    folder, config = _copy_with(exported["proba"], tmp_path, "bad_threads", bad)
    with pytest.raises(InvalidArgumentError, match="intra_op_thread_count"):
        OnnxRuntimeBackend(_context(folder, config))


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="onnxruntime-gpu present")
def test_kind_gpu_without_onnxruntime_gpu_fails_naming_the_model(exported):
    with pytest.raises(MissingDependencyError, match=r"model 'proba'.*KIND_GPU"):
        OnnxRuntimeBackend(_context(exported["proba"], kind="KIND_GPU"))


def _onnxruntime_runs_on_cuda() -> bool:
    """Whether onnxruntime can run a graph on a CUDA device here, decided apart from the
    backend: a one-node graph in a CUDA-only session, its output bound to device memory, must
    come back from the GPU with the right values (onnxruntime falls back to the CPU, with only
    a warning, when the GPU or the CUDA libraries are missing)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["X", "X"], ["Y"])], "double",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
        if session.get_providers()[0] != "CUDAExecutionProvider":
            return False
        binding = session.io_binding()
        binding.bind_cpu_input("X", np.array([1.0, 2.0], np.float32))
        binding.bind_output("Y", "cuda")
        session.run_with_iobinding(binding)
        (output,) = binding.get_outputs()
        return output.device_name().lower() == "cuda" and output.numpy().tolist() == [2.0, 4.0]
    except Exception:  # any failure to create or run the session means no usable GPU
        return False


@pytest.mark.gpu
def test_kind_gpu_needs_a_usable_gpu(exported, data):
    """With onnxruntime-gpu, KIND_GPU runs on CUDA when a GPU is usable and fails the load,
    naming the model, when none is: never silently on the CPU. (Without onnxruntime-gpu the
    test above checks the load fails.)"""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu (the NVIDIA GPU build) is not installed; without it KIND_GPU is checked by "
                    "test_kind_gpu_without_onnxruntime_gpu_fails_naming_the_model")
    if _onnxruntime_runs_on_cuda():
        backend = OnnxRuntimeBackend(_context(exported["proba"], kind="KIND_GPU"))
        assert backend._session.get_providers()[0] == "CUDAExecutionProvider"
        X, _ = data
        (on_gpu,) = backend.execute([_request("proba", X)])
        (on_cpu,) = OnnxRuntimeBackend(_context(exported["proba"])).execute([_request("proba", X)])
        assert on_gpu.error is None
        np.testing.assert_allclose(on_gpu.outputs["output__0"], on_cpu.outputs["output__0"], atol=1e-5)
    else:
        with pytest.raises(UnavailableError, match=r"model 'proba'.*KIND_GPU.*CUDA device 0"):
            OnnxRuntimeBackend(_context(exported["proba"], kind="KIND_GPU"))


# ------------------------------------------------------------------ string tensors, no batching


def _string_model(folder: Path, max_batch_size: int) -> mc.ModelConfig:
    """A graph ``TEXT`` (string) -> ``SAME`` (string, Identity) and ``EQUALS`` (bool: TEXT == "yes")."""
    import onnx
    from onnx import TensorProto, helper

    batch = ["N"] if max_batch_size else []
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["TEXT"], ["SAME"]),
            helper.make_node("Equal", ["TEXT", "yes"], ["EQUALS"]),
        ],
        "strings",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, [*batch, 1])],
        [
            helper.make_tensor_value_info("SAME", TensorProto.STRING, [*batch, 1]),
            helper.make_tensor_value_info("EQUALS", TensorProto.BOOL, [*batch, 1]),
        ],
        initializer=[helper.make_tensor("yes", TensorProto.STRING, [], [b"yes"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    (folder / "1").mkdir(parents=True)
    onnx.save_model(model, str(folder / "1" / "model.onnx"))
    config = mc.ModelConfig(name=folder.name, backend="onnxruntime", max_batch_size=max_batch_size)
    config.input.add(name="TEXT", data_type=mc.TYPE_STRING, dims=[1])
    config.output.add(name="SAME", data_type=mc.TYPE_STRING, dims=[1])
    config.output.add(name="EQUALS", data_type=mc.TYPE_BOOL, dims=[1])
    return config


def _strings(*values: bytes, batch: bool = True) -> np.ndarray:
    array = np.empty((len(values), 1) if batch else (1,), dtype=object)
    array[...] = np.array(values, dtype=object).reshape(array.shape)
    return array


def test_bytes_inputs_become_onnx_strings_and_come_back_as_bytes(tmp_path):
    folder = tmp_path / "strings"
    config = _string_model(folder, max_batch_size=8)
    backend = OnnxRuntimeBackend(_context(folder, config))
    first, bad, second = backend.execute([
        InferRequest("strings", {"TEXT": _strings(b"yes", "héllo".encode())}),
        InferRequest("strings", {"TEXT": _strings(b"\xff\xfe")}),
        InferRequest("strings", {"TEXT": _strings(b"no")}),
    ])
    assert first.outputs["SAME"].dtype == object
    assert first.outputs["SAME"].tolist() == [[b"yes"], ["héllo".encode()]]
    assert first.outputs["EQUALS"].tolist() == [[True], [False]]
    assert second.outputs["SAME"].tolist() == [[b"no"]]
    assert isinstance(bad.error, InvalidArgumentError) and "'TEXT'" in str(bad.error) and "UTF-8" in str(bad.error)


def test_a_model_without_batching_runs_request_by_request(tmp_path):
    folder = tmp_path / "single"
    config = _string_model(folder, max_batch_size=0)
    backend = OnnxRuntimeBackend(_context(folder, config))
    responses = backend.execute([
        InferRequest("single", {"TEXT": _strings(b"yes", batch=False)}),
        InferRequest("single", {"TEXT": _strings(b"maybe", batch=False)}),
    ])
    assert [r.outputs["SAME"].tolist() for r in responses] == [[b"yes"], [b"maybe"]]
    assert [r.outputs["EQUALS"].tolist() for r in responses] == [[True], [False]]


def test_a_batching_config_needs_a_dynamic_first_dimension(tmp_path):
    folder = tmp_path / "fixed"
    config = _string_model(folder, max_batch_size=0)
    config.max_batch_size = 4  # the graph's TEXT is [1], not [N, 1]
    with pytest.raises(InvalidArgumentError, match=r"'fixed'.*'TEXT'.*first dimension must be dynamic"):
        OnnxRuntimeBackend(_context(folder, config))
