"""Small model repositories for server tests, written in real Triton's style."""

from __future__ import annotations

import textwrap
from pathlib import Path

SCALE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters {{ key: "factor" value: {{ string_value: "{factor}" }} }}
{extra}
"""

SCALE_MODEL = '''
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X * factor; records the batch sizes it saw in a file next to it."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.factor = float(config["parameters"]["factor"]["string_value"])
        self.sleep = float(config["parameters"].get("sleep_s", {}).get("string_value", "0"))

    def execute(self, requests):
        if self.sleep:
            time.sleep(self.sleep)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if not np.isfinite(x).all():
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("X has NaN", pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x * self.factor)]))
        return responses
'''


def write_scale_model(repo: Path, name: str = "scale", factor: float = 2.0, max_batch_size: int = 8,
                      count: int = 1, extra: str = "dynamic_batching { max_queue_delay_microseconds: 2000 }",
                      version: int = 1) -> Path:
    folder = repo / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(SCALE_CONFIG.format(name=name, factor=factor, max_batch_size=max_batch_size,
                                                             count=count, extra=extra))
    (folder / str(version) / "model.py").write_text(textwrap.dedent(SCALE_MODEL))
    return folder


DECOUPLED_CONFIG = """
name: "counter"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

DECOUPLED_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for i in range(count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def write_python_model(repo: Path, name: str, config: str, code: str) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    (folder / "1" / "model.py").write_text(code)
    return folder


ECHO_CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ECHO_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            y = np.array([bytes(v) + b"!" for v in x.ravel()], dtype=np.object_).reshape(x.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", y)]))
        return responses
'''

def write_echo_model(repo: Path) -> Path:
    """``echo``: a BYTES tensor of any length back, each element with "!" appended."""
    return write_python_model(repo, "echo", ECHO_CONFIG, ECHO_MODEL)


GATED_CONFIG = """
name: "gated"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {width} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
"""

GATED_MODEL = '''
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = 2 X. Each batch creates the file 'running' in the model folder, then is held until the
    file 'open' exists there: the test decides when a batch ends."""

    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        open(os.path.join(self.folder, "running"), "w").close()
        while not os.path.exists(os.path.join(self.folder, "open")):
            time.sleep(0.005)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                            .as_numpy() * 2)]) for r in requests]
'''


def write_gated_model(repo: Path, width: int = 2) -> Path:
    """The model 'gated' (``width`` values per row); the test opens its gate with
    ``(folder / "open").touch()``, and must do so in any case before the server stops (a stop waits
    for the batch that is executing)."""
    return write_python_model(repo, "gated", GATED_CONFIG.format(width=width), GATED_MODEL)


_PICKY_CONFIG = """
name: "picky"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { }
"""

_PICKY_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x >= 0).all():
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
            else:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "model 'picky': input 'X' must not be negative")))
        return responses
'''


def write_picky_model(repo: Path) -> Path:
    """A Python model "picky" (X, Y: FP32 [2], batching) that answers Y = X, and fails each request
    holding a negative value with a message naming the model and tensor."""
    return write_python_model(repo, "picky", _PICKY_CONFIG, _PICKY_MODEL)
