"""Matplotlib charts for perf_analyzer / Model Analyzer style measurements.

Every function takes the results DataFrame the measuring engine produces (one row per
``(config, load level)``, latencies in microseconds) and returns a
:class:`matplotlib.figure.Figure`. The figures are built with the object-oriented API
(``Figure`` + ``fig.subplots()``), never with pyplot's global state, so they work headless
(tests, CI, scripts writing PNGs) and display inline in Jupyter. Each function also accepts an
existing ``ax`` to draw into, and then returns that axes' figure.

* :func:`plot_throughput_vs_latency` -- Model Analyzer's throughput-vs-latency curve per config;
* :func:`plot_latency_breakdown` -- perf_analyzer's latency components, stacked per load level;
* :func:`plot_knob_heatmap` -- best throughput over two config knobs, with a latency budget;
* :func:`plot_batch_size_histogram` -- how many executions ran at each batch size;
* :func:`plot_payload_comparison` -- tensor format and compression: throughput, latency, bytes.

Charts show latencies in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from triton_nb._deprecation import no_unknown, warn_deprecated
from triton_nb.errors import InvalidArgumentError

__all__ = [
    "BREAKDOWN_COLUMNS",
    "BREAKDOWN_LABELS",
    "OVER_BUDGET_GID",
    "payload_label",
    "plot_batch_size_histogram",
    "plot_knob_heatmap",
    "plot_latency_breakdown",
    "plot_payload_comparison",
    "plot_throughput_vs_latency",
]

#: perf_analyzer's latency components, in the order it reports them (client to server and back).
BREAKDOWN_COLUMNS: tuple[str, ...] = (
    "client_send_us",
    "network_server_send_recv_us",
    "server_queue_us",
    "server_compute_input_us",
    "server_compute_infer_us",
    "server_compute_output_us",
    "client_recv_us",
)

#: Legend labels for :data:`BREAKDOWN_COLUMNS`, same order.
BREAKDOWN_LABELS: tuple[str, ...] = (
    "client send",
    "network + server send/recv",
    "server queue",
    "server compute input",
    "server compute infer",
    "server compute output",
    "client recv",
)

_LOAD_COLUMNS = ("concurrency", "request_rate")
_US_PER_MS = 1000.0
#: ``gid`` given to the artists that mark over-budget heatmap cells (the hatch and the text).
OVER_BUDGET_GID = "over_budget"


# --------------------------------------------------------------------------------------------
# validation and small helpers
# --------------------------------------------------------------------------------------------


def _check_results(results: Any, required: Iterable[str], *, name: str = "results") -> pd.DataFrame:
    """Return ``results`` if it is a non-empty DataFrame holding every ``required`` column."""
    if not isinstance(results, pd.DataFrame):
        raise InvalidArgumentError(f"{name} must be a pandas DataFrame, got {type(results).__name__}")
    if results.empty:
        raise InvalidArgumentError(f"{name} is empty: there is nothing to plot")
    missing = [column for column in required if column not in results.columns]
    if missing:
        raise InvalidArgumentError(
            f"{name} has no column {missing[0]!r}"
            + (f" (also missing: {', '.join(map(repr, missing[1:]))})" if len(missing) > 1 else "")
            + f"; its columns are: {', '.join(map(str, results.columns))}"
        )
    return results


def _check_budget(where: str, latency_budget_ms: float | None, deprecated: dict[str, Any]) -> float | None:
    """The budget in microseconds (the unit of the latency columns), from ``latency_budget_ms`` (the
    unit :func:`~triton_nb.perf.tune` takes it in) or the deprecated ``latency_budget_us``."""
    if "latency_budget_us" in deprecated:
        old = deprecated.pop("latency_budget_us")
        if latency_budget_ms is not None:
            raise InvalidArgumentError(f"{where}: give latency_budget_ms only (latency_budget_us is its "
                                       "deprecated spelling)")
        warn_deprecated(f"{where}: latency_budget_us= is deprecated, use latency_budget_ms= (milliseconds, "
                        "as tune() takes the budget)", stacklevel=4)
        if old is not None:
            try:
                latency_budget_ms = float(old) / _US_PER_MS
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"latency_budget_us must be a number of microseconds, got {old!r}") from None
    no_unknown(where, deprecated)
    if latency_budget_ms is None:
        return None
    try:
        budget = float(latency_budget_ms)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"latency_budget_ms must be a number of milliseconds, got {latency_budget_ms!r}"
        ) from None
    if not math.isfinite(budget) or budget <= 0:
        raise InvalidArgumentError(f"latency_budget_ms must be a positive number of milliseconds, got {budget!r}")
    return budget * _US_PER_MS


def _figure_and_axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """Draw into ``ax`` if given, else into a fresh (pyplot-free) figure."""
    if ax is None:
        fig = Figure(figsize=figsize, layout="constrained")
        return fig, fig.subplots()
    if not isinstance(ax, Axes):
        raise InvalidArgumentError(f"ax must be a matplotlib Axes, got {type(ax).__name__}")
    fig = ax.figure
    # An Axes inside a SubFigure: climb to the Figure that owns it.
    while fig is not None and not isinstance(fig, Figure):
        fig = fig.figure
    assert fig is not None
    return fig, ax


def _latency_label(column: str) -> str:
    """``"latency_p99_us"`` -> ``"p99 latency"``, ``"latency_avg_us"`` -> ``"avg latency"``."""
    stem = column.removesuffix("_us")
    if stem.startswith("latency_"):
        return f"{stem.removeprefix('latency_')} latency"
    return stem.replace("_", " ")


def _value_label(column: str) -> str:
    if column == "throughput_infer_per_sec":
        return "throughput (infer/s)"
    if column.endswith("_us"):
        return f"{_latency_label(column)} (µs)"
    return column.replace("_", " ")


def _format_number(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:g}"


def _format_key(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_format_key(v) for v in value) + ")"
    if isinstance(value, float | np.floating):
        return "none" if math.isnan(value) else _format_number(float(value))
    if isinstance(value, np.integer):
        return str(int(value))
    return str(value)


def _sort_key(value: Any) -> tuple[int, Any]:
    """Numbers first (ascending), then numeric tuples, then everything else by text; missing last."""
    if value is None or (isinstance(value, float | np.floating) and math.isnan(value)):
        return (3, "")
    if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        return (0, float(value))
    if isinstance(value, tuple) and all(isinstance(v, int | float | np.integer | np.floating) for v in value):
        return (1, tuple(float(v) for v in value))
    return (2, str(value))


def _load_keys(frame: pd.DataFrame) -> tuple[list[tuple[int, float]], list[str]]:
    """Sort keys and labels (``"c=4"``, ``"r=100/s"``) of each row's load level.

    Concurrency levels sort before request rates. A row with neither set is an error.
    """
    concurrency = frame["concurrency"] if "concurrency" in frame.columns else pd.Series(np.nan, index=frame.index)
    rate = frame["request_rate"] if "request_rate" in frame.columns else pd.Series(np.nan, index=frame.index)
    keys: list[tuple[int, float]] = []
    labels: list[str] = []
    for position, (c, r) in enumerate(zip(concurrency, rate, strict=True)):
        if pd.notna(c):
            keys.append((0, float(c)))
            labels.append(f"c={_format_number(float(c))}")
        elif pd.notna(r):
            keys.append((1, float(r)))
            labels.append(f"r={_format_number(float(r))}/s")
        else:
            raise InvalidArgumentError(
                f"row {position} (index {frame.index[position]!r}) has neither 'concurrency' nor 'request_rate' set"
            )
    return keys, labels


def _sort_by_load(frame: pd.DataFrame) -> pd.DataFrame:
    if not any(column in frame.columns for column in _LOAD_COLUMNS):
        return frame
    keys, _ = _load_keys(frame)
    order = sorted(range(len(frame)), key=keys.__getitem__)
    return frame.iloc[order]


def _groups(frame: pd.DataFrame, by: str | None) -> list[tuple[Hashable, pd.DataFrame]]:
    """Split ``frame`` by column ``by``, groups in order of first appearance."""
    if by is None or by not in frame.columns:
        return [(None, frame)]
    return list(frame.groupby(by, sort=False, dropna=False))


def _model_name(frame: pd.DataFrame) -> str | None:
    if "model" not in frame.columns:
        return None
    names = frame["model"].dropna().unique()
    return str(names[0]) if len(names) == 1 else None


# --------------------------------------------------------------------------------------------
# 1. throughput vs latency
# --------------------------------------------------------------------------------------------


def plot_throughput_vs_latency(
    results: pd.DataFrame,
    latency: str = "latency_p99_us",
    by: str | None = "config",
    *,
    latency_budget_ms: float | None = None,
    ax: Axes | None = None,
    spread_from: str | None = None,
    highlight: Any = None,
    **deprecated: Any,
) -> Figure:
    """Model Analyzer's chart: throughput (y) against a latency percentile in ms (x).

    Parameters
    ----------
    results
        one row per (config, load level), with ``throughput_infer_per_sec`` and the
        ``latency`` column.
    latency
        the latency column for the x axis (microseconds; drawn in ms).
    by
        the column whose values each get one line (rows sorted by load level:
        concurrency, then request rate). If ``None`` or absent from ``results``, the rows
        make a single series.
    latency_budget_ms
        if given, a vertical dashed line at this latency (milliseconds, as
        :func:`~triton_nb.perf.tune` takes it; ``latency_budget_us`` is its deprecated spelling).
    ax
        axes to draw into; a new figure is made if ``None``.
    spread_from
        another latency column (``"latency_p50_us"``, say): each point also gets a
        bar from that latency to its own, showing the spread between the two percentiles.
    highlight
        the ``by`` value of one series to draw in full colour, the others faded
        (the tuning panel marks the config measured last).

    Returns
    -------
    Figure
        The figure holding the chart.
    """
    frame = _check_results(results, ["throughput_infer_per_sec", latency]
                           + ([spread_from] if spread_from is not None else []))
    budget = _check_budget("plot_throughput_vs_latency", latency_budget_ms, deprecated)
    fig, ax = _figure_and_axes(ax, (7.0, 4.5))

    groups = _groups(frame, by)
    for key, group in groups:
        group = _sort_by_load(group)
        label = _format_key(key) if key is not None else (_model_name(frame) or "results")
        alpha = 1.0 if highlight is None or key == highlight else 0.45
        throughput = group["throughput_infer_per_sec"].to_numpy(dtype=float)
        (line,) = ax.plot(
            group[latency].to_numpy(dtype=float) / _US_PER_MS,
            throughput,
            marker="o",
            linestyle="-" if len(group) > 1 else "none",
            alpha=alpha,
            label=label,
        )
        if spread_from is not None:
            ax.hlines(throughput, group[spread_from].to_numpy(dtype=float) / _US_PER_MS,
                      group[latency].to_numpy(dtype=float) / _US_PER_MS, colors=line.get_color(), alpha=alpha,
                      linewidth=3)
    if budget is not None:
        ax.axvline(
            budget / _US_PER_MS,
            linestyle="--",
            color="tab:red",
            label=f"budget {_format_number(budget / _US_PER_MS)} ms",
        )

    lat_label = _latency_label(latency)
    ax.set_xlabel(f"{lat_label} (ms)")
    ax.set_ylabel("throughput (infer/s)")
    model = _model_name(frame)
    ax.set_title(f"Throughput vs {lat_label}" + (f" — {model}" if model else ""))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title=by if by is not None and by in frame.columns else None, fontsize="small")
    return fig


# --------------------------------------------------------------------------------------------
# 2. latency breakdown
# --------------------------------------------------------------------------------------------


def plot_latency_breakdown(
    results: pd.DataFrame,
    config: Any = None,
    ax: Axes | None = None,
) -> Figure:
    """perf_analyzer's latency components, stacked per load level, in ms.

    One bar per load level (``"c=1"``, ``"c=2"``..., ``"r=100/s"``), stacking the seven
    components of :data:`BREAKDOWN_COLUMNS` in perf_analyzer's order: client send, network +
    server send/recv, server queue, server compute input / infer / output, client recv. A
    missing (NaN) component counts as 0.

    Parameters
    ----------
    results
        rows with the breakdown columns and ``concurrency`` and/or ``request_rate``.
    config
        when ``results`` has a ``config`` column with several configs, the one to draw;
        by default the first one in the frame.
    ax
        axes to draw into; a new figure is made if ``None``.

    Returns
    -------
    Figure
        The figure holding the chart.
    """
    frame = _check_results(results, BREAKDOWN_COLUMNS)
    if not any(column in frame.columns for column in _LOAD_COLUMNS):
        _check_results(frame, ["concurrency"])  # raises, naming the columns that are there

    title_config: str | None = None
    if "config" in frame.columns:
        configs = list(frame["config"].drop_duplicates())
        if config is None:
            config = configs[0]
        mask = frame["config"] == config
        if not mask.any():
            raise InvalidArgumentError(
                f"no rows with config {config!r}; configs are: {', '.join(map(_format_key, configs))}"
            )
        frame = frame[mask]
        title_config = _format_key(config)
    elif config is not None:
        _check_results(frame, ["config"])  # raises

    frame = _sort_by_load(frame)
    _, labels = _load_keys(frame)
    if len(set(labels)) != len(labels):
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        raise InvalidArgumentError(
            f"several rows for load level(s) {', '.join(repeated)}"
            + (f" in config {title_config!r}" if title_config else "")
            + "; filter the results to one config (or pass config=) first"
        )

    fig, ax = _figure_and_axes(ax, (max(4.0, 1.0 + 0.8 * len(labels)) + 3.0, 4.5))  # + room for the legend
    positions = np.arange(len(labels), dtype=float)
    bottom = np.zeros(len(labels))
    for column, label in zip(BREAKDOWN_COLUMNS, BREAKDOWN_LABELS, strict=True):
        heights = frame[column].to_numpy(dtype=float) / _US_PER_MS
        heights = np.nan_to_num(heights, nan=0.0)
        ax.bar(positions, heights, bottom=bottom, label=label, width=0.7)
        bottom = bottom + heights

    ax.set_xticks(positions, labels)
    ax.set_xlabel("load level")
    ax.set_ylabel("latency (ms)")
    parts = [part for part in (_model_name(frame), title_config) if part]
    ax.set_title("Latency breakdown" + (f" — {', '.join(parts)}" if parts else ""))
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    # Legend in perf_analyzer's order: the first entry is the bottom of each stack.
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


# --------------------------------------------------------------------------------------------
# 3. knob heatmap
# --------------------------------------------------------------------------------------------


def plot_knob_heatmap(
    results: pd.DataFrame,
    x: str = "max_queue_delay_microseconds",
    y: str = "instance_count",
    value: str = "throughput_infer_per_sec",
    latency: str = "latency_p99_us",
    *,
    latency_budget_ms: float | None = None,
    ax: Axes | None = None,
    **deprecated: Any,
) -> Figure:
    """Heatmap of the best (max) ``value`` for each combination of two config knobs.

    Each (x, y) cell gathers every row (every load level) measured with those knob values.

    * Without a budget, a cell shows the max ``value`` over its rows.
    * With ``latency_budget_ms``, a cell shows the max ``value`` over its rows whose
      ``latency`` is within the budget -- the best that configuration does while meeting it.
      A cell whose best (lowest) latency is still over the budget has no such row: it shows
      the unconstrained max, dimmed, hatched and marked "×" (those artists have
      ``gid="over_budget"``), and the title says so.

    Combinations never measured are left blank.

    Parameters
    ----------
    results
        the sweep's rows, with columns ``x``, ``y``, ``value`` (and ``latency`` when a
        budget is given).
    x, y
        the knob columns for the two axes. Values may be numbers, strings or tuples.
    value
        the column to maximise, throughput by default.
    latency
        the latency column the budget applies to (microseconds).
    latency_budget_ms
        the latency budget in milliseconds (as :func:`~triton_nb.perf.tune` takes it), or ``None``;
        ``latency_budget_us`` is its deprecated spelling.
    ax
        axes to draw into; a new figure is made if ``None``.

    Returns
    -------
    Figure
        The figure holding the chart.
    """
    if x == y:
        raise InvalidArgumentError(f"x and y must be different columns, both are {x!r}")
    budget = _check_budget("plot_knob_heatmap", latency_budget_ms, deprecated)
    required = [x, y, value] + ([latency] if budget is not None else [])
    frame = _check_results(results, required)

    values = frame[value].to_numpy(dtype=float)
    if budget is not None:
        latencies = frame[latency].to_numpy(dtype=float)
        within = latencies <= budget
    else:
        within = np.ones(len(frame), dtype=bool)

    x_keys = sorted(frame[x].drop_duplicates(), key=_sort_key)
    y_keys = sorted(frame[y].drop_duplicates(), key=_sort_key)
    x_index = {_sort_key(k): i for i, k in enumerate(x_keys)}
    y_index = {_sort_key(k): i for i, k in enumerate(y_keys)}

    grid = np.full((len(y_keys), len(x_keys)), np.nan)
    over = np.zeros(grid.shape, dtype=bool)
    for (x_key, y_key), positions in frame.groupby([x, y], sort=False, dropna=False).indices.items():
        row, col = y_index[_sort_key(y_key)], x_index[_sort_key(x_key)]
        cell_values = values[positions]
        cell_within = within[positions]
        if cell_within.any():
            cell_values = cell_values[cell_within]
        else:
            over[row, col] = True
        finite_values = cell_values[np.isfinite(cell_values)]
        grid[row, col] = finite_values.max() if finite_values.size else np.nan

    width = max(5.0, 2.0 + 1.1 * len(x_keys))
    height = max(3.5, 1.5 + 0.7 * len(y_keys))
    fig, ax = _figure_and_axes(ax, (width, height))
    image = ax.imshow(np.ma.masked_invalid(grid), origin="lower", aspect="auto", cmap="viridis")
    fig.colorbar(image, ax=ax, label=_value_label(value))

    finite = grid[np.isfinite(grid)]
    midpoint = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for row in range(grid.shape[0]):
        for col in range(grid.shape[1]):
            cell = grid[row, col]
            if not np.isfinite(cell):
                continue
            text = f"{cell:,.0f}" if abs(cell) >= 100 else f"{cell:,.3g}"
            if over[row, col]:
                ax.add_patch(
                    Rectangle(
                        (col - 0.5, row - 0.5),
                        1.0,
                        1.0,
                        facecolor="white",
                        alpha=0.6,
                        hatch="//",
                        edgecolor="0.4",
                        linewidth=0.0,
                        gid=OVER_BUDGET_GID,
                    )
                )
                ax.text(
                    col, row, f"× {text}", ha="center", va="center", color="0.25", fontsize="small", gid=OVER_BUDGET_GID
                )
            else:
                color = "black" if cell >= midpoint else "white"
                ax.text(col, row, text, ha="center", va="center", color=color, fontsize="small")

    ax.set_xticks(range(len(x_keys)), [_format_key(k) for k in x_keys])
    ax.set_yticks(range(len(y_keys)), [_format_key(k) for k in y_keys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    title = f"Best {_value_label(value)}"
    if budget is not None:
        title += (
            f" within {_latency_label(latency)} ≤ {_format_number(budget / _US_PER_MS)} ms"
            f"\n× = over budget at every load level ({int(over.sum())} of {int(np.isfinite(grid).sum())} cells)"
        )
    ax.set_title(title)
    return fig


# --------------------------------------------------------------------------------------------
# 4. batch-size histogram
# --------------------------------------------------------------------------------------------


def _add_counts(total: dict[int, int], counts: Any, where: str) -> None:
    if counts is None or (isinstance(counts, float) and math.isnan(counts)):
        return
    if not isinstance(counts, Mapping):
        raise InvalidArgumentError(
            f"{where}: batch_sizes must be a dict {{batch_size: count}}, got {type(counts).__name__}"
        )
    for size, count in counts.items():
        try:
            size_int, count_int = int(size), int(count)
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"{where}: batch size and count must be integers, got {size!r}: {count!r}"
            ) from None
        if size_int != float(size) or count_int != float(count):
            raise InvalidArgumentError(f"{where}: batch size and count must be integers, got {size!r}: {count!r}")
        if size_int < 1 or count_int < 0:
            raise InvalidArgumentError(f"{where}: batch sizes must be >= 1 and counts >= 0, got {size!r}: {count!r}")
        total[size_int] = total.get(size_int, 0) + count_int


def plot_batch_size_histogram(
    results_or_batch_sizes: pd.DataFrame | Mapping[int, int],
    ax: Axes | None = None,
) -> Figure:
    """Bars of execution counts per batch size.

    Parameters
    ----------
    results_or_batch_sizes
        a dict ``{batch_size: execution_count}``, or a results
        DataFrame whose ``batch_sizes`` column holds such a dict per row (empty dicts and
        missing values are skipped); the rows' counts are summed.
    ax
        axes to draw into; a new figure is made if ``None``.

    Returns
    -------
    Figure
        The figure holding the chart: one bar per batch size seen, in increasing order.
    """
    total: dict[int, int] = {}
    if isinstance(results_or_batch_sizes, pd.DataFrame):
        frame = _check_results(results_or_batch_sizes, ["batch_sizes"])
        for position, counts in enumerate(frame["batch_sizes"]):
            _add_counts(total, counts, f"row {position}")
    elif isinstance(results_or_batch_sizes, Mapping):
        _add_counts(total, results_or_batch_sizes, "batch_sizes")
    else:
        raise InvalidArgumentError(
            f"expected a results DataFrame or a dict {{batch_size: count}}, got {type(results_or_batch_sizes).__name__}"
        )
    total = {size: count for size, count in total.items() if count > 0}
    if not total:
        raise InvalidArgumentError("no batch executions recorded: every batch_sizes count is empty or zero")

    sizes = sorted(total)
    counts = [total[size] for size in sizes]
    executions = sum(counts)
    mean_batch = sum(size * count for size, count in zip(sizes, counts, strict=True)) / executions

    fig, ax = _figure_and_axes(ax, (max(5.0, 1.5 + 0.5 * len(sizes)), 4.0))
    positions = np.arange(len(sizes), dtype=float)
    bars = ax.bar(positions, counts, width=0.7, color="tab:blue")
    ax.bar_label(bars, labels=[f"{c:,}" for c in counts], fontsize="small", padding=2)
    ax.set_xticks(positions, [str(size) for size in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("executions")
    ax.set_title(f"Batch sizes executed ({executions:,} executions, mean batch {mean_batch:.3g})")
    ax.margins(y=0.12)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    return fig


def payload_label(row: Mapping[str, Any]) -> str:
    """A measurement's payload in a few words: ``"json"``, ``"binary + gzip"``, ``"json in, binary out"``."""
    def option(name: str, default: str) -> str:
        value = row.get(name)
        return value if isinstance(value, str) else default  # NaN where a row lacks it

    inputs, outputs = option("input_tensor_format", "binary"), option("output_tensor_format", "binary")
    label = inputs if inputs == outputs else f"{inputs} in, {outputs} out"
    compressions = {option(name, "none") for name in ("request_compression", "response_compression",
                                                      "grpc_compression_algorithm")} - {"none"}
    return " + ".join([label, *sorted(compressions)])


