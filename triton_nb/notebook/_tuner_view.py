"""What the tuning panel draws: short config labels, the plot of its points, the ranking table, the
server time per stage of one point, and a replay's two rankings side by side.

Plain functions over the panel's points (a DataFrame, one row per measured point) so that they are
tested without widgets. Figures use Matplotlib's object API (no pyplot state): the panel redraws
them from its background thread.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from triton_nb.perf.plots import plot_throughput_vs_latency
from triton_nb.perf.tune import config_label

__all__ = [
    "STAGES",
    "draw_message",
    "draw_points",
    "draw_stages",
    "png",
    "ranked",
    "ranking_html",
    "replay_html",
    "short_labels",
]

#: The server's stages of a request, as its statistics count them (and perf_analyzer reports them).
STAGES = ("queue", "compute_input", "compute_infer", "compute_output")
_STAGE_COLORS = ("#9e9e9e", "#64b5f6", "#1565c0", "#81c784")
#: The knobs a label names when every config on the plot has the same values (what one tunes first).
_FIRST_KNOBS = ("max_queue_delay_microseconds", "instance_count")


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


def knob_text(name: str, value: Any) -> str:
    """One knob's value, short: ``delay 100µs``, ``×2`` (instances), ``cache on``, ``in=json``."""
    if name == "max_batch_size":
        return f"mbs {value}"
    if name == "max_queue_delay_microseconds":
        return f"delay {value}µs"
    if name == "preferred_batch_size":
        return "preferred [" + ",".join(map(str, value)) + "]" if value else "no preferred"
    if name == "instance_count":
        return f"×{value}"
    if name in ("response_cache", "dynamic_batching"):
        return f"{'cache' if name == 'response_cache' else 'batching'} {'on' if value else 'off'}"
    return config_label({name: value})  # the client's knobs (in=json, req_zip=gzip), FIL parameters (algo=NAIVE)


def short_labels(knob_sets: Sequence[Mapping[str, Any]]) -> list[str]:
    """A label per knob set naming only the knobs whose values differ between the sets (``delay
    100µs ×2``): the legend of a plot whose configs share most of their knobs. When none differ,
    the queue delay and instance count."""
    names = list(dict.fromkeys(name for knobs in knob_sets for name in knobs))
    differing = [n for n in names if len({_hashable(knobs.get(n)) for knobs in knob_sets}) > 1]
    shown = differing or [n for n in _FIRST_KNOBS if n in names] or names[:2]
    return [" ".join(knob_text(n, knobs[n]) for n in shown if knobs.get(n) is not None) or "as configured"
            for knobs in knob_sets]


def labels_by_config(points: pd.DataFrame) -> dict[str, str]:
    """config (its full label) -> short label, over the configs of ``points``."""
    first = points.drop_duplicates("config")
    return dict(zip(first["config"], short_labels(list(first["knobs"])), strict=True))


def png(figure: Figure, dpi: int = 96) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.08)
    return buffer.getvalue()


def draw_message(figure: Figure, text: str) -> None:
    """A figure with no axes, only ``text``: what to do, instead of an empty frame."""
    figure.clear()
    figure.text(0.5, 0.5, text, ha="center", va="center", color="#555", fontsize=10, wrap=True)


def failed(points: pd.DataFrame) -> pd.Series:
    """Points whose requests failed (any error), or that had no answer at all."""
    return (points["errors"].fillna(0) > 0) | ~(points["throughput_infer_per_sec"].fillna(0) > 0)


def ranked(points: pd.DataFrame) -> pd.DataFrame:
    """``points`` best first: by throughput, the points with failed requests last (unranked);
    ``rank`` 1.. for the others."""
    bad = failed(points)
    order = points.assign(_bad=bad).sort_values(["_bad", "throughput_infer_per_sec"], ascending=[True, False],
                                                kind="stable")
    ranks = np.where(order["_bad"], 0, np.cumsum(~order["_bad"]))
    return order.drop(columns="_bad").assign(rank=ranks)


