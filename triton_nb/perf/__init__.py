"""Measure and tune served models, as perf_analyzer and Model Analyzer do, from Python.

* :func:`measure` — latency and throughput at each load level (concurrency or request rate), with
  the server-side breakdown, against the in-kernel server (in-process, HTTP, gRPC) or any KServe v2
  server by URL (real Triton included);
* :func:`tune` — a search over batching knobs, applied live to the in-kernel server (or through the
  repository load API on a remote one), ranked under a latency budget, with the recommended config;
* :func:`replay` — a sweep's top configs measured again on a real tritonserver by URL, both rankings
  side by side, and how our pick fares there (:attr:`ReplayResult.pick_vs_best`);
* plots of both (:mod:`triton_nb.perf.plots`).
"""

from triton_nb.perf.measure import PERF_ANALYZER_COLUMNS, measure, write_perf_analyzer_csv
from triton_nb.perf.plots import (
    plot_batch_size_histogram,
    plot_knob_heatmap,
    plot_latency_breakdown,
    plot_payload_comparison,
    plot_throughput_vs_latency,
)
from triton_nb.perf.replay import ReplayResult, replay
from triton_nb.perf.tune import SweepSettings, TuneResult, tune

__all__ = [
    "PERF_ANALYZER_COLUMNS",
    "ReplayResult",
    "SweepSettings",
    "TuneResult",
    "measure",
    "plot_batch_size_histogram",
    "plot_knob_heatmap",
    "plot_latency_breakdown",
    "plot_payload_comparison",
    "plot_throughput_vs_latency",
    "replay",
    "tune",
    "write_perf_analyzer_csv",
]
