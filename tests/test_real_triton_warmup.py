"""Model warm-up against real Triton: one repository, two servers, the same warm-ups and failures.

The repository's Python model logs every batch it executes (instance, number of requests, the
first request's tensors) to ``events.log`` in its folder; each server gets its own copy of the
repository, and the test compares what the warm-ups fed each instance, the statistics they left,
and that the same bad samples fail the load on both (messages compared loosely, and printed).

Not compared, because Triton 2.51 crashes (SIGSEGV) instead of failing the load: a sample whose
model raises from ``execute``, a ``batch_size`` above ``max_batch_size``, and a ``batch_size``
above 1 for a model that does not batch. CI installs the server; one that cannot run fails here.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason
from triton_nb import serve

pytestmark = pytest.mark.real_triton

MODEL = '''
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X; logs each batch; answers warm-ups (X[0] of 0 or 7) with an error when told to."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.fail = config.get("parameters", {}).get("fail", {}).get("string_value", "") == "true"
        self.instance = args["model_instance_name"]
        self.folder = args["model_repository"]

    def execute(self, requests):
        first = {t.name(): t.as_numpy() for t in requests[0].inputs()}
        event = {"instance": self.instance, "requests": len(requests),
                 "X": first["X"].tolist(), "S": [v.decode() for v in first["S"].ravel()]}
        with open(os.path.join(self.folder, "events.log"), "a") as log:
            log.write(json.dumps(event) + "\\n")
        warmup = all(float(pb_utils.get_input_tensor_by_name(r, "X").as_numpy().flat[0]) in (0.0, 7.0)
                     for r in requests)
        if warmup and self.fail:
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("bad warm-up data"))
                    for _ in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                            .as_numpy())]) for r in requests]
'''

X_ZERO = 'inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } }'
X_FILE = 'inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "x.bin" } }'
S_ZERO = 'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } }'
S_RANDOM = 'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] random_data: true } }'
S_FILE = 'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.bin" } }'

GOOD_SAMPLES = (f'{{ name: "zeros" batch_size: 3 count: 2 {X_ZERO} {S_ZERO} }}, '
                f'{{ name: "random_strings" batch_size: 1 {X_ZERO} {S_RANDOM} }}, '
                f'{{ name: "from_files" batch_size: 1 {X_FILE} {S_FILE} }}')

MODELS = {  # name: (samples, fail in execute, instances)
    "warm": (GOOD_SAMPLES, False, 2),
    "failing": (f'{{ name: "zeros" batch_size: 1 {X_ZERO} {S_ZERO} }}', True, 1),
    "short_file": (f'{{ name: "short" batch_size: 1 {X_FILE.replace("x.bin", "short.bin")} {S_ZERO} }}', False, 1),
    "missing_input": (f'{{ name: "lacking" batch_size: 1 {X_ZERO} }}', False, 1),
}


def _write_repository(root: Path) -> Path:
    for name, (samples, fail, count) in MODELS.items():
        folder = root / name
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.py").write_text(MODEL)
        (folder / "warmup").mkdir()
        (folder / "warmup" / "x.bin").write_bytes(np.array([7, 8], "<f4").tobytes())
        (folder / "warmup" / "short.bin").write_bytes(np.array([7], "<f4").tobytes())
        (folder / "warmup" / "s.bin").write_bytes(b"".join(struct.pack("<I", len(v)) + v for v in (b"hi", b"there")))
        (folder / "config.pbtxt").write_text(f"""
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }}, {{ name: "S" data_type: TYPE_STRING dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
dynamic_batching {{ }}
parameters {{ key: "fail" value: {{ string_value: "{str(fail).lower()}" }} }}
model_warmup [ {samples} ]
""")
    return root


def _events(folder: Path) -> dict[str, list[tuple]]:
    """Per instance, in order: (requests, X, S) of each executed batch."""
    path = folder / "events.log"
    per_instance: dict[str, list[tuple]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        event = json.loads(line)
        per_instance.setdefault(event["instance"], []).append((event["requests"], event["X"], event["S"]))
    return per_instance


def _observe(url: str, repository: Path) -> dict:
    """Load every model over HTTP; what each load did, the warm model's statistics and a reload."""
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    seen: dict = {"loads": {}}
    try:
        for name in MODELS:
            try:
                client.load_model(name)
                seen["loads"][name] = ("READY" if client.is_model_ready(name) else "NOT READY", "")
            except InferenceServerException as exc:
                seen["loads"][name] = ("FAILED", exc.message())
        (stats,) = client.get_inference_statistics("warm")["model_stats"]
        seen["stats"] = {key: stats[key] for key in ("inference_count", "execution_count")}
        seen["stats"]["success"] = stats["inference_stats"]["success"]["count"]
        seen["events"] = _events(repository / "warm")
        client.load_model("warm")  # a reload warms the new instances again
        seen["reloaded_events"] = _events(repository / "warm")
        (stats,) = client.get_inference_statistics("warm")["model_stats"]
        seen["reloaded_stats"] = {key: stats[key] for key in ("inference_count", "execution_count")}
    finally:
        client.close()
    return seen


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> dict[str, dict]:
    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)
    source = _write_repository(tmp_path_factory.mktemp("warmup") / "source")
    results = {}
    triton_repo = Path(shutil.copytree(source, source.parent / "triton"))
    with RealTritonServer(triton_repo, extra_args=("--model-control-mode=explicit",)) as server:
        results["triton"] = _observe(server.http_url, triton_repo)
    ours_repo = Path(shutil.copytree(source, source.parent / "triton_nb"))
    with serve(ours_repo, model_control_mode="explicit", load_models=[], http_port=0,
               network_model_control=True) as server:
        results["triton_nb"] = _observe(f"127.0.0.1:{server.http_port}", ours_repo)
    for who, seen in results.items():
        print(f"{who}: {json.dumps(seen['loads'], indent=1)}")
    return results


def test_both_run_the_same_warm_ups_on_every_instance(both):
    triton, ours = both["triton"]["events"], both["triton_nb"]["events"]
    assert set(triton) == {"warm_0_0", "warm_0_1"}
    assert ours == triton
    expected = [(3, [[0.0, 0.0]], ["", ""])] * 2 + [(1, [[0.0, 0.0]], ["", ""]), (1, [[7.0, 8.0]], ["hi", "there"])]
    assert triton["warm_0_0"] == expected  # random strings are empty in Triton too


def test_both_are_ready_only_after_warm_up_and_count_it_the_same(both):
    assert both["triton"]["loads"]["warm"] == both["triton_nb"]["loads"]["warm"] == ("READY", "")
    assert both["triton_nb"]["stats"] == both["triton"]["stats"] == {"inference_count": 16, "execution_count": 8,
                                                                    "success": 16}


def test_both_warm_up_again_on_a_reload(both):
    for who in ("triton", "triton_nb"):
        before, after = both[who]["events"], both[who]["reloaded_events"]
        assert {i: len(e) for i, e in after.items()} == {i: 2 * len(e) for i, e in before.items()}, who
    # the reloaded version's statistics start from zero: only its own warm-up is counted
    assert both["triton_nb"]["reloaded_stats"] == both["triton"]["reloaded_stats"] == {"inference_count": 16,
                                                                                      "execution_count": 8}


@pytest.mark.parametrize("model, words", [
    ("failing", ["failed to run warmup sample 'zeros'", "bad warm-up data"]),
    ("short_file", ["warmup setting expects 8 bytes, but the data provided from short.bin", "4 bytes"]),
    ("missing_input", ["expected 2 inputs but got 1 inputs for model 'missing_input'",
                       "missing required input(s) ['S']"]),
])
def test_both_fail_the_load_of_a_bad_sample(both, model, words):
    for who in ("triton", "triton_nb"):
        state, message = both[who]["loads"][model]
        assert state == "FAILED", who
        for word in words:
            assert word in message.replace(".binonly", ".bin only"), (who, message)  # Triton drops a space
    assert "'missing_input'" in both["triton_nb"]["loads"]["missing_input"][1]


def test_the_warm_fraud_export_loads_in_both_with_its_samples_run_once(trained, tmp_path):
    from triton_nb.repository import export_fraud_repository

    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)
    root = export_fraud_repository(trained, tmp_path / "repo", model_backend="python", warmup=True)
    counts = {}
    with RealTritonServer(root, extra_args=("--model-control-mode=explicit", "--load-model=preprocessing",
                                            "--load-model=fil")) as server:
        counts["triton"] = _inference_counts(server.http_url)
    with serve(root, model_control_mode="explicit", load_models=["preprocessing", "fil"], http_port=0) as server:
        counts["triton_nb"] = _inference_counts(f"127.0.0.1:{server.http_port}")
    assert counts["triton"] == counts["triton_nb"] == {"preprocessing": (1, 1), "fil": (1, 1)}


def _inference_counts(url: str) -> dict[str, tuple[int, int]]:
    client = httpclient.InferenceServerClient(url)
    try:
        assert client.is_model_ready("preprocessing") and client.is_model_ready("fil")
        stats = client.get_inference_statistics()["model_stats"]
        return {s["name"]: (s["inference_count"], s["execution_count"]) for s in stats}
    finally:
        client.close()