def draw_points(figure: Figure, points: pd.DataFrame, *, title: str, in_view: int | None) -> None:
    """The report's chart (p99 latency across, throughput up, a bar from p50 to p99) of every point,
    one series per config with a short label in a legend outside the axes, each marker numbered
    as in the table; the config of point ``in_view`` in full colour."""
    figure.clear()
    labels = labels_by_config(points)
    frame = points.assign(config=points["config"].map(labels))
    ax = figure.subplots()
    highlight = frame.loc[frame["point"] == in_view, "config"]
    plot_throughput_vs_latency(frame, latency="latency_p99_us", spread_from="latency_p50_us",
                               highlight=highlight.iloc[0] if len(highlight) else None, ax=ax)
    for line in ax.lines:  # points, not curves: two runs of one config at one load are not a trend
        line.set_linestyle("none")
    top = frame["throughput_infer_per_sec"].max()
    if top > 0:  # room above the best point for its number
        ax.set_ylim(0, top * 1.12)
    for _, row in frame.iterrows():
        x, y = row["latency_p99_us"] / 1e3, row["throughput_infer_per_sec"]
        if math.isfinite(x) and math.isfinite(y):
            ax.annotate(str(row["point"]), (x, y), xytext=(3, 3), textcoords="offset points", fontsize=7,
                        color="#333")
    handles, texts = ax.get_legend_handles_labels()
    legend = ax.get_legend()
    if legend is not None:
        legend.remove()
    # outside the axes, on the right: it never covers a point, however many configs there are
    ax.legend(handles, texts, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False,
              ncol=1 if len(texts) <= 14 else 2, borderaxespad=0.0)
    ax.set_title(title, fontsize=9)
    ax.xaxis.label.set_size(8)
    ax.yaxis.label.set_size(8)
    ax.tick_params(labelsize=7)


