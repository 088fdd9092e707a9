"""The metrics models (custom metrics from pb_utils.MetricFamily, a BLS model that loads and unloads
another) and a reader of Prometheus text, the same for triton_nb (tests/server/test_metrics_extra.py)
and for real Triton (tests/test_real_triton_metrics.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.scale_models import write_python_model

COUNTED_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{extra}
"""

COUNTED_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = 2 X; counts its requests (a counter), the rows of the last one (a gauge) and each
    request's input sum (a histogram) as custom metrics."""

    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        # a MetricFamily must outlive its Metric objects: Triton clears them with it
        self.families = [
            pb_utils.MetricFamily(name="custom_requests_total", description="Requests the model executed",
                                  kind=pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily(name="custom_last_rows", description="Rows of the last request",
                                  kind=pb_utils.MetricFamily.GAUGE),
            pb_utils.MetricFamily(name="custom_input_sum", description="Sum of each request's input",
                                  kind=pb_utils.MetricFamily.HISTOGRAM),
        ]
        self.requests = self.families[0].Metric(labels=labels)
        self.rows = self.families[1].Metric(labels=labels)
        self.sums = self.families[2].Metric(labels=labels, buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            self.requests.increment(1)
            self.rows.set(x.shape[0])
            self.sums.observe(float(x.sum()))
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x * 2)]))
        return responses
'''

LOADER_CONFIG = """
name: "loader"
backend: "python"
max_batch_size: 0
input [ { name: "ACTION" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "READY" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# The config and code of "target" as load_model's overrides (action 3): Y = 3 X.
TARGET_JSON = ('{"name": "target", "backend": "python", "max_batch_size": 8, '
               '"input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}], '
               '"output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}]}')
TRIPLE_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 3)]) for r in requests]
'''

LOADER_MODEL = f'''
import numpy as np
import triton_python_backend_utils as pb_utils

TARGET_JSON = {TARGET_JSON!r}
TRIPLE_MODEL = {TRIPLE_MODEL!r}


class TritonPythonModel:
    """A BLS model driving the model loading API: ACTION 1 loads "target", 2 unloads it, 3 loads
    it with a config and model.py given as overrides, 4 loads a model the repository lacks;
    READY says whether "target" is ready after that. pb_utils' errors become the response's."""

    def execute(self, requests):
        responses = []
        for request in requests:
            action = int(pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0])
            try:
                if action == 1:
                    pb_utils.load_model(model_name="target")
                elif action == 2:
                    pb_utils.unload_model(model_name="target")
                elif action == 3:
                    pb_utils.load_model(model_name="target", config=TARGET_JSON,
                                        files={{"file:1/model.py": TRIPLE_MODEL.encode()}})
                elif action == 4:
                    pb_utils.load_model(model_name="missing")
                ready = pb_utils.is_model_ready(model_name="target")
            except pb_utils.TritonModelException as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("READY", np.array([1 if ready else 0], dtype=np.int32))]))
        return responses
'''


def write_counted(repo: Path, name: str = "counted", extra: str = "") -> Path:
    return write_python_model(repo, name, COUNTED_CONFIG.format(name=name, extra=extra), COUNTED_MODEL)


def write_loader(repo: Path) -> None:
    """The BLS "loader" and the "target" it loads (Y = 2 X, the counted model under another name)."""
    write_python_model(repo, "loader", LOADER_CONFIG, LOADER_MODEL)
    write_counted(repo, "target")


# ---------------------------------------------------------------------- reading /metrics
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str | bytes) -> dict[str, dict]:
    """``{family: {"type": ..., "samples": [(sample name, labels, value), ...]}}`` of Prometheus text."""
    if isinstance(text, bytes):
        text = text.decode()
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, current, kind = line.split(" ", 3)
            families[current] = {"type": kind, "samples": []}
        elif line and not line.startswith("#"):
            found = _SAMPLE.match(line)
            assert found is not None and current is not None, line
            name, labels, value = found.groups()
            families[current]["samples"].append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return families


SUMMARIES = ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us")

