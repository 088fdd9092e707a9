"""What Triton added to the server after 2.51 that an ensemble or Python-model user meets: the
ensemble's ``max_inflight_requests`` (2.63) and the first-response histogram of every model (2.65)."""

from __future__ import annotations

import sys
import textwrap
from concurrent.futures import wait
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.metrics_models import parse_metrics
from triton_nb import serve
from triton_nb.errors import TritonNBError
from triton_nb.repository.config import parse_config
from triton_nb.repository.fields import check_fields
from triton_nb.tensors import InferRequest

STEP_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 4 kind: KIND_CPU }} ]
{extra}
"""

# Y = X + 1; counts the executes running at once in a probe the test reads (sys.modules, shared by
# the thread instances). Each waits, at most 0.3 s, for three to run together, so without a limit
# the four instances crowd; with one they cannot.
PROBED_STEP = '''
import sys
import threading
import types

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        probes = sys.modules.setdefault("_triton_nb_inflight_probes", types.ModuleType("probes"))
        self.probe = probes.__dict__.setdefault(args["model_name"], {
            "lock": threading.Lock(), "now": 0, "most": 0, "crowd": threading.Event()})

    def execute(self, requests):
        probe = self.probe
        with probe["lock"]:
            probe["now"] += 1
            probe["most"] = max(probe["most"], probe["now"])
            if probe["now"] >= 3:
                probe["crowd"].set()
        probe["crowd"].wait(0.3)
        with probe["lock"]:
            probe["now"] -= 1
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]) for r in requests]
'''

ENSEMBLE_CONFIG = """
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{
  {limit}
  step [
    {{ model_name: "{first}" model_version: -1
       input_map {{ key: "X" value: "X" }} output_map {{ key: "Y" value: "T" }} }},
    {{ model_name: "{second}" model_version: -1
       input_map {{ key: "X" value: "T" }} output_map {{ key: "Y" value: "Y" }} }}
  ]
}}
"""


def write(repo: Path, name: str, config: str, code: str | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    if code is not None:
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


def probe(name: str) -> dict:
    return sys.modules["_triton_nb_inflight_probes"].__dict__[name]


# ---------------------------------------------------------------------- max_inflight_requests (2.63)
@pytest.fixture(scope="module")
def ensembles(tmp_path_factory):
    repo = tmp_path_factory.mktemp("inflight")
    for name in ("first_limited", "second_limited", "first_free", "second_free"):
        write(repo, name, STEP_CONFIG.format(name=name, extra=""), PROBED_STEP)
    write(repo, "limited", ENSEMBLE_CONFIG.format(name="limited", limit="max_inflight_requests: 2",
                                                   first="first_limited", second="second_limited"))
    write(repo, "free", ENSEMBLE_CONFIG.format(name="free", limit="", first="first_free", second="second_free"))
    sys.modules.pop("_triton_nb_inflight_probes", None)
    with serve(repo) as server:
        yield server


def run_together(server, model: str, count: int = 8) -> list[float]:
    futures = [server.infer_async(InferRequest(model, {"X": np.array([float(i)], np.float32)})) for i in range(count)]
    wait(futures, timeout=120)
    return [float(f.result(timeout=0).outputs["Y"][0]) for f in futures]


def test_without_a_limit_the_steps_instances_run_together(ensembles):
    assert run_together(ensembles, "free") == [i + 2.0 for i in range(8)]
    assert probe("first_free")["most"] >= 3 and probe("second_free")["most"] >= 3


def test_max_inflight_requests_bounds_each_steps_requests_in_flight(ensembles):
    assert run_together(ensembles, "limited") == [i + 2.0 for i in range(8)]
    assert 1 <= probe("first_limited")["most"] <= 2
    assert 1 <= probe("second_limited")["most"] <= 2
    stats = {m["name"]: m for m in ensembles.statistics()["model_stats"]}
    assert stats["limited"]["inference_stats"]["success"]["count"] == 8
    assert stats["second_limited"]["inference_stats"]["success"]["count"] == 8


def test_a_failing_step_frees_its_slot(tmp_path):
    failing = PROBED_STEP.replace("return [pb_utils.InferenceResponse(", "raise ValueError('no')\n        return [(")
    write(tmp_path, "first", STEP_CONFIG.format(name="first", extra=""), PROBED_STEP)
    write(tmp_path, "second", STEP_CONFIG.format(name="second", extra=""), failing)
    write(tmp_path, "limited", ENSEMBLE_CONFIG.format(name="limited", limit="max_inflight_requests: 1",
                                                       first="first", second="second"))
    with serve(tmp_path) as server:
        futures = [server.infer_async(InferRequest("limited", {"X": np.array([1.0], np.float32)})) for _ in range(3)]
        wait(futures, timeout=120)
        for future in futures:  # each fails at its step; none waits for a slot that is never freed
            with pytest.raises(TritonNBError, match="step 1 \\('second'\\)"):
                future.result(timeout=0)


def test_max_inflight_requests_is_served_not_refused():
    config = parse_config(ENSEMBLE_CONFIG.format(name="e", limit="max_inflight_requests: 4", first="a", second="b"))
    assert config.ensemble_scheduling.max_inflight_requests == 4
    assert check_fields(config) == []


# ---------------------------------------------------------------------- first-response histogram (2.65)
PLAIN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if x[0] < 0:
                raise ValueError("negative")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
'''

# X[0] responses, then the final flag alone
STREAMING = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            for i in range(int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0])):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([i], np.float32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

ONE = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
{extra}
"""