def draw_stages(figure: Figure, stages: Mapping[str, Mapping[str, float]], *, title: str) -> None:
    """The server's time per request of each model (an ensemble's composing models, in order),
    stacked by stage: queue, compute input, compute infer, compute output (ms)."""
    figure.clear()
    if not stages:
        draw_message(figure, "no server statistics for this point")
        return
    ax = figure.subplots()
    models = list(stages)
    left = np.zeros(len(models))
    for stage, color in zip(STAGES, _STAGE_COLORS, strict=True):
        widths = np.array([stages[m].get(stage, 0.0) / 1e3 for m in models])
        ax.barh(models, widths, left=left, color=color, label=stage.replace("_", " "), height=0.6)
        left += widths
    for y, total in enumerate(left):
        ax.annotate(f"{total:.3g} ms", (total, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(float(left.max()), 1e-3) * 1.3)
    ax.set_xlabel("server time per request (ms)", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=2, fontsize=8, frameon=False)


def _load(row: Mapping[str, Any]) -> str:
    rate = row.get("request_rate")
    if rate is not None and not (isinstance(rate, float) and math.isnan(rate)):
        return f"{rate:g}/s"
    concurrency = row.get("concurrency")
    return f"c={int(concurrency)}" if concurrency is not None and concurrency == concurrency else ""


def _ms(value: float) -> str:
    return f"{value / 1e3:.3g}" if value == value else "–"


_CELL = 'style="padding:1px 6px;text-align:{align};white-space:{wrap};vertical-align:top"'


def _table(headers: Sequence[str], rows: Sequence[tuple[Sequence[str], str]], *, numeric: set[int],
           wrapping: set[int] = frozenset()) -> str:
    """A compact HTML table; each row is (cells, row style); cells are HTML already. Columns in
    ``wrapping`` may break lines, so that the table fits a narrow output area."""
    def cell(tag: str, i: int, content: str) -> str:
        align = "right" if i in numeric else "left"
        return f"<{tag} {_CELL.format(align=align, wrap='normal' if i in wrapping else 'nowrap')}>{content}</{tag}>"

    head = "".join(cell("th", i, html.escape(h)) for i, h in enumerate(headers))
    body = "".join(f'<tr style="{style}">' + "".join(cell("td", i, c) for i, c in enumerate(cells)) + "</tr>"
                   for cells, style in rows)
    return (f'<table class="triton-nb-ranking" style="border-collapse:collapse;font-size:12px;line-height:1.3">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def ranking_html(points: pd.DataFrame, *, recommended: int | None, in_view: int | None) -> str:
    """The points ranked by throughput (failed ones last, unranked), each with its number on the
    plot, its short config (the full one as the tooltip), how it was measured and its figures; the
    sweep's recommended point marked ★, the point in view in bold."""
    if points.empty:
        return ""
    labels = labels_by_config(points)
    rows = []
    for _, row in ranked(points).iterrows():
        bad = row["rank"] == 0
        mark = " ★ recommended" if row["point"] == recommended else ""
        config = (f'<span title="{html.escape(str(row["config"]))}">{html.escape(labels[row["config"]])}</span>'
                  f"<b>{mark}</b>")
        errors = int(row["errors"]) if row["errors"] == row["errors"] else 0
        how = " · ".join(html.escape(str(part)) for part in (row["source"], _load(row), row["protocol"]) if part)
        cells = ["–" if bad else str(row["rank"]), str(row["point"]), config, how,
                 f"{row['throughput_infer_per_sec']:,.1f}", _ms(row["latency_p50_us"]), _ms(row["latency_p99_us"]),
                 f'<span style="color:#b00020"><b>{errors:,}</b></span>' if errors else "0"]
        style = ("color:#b00020;" if bad else "") + ("font-weight:bold;" if row["point"] == in_view else "")
        if row["point"] == recommended:
            style += "background:#e8f5e9;"
        rows.append((cells, style))
    return _table(["rank", "#", "config", "measured", "infer/s", "p50 ms", "p99 ms", "errors"], rows,
                  numeric={0, 1, 4, 5, 6, 7}, wrapping={2, 3})


def replay_html(outcome: Any) -> str:
    """A :class:`~triton_nb.perf.ReplayResult` as the panel shows it: the figure (our pick's share of
    real Triton's best), then both rankings of the replayed configs side by side."""
    comparison = outcome.comparison
    latency = next((c.removeprefix("sweep_") for c in comparison.columns
                    if c.startswith("sweep_latency_p") and c.endswith("_us")), "latency_p99_us")
    figure = "–" if outcome.pick_vs_best is None else f"{outcome.pick_vs_best:.2f}"
    rows = []
    for _, row in comparison.iterrows():
        def rank(side: str, row: Any = row) -> str:
            value = row[f"{side}_rank"]
            return "–" if value != value else str(int(value))

        label = html.escape(str(row["config"])) + (" <b>★ our pick</b>" if row["recommended"] else "")
        rows.append(([label, rank("sweep"), f"{row['sweep_throughput_infer_per_sec']:,.1f}",
                      _ms(row[f"sweep_{latency}"]), rank("triton"), f"{row['triton_throughput_infer_per_sec']:,.1f}",
                      _ms(row[f"triton_{latency}"])], "background:#e8f5e9;" if row["recommended"] else ""))
    percentile = latency.removeprefix("latency_").removesuffix("_us")
    table = _table(["config", "sweep rank", "sweep infer/s", f"sweep {percentile} ms", "Triton rank",
                    "Triton infer/s", f"Triton {percentile} ms"], rows, numeric={1, 2, 3, 4, 5, 6}, wrapping={0})
    notes = "".join(f"<div>{html.escape(note)}</div>" for note in outcome.notes)
    return (f'<div style="font-size:13px"><b>pick vs best on real Triton: {figure}</b> — '
            f"{html.escape(outcome.summary())}</div>{notes}{table}")