def plot_payload_comparison(results: pd.DataFrame) -> Figure:
    """The payload trade-off: for each payload (tensor format and compression) and load level,
    throughput, p50 and p99 latency, and the mean request and response bytes on the wire — three
    panels of grouped bars, the load levels side by side."""
    frame = _check_results(results, ("throughput_infer_per_sec", "latency_p50_us", "latency_p99_us",
                                     "request_bytes", "response_bytes", "concurrency"))
    frame = frame.assign(payload=[payload_label(row) for row in frame.to_dict("records")])
    payloads = list(dict.fromkeys(frame["payload"]))
    levels = sorted(frame["concurrency"].dropna().unique())
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    throughput_ax, latency_ax, bytes_ax = fig.subplots(1, 3)
    width = 0.8 / max(1, len(levels))
    positions = np.arange(len(payloads))
    for number, level in enumerate(levels):
        at = frame[frame["concurrency"] == level].set_index("payload").reindex(payloads)
        offset = positions + (number - (len(levels) - 1) / 2) * width
        throughput_ax.bar(offset, at["throughput_infer_per_sec"], width, label=f"{level:g} in flight")
        latency_ax.bar(offset, at["latency_p99_us"] / 1e3, width, alpha=0.45, label=f"p99, {level:g} in flight")
        latency_ax.scatter(offset, at["latency_p50_us"] / 1e3, marker="_", s=200, color="black", zorder=3,
                           label="p50" if number == 0 else None)
        if number == 0:  # bytes per request do not depend on the load
            bytes_ax.bar(positions - 0.2, at["request_bytes"], 0.4, label="request")
            bytes_ax.bar(positions + 0.2, at["response_bytes"], 0.4, label="response")
    for ax, title, unit in ((throughput_ax, "throughput", "infer/s"), (latency_ax, "latency", "ms"),
                            (bytes_ax, "bytes on the wire per request", "bytes")):
        ax.set_xticks(positions, payloads, rotation=15, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.legend(fontsize=7)
    model = _model_name(frame)
    if model:
        fig.suptitle(f"{model}: payload format and compression", fontsize=11)
    return fig
