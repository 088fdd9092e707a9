"""Request data for a measurement on models with variable dimensions (``dims: [-1]``)."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from triton_nb import serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.perf import measure
from triton_nb.perf.inputs import request_inputs

VARIABLE = {"name": "ragged", "max_batch_size": 8, "input": [
    {"name": "X", "data_type": "TYPE_FP32", "dims": ["-1"]},
    {"name": "S", "data_type": "TYPE_STRING", "dims": ["-1"]},
    {"name": "M", "data_type": "TYPE_INT32", "dims": ["2", "-1"]}]}
UNBATCHED = {**VARIABLE, "max_batch_size": 0}


@pytest.mark.parametrize("config", [VARIABLE, UNBATCHED], ids=["batched", "unbatched"])
def test_random_and_zero_inputs_take_one_element_for_a_variable_dimension(config):
    batch = [3] if config["max_batch_size"] else []
    rows = 3 if config["max_batch_size"] else 1
    random = request_inputs(config, "random", rows_per_request=rows, count=2)
    assert [r["X"].shape for r in random] == [(*batch, 1)] * 2
    assert random[0]["S"].shape == (*batch, 1) and random[0]["S"].dtype == object
    assert random[0]["M"].shape == (*batch, 2, 1) and random[0]["M"].dtype == np.int32
    assert not np.array_equal(random[0]["M"], random[1]["M"]) or not np.array_equal(random[0]["X"], random[1]["X"])
    zero = request_inputs(config, "zero", rows_per_request=rows, count=1)[0]
    assert zero["X"].shape == (*batch, 1) and not zero["X"].any()
    assert zero["S"].ravel().tolist() == [b""] * rows and not zero["M"].any()


def test_json_inputs_keep_their_length_for_a_variable_dimension(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"data": [
        {"X": [1, 2, 3], "S": ["a", "b"], "M": {"content": [1, 2, 3, 4], "shape": [2, 2]}},
        {"X": [4, 5, 6], "S": ["c", "d"], "M": {"content": [5, 6, 7, 8], "shape": [2, 2]}}]}))
    (request,) = request_inputs(VARIABLE, path, rows_per_request=2)
    assert request["X"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert request["S"].tolist() == [[b"a", b"b"], [b"c", b"d"]]
    assert request["M"].shape == (2, 2, 2) and request["M"][1].tolist() == [[5, 6], [7, 8]]
    # two variable dimensions cannot be inferred from flat content: perf_analyzer needs "shape" too
    path.write_text(json.dumps({"data": [{"X": [1], "S": ["a"], "M": [1, 2, 3, 4]}]}))
    (request,) = request_inputs(VARIABLE, path)
    assert request["M"].shape == (1, 2, 2)
    two_free = {**VARIABLE, "input": [{"name": "M", "data_type": "TYPE_INT32", "dims": ["-1", "-1"]}]}
    path.write_text(json.dumps({"data": [{"M": [1, 2, 3, 4]}]}))
    with pytest.raises(InvalidArgumentError, match=r"input 'M'.*\[-1, -1\].*\"shape\""):
        request_inputs(two_free, path)
    path.write_text(json.dumps({"data": [{"X": [1, 2]}, {"X": [3]}]}))
    with pytest.raises(InvalidArgumentError, match=r"entries 0..1 give input 'X' the shapes \[\[1\], \[2\]\]"):
        request_inputs({**VARIABLE, "input": VARIABLE["input"][:1]}, path, rows_per_request=2)


RAGGED_CONFIG = """
name: "ragged"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

RAGGED_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]) for r in requests]
'''


def test_a_measurement_with_random_inputs_on_a_variable_dimension_model(tmp_path):
    folder = tmp_path / "ragged"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(RAGGED_CONFIG)
    (folder / "1" / "model.py").write_text(textwrap.dedent(RAGGED_MODEL))
    with serve(tmp_path) as server:
        results = measure(server, "ragged", concurrency_range=2, input_data="random",
                          measurement_request_count=50, max_trials=3)
    assert len(results) == 1
    assert results["throughput_infer_per_sec"].iloc[0] > 0
