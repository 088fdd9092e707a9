"""A small model repository that both real Triton and triton_nb serve, for the front-end conformance tests.

Every model is a Python-backend model (``config.pbtxt`` + ``1/model.py``) that uses only NumPy and
``triton_python_backend_utils``, so the same files run in Triton's stub and in triton_nb's in-process
Python backend.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

# the Triton datatypes echo_all carries, with their config.pbtxt spelling
DATATYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
}

FAILS_MESSAGE = "model says no"

_ECHO_ALL_MODEL = f'''
import triton_python_backend_utils as pb_utils

DATATYPES = {list(DATATYPES)!r}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for datatype in DATATYPES:
                tensor = pb_utils.get_input_tensor_by_name(request, "INPUT_" + datatype)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor("OUTPUT_" + datatype, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

_ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
dynamic_batching {}
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

_ADD_SUB_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(np.float32))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
"""

_FAILS_CONFIG = """
name: "fails"
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
]
"""

_FAILS_MODEL = f"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError({FAILS_MESSAGE!r})) for _ in requests]
"""


def _echo_all_config() -> str:
    inputs = ",\n".join(
        f'  {{ name: "INPUT_{t}" data_type: {c} dims: [ -1 ] optional: true }}' for t, c in DATATYPES.items()
    )
    outputs = ",\n".join(f'  {{ name: "OUTPUT_{t}" data_type: {c} dims: [ -1 ] }}' for t, c in DATATYPES.items())
    return f'name: "echo_all"\nbackend: "python"\nmax_batch_size: 0\ninput [\n{inputs}\n]\noutput [\n{outputs}\n]\n'


def _write_model(root: Path, name: str, config: str, model: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())
    (root / name / "1" / "model.py").write_text(textwrap.dedent(model).lstrip())


def write_conformance_repo(root: Path) -> Path:
    """Write the models ``echo_all``, ``add_sub`` and ``fails`` under ``root`` (created) and return it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _write_model(root, "echo_all", _echo_all_config(), _ECHO_ALL_MODEL)
    _write_model(root, "add_sub", _ADD_SUB_CONFIG, _ADD_SUB_MODEL)
    _write_model(root, "fails", _FAILS_CONFIG, _FAILS_MODEL)
    return root
