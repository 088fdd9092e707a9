"""The metrics users ask for, against a real Triton Inference Server (2.51, nvidia-pytriton's binary):
the same Python models and ``--metrics-config summary_latencies=true`` on both servers give the same
metric families, types, sample names and label sets (custom metrics from ``pb_utils.MetricFamily``,
the latency summaries, the CPU gauges), the same custom metric values, and ``pb_utils.load_model`` /
``unload_model`` from a BLS model behave alike in explicit mode and fail with the same words in
mode none. (Latency values differ, as they would between two runs of one server.)"""

from __future__ import annotations

import http.client
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.helpers.metrics_models import (  # the in-kernel tests' models
    SUMMARIES,
    parse_metrics,
    write_counted,
    write_loader,
)
from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason
from triton_nb import serve

pytestmark = pytest.mark.real_triton

COMPARED = (*SUMMARIES, "custom_requests_total", "custom_last_rows", "custom_input_sum", "nv_cpu_utilization",
            "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes", "nv_inference_request_success",
            "nv_inference_count")
CUSTOM = ("custom_requests_total", "custom_last_rows", "custom_input_sum")


def _require_tritonserver() -> None:
    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)


@contextmanager
def _real(repo: Path, mode: str, models: list[str]) -> Iterator[tuple[str, str]]:
    args = [f"--model-control-mode={mode}", "--metrics-config=summary_latencies=true",
            *(f"--load-model={m}" for m in models)]
    with RealTritonServer(repo, extra_args=args, startup_timeout_s=90.0) as server:
        yield server.http_url, server.metrics_url


@contextmanager
def _ours(repo: Path, mode: str, models: list[str]) -> Iterator[tuple[str, str]]:
    with serve(repo, model_control_mode=mode, load_models=models or "*", http_port=0, metrics_port=0,
               metrics_config=["summary_latencies=true"], freeze_gc=False) as server:
        yield f"127.0.0.1:{server.http_port}", f"http://127.0.0.1:{server.metrics_port}/metrics"


ABORTED = "<the server aborted>"
_ATTEMPTS = 3


def _infer(client: httpclient.InferenceServerClient, model: str, name: str, data: np.ndarray, output: str) -> object:
    """The output's first element, the error's message, or :data:`ABORTED` (the connection closed)."""
    tensor = httpclient.InferInput(name, list(data.shape), "FP32" if data.dtype == np.float32 else "INT32")
    tensor.set_data_from_numpy(data)
    try:
        return client.infer(model, [tensor]).as_numpy(output).flat[0].item()
    except InferenceServerException as exc:
        return exc.message()
    except (OSError, http.client.HTTPException):  # geventhttpclient's HTTPConnectionClosed, or refused: gone
        return ABORTED


def _act(client: httpclient.InferenceServerClient, action: int) -> object:
    return _infer(client, "loader", "ACTION", np.array([action], dtype=np.int32), "READY")


def _run(start: Callable, repo: Path, mode: str, models: list[str]) -> tuple[list[object], dict[str, dict]]:
    """Requests to "counted", then the loader's actions (with "target" inferred after each load):
    the answers, and the /metrics families at the end (explicit mode only).

    Triton 2.51's Python backend aborts the server (boost ``lock_exception``) at random when a
    model-control call fails, at that request (about one run in four here) or at the instance's
    next: the failing call is therefore the loader's last request (in mode none there is one:
    load; unload's words are checked in-kernel), and :func:`_run_real` retries a run it aborted."""
    with start(repo, mode, models) as (url, metrics_url):
        client = httpclient.InferenceServerClient(url)
        try:
            answers: list[object] = [_infer(client, "counted", "X", np.full((rows, 2), 3.0, np.float32), "Y")
                                     for rows in (1, 2, 3)]
            if mode == "explicit":
                answers += [_act(client, 0), _act(client, 1),
                            _infer(client, "target", "X", np.ones((1, 2), np.float32), "Y"),
                            _act(client, 2), _act(client, 3),
                            _infer(client, "target", "X", np.ones((1, 2), np.float32), "Y"),
                            # back to the repository's "target": its custom series continue from before
                            _act(client, 1), _infer(client, "target", "X", np.ones((1, 2), np.float32), "Y")]
                missing = _act(client, 4)  # the backend's prefixes, then the server's own words
                answers.append(missing.split(":")[0] if isinstance(missing, str) else missing)
            else:
                answers.append(_act(client, 1))
        finally:
            client.close()
        families = {}
        if mode == "explicit" and ABORTED not in answers:
            with urllib.request.urlopen(metrics_url, timeout=10) as response:
                families = parse_metrics(response.read())
    return answers, families


def _run_real(repo: Path, mode: str, models: list[str]) -> tuple[list[object], dict[str, dict]]:
    for _ in range(_ATTEMPTS):
        answers, families = _run(_real, repo, mode, models)
        if ABORTED not in answers:
            break
    return answers, families


def _shape(families: dict[str, dict]) -> dict[str, tuple[str, set[tuple[str, frozenset[str]]]]]:
    """Each compared family's type and its (sample name, label names) pairs."""
    return {name: (families[name]["type"], {(sample, frozenset(labels)) for sample, labels, _ in
                                            families[name]["samples"]})
            for name in COMPARED if name in families}


def _custom_values(families: dict[str, dict]) -> dict[str, set[tuple[str, tuple[tuple[str, str], ...], float]]]:
    return {name: {(sample, tuple(sorted(labels.items())), value) for sample, labels, value in
                   families[name]["samples"]} for name in CUSTOM if name in families}


@pytest.mark.slow
def test_custom_metrics_summaries_and_the_model_loading_api_match_real_triton(tmp_path):
    _require_tritonserver()
    repo = tmp_path / "repo"
    write_counted(repo)
    write_loader(repo)
    models = ["counted", "loader"]
    real_answers, real = _run_real(repo, "explicit", models)
    our_answers, ours = _run(_ours, repo, "explicit", models)

    assert our_answers == real_answers
    # load, unload, load with overrides, load from the repository again, a model the repository lacks
    assert our_answers[3:] == [0, 1, 2.0, 0, 1, 3.0, 1, 2.0, "Failed to load model"]
    assert _shape(ours) == _shape(real)
    assert set(_shape(ours)) == set(COMPARED)
    assert _custom_values(ours) == _custom_values(real)
    target = [v for name, labels, v in ours["custom_requests_total"]["samples"] if labels["model"] == "target"]
    assert target == [2]  # one request before the unload, one after the reload: the same series
    for family in SUMMARIES:  # a count per successful request of "counted", as Triton's
        counts = {labels["model"]: v for name, labels, v in ours[family]["samples"] if name == f"{family}_count"}
        assert counts["counted"] == 3


def test_the_model_loading_api_fails_alike_outside_explicit_mode(tmp_path):
    _require_tritonserver()
    repo = tmp_path / "repo"
    write_counted(repo)
    write_loader(repo)
    real_answers, _ = _run_real(repo, "none", [])
    our_answers, _ = _run(_ours, repo, "none", [])
    assert our_answers == real_answers
    assert our_answers[3:] == ["Failed to load model: Failed to process the request for model 'loader_0', message: "
                               "explicit model load / unload is not allowed if polling is enabled"]
