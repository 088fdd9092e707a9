"""The response cache (triton_nb.server.cache): keys, the LRU store, Triton's statistics and
metrics for hits and misses, and the cache on every path — in-process, HTTP, gRPC, ensembles,
live switching, reloads, the perf tools and the CLI flag."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from concurrent.futures import Future

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.cache_models import CACHE, write_ensemble, write_pair
from tests.helpers.scale_models import DECOUPLED_CONFIG, write_python_model, write_scale_model
from triton_nb import perf, serve
from triton_nb.cli import main
from triton_nb.errors import InvalidArgumentError
from triton_nb.perf.inputs import request_inputs, with_repeats
from triton_nb.repository.config import ModelConfig, config_from_json
from triton_nb.server.cache import (
    EXISTS,
    INSERTED,
    TOO_LARGE,
    CacheSwitches,
    ResponseCache,
    ServerCache,
    entry_nbytes,
    parse_cache_config,
    request_key,
    response_cache_problem,
)
from triton_nb.server.observability.stats import ModelStats, ServerStats
from triton_nb.tensors import InferRequest, InferResponse

MB = 1 << 20


def model_stats(server, name: str) -> dict:
    return server.statistics(name)["model_stats"][0]


def infer(server, model: str, x: np.ndarray, name: str = "X", outputs=None) -> InferResponse:
    return server.infer(InferRequest(model, {name: x}, requested_outputs=outputs), timeout_s=30)


def sample(text: str, family: str, model: str) -> float | None:
    found = re.search(rf'^{family}{{model="{model}",version="1"}} (\S+)$', text, re.MULTILINE)
    return None if found is None else float(found.group(1))


X1 = np.array([[1.0, 2.0]], dtype=np.float32)
X2 = np.array([[3.0, 4.0]], dtype=np.float32)


# ---------------------------------------------------------------------- keys


def key(request: InferRequest, model: str = "m", version: int = 1, generation=(0,)) -> bytes | None:
    return request_key(model, version, generation, request)


def test_the_key_covers_model_version_generation_outputs_and_every_input_detail():
    base = InferRequest("m", {"A": np.arange(8, dtype=np.float32).reshape(2, 4), "B": np.array([1], np.int64)})
    same = InferRequest("m", {"B": np.array([1], np.int64), "A": np.arange(8, dtype=np.float32).reshape(2, 4)})
    assert key(base) == key(same)  # input order does not matter
    assert len(key(base)) == 32
    assert key(base, model="n") != key(base)
    assert key(base, version=2) != key(base)
    assert key(base, generation=(1,)) != key(base)
    reshaped = InferRequest("m", {"A": np.arange(8, dtype=np.float32).reshape(4, 2), "B": np.array([1], np.int64)})
    assert key(reshaped) != key(base)  # same bytes, another shape (Triton's 64-bit hash collides here)
    retyped = InferRequest("m", {"A": np.arange(8, dtype=np.float32).reshape(2, 4).view(np.int32),
                                 "B": np.array([1], np.int64)})
    assert key(retyped) != key(base)  # same bytes, another datatype
    renamed = InferRequest("m", {"C": base.inputs["A"], "B": base.inputs["B"]})
    assert key(renamed) != key(base)
    changed = InferRequest("m", {"A": base.inputs["A"] + 1, "B": base.inputs["B"]})
    assert key(changed) != key(base)
    wide = np.zeros((2, 8), dtype=np.float32)
    wide[:, ::2] = base.inputs["A"]
    strided = InferRequest("m", {"A": wide[:, ::2], "B": base.inputs["B"]})
    assert not strided.inputs["A"].flags.c_contiguous
    assert key(strided) == key(base)  # a view hashes as its values


def test_the_key_separates_requested_outputs_and_ignores_their_order():
    def request(outputs):
        return InferRequest("m", {"X": X1}, requested_outputs=outputs)

    assert key(request(["P", "Q"])) == key(request(["Q", "P"]))
    assert key(request(["P"])) != key(request(["P", "Q"]))
    assert key(request(None)) != key(request(["P"]))
    assert key(request(None)) == key(request([]))


def test_bytes_elements_keep_their_boundaries():
    def strings(*values):
        return InferRequest("m", {"S": np.array(values, dtype=object)})

    assert key(strings(b"ab", b"c")) != key(strings(b"a", b"bc"))
    assert key(strings(b"ab", b"")) != key(strings(b"ab"))
    assert key(strings("ab", "c")) == key(strings(b"ab", b"c"))  # text is its UTF-8
    assert key(strings(1, 2)) is None  # not bytes: such a request is not cached


# ---------------------------------------------------------------------- the store


def outputs(n: int, value: float = 0.0) -> dict[str, np.ndarray]:
    return {"Y": np.full(n, value, dtype=np.float32)}


def test_entries_are_evicted_least_recently_used_first_within_the_byte_budget():
    one = entry_nbytes(b"k" * 32, outputs(100))
    cache = ResponseCache(3 * one)
    keys = [bytes([i]) * 32 for i in range(4)]
    for i in range(3):
        assert cache.insert(keys[i], outputs(100, i)) == INSERTED
    assert cache.used_bytes == 3 * one and len(cache) == 3
    assert cache.lookup(keys[0]) is not None  # 0 is now the most recently used
    assert cache.insert(keys[3], outputs(100, 3)) == INSERTED
    assert keys[1] not in cache and all(k in cache for k in (keys[0], keys[2], keys[3]))
    assert cache.evictions == 1 and cache.used_bytes == 3 * one
    assert cache.insert(keys[3], outputs(100, 9)) == EXISTS
    assert cache.lookup(keys[3])["outputs"]["Y"][0] == 3  # an existing entry is left as it was


def test_an_entry_larger_than_the_cache_is_not_inserted_and_evicts_nothing():
    cache = ResponseCache(1000)
    assert cache.insert(b"a" * 32, outputs(10)) == INSERTED
    assert cache.insert(b"b" * 32, outputs(1000)) == TOO_LARGE
    assert b"b" * 32 not in cache and b"a" * 32 in cache and cache.evictions == 0


def test_stored_outputs_are_copies_that_neither_side_can_change():
    cache = ResponseCache(MB)
    source = outputs(4, 1.0)
    cache.insert(b"k", source)
    source["Y"][:] = 7  # the model reuses its buffer
    first = cache.lookup(b"k")["outputs"]["Y"]
    assert first.tolist() == [1.0] * 4 and first.flags.writeable
    first[:] = 9  # a caller changes what it got
    assert cache.lookup(b"k")["outputs"]["Y"].tolist() == [1.0] * 4


def test_bytes_outputs_count_their_lengths():
    strings = {"S": np.array([b"abc", b""], dtype=object)}
    assert entry_nbytes(b"k" * 32, strings) == 32 + 1 + 8 + (4 + 3) + (4 + 0)


def test_counters_and_gauges_follow_the_local_caches_names():
    cache = ResponseCache(MB)
    cache.lookup(b"a")
    cache.insert(b"a", outputs(2))
    cache.lookup(b"a")
    gauges = cache.snapshot()
    assert {k: gauges[k] for k in ("nv_cache_num_entries", "nv_cache_num_hits", "nv_cache_num_misses",
                                   "nv_cache_num_lookups", "nv_cache_num_evictions")} == {
        "nv_cache_num_entries": 1, "nv_cache_num_hits": 1, "nv_cache_num_misses": 1, "nv_cache_num_lookups": 2,
        "nv_cache_num_evictions": 0}
    assert gauges["nv_cache_util"] == pytest.approx(cache.used_bytes / MB)


def test_many_threads_keep_the_store_consistent():
    cache = ResponseCache(40 * entry_nbytes(b"k" * 32, outputs(8)))
    errors = []

    def work(worker: int) -> None:
        try:
            for i in range(400):
                k = bytes([worker, i % 60]) * 16
                found = cache.lookup(k)
                if found is None:
                    cache.insert(k, outputs(8, worker * 1000 + i % 60))
                else:
                    assert found["outputs"]["Y"][0] == worker * 1000 + i % 60
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert cache.used_bytes <= cache.size_bytes
    assert cache.used_bytes == len(cache) * entry_nbytes(b"k" * 32, outputs(8))
    assert cache.lookups == 8 * 400 and cache.hits + cache.misses == cache.lookups


# ---------------------------------------------------------------------- configuration


def test_cache_config_takes_tritons_syntax_and_refuses_other_caches():
    assert parse_cache_config(["local,size=1048576"]) == MB
    assert parse_cache_config(["local,size=10", "local,size=20"]) == 20
    with pytest.raises(InvalidArgumentError, match="cache 'redis' is not available"):
        parse_cache_config(["redis,host=localhost"])
    with pytest.raises(InvalidArgumentError, match="needs a size"):
        parse_cache_config(["local,sise=10"])
    for bad in ("local,size=0", "local,size=-5", "local,size=1k"):
        with pytest.raises(InvalidArgumentError, match="size must be a whole number"):
            parse_cache_config([bad])
    with pytest.raises(InvalidArgumentError, match="expected <cache>,<key>=<value>"):
        parse_cache_config(["local"])


def test_the_serve_command_refuses_another_cache_before_serving(tmp_path, capsys):
    write_scale_model(tmp_path)
    assert main(["serve", "--model-repository", str(tmp_path), "--cache-config", "redis,host=x"]) == 2
    assert "cache 'redis' is not available" in capsys.readouterr().err


def test_tritons_load_time_refusals_are_available_with_its_words():
    decoupled = config_from_json({"name": "d", "model_transaction_policy": {"decoupled": True},
                                  "response_cache": {"enable": True}})
    assert response_cache_problem(decoupled) == (
        "Response Cache does not currently support model d with 'decoupled' transaction policy. "
        "Please disable the response cache.")
    sequence = config_from_json({"name": "s", "sequence_batching": {}, "response_cache": {"enable": True}})
    assert "with sequence batching scheduler" in response_cache_problem(sequence)
    assert response_cache_problem(config_from_json({"name": "d", "model_transaction_policy": {
        "decoupled": True}})) is None


def test_a_negative_size_is_refused(repo):
    with pytest.raises(InvalidArgumentError, match="cache_size_bytes"):
        serve(repo, cache_size_bytes=-1)


# ---------------------------------------------------------------------- statistics and metrics


def test_hits_and_misses_count_as_tritons_infer_stats_does():
    stats = ModelStats("m", 1)
    stats.record_successes([(50_000, 10_000, 2)], compute_input_ns=1_000, compute_infer_ns=5_000,
                           compute_output_ns=500)
    stats.record_cache_miss(3_000)
    stats.record_cache_hit(request_ns=8_000, queue_ns=1_500, hit_ns=2_500)
    inference = stats.to_json()["inference_stats"]
    assert inference["success"] == {"count": 2, "ns": 50_000 + 3_000 + 8_000}
    assert inference["queue"] == {"count": 2, "ns": 11_500}
    assert inference["compute_infer"] == {"count": 1, "ns": 5_000}  # successes less hits
    assert inference["cache_hit"] == {"count": 1, "ns": 2_500}
    assert inference["cache_miss"] == {"count": 1, "ns": 3_000}
    assert stats.to_json()["inference_count"] == 2 and stats.to_json()["execution_count"] == 0


def test_cache_series_exist_only_for_versions_that_use_the_cache_in_tritons_order():
    server = ServerStats()
    server.model("plain", 1).record_request(success=True, request_ns=1_000)
    server.model("cached", 1).record_cache_hit(request_ns=4_000, queue_ns=0, hit_ns=2_000)
    server.model("idle", 1)
    server.cache_series = lambda name, version: name == "idle"
    text = server.prometheus_text().decode()
    assert sample(text, "nv_cache_num_hits_per_model", "cached") == 1
    assert sample(text, "nv_cache_hit_duration_per_model", "cached") == 2
    assert sample(text, "nv_cache_num_misses_per_model", "idle") == 0  # enabled, nothing yet
    assert sample(text, "nv_cache_num_hits_per_model", "plain") is None
    assert sample(text, "nv_inference_request_duration_us", "cached") == 4
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    at = types.index("nv_cache_num_hits_per_model")
    assert types[at - 1] == "nv_inference_compute_output_duration_us"
    assert types[at:at + 4] == ["nv_cache_num_hits_per_model", "nv_cache_hit_duration_per_model",
                                "nv_cache_num_misses_per_model", "nv_cache_miss_duration_per_model"]
    assert types[at + 4] == "nv_inference_pending_request_count"
    server.cache_series = None
    bare = ServerStats()
    bare.model("plain", 1)
    assert "nv_cache" not in bare.prometheus_text().decode()  # no series, no family


# ---------------------------------------------------------------------- the server, in process


@pytest.fixture
def cached(tmp_path):
    write_scale_model(tmp_path, "scale", extra=f"dynamic_batching {{ }}\n{CACHE}")
    write_scale_model(tmp_path, "plain", extra="dynamic_batching { }")
    write_pair(tmp_path)
    with serve(tmp_path, cache_size_bytes=MB, metrics_port=0) as server:
        yield server


def test_repeated_requests_are_hits_and_the_model_runs_once_per_distinct_input(cached):
    client = cached.client()
    answers = [client.infer("scale", {"X": x}).as_numpy("Y").tolist() for x in (X1, X1, X2, X1, X2)]
    assert answers == [[[2.0, 4.0]], [[2.0, 4.0]], [[6.0, 8.0]], [[2.0, 4.0]], [[6.0, 8.0]]]
    stats = model_stats(cached, "scale")
    inference = stats["inference_stats"]
    assert stats["execution_count"] == 2 and stats["inference_count"] == 2
    assert inference["success"]["count"] == 5 and inference["queue"]["count"] == 5
    assert inference["cache_hit"]["count"] == 3 and inference["cache_miss"]["count"] == 2
    assert inference["compute_infer"]["count"] == 2
    assert inference["cache_hit"]["ns"] > 0 and inference["cache_miss"]["ns"] > 0
    assert cached.response_cache is not None and len(cached.response_cache) == 2


def test_a_hit_answers_a_writable_copy(cached):
    first = infer(cached, "scale", X1).outputs["Y"]
    first[:] = -1
    again = infer(cached, "scale", X1)
    assert again.outputs["Y"].tolist() == [[2.0, 4.0]] and again.model_version == 1
    assert model_stats(cached, "scale")["inference_stats"]["cache_hit"]["count"] == 1


def test_a_model_without_the_flag_never_uses_the_cache(cached):
    for _ in range(3):
        infer(cached, "plain", X1)
    stats = model_stats(cached, "plain")
    assert stats["execution_count"] == 3 and stats["inference_stats"]["cache_hit"]["count"] == 0
    text = cached.metrics_text().decode()
    assert sample(text, "nv_cache_num_hits_per_model", "plain") is None
    assert sample(text, "nv_cache_num_hits_per_model", "scale") == 0
    assert re.search(r"^nv_cache_num_entries 0$", text, re.MULTILINE)


def test_a_failed_request_is_not_cached(cached):
    bad = np.array([[np.nan, 1.0]], dtype=np.float32)
    for _ in range(2):
        with pytest.raises(Exception, match="NaN"):
            infer(cached, "pair", bad)
    stats = model_stats(cached, "pair")
    assert stats["execution_count"] == 2 and stats["inference_stats"]["fail"]["count"] == 2
    assert stats["inference_stats"]["cache_miss"]["count"] == 0
    assert len(cached.response_cache) == 0


def test_requested_outputs_are_part_of_the_key(cached):
    only_double = infer(cached, "pair", X1, outputs=["DOUBLE"])
    only_plus = infer(cached, "pair", X1, outputs=["PLUS"])  # Triton 2.51 would answer DOUBLE here
    assert set(only_double.outputs) == {"DOUBLE"} and set(only_plus.outputs) == {"PLUS"}
    assert only_plus.outputs["PLUS"].tolist() == [[2.0, 3.0]]
    both = infer(cached, "pair", X1)
    assert set(both.outputs) == {"DOUBLE", "PLUS"}
    assert infer(cached, "pair", X1, outputs=["PLUS"]).outputs["PLUS"].tolist() == [[2.0, 3.0]]
    stats = model_stats(cached, "pair")["inference_stats"]
    assert stats["cache_miss"]["count"] == 3 and stats["cache_hit"]["count"] == 1


def test_same_bytes_in_another_shape_is_another_request(cached):
    data = np.arange(8, dtype=np.float32)
    wide = infer(cached, "pair", data.reshape(2, 4), outputs=["DOUBLE"]).outputs["DOUBLE"]
    tall = infer(cached, "pair", data.reshape(4, 2), outputs=["DOUBLE"]).outputs["DOUBLE"]
    assert wide.shape == (2, 4) and tall.shape == (4, 2)
    assert model_stats(cached, "pair")["inference_stats"]["cache_hit"]["count"] == 0


def test_the_cache_is_shared_by_models_and_evicts_within_its_size(tmp_path):
    write_scale_model(tmp_path, "scale", extra=f"dynamic_batching {{ }}\n{CACHE}")
    write_scale_model(tmp_path, "other", factor=3.0, extra=f"dynamic_batching {{ }}\n{CACHE}")
    one_entry = entry_nbytes(b"k" * 32, {"Y": X1})
    with serve(tmp_path, cache_size_bytes=one_entry) as server:
        for x in (X1, X2, X1):  # each evicts the other: no hit
            infer(server, "scale", x)
        assert model_stats(server, "scale")["inference_stats"]["cache_hit"]["count"] == 0
        assert infer(server, "other", X1).outputs["Y"].tolist() == [[3.0, 6.0]]  # not scale's entry
        assert server.response_cache.evictions == 3 and len(server.response_cache) == 1
        infer(server, "other", X1)
        assert model_stats(server, "other")["inference_stats"]["cache_hit"]["count"] == 1


def test_a_response_larger_than_the_cache_is_a_miss_every_time(tmp_path, caplog):
    write_scale_model(tmp_path, "scale", extra=f"dynamic_batching {{ }}\n{CACHE}")
    with serve(tmp_path, cache_size_bytes=16) as server:
        for _ in range(2):
            infer(server, "scale", X1)
        stats = model_stats(server, "scale")
        assert stats["execution_count"] == 2 and stats["inference_stats"]["cache_miss"]["count"] == 2
        assert len(server.response_cache) == 0
    assert "larger than the cache" in caplog.text


def test_without_a_server_cache_the_flag_does_nothing_but_shows_zero_series(tmp_path):
    write_scale_model(tmp_path, "scale", extra=f"dynamic_batching {{ }}\n{CACHE}")
    with serve(tmp_path) as server:
        for _ in range(2):
            infer(server, "scale", X1)
        stats = model_stats(server, "scale")
        assert stats["execution_count"] == 2 and stats["inference_stats"]["cache_hit"]["count"] == 0
        assert server.response_cache is None and server.cache_size_bytes is None
        text = server.metrics_text().decode()
        assert sample(text, "nv_cache_num_hits_per_model", "scale") == 0  # as Triton 2.51 shows it
        assert "nv_cache_util" not in text
        with pytest.raises(InvalidArgumentError, match="no response cache"):
            server.update_response_cache("scale", enable=True)


def test_the_cache_is_switched_live_and_a_reload_starts_cold(cached):
    cached.update_response_cache("plain", enable=True)
    assert cached.model_config("plain").response_cache.enable
    infer(cached, "plain", X1)
    infer(cached, "plain", X1)
    assert model_stats(cached, "plain")["inference_stats"]["cache_hit"]["count"] == 1
    assert cached.update_response_cache("plain", enable=False) is False
    assert not cached.model_config("plain").response_cache.enable
    infer(cached, "plain", X1)
    assert model_stats(cached, "plain")["execution_count"] == 2
    cached.update_response_cache("plain", enable=True)
    infer(cached, "plain", X1)  # its entry stayed
    assert model_stats(cached, "plain")["inference_stats"]["cache_hit"]["count"] == 2
    cached.update_response_cache("plain", enable=True, drop_entries=True)
    infer(cached, "plain", X1)
    assert model_stats(cached, "plain")["execution_count"] == 3

    infer(cached, "scale", X1)
    config = cached.model_config_json("scale")
    config["parameters"]["factor"] = {"string_value": "10"}
    cached.load_model("scale", config=config)
    assert infer(cached, "scale", X1).outputs["Y"].tolist() == [[10.0, 20.0]]  # not the old entry
    cached.load_model("plain")  # a reload: the config decides again
    assert not cached.model_config("plain").response_cache.enable


def test_a_decoupled_model_cannot_be_switched_on(tmp_path):
    write_python_model(tmp_path, "counter", DECOUPLED_CONFIG, """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
