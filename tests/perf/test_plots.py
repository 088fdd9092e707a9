"""Tests for triton_nb.perf.plots: the charts draw the data they are given, headless."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from triton_nb.errors import InvalidArgumentError
from triton_nb.perf.plots import (
    BREAKDOWN_COLUMNS,
    BREAKDOWN_LABELS,
    OVER_BUDGET_GID,
    plot_batch_size_histogram,
    plot_knob_heatmap,
    plot_latency_breakdown,
    plot_throughput_vs_latency,
)

matplotlib.use("Agg")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(config: str, concurrency: float | None, rate: float | None, seed: int, **extra: object) -> dict:
    rng = np.random.default_rng(seed)
    parts = rng.uniform(10, 500, size=len(BREAKDOWN_COLUMNS))
    total = float(parts.sum())
    return {
        "model": "fraud",
        "protocol": "http",
        "config": config,
        "concurrency": np.nan if concurrency is None else concurrency,
        "request_rate": np.nan if rate is None else rate,
        "throughput_infer_per_sec": float(rng.uniform(100, 5000)),
        "latency_avg_us": total,
        "latency_p50_us": total * 0.9,
        "latency_p90_us": total * 1.2,
        "latency_p95_us": total * 1.4,
        "latency_p99_us": total * 1.8,
        **dict(zip(BREAKDOWN_COLUMNS, parts.tolist(), strict=True)),
        "batch_sizes": {1: int(rng.integers(1, 50)), 4: int(rng.integers(0, 20))},
        **extra,
    }


@pytest.fixture
def sweep() -> pd.DataFrame:
    """Two configs, concurrency 1/2/4 each, rows deliberately out of load order."""
    rows = [
        _row("delay=0us", 4, None, 1),
        _row("delay=0us", 1, None, 2),
        _row("delay=100us", 2, None, 3),
        _row("delay=0us", 2, None, 4),
        _row("delay=100us", 4, None, 5),
        _row("delay=100us", 1, None, 6),
    ]
    return pd.DataFrame(rows)


def _assert_png(fig: Figure, tmp_path) -> None:
    path = tmp_path / "x.png"
    fig.savefig(path)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 1000


# ---------------------------------------------------------------------------------------------
# throughput vs latency
# ---------------------------------------------------------------------------------------------


def test_throughput_vs_latency_one_line_per_config_sorted_by_load(sweep, tmp_path):
    fig = plot_throughput_vs_latency(sweep)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["delay=0us", "delay=100us"]
    for line in lines:
        expected = sweep[sweep["config"] == line.get_label()].sort_values("concurrency")
        np.testing.assert_allclose(line.get_xdata(), expected["latency_p99_us"] / 1000)
        np.testing.assert_allclose(line.get_ydata(), expected["throughput_infer_per_sec"])
        assert line.get_marker() == "o"
    assert ax.get_legend() is not None
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["delay=0us", "delay=100us"]
    assert "(ms)" in ax.get_xlabel()
    _assert_png(fig, tmp_path)


def test_throughput_vs_latency_budget_line_and_other_percentile(sweep):
    fig = plot_throughput_vs_latency(sweep, latency="latency_p95_us", latency_budget_ms=2.5)
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 3  # two configs + the budget
    budget = lines[-1]
    assert budget.get_linestyle() == "--"
    assert list(budget.get_xdata()) == [2.5, 2.5]
    first = sweep[sweep["config"] == "delay=0us"].sort_values("concurrency")
    np.testing.assert_allclose(lines[0].get_xdata(), first["latency_p95_us"] / 1000)
    assert "p95" in ax.get_xlabel()


def test_throughput_vs_latency_single_series_without_by_column(sweep):
    frame = sweep.drop(columns="config")
    fig = plot_throughput_vs_latency(frame)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 1
    expected = frame.sort_values(["concurrency"], kind="stable")
    np.testing.assert_allclose(lines[0].get_ydata(), expected["throughput_infer_per_sec"])
    assert lines[0].get_label() == "fraud"


def test_throughput_vs_latency_group_by_other_column_and_request_rate():
    frame = pd.DataFrame(
        [
            _row("a", None, 400.0, 1, instance_count=1),
            _row("a", None, 100.0, 2, instance_count=1),
            _row("b", None, 200.0, 3, instance_count=2),
            _row("b", None, 50.0, 4, instance_count=2),
        ]
    )
    fig = plot_throughput_vs_latency(frame, by="instance_count")
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["1", "2"]
    expected = frame[frame["instance_count"] == 1].sort_values("request_rate")
    np.testing.assert_allclose(lines[0].get_ydata(), expected["throughput_infer_per_sec"])


def test_throughput_vs_latency_draws_into_given_axes(sweep):
    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert plot_throughput_vs_latency(sweep, ax=right) is fig
    assert len(right.get_lines()) == 2
    assert len(left.get_lines()) == 0


def test_throughput_vs_latency_errors(sweep):
    with pytest.raises(ValueError, match=r"no column 'latency_p999_us'.*columns are: .*latency_p99_us"):
        plot_throughput_vs_latency(sweep, latency="latency_p999_us")
    with pytest.raises(ValueError, match=r"no column 'throughput_infer_per_sec'"):
        plot_throughput_vs_latency(sweep.drop(columns="throughput_infer_per_sec"))
    with pytest.raises(ValueError, match=r"empty"):
        plot_throughput_vs_latency(sweep.iloc[0:0])
    with pytest.raises(ValueError, match=r"latency_budget_ms must be a positive number of milliseconds"):
        plot_throughput_vs_latency(sweep, latency_budget_ms=-1)
    with pytest.raises(ValueError, match=r"must be a pandas DataFrame"):
        plot_throughput_vs_latency([1, 2, 3])
    bad = sweep.copy()
    bad.loc[0, "concurrency"] = np.nan
    with pytest.raises(ValueError, match=r"neither 'concurrency' nor 'request_rate'"):
        plot_throughput_vs_latency(bad)


# ---------------------------------------------------------------------------------------------
# latency breakdown
# ---------------------------------------------------------------------------------------------


def _stacks(ax) -> list[BarContainer]:
    return [c for c in ax.containers if isinstance(c, BarContainer)]


def test_latency_breakdown_stacks_components_in_order(sweep, tmp_path):
    fig = plot_latency_breakdown(sweep)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    stacks = _stacks(ax)
    assert [c.get_label() for c in stacks] == list(BREAKDOWN_LABELS)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["c=1", "c=2", "c=4"]
    expected = sweep[sweep["config"] == "delay=0us"].sort_values("concurrency")  # the first config
    for bar_index in range(3):
        row = expected.iloc[bar_index]
        bottom = 0.0
        for column, container in zip(BREAKDOWN_COLUMNS, stacks, strict=True):
            patch = container.patches[bar_index]
            assert patch.get_y() == pytest.approx(bottom)
            assert patch.get_height() == pytest.approx(row[column] / 1000)
            bottom += patch.get_height()
        assert bottom == pytest.approx(sum(row[c] for c in BREAKDOWN_COLUMNS) / 1000)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(BREAKDOWN_LABELS)
    assert "delay=0us" in ax.get_title()
    _assert_png(fig, tmp_path)


def test_latency_breakdown_selects_config_and_labels_request_rates():
    frame = pd.DataFrame(
        [
            _row("a", None, 100.0, 1),
            _row("b", None, 250.5, 2),
            _row("b", None, 100.0, 3),
            _row("b", 8, None, 4),
        ]
    )
    frame.loc[2, "server_queue_us"] = np.nan  # a missing component counts as 0
    fig = plot_latency_breakdown(frame, config="b")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["c=8", "r=100/s", "r=250.5/s"]
    stacks = _stacks(ax)
    tops = [sum(c.patches[i].get_height() for c in stacks) for i in range(3)]
    expected_rows = [frame.loc[3], frame.loc[2], frame.loc[1]]
    for top, row in zip(tops, expected_rows, strict=True):
        assert top == pytest.approx(np.nansum([row[c] for c in BREAKDOWN_COLUMNS]) / 1000)
    assert stacks[2].patches[1].get_height() == 0.0


def test_latency_breakdown_without_config_column(sweep):
    frame = sweep[sweep["config"] == "delay=100us"].drop(columns="config")
    ax = plot_latency_breakdown(frame).axes[0]
    assert len(_stacks(ax)) == 7
    assert all(len(c.patches) == 3 for c in _stacks(ax))


def test_latency_breakdown_errors(sweep):
    with pytest.raises(ValueError, match=r"no rows with config 'nope'; configs are: delay=0us, delay=100us"):
        plot_latency_breakdown(sweep, config="nope")
    with pytest.raises(ValueError, match=r"no column 'server_queue_us'.*columns are:"):
        plot_latency_breakdown(sweep.drop(columns="server_queue_us"))
    with pytest.raises(ValueError, match=r"several rows for load level\(s\) c=1, c=2, c=4"):
        plot_latency_breakdown(sweep.drop(columns="config"))
    with pytest.raises(ValueError, match=r"no column 'concurrency'"):
        plot_latency_breakdown(sweep.drop(columns=["concurrency", "request_rate"]))
    with pytest.raises(ValueError, match=r"no column 'config'"):
        plot_latency_breakdown(sweep.drop(columns="config"), config="x")
    with pytest.raises(ValueError, match=r"empty"):
        plot_latency_breakdown(sweep.iloc[0:0])


# ---------------------------------------------------------------------------------------------
# knob heatmap
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def knob_sweep() -> pd.DataFrame:
    """delay x instances with 2-3 load levels per cell; (500us, 2 instances) never measured."""
    rng = np.random.default_rng(7)
    rows = []
    for delay in (0, 100, 500):
        for instances in (1, 2):
            if (delay, instances) == (500, 2):
                continue
            for concurrency in (1, 4, 16):
                rows.append(
                    {
                        "config": f"delay={delay}us instances={instances}",
                        "max_queue_delay_microseconds": delay,
                        "instance_count": instances,
                        "concurrency": concurrency,
                        "throughput_infer_per_sec": float(rng.uniform(500, 9000)),
                        "latency_p99_us": float(rng.uniform(200, 3000)),
                    }
                )
    frame = pd.DataFrame(rows)
    # One cell where every load level is over a 1000us budget, one with all within.
    cell = (frame["max_queue_delay_microseconds"] == 100) & (frame["instance_count"] == 1)
    frame.loc[cell, "latency_p99_us"] = [1500.0, 2500.0, 4000.0]
    cell = (frame["max_queue_delay_microseconds"] == 0) & (frame["instance_count"] == 2)
    frame.loc[cell, "latency_p99_us"] = [300.0, 500.0, 900.0]
    return frame.sample(frac=1.0, random_state=3).reset_index(drop=True)


def _image_grid(ax) -> np.ma.MaskedArray:
    (image,) = ax.get_images()
    return np.ma.asarray(image.get_array())


def test_knob_heatmap_cells_are_pivot_max(knob_sweep, tmp_path):
    fig = plot_knob_heatmap(knob_sweep)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    expected = knob_sweep.pivot_table(
        index="instance_count", columns="max_queue_delay_microseconds", values="throughput_infer_per_sec", aggfunc="max"
    )
    grid = _image_grid(ax)
    assert grid.shape == expected.shape
    np.testing.assert_allclose(grid.filled(np.nan), expected.to_numpy())
    assert grid.mask[1, 2]  # (500us, 2 instances) was never measured
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "100", "500"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2"]
    texts = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in ax.texts}
    assert len(texts) == 5
    assert texts[(0, 0)] == f"{expected.iloc[0, 0]:,.0f}"
    assert not [a for a in ax.get_children() if a.get_gid() == OVER_BUDGET_GID]
    assert "budget" not in ax.get_title()
    _assert_png(fig, tmp_path)


def test_knob_heatmap_marks_exactly_the_over_budget_cells(knob_sweep, tmp_path):
    budget = 1000.0
    fig = plot_knob_heatmap(knob_sweep, latency_budget_ms=budget / 1e3)
    ax = fig.axes[0]
    x_keys, y_keys = [0, 100, 500], [1, 2]

    cells = knob_sweep.groupby(["max_queue_delay_microseconds", "instance_count"])
    over_expected = {
        (x_keys.index(x), y_keys.index(y))
        for (x, y), latency in cells["latency_p99_us"].min().items()
        if latency > budget
    }
    assert (1, 0) in over_expected  # the all-over cell built in the fixture
    assert (0, 1) not in over_expected

    marked = {
        (round(p.get_x() + 0.5), round(p.get_y() + 0.5))
        for p in ax.patches
        if isinstance(p, Rectangle) and p.get_gid() == OVER_BUDGET_GID
    }
    assert marked == over_expected
    marked_texts = {
        (round(t.get_position()[0]), round(t.get_position()[1])) for t in ax.texts if t.get_gid() == OVER_BUDGET_GID
    }
    assert marked_texts == over_expected
    assert all(t.get_text().startswith("×") for t in ax.texts if t.get_gid() == OVER_BUDGET_GID)
    assert not any("×" in t.get_text() for t in ax.texts if t.get_gid() != OVER_BUDGET_GID)

    # In-budget cells show the best throughput among in-budget rows; over-budget ones the plain max.
    grid = _image_grid(ax).filled(np.nan)
    within = knob_sweep[knob_sweep["latency_p99_us"] <= budget]
    best_within = within.groupby(["max_queue_delay_microseconds", "instance_count"])["throughput_infer_per_sec"].max()
    best_any = cells["throughput_infer_per_sec"].max()
    for (x, y), best in best_any.items():
        col, row = x_keys.index(x), y_keys.index(y)
        want = best if (col, row) in over_expected else best_within[(x, y)]
        assert grid[row, col] == pytest.approx(want)
    assert "×" in ax.get_title()
    assert "1 ms" in ax.get_title()
    assert f"{len(over_expected)} of 5 cells" in ax.get_title()
    _assert_png(fig, tmp_path)


def test_knob_heatmap_tuple_and_string_knobs():
    frame = pd.DataFrame(
        {
            "preferred_batch_size": [(4, 8), (2,), (4, 8), (2,)],
            "config": ["x", "x", "y", "y"],
            "throughput_infer_per_sec": [10.0, 20.0, 30.0, 40.0],
        }
    )
    fig = plot_knob_heatmap(frame, x="preferred_batch_size", y="config")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["(2)", "(4, 8)"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "y"]
    np.testing.assert_allclose(_image_grid(ax).filled(np.nan), [[20.0, 10.0], [40.0, 30.0]])


def test_knob_heatmap_errors(knob_sweep):
    with pytest.raises(ValueError, match=r"no column 'preferred_batch_size'.*columns are: .*instance_count"):
        plot_knob_heatmap(knob_sweep, x="preferred_batch_size")
    with pytest.raises(ValueError, match=r"no column 'latency_p95_us'"):
        plot_knob_heatmap(knob_sweep, latency="latency_p95_us", latency_budget_ms=1)
    with pytest.raises(ValueError, match=r"x and y must be different"):
        plot_knob_heatmap(knob_sweep, x="instance_count")
    with pytest.raises(ValueError, match=r"empty"):
        plot_knob_heatmap(knob_sweep.iloc[0:0])
    with pytest.raises(ValueError, match=r"latency_budget_ms must be a positive"):
        plot_knob_heatmap(knob_sweep, latency_budget_ms=math.inf)


# ---------------------------------------------------------------------------------------------
# batch-size histogram
# ---------------------------------------------------------------------------------------------


def _bars(ax) -> tuple[list[str], list[float]]:
    (container,) = _stacks(ax)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    return labels, [p.get_height() for p in container.patches]


def test_batch_size_histogram_from_dict(tmp_path):
    fig = plot_batch_size_histogram({8: 3, 1: 10, 64: 2, 2: 0})
    assert isinstance(fig, Figure)
    labels, heights = _bars(fig.axes[0])
    assert labels == ["1", "8", "64"]  # zero counts are dropped, sizes ascending
    assert heights == [10, 3, 2]
    assert "15 executions" in fig.axes[0].get_title()
    _assert_png(fig, tmp_path)


def test_batch_size_histogram_sums_dataframe_rows(sweep):
    frame = sweep.copy()
    frame["batch_sizes"] = [{1: 5, 4: 2}, {}, {4: 3, 16: 1}, None, {"1": 1}, {16: 4}]
    labels, heights = _bars(plot_batch_size_histogram(frame).axes[0])
    assert labels == ["1", "4", "16"]
    assert heights == [6, 5, 5]


def test_batch_size_histogram_errors(sweep):
    with pytest.raises(ValueError, match=r"no column 'batch_sizes'.*columns are:"):
        plot_batch_size_histogram(sweep.drop(columns="batch_sizes"))
    with pytest.raises(ValueError, match=r"no batch executions recorded"):
        plot_batch_size_histogram({})
    frame = sweep.copy()
    frame["batch_sizes"] = [{}] * len(frame)
    with pytest.raises(ValueError, match=r"no batch executions recorded"):
        plot_batch_size_histogram(frame)
    with pytest.raises(ValueError, match=r"empty"):
        plot_batch_size_histogram(sweep.iloc[0:0])
    with pytest.raises(ValueError, match=r"batch sizes must be >= 1"):
        plot_batch_size_histogram({0: 3})
    with pytest.raises(ValueError, match=r"must be integers"):
        plot_batch_size_histogram({1.5: 3})
    with pytest.raises(ValueError, match=r"row 0: batch_sizes must be a dict"):
        plot_batch_size_histogram(pd.DataFrame({"batch_sizes": [[1, 2]]}))
    with pytest.raises(ValueError, match=r"expected a results DataFrame or a dict"):
        plot_batch_size_histogram([1, 2, 3])


def test_errors_are_triton_nb_invalid_argument(sweep):
    with pytest.raises(InvalidArgumentError):
        plot_throughput_vs_latency(sweep, latency="nope")
