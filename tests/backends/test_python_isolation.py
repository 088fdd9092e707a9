"""The Python backend: each model's sibling modules are its own, and the backend reaches pb_utils' internals only
through its private bridge."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np

from tests.helpers.python_models import SIMPLE_CONFIG, request, write_model
from triton_nb.backends import pb_utils
from triton_nb.backends.python import PythonBackend
from triton_nb.tensors import InferRequest, InferResponse

# --------------------------------------------------------------------------- module isolation

HELPER_MODEL = """
import helper
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        from helper import VALUE
        self.value = VALUE

    def execute(self, requests):
        import helper as lazy  # imported again inside execute: still this model's file
        from . import relative
        out = []
        for request in requests:
            x = request.inputs()[0].as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 0 + helper.VALUE * 100
                                                                   + lazy.VALUE * 10 + relative.VALUE)]))
        return out
"""


def helper_model(root: Path, name: str, value: int) -> Path:
    return write_model(root, name, HELPER_MODEL, SIMPLE_CONFIG.format(name=name),
                       files={"helper.py": f"VALUE = {value}\n", "relative.py": f"VALUE = {value}\n"})


def run_value(backend: PythonBackend, name: str) -> float:
    (response,) = backend.execute([request(name, X=np.zeros((1, 1), np.float32))])
    assert response.error is None, response.error
    return float(response.outputs["Y"][0, 0])


def test_sibling_modules_of_different_models_do_not_collide(tmp_path, backends):
    path_before = list(sys.path)
    a = backends(helper_model(tmp_path, "model_a", 1))
    b = backends(helper_model(tmp_path, "model_b", 2))
    # Two repositories, each with a model of the same name and its own helper.py.
    c = backends(helper_model(tmp_path / "other_repo", "model_a", 3))
    assert "helper" not in sys.modules and "relative" not in sys.modules
    assert sys.path == path_before
    assert (a._model.value, b._model.value, c._model.value) == (1, 2, 3)
    assert (run_value(a, "model_a"), run_value(b, "model_b"), run_value(c, "model_a")) == (111.0, 222.0, 333.0)
    assert "helper" not in sys.modules
    modules = {type(backend._model).__module__ for backend in (a, b, c)}
    assert len(modules) == 3 and all(m.startswith("_triton_nb_python_models.") for m in modules)


def test_concurrent_instances_keep_their_own_siblings(tmp_path, backends):
    a = backends(helper_model(tmp_path, "model_a", 1))
    b = backends(helper_model(tmp_path, "model_b", 2))
    failures: list[str] = []

    def hammer(backend: PythonBackend, name: str, expected: float) -> None:
        for _ in range(40):
            got = run_value(backend, name)
            if got != expected:
                failures.append(f"{name}: {got}")

    threads = [threading.Thread(target=hammer, args=(a, "model_a", 111.0)) for _ in range(3)]
    threads += [threading.Thread(target=hammer, args=(b, "model_b", 222.0)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert "helper" not in sys.modules


def test_an_unrelated_module_of_the_same_name_survives(tmp_path, backends, monkeypatch):
    import types

    outsider = types.ModuleType("helper")
    outsider.VALUE = -1
    monkeypatch.setitem(sys.modules, "helper", outsider)
    backend = backends(helper_model(tmp_path, "model_a", 4))
    assert run_value(backend, "model_a") == 444.0
    assert sys.modules["helper"] is outsider


def test_versions_and_instances_of_one_model_have_their_own_modules(tmp_path, backends):
    folder = helper_model(tmp_path, "m", 5)
    (folder / "2").mkdir()
    for file in ("model.py", "relative.py"):
        (folder / "2" / file).write_text((folder / "1" / file).read_text())
    (folder / "2" / "helper.py").write_text("VALUE = 6\n")
    v1_first, v1_second = backends(folder, instance_name="m_0"), backends(folder, instance_name="m_1")
    v2 = backends(folder, version=2)
    assert (run_value(v1_first, "m"), run_value(v1_second, "m"), run_value(v2, "m")) == (555.0, 555.0, 665.0)
    assert v1_first._loaded.scope.kept["helper"] is not v1_second._loaded.scope.kept["helper"]


# --------------------------------------------------------------------------- the bridge

BACKENDS = Path(__file__).resolve().parents[2] / "triton_nb" / "backends"
PB_FAMILY = {"pb_utils.py", "_pb_bridge.py", "_pb_context.py", "_pb_errors.py", "_pb_inference.py", "_pb_tensor.py"}


def test_the_backend_reaches_pb_utils_internals_only_through_the_bridge():
    """Outside pb_utils and its private modules nothing reads a private name of pb_utils or sets
    a private attribute of another object (the backend uses _pb_bridge), and nothing under
    backends/ imports the server above it."""
    import ast

    for path in sorted(BACKENDS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not [m for m in imported if m.startswith("triton_nb.server")], path.name
        if path.name in PB_FAMILY:
            continue
        private = [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                   and isinstance(node.value, ast.Name) and node.value.id == "pb_utils" and node.attr.startswith("_")]
        assert not private, f"{path.name} reads pb_utils.{private}"
        # what the old bridge did (request._forward = ...): set a private attribute of another object
        patched = [ast.unparse(target) for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                   for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                   if isinstance(target, ast.Attribute) and target.attr.startswith("_")
                   and not target.attr.startswith("__")
                   and not (isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"))]
        assert not patched, f"{path.name} sets {patched}"


def test_pb_utils_classes_are_not_patched_while_serving(tmp_path, backends):
    """A decoupled model's requests get their forwarder when they are made: serving does not
    replace anything on pb_utils' classes."""
    before = dict(vars(pb_utils.InferenceRequest)), dict(vars(pb_utils.InferenceResponseSender))
    folder = write_model(tmp_path, "streamer", """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    sender = request.get_response_sender()
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones((1, 1), np.float32))]))
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """, """
        name: "streamer"
        backend: "python"
        max_batch_size: 4
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
        model_transaction_policy { decoupled: true }
    """)
    backend = backends(folder)
    streamed: list[tuple[InferResponse | None, bool]] = []
    request = InferRequest(model_name="streamer", inputs={"X": np.zeros((1, 1), np.float32)},
                           response_sender=lambda response, final: streamed.append((response, final)))
    assert backend.execute([request]) is None
    assert [final for _, final in streamed] == [False, True]
    assert streamed[0][0].outputs["Y"].tolist() == [[1.0]]
    assert (dict(vars(pb_utils.InferenceRequest)), dict(vars(pb_utils.InferenceResponseSender))) == before