""")
    with serve(tmp_path, cache_size_bytes=MB) as server, pytest.raises(InvalidArgumentError,
                                                                       match="'decoupled' transaction policy"):
        server.update_response_cache("counter", enable=True)


# ---------------------------------------------------------------------- ensembles


@pytest.fixture
def ensembles(tmp_path):
    write_pair(tmp_path, "inner", extra="")
    write_pair(tmp_path, "inner_cached", extra=CACHE)
    write_ensemble(tmp_path, "top", "inner", extra=CACHE)
    write_ensemble(tmp_path, "plain_top", "inner_cached")
    with serve(tmp_path, cache_size_bytes=MB) as server:
        yield server


def test_an_ensemble_with_the_cache_is_looked_up_before_its_steps(ensembles):
    for _ in range(3):
        assert infer(ensembles, "top", X1, name="IN").outputs["OUT"].tolist() == [[2.0, 4.0]]
    top = model_stats(ensembles, "top")
    assert top["inference_stats"]["success"]["count"] == 3
    assert top["inference_stats"]["cache_hit"]["count"] == 2 and top["inference_stats"]["cache_miss"]["count"] == 1
    assert top["inference_count"] == 1  # the hits inferred nothing
    inner = model_stats(ensembles, "inner")
    assert inner["execution_count"] == 1 and inner["inference_stats"]["success"]["count"] == 1


def test_composing_models_cache_on_their_own(ensembles):
    for _ in range(3):
        infer(ensembles, "plain_top", X1, name="IN")
    assert model_stats(ensembles, "plain_top")["inference_stats"]["success"]["count"] == 3
    assert model_stats(ensembles, "plain_top")["inference_stats"]["cache_hit"]["count"] == 0
    inner = model_stats(ensembles, "inner_cached")
    assert inner["execution_count"] == 1 and inner["inference_stats"]["cache_hit"]["count"] == 2


def test_reloading_a_composing_model_invalidates_the_ensembles_entries(ensembles):
    infer(ensembles, "top", X1, name="IN")
    ensembles.load_model("inner")
    infer(ensembles, "top", X1, name="IN")
    assert model_stats(ensembles, "top")["inference_stats"]["cache_hit"]["count"] == 0
    assert model_stats(ensembles, "inner")["execution_count"] == 1  # it ran again (a reload counts from zero)


def test_a_carried_step_is_looked_up_request_by_request():
    """A step carrying several ensemble requests' rows to a caching model is split, so that each
    part is looked up (and run) on its own, as Triton looks up each ensemble request."""
    config = config_from_json({"name": "m", "max_batch_size": 8, "response_cache": {"enable": True}})

    class Target:
        name, version, config, ensemble = "m", 1, None, None
        stats = ModelStats("m", 1)

    target = Target()
    target.config = config
    switches = CacheSwitches(lambda name, version: target)
    submitted: list[InferRequest] = []

    def submit(request: InferRequest) -> Future:
        submitted.append(request)
        future: Future = Future()
        future.set_result(InferResponse("m", 1, {"Y": request.inputs["X"] * 2}))
        return future

    cache = ServerCache(MB, switches, submit)
    carried = InferRequest("m", {"X": np.array([[1.0], [2.0], [3.0]], np.float32)}, carried_rows=(1, 2))
    joined = cache.lookup(target, carried)
    assert isinstance(joined, Future)
    assert joined.result(timeout=5).outputs["Y"].tolist() == [[2.0], [4.0], [6.0]]
    assert [r.inputs["X"].tolist() for r in submitted] == [[[1.0]], [[2.0], [3.0]]]
    assert all(not r.carried_rows for r in submitted)


# ---------------------------------------------------------------------- over the network


def test_http_grpc_and_metrics_serve_from_the_cache(tmp_path):
    write_scale_model(tmp_path, "scale", extra=f"dynamic_batching {{ }}\n{CACHE}")
    with serve(tmp_path, http_port=0, grpc_port=0, metrics_port=0, cache_size_bytes=MB) as server:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            for module, client, x in ((httpclient, http, X1), (grpcclient, grpc, X2)):
                for _ in range(2):
                    tensor = module.InferInput("X", [1, 2], "FP32")
                    tensor.set_data_from_numpy(x)
                    result = client.infer("scale", [tensor])
                    np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)
            stats = http.get_inference_statistics("scale")["model_stats"][0]
            assert stats["execution_count"] == 2
            assert int(stats["inference_stats"]["cache_hit"]["count"]) == 2
            grpc_stats = grpc.get_inference_statistics("scale", as_json=True)["model_stats"][0]
            assert int(grpc_stats["inference_stats"]["cache_miss"]["count"]) == 2
        finally:
            http.close()
            grpc.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert sample(text, "nv_cache_num_hits_per_model", "scale") == 2
        assert sample(text, "nv_cache_num_misses_per_model", "scale") == 2
        assert re.search(r"^nv_cache_num_lookups 4$", text, re.MULTILINE)


def test_the_serve_command_starts_a_cache(tmp_path):
    from tests.helpers.serve_cli import start_serve

    write_scale_model(tmp_path, "scale", extra=f"dynamic_batching {{ }}\n{CACHE}")
    process, ports, _ = start_serve(tmp_path, "--cache-config", f"local,size={MB}")
    try:
        body = json.dumps({"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).encode()
        for _ in range(2):
            request = urllib.request.Request(f"http://127.0.0.1:{ports['HTTPService']}/v2/models/scale/infer",
                                             data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                assert json.loads(response.read())["outputs"][0]["data"] == [2.0, 4.0]
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['Metrics']}/metrics", timeout=10) as response:
            assert sample(response.read().decode(), "nv_cache_num_hits_per_model", "scale") == 1
    finally:
        process.terminate()
        process.wait(timeout=60)


# ---------------------------------------------------------------------- perf and tune


def test_repeats_give_the_asked_share_of_first_pass_hits():
    distinct = list(range(20))
    sequence = with_repeats(distinct, 100, seed=3)
    assert len(sequence) == 100 and set(sequence) == set(distinct)
    seen: set[int] = set()
    hits = 0
    for item in sequence:
        hits += item in seen
        seen.add(item)
    assert hits == 80
    assert [sequence.index(i) for i in distinct] == sorted(sequence.index(i) for i in distinct)
    config = {"name": "m", "max_batch_size": 8, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}]}
    requests = request_inputs(config, "random", count=50, repeat_ratio=0.8)
    assert len(requests) == 50 and len({id(r) for r in requests}) == 10
    with pytest.raises(InvalidArgumentError, match="repeat_ratio"):
        request_inputs(config, "random", repeat_ratio=1.0)


def test_measure_reports_the_servers_cache_hits(cached):
    frame = perf.measure(cached, "scale", concurrency_range=[1], repeat_ratio=0.5, request_count=4000,
                         measurement_interval_ms=150, max_trials=3, warmup_ms=50)
    row = frame.iloc[0]
    assert 0.0 < row["cache_hit_ratio"] <= 1.0
    assert row["server_cache_hit_us"] > 0 and row["server_cache_miss_us"] > 0
    plain = perf.measure(cached, "plain", concurrency_range=[1], measurement_interval_ms=100, max_trials=2,
                         warmup_ms=50)
    assert plain.iloc[0]["cache_hit_ratio"] == 0.0


def test_tune_switches_the_cache_live_and_restores_it(cached):
    result = perf.tune(cached, "plain", {"response_cache": [False, True]}, concurrency_range=[1],
                       repeat_ratio=0.9, measurement_interval_ms=100, max_trials=2, progress=False)
    assert set(result.ranking["config"]) == {"cache=False", "cache=True"}
    by_config = result.measurements.set_index("config")
    assert by_config.loc["cache=True", "cache_hit_ratio"] > 0
    assert by_config.loc["cache=False", "cache_hit_ratio"] == 0
    assert not cached.model_config("plain").response_cache.enable  # restored
    assert result.recommended_config["response_cache"] == {"enable": result.recommended["response_cache"]}


def test_tune_refuses_the_knob_without_a_server_cache(tmp_path):
    write_scale_model(tmp_path, "scale")
    with serve(tmp_path) as server, pytest.raises(InvalidArgumentError, match="no response cache"):
        perf.tune(server, "scale", {"response_cache": [True]}, concurrency_range=[1], measurement_interval_ms=100,
                  max_trials=1, progress=False)


def test_the_tuner_panel_offers_the_cache_knob(cached, tmp_path):
    tuner = cached.tune("plain")
    assert not tuner.controls["response_cache"].disabled and not tuner.controls["response_cache"].value
    tuner.controls["response_cache"].value = True
    tuner.buttons["apply"].click()
    assert "cache=True" in tuner.message
    assert cached.model_config("plain").response_cache.enable
    write_scale_model(tmp_path / "bare", "scale")
    with serve(tmp_path / "bare") as bare:
        panel = bare.tune("scale")
        assert panel.controls["response_cache"].disabled and panel.controls["sweep_cache"].disabled
        assert "cache" not in panel._live_knobs()


def test_model_config_json_round_trips_the_live_setting(cached):
    cached.update_response_cache("plain", enable=True)
    config = cached.model_config_json("plain")
    assert config["response_cache"] == {"enable": True}
    assert isinstance(config_from_json(config), ModelConfig)


def test_the_fraud_ensemble_caches_its_fil_step_under_load(trained, fraud_frame, tmp_path, monkeypatch):
    """FIL takes a step carrying several ensemble requests; with its cache on, each of them is
    looked up on its own, the answers stay exact and repeated rows are hits."""
    from concurrent.futures import ThreadPoolExecutor

    from triton_nb.repository import BatchingOptions, export_fraud_repository

    root = export_fraud_repository(trained, tmp_path / "repo", predict_proba=True,
                                   batching=BatchingOptions(max_queue_delay_microseconds=20_000))
    with (root / "fil" / "config.pbtxt").open("a") as config:
        config.write(f"\n{CACHE}\n")
    splits = []
    real_split = ServerCache._split

    def spying(self, request):
        splits.append(len(request.carried_rows))
        return real_split(self, request)

    monkeypatch.setattr(ServerCache, "_split", spying)
    rows = fraud_frame.head(60)
    order = [i % 60 for i in range(180)]  # every row three times
    with serve(root, cache_size_bytes=8 * MB) as server:
        client = server.client()
        with ThreadPoolExecutor(24) as pool:
            got = list(pool.map(lambda i: client.infer("ensemble", rows.iloc[i:i + 1]).as_numpy("predictions")[0],
                                order))
        np.testing.assert_allclose(got, trained.predict_proba(rows)[order, 1], rtol=1e-5)
        fil = model_stats(server, "fil")
        assert fil["inference_stats"]["success"]["count"] == 180
        assert fil["inference_stats"]["cache_hit"]["count"] > 0
        assert fil["inference_stats"]["cache_hit"]["count"] + fil["inference_count"] == 180
    assert splits and max(splits) > 1  # carried steps were split, not cached as one
