"""Custom backends for the tests: a registered class, an installed entry point, a Python-based
backend folder shared by two models with their own parameters and files, and a Python-based
backend whose ``auto_complete_config`` writes its models' tensors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from triton_nb.backends.base import Backend
from triton_nb.tensors import InferResponse


class Negate(Backend):
    """Y = -X: a backend written against triton_nb's Backend interface."""

    def execute(self, requests):
        return [InferResponse(self.context.name, self.context.version, {"Y": -r.inputs["X"]}) for r in requests]


MODEL_CONFIG = """
name: "{name}"
backend: "{backend}"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{parameters}
"""

#: The Python-based backend "scaler": Y = X * factor + offset, the factor from the model's own
#: parameters, the offset from a file in the model's own folder, the arithmetic from a sibling
#: module of the backend's model.py.
SCALER_MODEL = '''
import json
import os

import triton_python_backend_utils as pb_utils
from scaler_helper import combine


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.factor = float(config["parameters"]["factor"]["string_value"])
        with open(os.path.join(args["model_repository"], "offset.txt")) as stream:
            self.offset = float(stream.read())

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", combine(
            pb_utils.get_input_tensor_by_name(r, "X").as_numpy(), self.factor, self.offset))]) for r in requests]
'''

SCALER_HELPER = '''
import numpy as np


def combine(x, factor, offset):
    return (x * factor + offset).astype(np.float32)
'''

#: model -> (backend, factor, offset) of the scaler models
SCALED = {"scaled_a": (2.0, 1.0), "scaled_b": (10.0, 0.0)}


def write_model(repo: Path, name: str, backend: str, parameters: str = "") -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(MODEL_CONFIG.format(name=name, backend=backend, parameters=parameters))
    return folder


def write_scaler_backend(backends: Path) -> Path:
    """``backends/scaler/model.py`` (and its helper module)."""
    folder = backends / "scaler"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(SCALER_MODEL)
    (folder / "scaler_helper.py").write_text(SCALER_HELPER)
    return folder


def write_scaled_models(repo: Path) -> None:
    for name, (factor, offset) in SCALED.items():
        folder = write_model(repo, name, "scaler",
                             f'parameters {{ key: "factor" value: {{ string_value: "{factor}" }} }}')
        (folder / "offset.txt").write_text(str(offset))


#: The Python-based backend "tripler": Y = 3 X, for a model whose config names only the backend;
#: its auto_complete_config declares the tensors and the batch size, and says in which process it ran.
TRIPLER_MODEL = '''
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(8)
        with open(os.path.join(os.path.dirname(__file__), "completed_in.txt"), "a") as record:
            record.write(f"{os.getpid()}\\n")
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 3)]) for r in requests]
'''


def write_tripler(backends: Path, repo: Path, model: str = "tripled") -> Path:
    """``backends/tripler/model.py`` and a model ``repo/<model>`` whose config is its backend alone."""
    folder = backends / "tripler"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(TRIPLER_MODEL)
    (repo / model / "1").mkdir(parents=True)
    (repo / model / "config.pbtxt").write_text('backend: "tripler"\n')
    return folder


def write_entry_point_distribution(site: Path, name: str) -> None:
    """A distribution installed in ``site`` (a folder for sys.path) whose entry point ``name`` in the
    group ``triton_nb.backends`` is a Backend class of its own module."""
    (site / "doubling_backend.py").write_text(textwrap.dedent('''
        from triton_nb.backends.base import Backend
        from triton_nb.tensors import InferResponse


        class Doubling(Backend):
            def execute(self, requests):
                return [InferResponse(self.context.name, self.context.version, {"Y": r.inputs["X"] * 2})
                        for r in requests]
    '''))
    info = site / "doubling_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: doubling-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[triton_nb.backends]\n{name} = doubling_backend:Doubling\n")


X = np.array([[1.0, -2.0]], np.float32)
