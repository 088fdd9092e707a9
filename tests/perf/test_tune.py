"""tune: the search finds a known optimum on a fake target whose figures follow the knobs in a
known way; constraints, early stop, interrupts and restoring the original; and a live tune of the
in-kernel server."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.scale_models import write_scale_model
from tests.helpers.tune_fakes import ORIGINAL, FakeTarget
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.perf import Sequences, Wire, tune
from triton_nb.perf.tune import config_with_knobs, knobs_of
from triton_nb.repository.config import load_config

pytestmark = pytest.mark.usefixtures("fake_loads")

KNOBS = {"max_queue_delay_microseconds": [0, 500, 2000], "instance_count": [1, 2, 4]}
FAST = {"concurrency_range": "1:16:5", "measurement_interval_ms": 40, "max_trials": 3, "progress": False,
        "input_data": "zero"}


def test_brute_force_finds_the_known_optimum_and_restores():
    target = FakeTarget()
    result = tune(target, "m", KNOBS, **FAST)
    assert result.recommended == {"max_queue_delay_microseconds": 500, "instance_count": 2}
    assert len(result.ranking) == 9 and result.ranking.iloc[0]["config"] == "delay_us=500 instances=2"
    assert result.ranking.iloc[0]["throughput_infer_per_sec"] == pytest.approx(4000, rel=0.15)
    assert len(target.applied) == 9 and target.restored == [result.original_config]
    assert target.knobs == {"max_queue_delay_microseconds": 100, "instance_count": 1}
    assert set(result.measurements["concurrency"]) == {1, 6, 11, 16}
    assert result.recommended_config["dynamic_batching"]["max_queue_delay_microseconds"] == 500


def test_quick_search_climbs_to_the_same_optimum_with_fewer_configs():
    target = FakeTarget()
    result = tune(target, "m", KNOBS, search="quick", **FAST)
    assert result.recommended == {"max_queue_delay_microseconds": 500, "instance_count": 2}
    assert len(result.ranking) < 9
    assert target.restored


def test_a_latency_budget_rules_out_slow_configs_and_stops_their_sweep():
    target = FakeTarget()
    result = tune(target, "m", KNOBS, latency_budget_ms=2.0, **FAST)  # a 2000 µs delay is over it at once
    slow = result.measurements[result.measurements["max_queue_delay_microseconds"] == 2000]
    assert not slow["feasible"].any() and set(slow["concurrency"]) == {1}
    assert result.recommended["max_queue_delay_microseconds"] != 2000
    nothing = tune(FakeTarget(), "m", KNOBS, latency_budget_ms=0.001, **FAST)
    assert nothing.recommended is None and "no config met the constraints" in nothing.notes
    with pytest.raises(InvalidArgumentError, match="nothing to write"):
        nothing.write_config(Path("unused"))


def test_the_sweep_stops_when_throughput_stops_rising():
    target = FakeTarget(plateau=True)
    result = tune(target, "m", {"instance_count": [1]}, **{**FAST, "concurrency_range": "1:12:1"})
    # 2000, 4000, then 6000 from c=3 on: four steps under 5% more than c=3 end it at c=7
    assert result.measurements["concurrency"].tolist() == [1, 2, 3, 4, 5, 6, 7]


def test_an_interrupted_sweep_keeps_what_it_measured_and_restores():
    target = FakeTarget()
    seen = []

    def stop_after_five(point: dict) -> None:
        seen.append(point)
        if len(seen) == 5:
            raise KeyboardInterrupt

    result = tune(target, "m", KNOBS, on_point=stop_after_five, **FAST)
    assert result.interrupted and len(result.measurements) == 5 and target.restored


def test_errors_restore_too_and_propagate():
    target = FakeTarget()

    def broken(point: dict) -> None:
        raise RuntimeError("plot failed")

    with pytest.raises(RuntimeError, match="plot failed"):
        tune(target, "m", KNOBS, on_point=broken, **FAST)
    assert target.restored


def test_bad_knobs_are_named():
    with pytest.raises(InvalidArgumentError, match="unknown knob 'delay'"):
        tune(FakeTarget(), "m", {"delay": [1]}, **FAST)
    with pytest.raises(InvalidArgumentError, match="knob 'instance_count' has no values"):
        tune(FakeTarget(), "m", {"instance_count": []}, **FAST)


def test_a_live_tune_of_the_in_kernel_server_writes_its_recommendation(tmp_path):
    write_scale_model(tmp_path, extra="dynamic_batching { max_queue_delay_microseconds: 300 }")
    with serve(tmp_path) as server:
        result = tune(server, "scale", {"max_queue_delay_microseconds": [0, 1000], "instance_count": [1, 2]},
                      concurrency_range=[1, 4], measurement_interval_ms=150, max_trials=3, progress=False,
                      write_config=tmp_path / "scale")
        config = server.model_config("scale")
        assert config.dynamic_batching.max_queue_delay_microseconds == 300  # restored
        assert config.instance_group[0].count == 1
    assert len(result.ranking) == 4 and result.recommended is not None
    written = load_config(tmp_path / "scale" / "config.pbtxt")
    assert written.dynamic_batching.max_queue_delay_microseconds == result.recommended["max_queue_delay_microseconds"]
    assert written.instance_group[0].count == result.recommended["instance_count"]


def test_a_config_parameter_knob_reloads_the_model_and_the_original_comes_back(tmp_path):
    write_scale_model(tmp_path, factor=2.0)
    with serve(tmp_path) as server:
        result = tune(server, "scale", {"parameters.factor": ["3", "5"]}, concurrency_range=[1],
                      measurement_interval_ms=100, max_trials=3, progress=False)
        assert set(result.measurements["parameters.factor"]) == {"3", "5"}
        x = np.ones((1, 2), np.float32)
        assert server.client().infer("scale", {"X": x}).as_numpy("Y").tolist() == [[2.0, 2.0]]  # factor 2 again


CHAIN = """
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "a" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "T" } },
  { model_name: "b" model_version: -1 input_map { key: "X" value: "T" } output_map { key: "Y" value: "Y" } }
] }
"""


def test_composing_models_tuned_together_against_a_no_batching_baseline(tmp_path):
    write_scale_model(tmp_path, name="a", factor=2.0)
    write_scale_model(tmp_path, name="b", factor=3.0)
    (tmp_path / "chain" / "1").mkdir(parents=True)
    (tmp_path / "chain" / "config.pbtxt").write_text(CHAIN)
    with serve(tmp_path) as server:
        assert server.wait_warm("chain", timeout_s=30)
        seen = []

        def during(point):  # what the server ran while each point was measured
            seen.append((point["config"], [server.model_config(m).HasField("dynamic_batching") for m in "ab"],
                         [server.model_config(m).dynamic_batching.max_queue_delay_microseconds for m in "ab"]))

        result = tune(server, "chain", {"max_queue_delay_microseconds": [0, 300]}, tuned_model=["a", "b"],
                      no_batching_baseline=True, concurrency_range=[1, 4], measurement_interval_ms=100,
                      max_trials=3, progress=False, on_point=during, input_data="zero")
        for model in "ab":  # both restored, batcher on, with their own delay
            assert server.model_config(model).dynamic_batching.max_queue_delay_microseconds == 2000
        assert server.client().infer("chain", {"X": np.ones((1, 2), np.float32)}).as_numpy("Y").tolist() == [[6, 6]]
    assert seen[0][0] == "dynamic batching off" and seen[0][1] == [False, False]  # measured first
    assert {label: delays for label, on, delays in seen if on == [True, True]} == {
        "delay_us=0": [0, 0], "delay_us=300": [300, 300]}
    assert set(result.ranking["config"]) == {"dynamic batching off", "delay_us=0", "delay_us=300"}
    ranking = result.ranking.set_index("config")
    expected = ranking.iloc[0]["throughput_infer_per_sec"] / ranking.loc["dynamic batching off",
                                                                      "throughput_infer_per_sec"]
    assert result.batching_gain == pytest.approx(expected)
    assert result.recommended is not None and all(v == v for v in result.recommended.values())  # no NaN knobs
    if result.recommended == {"dynamic_batching": False}:
        assert "dynamic_batching" not in result.recommended_config
    else:
        assert set(result.recommended) == {"max_queue_delay_microseconds"}


def test_the_no_batching_knob_writes_a_config_without_dynamic_batching():
    assert "dynamic_batching" not in config_with_knobs(ORIGINAL, {"dynamic_batching": False})
    assert knobs_of(config_with_knobs(ORIGINAL, {"dynamic_batching": False}), ["dynamic_batching"]) == {
        "dynamic_batching": False}
    assert knobs_of(ORIGINAL, ["dynamic_batching"]) == {"dynamic_batching": True}


def test_a_no_batching_baseline_needs_models_that_batch(tmp_path):
    write_scale_model(tmp_path, max_batch_size=0, extra="")
    with serve(tmp_path) as server, pytest.raises(InvalidArgumentError, match="scale do not batch"):
        tune(server, "scale", {"instance_count": [1]}, no_batching_baseline=True, **FAST)


def test_tune_takes_the_groups_and_sweeps_a_wire_field_without_a_warning():
    target = FakeTarget()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        result = tune(target, "m", {"max_queue_delay_microseconds": [100], "request_compression": ["none", "gzip"]},
                      concurrency_range=[1], wire=Wire(response_compression="gzip"), shared_memory="none",
                      sequences=Sequences(), measurement_interval_ms=50, max_trials=2, progress=False)
    assert sorted(result.measurements["request_compression"]) == ["gzip", "none"]  # the swept field
    assert set(result.measurements["response_compression"]) == {"gzip"}  # the fixed one
    assert result.settings.wire == Wire(response_compression="gzip")
    assert "request_compression" not in result.recommended_config  # a client knob is not the config's