HISTOGRAM = "nv_inference_first_response_histogram_ms"


def histogram_counts(server) -> dict[str, float]:
    families = parse_metrics(server.metrics_text())
    return {labels["model"]: value for name, labels, value in families[HISTOGRAM]["samples"]
            if name == f"{HISTOGRAM}_count"}


@pytest.mark.parametrize("python_instances", ["thread", "process"])
def test_every_model_observes_its_first_responses(tmp_path, python_instances):
    write(tmp_path, "plain", ONE.format(name="plain", extra=""), PLAIN)
    write(tmp_path, "streaming", ONE.format(name="streaming", extra="model_transaction_policy { decoupled: true }"),
          STREAMING)
    write(tmp_path, "pair", ENSEMBLE_CONFIG.format(name="pair", limit="", first="plain", second="plain"))
    with serve(tmp_path, metrics_config=["histogram_latencies=true"], python_instances=python_instances) as server:
        assert histogram_counts(server) == {"plain": 0, "streaming": 0, "pair": 0}  # every model: Triton 2.65
        server.infer(InferRequest("plain", {"X": np.array([1.0], np.float32)}), timeout_s=60)
        with pytest.raises(TritonNBError):  # an error response is a first response too
            server.infer(InferRequest("plain", {"X": np.array([-1.0], np.float32)}), timeout_s=60)
        with pytest.raises(TritonNBError):  # refused before it was scheduled: no response, not observed
            server.infer(InferRequest("plain", {"X": np.array([1.0, 2.0], np.float32)}), timeout_s=60)
        server.infer(InferRequest("pair", {"X": np.array([1.0], np.float32)}), timeout_s=60)
        client = server.client()
        assert len(list(client.stream_infer("streaming", {"X": np.array([3.0], np.float32)}))) >= 3
        list(client.stream_infer("streaming", {"X": np.array([0.0], np.float32)}))  # the final flag alone
        counts = histogram_counts(server)
    # plain: 1 success + 1 error + the ensemble's 2 steps; streaming: one first response of its
    # three, none for the request that sent none
    assert counts == {"plain": 4, "streaming": 1, "pair": 1}


# ---------------------------------------------------------------------- a request cancelled while queued
# Y = X; X[0] of 1 waits (at most 60 s) until the test lets it go, holding the model's one instance
GATED = '''
import sys
import threading
import types

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        gates = sys.modules.setdefault("_triton_nb_cancel_gates", types.ModuleType("gates"))
        self.gate = gates.__dict__.setdefault("gate", {"running": threading.Event(), "go": threading.Event(),
                                                       "executed": []})

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            self.gate["executed"].append(float(x[0]))
            if x[0] == 1:
                self.gate["running"].set()
                self.gate["go"].wait(60)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
'''


def test_a_request_cancelled_while_queued_never_runs(tmp_path):
    from triton_nb.errors import RequestCancelledError

    write(tmp_path, "gated", ONE.format(name="gated", extra="instance_group [ { count: 1 kind: KIND_CPU } ]"), GATED)
    sys.modules.pop("_triton_nb_cancel_gates", None)
    with serve(tmp_path) as server:
        gate = sys.modules["_triton_nb_cancel_gates"].__dict__["gate"]
        holding = server.infer_async(InferRequest("gated", {"X": np.array([1.0], np.float32)}))
        assert gate["running"].wait(60)
        queued = InferRequest("gated", {"X": np.array([2.0], np.float32)})
        waiting = server.infer_async(queued)
        queued.cancelled = True  # what a BLS caller's ResponseIterator.cancel() does
        gate["go"].set()
        assert float(holding.result(timeout=60).outputs["Y"][0]) == 1.0
        with pytest.raises(RequestCancelledError, match="model 'gated': the request was cancelled before it ran"):
            waiting.result(timeout=60)
        stats = server.statistics("gated")["model_stats"][0]["inference_stats"]
    assert gate["executed"] == [1.0]
    assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 1
