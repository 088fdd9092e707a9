"""The response cache against a real Triton Inference Server (2.51, nvidia-pytriton's binary, with its
local cache from the wheel's ``caches/`` folder): the same Python-model repository, the same request
sequence, the same hits, misses, executions and ``nv_cache_*_per_model`` series on both servers —
with the cache (``--cache-config local,size=N`` / ``cache_size_bytes=N``) and without it (the
models' ``response_cache`` flag then does nothing, but their series are there at zero)."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.helpers.cache_models import CACHE, write_ensemble, write_pair  # the same models as the in-kernel tests
from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason
from triton_nb import serve

pytestmark = pytest.mark.real_triton

SIZE = 1 << 20
X1 = np.array([[1.0, 2.0]], dtype=np.float32)
X2 = np.array([[3.0, 4.0]], dtype=np.float32)
# (model, input name, data): repeats of X1 and X2, the same on both servers
SEQUENCE = [("pair", "X", X1), ("pair", "X", X1), ("pair", "X", X2), ("pair", "X", X1), ("pair", "X", X2),
            ("plain", "X", X1), ("plain", "X", X1),
            ("top", "IN", X1), ("top", "IN", X1), ("top", "IN", X2), ("top", "IN", X1)]


def _require_tritonserver() -> None:
    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)


def _repository(root: Path) -> Path:
    write_pair(root, "pair", extra=CACHE)
    write_pair(root, "plain", extra="")
    write_pair(root, "inner", extra="")
    write_ensemble(root, "top", "inner", extra=CACHE)
    return root


@contextmanager
def _real(repo: Path, cache: bool) -> Iterator[tuple[str, str]]:
    args = [f"--cache-config=local,size={SIZE}"] if cache else []
    with RealTritonServer(repo, extra_args=args, startup_timeout_s=90.0) as server:
        yield server.http_url, server.metrics_url


@contextmanager
def _ours(repo: Path, cache: bool) -> Iterator[tuple[str, str]]:
    with serve(repo, http_port=0, metrics_port=0, cache_size_bytes=SIZE if cache else None) as server:
        yield f"127.0.0.1:{server.http_port}", f"http://127.0.0.1:{server.metrics_port}/metrics"


def _run(start: Callable, repo: Path, cache: bool) -> tuple[dict[str, dict], str, list[np.ndarray]]:
    """Send the sequence; the statistics by model, the /metrics text and the answers."""
    with start(repo, cache) as (url, metrics_url):
        client = httpclient.InferenceServerClient(url)
        try:
            answers = []
            for model, name, data in SEQUENCE:
                tensor = httpclient.InferInput(name, list(data.shape), "FP32")
                tensor.set_data_from_numpy(data)
                result = client.infer(model, [tensor])
                answers.append(result.as_numpy("DOUBLE" if name == "X" else "OUT"))
            stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
        finally:
            client.close()
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            text = response.read().decode()
    return stats, text, answers


def _counts(stats: dict[str, dict], model: str, ensemble: bool = False) -> dict[str, int]:
    entry = stats[model]
    inference = entry["inference_stats"]
    counts = {"success": int(inference["success"]["count"]), "queue": int(inference["queue"]["count"]),
              "cache_hit": int(inference["cache_hit"]["count"]), "cache_miss": int(inference["cache_miss"]["count"]),
              "inference_count": int(entry["inference_count"])}
    if not ensemble:  # an ensemble's executions and compute are its steps' (counted differently here)
        counts.update(execution_count=int(entry["execution_count"]),
                      compute_infer=int(inference["compute_infer"]["count"]))
    return counts


def _series(text: str, family: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        rf'^{family}{{model="([^"]+)",version="1"}} (\S+)$', text, re.MULTILINE)}


@pytest.mark.parametrize("cache", [True, False], ids=["with-cache", "without-cache"])
def test_hits_misses_and_series_match_real_triton(tmp_path, cache):
    _require_tritonserver()
    repo = _repository(tmp_path / "repo")
    real_stats, real_text, real_answers = _run(_real, repo, cache)
    our_stats, our_text, our_answers = _run(_ours, repo, cache)

    for real, ours in zip(real_answers, our_answers, strict=True):
        np.testing.assert_array_equal(ours, real)
    for model, ensemble in (("pair", False), ("plain", False), ("top", True), ("inner", False)):
        assert _counts(our_stats, model, ensemble) == _counts(real_stats, model, ensemble), model

    pair = _counts(our_stats, "pair")
    if cache:  # what the sequence means: one execution per distinct input, the rest hits
        assert pair["cache_hit"] == 3 and pair["cache_miss"] == 2 and pair["execution_count"] == 2
        assert _counts(our_stats, "top", True)["cache_hit"] == 2 and _counts(our_stats, "inner")["success"] == 2
    else:
        assert pair["cache_hit"] == 0 and pair["execution_count"] == 5

    for family in ("nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model"):
        real_series, our_series = _series(real_text, family), _series(our_text, family)
        assert set(real_series) == set(our_series) == {"pair", "top"}, family  # only models that enable it
        assert our_series == real_series, family
    for family in ("nv_cache_hit_duration_per_model", "nv_cache_miss_duration_per_model"):
        assert set(_series(our_text, family)) == set(_series(real_text, family)) == {"pair", "top"}
    assert ("# TYPE nv_cache_num_entries gauge" in real_text) == cache
    assert ("# TYPE nv_cache_num_entries gauge" in our_text) == cache
