"""Measure and tune served models, as perf_analyzer and Model Analyzer do, from Python.

* :func:`measure` — latency and throughput at each load level (concurrency or request rate), with
  the server-side breakdown, against the in-kernel server (in-process, HTTP, gRPC) or any KServe v2
  server by URL (real Triton included);
* :func:`tune` — a search over batching knobs, applied live to the in-kernel server (or through the
  repository load API on a remote one), ranked under a latency budget, with the recommended config;
* :func:`replay` — a sweep's top configs measured again on a real tritonserver by URL, both rankings
  side by side, and how our pick fares there (:attr:`ReplayResult.pick_vs_best`);
* plots of both (:mod:`triton_nb.perf.plots`);
* the option groups both take (:mod:`triton_nb.perf.options`): :class:`Wire`, :class:`Sequences`,
  :class:`SharedMemory`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triton_nb.perf.measure import PERF_ANALYZER_COLUMNS, measure, write_perf_analyzer_csv
from triton_nb.perf.options import COMPRESSIONS, TENSOR_FORMATS, Sequences, SharedMemory, Wire
from triton_nb.perf.replay import ReplayResult, replay
from triton_nb.perf.tune import SweepSettings, TuneResult, tune

__all__ = [
    "COMPRESSIONS",
    "PERF_ANALYZER_COLUMNS",
    "TENSOR_FORMATS",
    "ReplayResult",
    "Sequences",
    "SharedMemory",
    "SweepSettings",
    "TuneResult",
    "Wire",
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

if TYPE_CHECKING:
    from triton_nb.perf.plots import (
        plot_batch_size_histogram,
        plot_knob_heatmap,
        plot_latency_breakdown,
        plot_payload_comparison,
        plot_throughput_vs_latency,
    )

# The plots load matplotlib (seconds): only when one is asked for, so that the command line and
# the magics can import the option groups without it.
_PLOTS = ("plot_batch_size_histogram", "plot_knob_heatmap", "plot_latency_breakdown", "plot_payload_comparison",
          "plot_throughput_vs_latency")


def __getattr__(name: str) -> Any:
    if name in _PLOTS:
        from triton_nb.perf import plots

        return getattr(plots, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
