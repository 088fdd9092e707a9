"""The response-cache models, the same for triton_nb (tests/server/test_cache.py) and for real
Triton (tests/test_real_triton_cache.py)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.scale_models import write_python_model

CACHE = "response_cache { enable: true }"

PAIR_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "DOUBLE" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "PLUS" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{extra}
"""

PAIR_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """DOUBLE = 2 X, PLUS = X + 1; a request with a NaN fails."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if not np.isfinite(x).all():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("X has NaN")))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("DOUBLE", x * 2), pb_utils.Tensor("PLUS", x + 1)]))
        return responses
'''

ENSEMBLE_CONFIG = """
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{inner}" model_version: -1
  input_map {{ key: "X" value: "IN" }} output_map {{ key: "DOUBLE" value: "OUT" }} }} ] }}
{extra}
"""


def write_pair(repo: Path, name: str = "pair", extra: str = CACHE) -> None:
    write_python_model(repo, name, PAIR_CONFIG.format(name=name, extra=extra), PAIR_MODEL)


def write_ensemble(repo: Path, name: str, inner: str, extra: str = "") -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(ENSEMBLE_CONFIG.format(name=name, inner=inner, extra=extra))

