"""replay: a sweep's top configs measured again on another server (a fake one whose optimum lies
elsewhere), both rankings side by side and the pick-vs-best figure; the figure's arithmetic on
hand-made rankings; and the one-line errors."""

from __future__ import annotations

import math
import socket

import pandas as pd
import pytest

from tests.helpers.tune_fakes import FakeTarget
from triton_nb.errors import InvalidArgumentError, NotFoundError, UnavailableError
from triton_nb.perf import ReplayResult, replay, tune
from triton_nb.perf.replay import compare_rankings, pick_vs_best

pytestmark = pytest.mark.usefixtures("fake_loads")

KNOBS = {"max_queue_delay_microseconds": [0, 500, 2000], "instance_count": [1, 2]}
FAST = {"concurrency_range": "1:16:5", "measurement_interval_ms": 40, "max_trials": 3, "progress": False,
        "input_data": "zero"}


def elsewhere(knobs: dict) -> float:
    """A "real" server whose best config has no delay (the sweep's fake prefers 500 µs)."""
    delay, instances = knobs["max_queue_delay_microseconds"], knobs["instance_count"]
    return max(300.0, 4000.0 - delay - abs(instances - 2) * 900)


@pytest.fixture
def swept():
    return tune(FakeTarget(), "m", KNOBS, **FAST)


def test_the_top_configs_are_replayed_in_alternating_rounds_and_both_rankings_shown(swept):
    real = FakeTarget(capacity=elsewhere)
    seen = []
    outcome = replay(swept, real, top=3, rounds=2, progress=False, on_point=seen.append)
    assert isinstance(outcome, ReplayResult)
    top = list(swept.ranking["config"].head(3))
    assert top[0] == "delay_us=500 instances=2" and list(outcome.comparison["config"]) == top
    # round 2 runs the configs backwards, and repeats the load levels each config had in round 1
    applied = [(k["max_queue_delay_microseconds"], k["instance_count"]) for k in real.applied]
    assert applied[:3] == applied[3:][::-1] and len(applied) == 6
    assert real.restored and real.knobs == {"max_queue_delay_microseconds": 100, "instance_count": 1}
    levels = outcome.measurements.groupby(["config", "round"])["concurrency"].apply(tuple).unstack()
    assert (levels[1] == levels[2]).all() and {row["round"] for row in seen} == {1, 2}
    table = outcome.comparison
    assert list(table["sweep_rank"]) == [1, 2, 3] and table["recommended"].tolist() == [True, False, False]
    assert sorted(table["triton_rank"]) == [1, 2, 3] and table["triton_feasible"].all()
    assert {"sweep_throughput_infer_per_sec", "sweep_latency_p99_us", "triton_throughput_infer_per_sec",
            "triton_latency_p99_us", "sweep_concurrency", "triton_concurrency"} <= set(table.columns)
    ours = table.loc[table["recommended"], "triton_throughput_infer_per_sec"].iloc[0]
    assert outcome.pick_vs_best == pytest.approx(ours / table["triton_throughput_infer_per_sec"].max())
    assert 0 < outcome.pick_vs_best <= 1
    assert outcome.triton_best == table.loc[table["triton_rank"] == 1, "config"].iloc[0]
    assert outcome.recommended in repr(outcome) and f"{outcome.pick_vs_best:.2f}" in outcome.summary()


def test_an_error_midway_restores_the_original_config_and_propagates(swept):
    real = FakeTarget()

    def broken(point: dict) -> None:
        raise RuntimeError("plot failed")

    with pytest.raises(RuntimeError, match="plot failed"):
        replay(swept, real, progress=False, on_point=broken)
    assert real.restored and real.knobs == {"max_queue_delay_microseconds": 100, "instance_count": 1}


def _ranking(rows: list[tuple[str, int, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"config": c, "rank": r, "concurrency": 4, "throughput_infer_per_sec": t,
                          "latency_p99_us": lat, "feasible": True} for c, r, t, lat in rows])


def test_the_figure_is_our_picks_real_throughput_over_the_best_real_throughput():
    sweep = _ranking([("a", 1, 1000.0, 900.0), ("b", 2, 950.0, 800.0), ("c", 3, 700.0, 700.0)])
    triton = _ranking([("b", 1, 800.0, 1000.0), ("a", 2, 760.0, 1100.0), ("c", 3, 500.0, 900.0)])
    table = compare_rankings(sweep, triton, ["a", "b", "c"], "latency_p99_us", recommended="a")
    assert table[["config", "sweep_rank", "triton_rank"]].values.tolist() == [["a", 1, 2], ["b", 2, 1], ["c", 3, 3]]
    assert pick_vs_best(table) == pytest.approx(760 / 800)
    assert pick_vs_best(compare_rankings(sweep, triton, ["a", "b"], "latency_p99_us", recommended="b")) == 1.0
    # an interrupt before our pick was measured on real Triton: no figure
    partial = compare_rankings(sweep, triton[triton["config"] != "a"], ["a", "b"], "latency_p99_us", "a")
    assert math.isnan(partial.loc[0, "triton_throughput_infer_per_sec"]) and pick_vs_best(partial) is None


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_server_is_one_line_naming_the_url(swept):
    url = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(UnavailableError, match=f"replay on {url}") as caught:
        replay(swept, url, progress=False)
    assert "\n" not in str(caught.value)


def test_a_model_the_server_lacks_is_named(swept):
    real = FakeTarget(models=("other",))
    with pytest.raises(NotFoundError, match=r"replay on fake:8000: no model 'm' there") as caught:
        replay(swept, real, progress=False)
    assert "\n" not in str(caught.value) and not real.applied


def test_bad_arguments_are_named(swept):
    with pytest.raises(InvalidArgumentError, match="top must be >= 1, got 0"):
        replay(swept, FakeTarget(), top=0)
    with pytest.raises(InvalidArgumentError, match="rounds must be >= 1"):
        replay(swept, FakeTarget(), rounds=0)
    none_met = tune(FakeTarget(), "m", {"instance_count": [1]}, min_throughput=1e9, **FAST)
    with pytest.raises(InvalidArgumentError, match="recommended no config"):
        replay(none_met, FakeTarget())
