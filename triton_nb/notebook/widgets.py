"""The tuning panel: ``triton_nb.notebook.widgets.Tuner(server, "ensemble")`` (or ``server.tune("ensemble")``).

An ipywidgets panel over a running in-kernel server, laid out for a laptop's notebook (it wraps to
the output area's width, 1024 px screens included). The knobs are grouped in tabs:

* **Batching** — the tuned model's max batch size, queue delay (with, under it, why its batches left),
  preferred batch sizes, instance count, FIL engine parameters for a FIL model, and its response
  cache on a server started with ``cache_size_bytes``;
* **Load** — concurrency or request rate, protocol, measurement length and windows, the share of
  repeated requests;
* **Payload** — what the requests carry and how they travel (client-side, never the server): the
  request data (generated card transactions by default for a model whose inputs are the fraud
  example's raw columns, such as its ensemble; random tensors for others), the request and response
  tensor format (binary or JSON, HTTP), compression (of requests over HTTP, or gRPC's messages)
  and compressed answers (HTTP);
* **Sweep** — the delays and instance counts a sweep tries, and whether it also tries the response
  cache off and on, the request tensor format binary and JSON, compression off and gzip;
* **Replay** — a tritonserver's URL: the latest sweep's best configs measured again there.

Buttons:

* **Apply** changes the serving model live (``update_batching``: from the next batch, no reload, no
  request dropped; ``update_response_cache`` for the response cache); changed FIL parameters reload
  the model beside the serving one (in the background thread).
* **Measure** runs :func:`triton_nb.perf.measure` at the current load in a background thread (the
  kernel stays responsive) and adds a point to the plot and the table; earlier configs stay.
* **Sweep** runs :func:`triton_nb.perf.tune` over the Sweep tab's grid; each config's point appears
  on the plot and in the ranking as soon as it is measured, with "sweep: 3 of 12 configs measured";
  the original config comes back at the end.
* **Save config** writes ``config.pbtxt`` into the repository folder of the tuned model: the sweep's
  recommendation when the latest action was a sweep that found one, else the knobs in force.
* **Export** copies the whole served repository to a new folder with that same config for the
  tuned model: a repository to hand to a tritonserver.
* **Replay on Triton** (Replay tab) runs :func:`triton_nb.perf.replay` on the latest sweep against
  the tritonserver at the URL typed in, and shows both rankings side by side and how our pick fares
  there (``pick_vs_best``).

The plot shows throughput against p99 latency (a bar from p50) per config, each point numbered as in
the table, the legend naming only the knobs that differ between the configs. The table ranks the
points by throughput (points with failed requests last, in red), the sweep's recommended one
marked ★. Beside the plot, the server's time per request by stage (queue, compute input, infer,
output) of each model (an ensemble's composing models) for the point in view — the latest, or the
one picked. A measurement whose requests fail says so in red in the status line, with the first
error's message.

One background action at a time: a click while one runs is ignored, with a message. Errors (bad
input, refused knobs, a failed measurement) show as one line in the status and are never raised
from a callback or lost in a thread. Plots are PNGs in ``ipywidgets.Image``, which a background
thread may update safely.
"""

from __future__ import annotations

import html
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from triton_nb._deprecation import no_unknown, renamed
from triton_nb.errors import InvalidArgumentError
from triton_nb.fraud.encoding.columns import RAW_INPUT_COLUMNS
from triton_nb.notebook import _tuner_view as view
from triton_nb.notebook._tuner_layout import FIL_OPTIONS, PanelLayout
from triton_nb.perf.measure import WIRE_OPTIONS, measure
from triton_nb.perf.options import Wire
from triton_nb.perf.replay import replay, replayed_configs
from triton_nb.perf.stats import server_breakdown
from triton_nb.perf.tune import BATCHING_KNOBS, CLIENT_KNOBS, config_label, config_with_knobs, knobs_of, tune
from triton_nb.server.observability.stats import BATCH_REASONS_KEY, BatchReason

__all__ = ["FIL_OPTIONS", "Tuner", "default_input_data"]

_FIL_DEFAULTS = {"storage_type": "AUTO", "algo": "ALGO_AUTO", "layout": "depth_first"}
_POINT_COLUMNS = ["point", "config", "knobs", "source", "protocol", "concurrency", "request_rate",
                  "throughput_infer_per_sec", "latency_p50_us", "latency_p99_us", "errors", "first_error",
                  "completed_requests", "stages", "sweep", "sweep_config"]
#: How the batch readout names each reason (short, to fit beside the knobs).
_REASON_LABELS = {
    BatchReason.MAX_BATCH_SIZE: "full", BatchReason.PREFERRED_BATCH_SIZE: "preferred size",
    BatchReason.MAX_QUEUE_DELAY: "delay", BatchReason.INSTANCE_FREE: "free instance",
    BatchReason.DIFFERENT_SHAPE: "other shape", BatchReason.DRAINING: "draining",
    BatchReason.NO_DYNAMIC_BATCHING: "unbatched",
}
_REASONS_TIP = ("why each batch left: full = max_batch_size reached (or the next request did not fit), delay = "
                "max_queue_delay_microseconds ran out, free instance = an instance took the queue as it was (delay 0, "
                "or spent while every instance was busy)")
_EMPTY_PLOT = ("No points yet.\nPress Measure to measure the knobs in force,\n"
               "or Sweep to try every config of the Sweep tab.")
def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _int_list(text: str, what: str, *, minimum: int = 0) -> list[int]:
    """``"8, 16"`` -> ``[8, 16]``; a clear error naming ``what`` for anything else."""
    values = []
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise InvalidArgumentError(f"{what}: {part!r} is not a whole number (give e.g. '8,16')") from None
        if value < minimum:
            raise InvalidArgumentError(f"{what}: {value} must be >= {minimum}")
        values.append(value)
    return values


def default_input_data(config: dict[str, Any]) -> str:
    """The request data a model accepts by default: ``"fraud"`` (generated card transactions) when
    its inputs are the fraud example's raw transaction columns (its ensemble, its preprocessing
    model), whose strings random tensors would not parse; ``"random"`` for any other model."""
    names = {spec.get("name") for spec in config.get("input", [])}
    return "fraud" if names and names <= set(RAW_INPUT_COLUMNS) else "random"


class Tuner(PanelLayout):
    """The tuning panel for ``model`` served by an in-kernel ``server`` (see the module).

    ``tuned_model``: the model whose knobs change; by default ``model`` itself, or for an ensemble
    its last step. ``input_data``: what the measurements send (as :func:`triton_nb.perf.measure`);
    by default generated card transactions for a model whose inputs are the fraud example's raw
    columns, random tensors for others (see :func:`default_input_data`); the Payload tab switches.
    ``repeat_ratio``: the initial share of repeated requests (the Load tab's "repeated share" control,
    :func:`triton_nb.perf.measure`'s ``repeat_ratio``), for measuring the response cache.

    For code and tests: :attr:`widget` (the root box, CSS class ``triton-nb-tuner``), :attr:`controls`
    and :attr:`buttons` (name -> widget), :attr:`points` (a DataFrame, one row per measured point),
    :attr:`status`, :attr:`message` (the status line as text), :attr:`figure` (the plot),
    :attr:`result` (the latest sweep's :class:`~triton_nb.perf.TuneResult`),
    :attr:`replay_result` and :meth:`wait`.
    """

    def __init__(self, server: Any, model: str, *, tuned_model: str | None = None,
                 input_data: Any = None, repeat_ratio: float = 0.0) -> None:
        self.server = server
        self.model = model
        self.repeat_ratio = repeat_ratio
        # the response cache knob needs a server with a cache
        self.cache = getattr(server, "cache_size_bytes", None) is not None
        served = server.model_config_json(model)
        self.tuned_model = tuned_model or self._default_tuned_model(model, served)
        loaded = server.input_config(self.tuned_model)  # the configured config: its limits
        self.batching = loaded.max_batch_size > 0
        self.limit = int(loaded.max_batch_size)
        self.fil = loaded.backend == "fil"
        # the models whose stages the latency chart shows: an ensemble's composing models, in order
        steps = served.get("ensemble_scheduling", {}).get("step", [])
        self._stage_models = list(dict.fromkeys(step["model_name"] for step in steps)) or [model]
        self._accepted_data = default_input_data(served)
        # a DataFrame, a dict or a JSON file's path: offered as "the data given" beside the named kinds
        named = isinstance(input_data, str) and input_data in ("fraud", "random", "zero")
        self._given = None if input_data is None or named else input_data
        self._initial_data = ("given" if self._given is not None
                              else input_data if isinstance(input_data, str) else self._accepted_data)
        self.result: Any = None  # the latest sweep's TuneResult, until the next Apply (what Save config writes)
        self.last_sweep: Any = None  # the latest sweep's TuneResult, kept for Replay
        self.replay_result: Any = None
        self._points: list[dict[str, Any]] = []
        self._sweeps = 0
        self._recommended_point: int | None = None  # the latest sweep's recommended point (★ in the table)
        self._shown_sweep: int | None = None
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._running = ""
        self._quiet = False  # set while the panel itself changes the point in view
        # the batch reasons' totals at the last Apply (None: count from the load)
        self._reasons_at_apply: dict[str, tuple[int, int]] | None = None
        self.figure = Figure(figsize=(5.0, 3.3))
        self.stages_figure = Figure(figsize=(4.2, 2.0))
        self._build(self._live_knobs())
        self._redraw()

    # ------------------------------------------------------------------ set-up
    def _default_tuned_model(self, model: str, config: dict[str, Any]) -> str:
        steps = config.get("ensemble_scheduling", {}).get("step", [])
        if config.get("platform") == "ensemble" or steps:
            if not steps:
                raise InvalidArgumentError(f"ensemble '{model}' has no steps to tune")
            return steps[-1]["model_name"]
        return model

    def _live_knobs(self) -> dict[str, Any]:
        """The tuned model's knobs in force now (the ones this panel can change)."""
        config = self.server.model_config_json(self.tuned_model)
        names = list(BATCHING_KNOBS) if self.batching else ["instance_count"]
        if self.cache:
            names.append("response_cache")
        if self.fil:
            names += [f"parameters.{key}" for key in FIL_OPTIONS]
        knobs = knobs_of(config, names)
        for key, default in _FIL_DEFAULTS.items():
            if self.fil and knobs.get(f"parameters.{key}") is None:
                knobs[f"parameters.{key}"] = default
        return knobs

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # ------------------------------------------------------------------ state for callers
    @property
    def points(self) -> pd.DataFrame:
        """One row per measured point: its number, config label, knobs, source, protocol, load,
        throughput, p50, p99, errors (and the first one's message), server time per stage."""
        with self._lock:
            return pd.DataFrame(list(self._points), columns=_POINT_COLUMNS)

    @property
    def input_data(self) -> Any:
        """What Measure and Sweep send (the Payload tab's "request data")."""
        choice = self.controls["input_data"].value
        return self._given if choice == "given" else choice

    @property
    def busy(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def wait(self, timeout_s: float | None = None, **deprecated: Any) -> bool:
        """Join the background action, if any, for at most ``timeout_s`` seconds (None: until it
        ends); True when none is running any more. (``timeout=`` is the old spelling.)"""
        timeout_s = renamed("Tuner.wait", deprecated, "timeout", "timeout_s", timeout_s, None)
        no_unknown("Tuner.wait", deprecated)
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        return not self.busy

    # ------------------------------------------------------------------ status
    @staticmethod
    def _html(message: str, error: bool = False) -> str:
        # a div of its own line height: a long line wraps tight, not at the widgets' 28 px rows
        style = "line-height:1.35;padding:4px 0" + (";color:#b00020;font-weight:bold" if error else "")
        return f'<div style="{style}">{html.escape(message)}</div>'

    def _say(self, message: str, error: bool = False) -> None:
        self.message = message.splitlines()[0] if message else ""
        self.status.value = self._html(self.message, error)

    def _error(self, exc: BaseException) -> None:
        self._say(f"error: {_one_line(exc)}", error=True)
        self.progress.bar_style = "danger"

    def _guarded(self, handler: Callable[[], None]) -> Callable[[Any], None]:
        def on_click(_button: Any) -> None:
            try:
                handler()
            except Exception as exc:  # shown in the panel, never raised into the front end
                self._error(exc)

        return on_click

    def _refuse_if_busy(self, action: str) -> bool:
        if self.busy:
            self._say(f"busy: a {self._running} is running — {action} ignored (wait for it to finish)")
            return True
        return False

    def _start(self, name: str, work: Callable[[], None]) -> None:
        """Run ``work`` on a daemon thread; its errors go to the status line."""
        def run() -> None:
            try:
                work()
            except Exception as exc:
                self._error(exc)
            else:
                if self.progress.bar_style != "danger":  # failed requests leave it red
                    self.progress.bar_style = "success"

        with self._lock:
            if self.busy:  # two clicks racing: the second is ignored
                self._say(f"busy: a {self._running} is running — {name} ignored (wait for it to finish)")
                return
            self._running = name
            self.progress.bar_style = "info"
            self._thread = threading.Thread(target=run, name=f"triton-nb-tuner-{name}", daemon=True)
            self._thread.start()

    @staticmethod
    def _failure(point: dict[str, Any]) -> str | None:
        """What went wrong with a point's requests, in one line; None when they were answered."""
        errors = int(point["errors"] or 0)
        if errors:
            first = point.get("first_error") or "no message"
            return (f"{errors:,} request(s) failed, {int(point.get('completed_requests') or 0):,} answered — "
                    f"first error: {first}")
        if not point["throughput_infer_per_sec"] > 0:
            return "no request was answered"
        return None

    # ------------------------------------------------------------------ reading the controls
    def _knobs_from_controls(self) -> dict[str, Any]:
        c = self.controls
        knobs: dict[str, Any] = {}
        if self.batching:
            mbs = int(c["max_batch_size"].value)
            if not 1 <= mbs <= self.limit:
                raise InvalidArgumentError(f"max batch size {mbs} must be between 1 and the model's limit {self.limit}")
            preferred = _int_list(c["preferred_batch_size"].value, "preferred sizes", minimum=1)
            too_big = [p for p in preferred if p > mbs]
            if too_big:
                raise InvalidArgumentError(f"preferred sizes {too_big} exceed the max batch size {mbs}")
            knobs.update(max_batch_size=mbs, max_queue_delay_microseconds=int(c["max_queue_delay_microseconds"].value),
                         preferred_batch_size=preferred)
        knobs["instance_count"] = int(c["instance_count"].value)
        if self.cache:
            knobs["response_cache"] = bool(c["response_cache"].value)
        return knobs

    def _fil_from_controls(self) -> dict[str, str]:
        return {name: str(widget.value) for name, widget in self.controls.items() if name.startswith("parameters.")}

    def _load(self) -> dict[str, Any]:
        c = self.controls
        if c["load"].value == "concurrency":
            return {"concurrency_range": [int(c["concurrency"].value)]}
        return {"request_rate_range": [float(c["request_rate"].value)]}

    def _wire(self, protocol: str) -> dict[str, str]:
        """The payload controls as :func:`~triton_nb.perf.measure`'s wire options for ``protocol``:
        "compression" is the request bodies' over HTTP, the messages' over gRPC. Only values other
        than the defaults are given, so a measurement in-process with defaults passes none (and a
        non-default one there is refused by name)."""
        c = self.controls
        compression = "grpc_compression_algorithm" if protocol == "grpc" else "request_compression"
        wire = {"input_tensor_format": c["input_tensor_format"].value,
                "output_tensor_format": c["output_tensor_format"].value, compression: c["compression"].value,
                "response_compression": c["response_compression"].value}
        return {name: value for name, value in wire.items() if value != WIRE_OPTIONS[name][0]}

    @staticmethod
    def _client_of(row: dict[str, Any]) -> dict[str, Any]:
        """The client knobs a measured row used, those other than the defaults (for its label)."""
        return {name: row[name] for name in CLIENT_KNOBS
                if isinstance(row.get(name), str) and row[name] != WIRE_OPTIONS[name][0]}

    def _timing(self) -> dict[str, Any]:
        interval = int(self.controls["measurement_interval_ms"].value)
        ratio = float(self.controls["repeat_ratio"].value)
        if not 0.0 <= ratio < 1.0:
            raise InvalidArgumentError(f"repeated share: {ratio} must be at least 0 and below 1")
        return {"measurement_interval_ms": interval, "max_trials": int(self.controls["max_trials"].value),
                "warmup_ms": min(interval, 1000), "repeat_ratio": ratio}

    # ------------------------------------------------------------------ actions
    def _on_apply(self) -> None:
        if self._refuse_if_busy("Apply"):
            return
        knobs = self._knobs_from_controls()
        params = self._fil_from_controls()
        live = self._live_knobs()
        reload = {k: v for k, v in params.items() if live.get(k) != v}

        cache = knobs.pop("response_cache", None)

        def update() -> dict[str, Any]:
            now = self.server.update_batching(self.tuned_model, **knobs)
            if cache is not None:
                now["response_cache"] = self.server.update_response_cache(self.tuned_model, enable=cache)
            return now

        self.result = None
        if not reload:
            now = update()
            self._count_reasons_from_now()
            self._say(f"applied to {self.tuned_model}: {config_label(self._shown(now))}")
            return

        def work() -> None:
            self._say(f"reloading {self.tuned_model} with {config_label(reload)} …")
            config = config_with_knobs(self.server.model_config_json(self.tuned_model), reload)
            self.server.load_model(self.tuned_model, config=config)  # swapped in when ready: nothing dropped
            now = update()
            self._count_reasons_from_now()
            self._say(f"applied to {self.tuned_model}: {config_label({**self._shown(now), **reload})}")

        self._start("reload", work)

    def _shown(self, knobs: dict[str, Any]) -> dict[str, Any]:
        names = (*(BATCHING_KNOBS if self.batching else ("instance_count",)), "response_cache")
        return {n: knobs[n] for n in names if n in knobs}

    def _on_measure(self) -> None:
        if self._refuse_if_busy("Measure"):
            return
        load = self._load()
        timing = self._timing()
        protocol = self.controls["protocol"].value
        wire = self._wire(protocol)
        data = self.input_data

        def work() -> None:
            knobs = {**self._live_knobs(), **wire}
            what = ", ".join(f"{k.removesuffix('_range')} {v[0]:g}" for k, v in load.items())
            self._say(f"measuring {self.model} at {what} over {protocol} ({config_label(knobs)}) …")
            self.progress.max, self.progress.value = 1, 0
            started = time.monotonic()
            before = self.server.statistics()
            frame = measure(self.server, self.model, protocol=protocol, input_data=data, **load, **timing,
                            wire=Wire(**wire))
            point = self._add_point(frame.iloc[0].to_dict(), knobs, "measure", self._stages(before))
            self.progress.value = 1
            failure = self._failure(point)
            if failure:
                self.progress.bar_style = "danger"
                self._say(f"requests FAILED measuring {self.model} ({self._data_name(data)}): {failure}", error=True)
                return
            self._say(f"measured #{point['point']} {point['config']}: {point['throughput_infer_per_sec']:,.0f} "
                      f"infer/s, p50 {point['latency_p50_us'] / 1e3:.2f} ms, p99 {point['latency_p99_us'] / 1e3:.2f}"
                      f" ms ({time.monotonic() - started:.1f} s)")

        self._start("measurement", work)

    @staticmethod
    def _data_name(data: Any) -> str:
        return f"input_data={data!r}" if isinstance(data, str) else "the data given"

    def _sweep_grid(self, protocol: str, wire: dict[str, str]) -> dict[str, list[Any]]:
        grid: dict[str, list[Any]] = {}
        if self.batching:
            delays = _int_list(self.controls["sweep_delays"].value, "sweep delays", minimum=0)
            if delays:
                grid["max_queue_delay_microseconds"] = delays
        instances = _int_list(self.controls["sweep_instances"].value, "sweep instances", minimum=1)
        if instances:
            grid["instance_count"] = instances
        if self.cache and self.controls["sweep_cache"].value:
            grid["response_cache"] = [False, True]
        if self.controls["sweep_formats"].value:
            wire.pop("input_tensor_format", None)
            grid["input_tensor_format"] = ["binary", "json"]
        if self.controls["sweep_compression"].value:
            compression = "grpc_compression_algorithm" if protocol == "grpc" else "request_compression"
            wire.pop(compression, None)
            grid[compression] = ["none", "gzip"]
        if not grid:
            raise InvalidArgumentError("give sweep delays and/or instance counts, e.g. '0,100,500' and '1,2'")
        if protocol == "inprocess" and any(name in grid for name in CLIENT_KNOBS):
            raise InvalidArgumentError("sweeping the payload needs protocol http or grpc: in-process calls have "
                                       "no wire format")
        return grid

    def _on_sweep(self) -> None:
        if self._refuse_if_busy("Sweep"):
            return
        protocol = self.controls["protocol"].value
        wire = self._wire(protocol)
        grid = self._sweep_grid(protocol, wire)
        concurrency = int(self.controls["concurrency"].value)
        timing = self._timing()
        timing.pop("warmup_ms")
        data = self.input_data
        total = 1
        for values in grid.values():
            total *= len(values)
        self._sweeps += 1
        sweep = self._sweeps
        failures: list[str] = []
        marks = {"before": self.server.statistics()}

        def on_point(row: dict[str, Any]) -> None:
            # called while the config is applied (its knobs in force); the payload's knobs come with the row
            after = self.server.statistics()
            stages = self._stages(marks["before"], after)
            marks["before"] = after  # the next config's run starts after this one's
            point = self._add_point(row, {**self._live_knobs(), **self._client_of(row)}, "sweep", stages,
                                    sweep=sweep)
            self.progress.value = min(self.progress.value + 1, self.progress.max)
            failure = self._failure(point)
            if failure:
                failures.append(failure)
                self.progress.bar_style = "danger"
            progress = f"sweep: {self.progress.value} of {total} configs measured"
            if failures:
                self._say(f"{progress} — requests FAILED at {len(failures)}: {failures[0]}", error=True)
            else:
                self._say(f"{progress}; best so far #{view.ranked(self._sweep_points(sweep))['point'].iloc[0]} …")

        def work() -> None:
            self.progress.max, self.progress.value = total, 0
            self._say(f"sweep: {total} configs of {self.tuned_model} at concurrency {concurrency} …")
            result = tune(self.server, self.model, grid, concurrency_range=[concurrency],
                          tuned_model=self.tuned_model, protocol=protocol, input_data=data,
                          progress=False, on_point=on_point, wire=wire, **timing)
            self.result = self.last_sweep = result
            best = result.recommended
            if best is not None:
                label = config_label(best)
                swept = self._sweep_points(sweep)
                chosen = list(swept.loc[swept["sweep_config"] == label, "point"])
                self._recommended_point = chosen[0] if chosen else None
                self._redraw()
            outcome = (f"recommended #{self._recommended_point} {config_label(best)} (Save config writes it)"
                       if best else "no config met the constraints")
            if failures:
                self._say(f"sweep done: {len(result.measurements)} points; requests FAILED at {len(failures)} of "
                          f"them ({self._data_name(data)}) — {failures[0]}; {outcome}", error=True)
            else:
                self._say(f"sweep done: {len(result.measurements)} points; {outcome}")

        self._start("sweep", work)

    def _sweep_points(self, sweep: int) -> pd.DataFrame:
        points = self.points
        return points[points["sweep"] == sweep]

    def config_path(self) -> Path:
        """Where Save config writes: ``<repository>/<tuned model>/config.pbtxt``."""
        return Path(self.server.repository) / self.tuned_model / "config.pbtxt"

    def _chosen(self) -> tuple[dict[str, Any], str]:
        """The knobs Save config and Export write, and how to name them: the sweep's recommendation
        when the latest action was a sweep that found one, else the knobs in force."""
        if self.result is not None and self.result.recommended is not None:
            return dict(self.result.recommended), f"the sweep's best ({config_label(self.result.recommended)})"
        knobs = self._live_knobs()
        return knobs, config_label(knobs)

    def _write_config(self, path: Path, knobs: dict[str, Any]) -> Path:
        """``knobs`` into the config file at ``path`` (only the knobs change; a missing file gets the
        served config)."""
        from triton_nb.repository.config import config_from_json, config_to_json, load_config, save_config

        base = config_to_json(load_config(path)) if path.is_file() else self.server.model_config_json(self.tuned_model)
        config = config_with_knobs(base, knobs)
        return save_config(config_from_json(config, source=f"{self.tuned_model} config"), path)

    def _on_save(self) -> None:
        if self._refuse_if_busy("Save config"):
            return
        knobs, what = self._chosen()
        written = self._write_config(self.config_path(), knobs)
        self._say(f"saved {what} to {written}")

    def _on_export(self) -> None:
        if self._refuse_if_busy("Export"):
            return
        text = str(self.controls["export_folder"].value).strip()
        if not text:
            raise InvalidArgumentError("export: give the folder to write the repository to")
        source = Path(self.server.repository).absolute()
        # a relative folder goes beside the served repository, whatever the kernel's working directory
        target = (source.parent / Path(text).expanduser()).resolve()
        if target == source or source in target.parents:
            raise InvalidArgumentError(f"export: {target} is inside the served repository {source}: name another "
                                       f"folder")
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise InvalidArgumentError(f"export: {target} exists and is not an empty folder: name a new one")
        knobs, what = self._chosen()

        def work() -> None:
            self._say(f"exporting {source} to {target} …")
            shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            self._write_config(target / self.tuned_model / "config.pbtxt", knobs)
            self._say(f"exported the repository to {target} with {self.tuned_model}: {what}")

        self._start("export", work)

    def _on_replay(self) -> None:
        if self._refuse_if_busy("Replay"):
            return
        url = str(self.controls["replay_url"].value).strip()
        if not url:
            raise InvalidArgumentError("replay: give the URL (host:port) of a tritonserver started with "
                                       "--model-control-mode=explicit on this repository, or 'start' to start one")
        result = self.last_sweep
        if result is None:
            raise InvalidArgumentError("replay: run a Sweep first — Replay measures its best configs again on "
                                       "real Triton")
        if result.recommended is None:
            raise InvalidArgumentError("replay: the latest sweep recommended no config: nothing to compare")
        top, rounds = int(self.controls["replay_top"].value), int(self.controls["replay_rounds"].value)
        configs = replayed_configs(result.ranking, result.settings.knob_names, result.recommended, top)
        total = rounds * len(configs)

        def on_point(row: dict[str, Any]) -> None:
            self.progress.value = min(self.progress.value + 1, self.progress.max)
            self._say(f"replay on {url}: {self.progress.value} of {total} measured ({row.get('config')}) …")

        def work() -> None:
            self.progress.max, self.progress.value = total, 0
            self._say(f"replay on {url}: {len(configs)} configs × {rounds} rounds …")
            if url == "start":  # the wheel's tritonserver over this repository's Python twin, stopped after
                outcome = replay(result, None, top=top, rounds=rounds, progress=False, on_point=on_point,
                                 model_repository=self.server.repository)
            else:
                outcome = replay(result, url, top=top, rounds=rounds, progress=False, on_point=on_point)
            self.replay_result = outcome
            self.replay_view.value = view.replay_html(outcome)
            self._say(outcome.summary())

        self._start("replay", work)

    # ------------------------------------------------------------------ points, plot, table
    def _stages(self, before: dict[str, Any], after: dict[str, Any] | None = None) -> dict[str, dict[str, float]]:
        """The server's time per request by stage of each model whose stages are shown, from the
        statistics between ``before`` and ``after`` (default now): the point's run, its warm-up included."""
        after = self.server.statistics() if after is None else after
        stages: dict[str, dict[str, float]] = {}
        for name in self._stage_models:
            try:
                part = server_breakdown(before, after, name)
            except ValueError:  # not serving (unloaded meanwhile): no figures for it
                continue
            stages[name] = {"queue": part.queue_us, "compute_input": part.compute_input_us,
                            "compute_infer": part.compute_infer_us, "compute_output": part.compute_output_us}
        return stages

    def _add_point(self, row: dict[str, Any], knobs: dict[str, Any], source: str,
                   stages: dict[str, dict[str, float]], sweep: int | None = None) -> dict[str, Any]:
        with self._lock:
            point = {
                "point": len(self._points) + 1,
                "config": config_label(knobs),
                "knobs": dict(knobs),
                "source": source,
                "protocol": row.get("protocol"),
                "concurrency": row.get("concurrency"),
                "request_rate": row.get("request_rate"),
                "throughput_infer_per_sec": float(row["throughput_infer_per_sec"]),
                "latency_p50_us": float(row["latency_p50_us"]),
                "latency_p99_us": float(row["latency_p99_us"]),
                "errors": int(row.get("errors", 0) or 0),
                "first_error": str(row.get("first_error") or ""),
                "completed_requests": row.get("completed_requests"),
                "stages": stages,
                "sweep": sweep,
                "sweep_config": row.get("config") if sweep is not None else None,
            }
            self._points.append(point)
            if sweep is not None and sweep != self._shown_sweep:
                self._shown_sweep, self._recommended_point = sweep, None  # a new sweep: no pick yet
            self._quiet = True
            try:
                shown = pd.DataFrame(self._points, columns=_POINT_COLUMNS)
                labels = view.labels_by_config(shown)
                self.in_view.options = [("latest point", 0)] + [
                    (f"#{p['point']} {labels[p['config']]}", p["point"]) for p in reversed(self._points)]
                self.in_view.value = 0
            finally:
                self._quiet = False
        self._redraw()
        return point

    def _on_view(self, _change: Any) -> None:
        if not self._quiet:
            self._redraw()

    def _point_in_view(self, points: pd.DataFrame) -> int | None:
        if points.empty:
            return None
        chosen = self.in_view.value
        return int(points["point"].iloc[-1]) if not chosen else int(chosen)

    def _redraw(self) -> None:
        points = self.points
        in_view = self._point_in_view(points)
        with self._lock:
            if points.empty:
                view.draw_message(self.figure, _EMPTY_PLOT)
                view.draw_message(self.stages_figure, "The server's time per stage of a\nmeasured point shows here.")
            else:
                view.draw_points(self.figure, points, in_view=in_view,
                                 title=f"{self.model}: throughput vs p99 latency (bar from p50); #: point")
                row = points[points["point"] == in_view].iloc[0]
                view.draw_stages(self.stages_figure, row["stages"],
                                 title=f"#{in_view}: server time per request by stage")
            image, stages = view.png(self.figure), view.png(self.stages_figure)
        self.image.value = image
        self.stages_image.value = stages
        self.table.value = view.ranking_html(points, recommended=self._recommended_point, in_view=in_view)
        self._show_batch_reasons()

    # ------------------------------------------------------------------ why batches left
    def _reason_totals(self) -> dict[str, tuple[int, int]]:
        """reason -> (batches, rows) of the tuned model, all its versions, since they loaded."""
        totals: dict[str, tuple[int, int]] = {}
        for entry in self.server.statistics(self.tuned_model)["model_stats"]:
            for reason, counted in entry.get(BATCH_REASONS_KEY, {}).items():
                batches, rows = totals.get(reason, (0, 0))
                totals[reason] = (batches + counted["count"], rows + counted["rows"])
        return totals

    def _count_reasons_from_now(self) -> None:
        """The readout counts from this Apply on: the batches that the new knobs formed."""
        self._reasons_at_apply = self._reason_totals()
        self._show_batch_reasons()

    def _show_batch_reasons(self) -> None:
        try:
            totals = self._reason_totals()
        except InvalidArgumentError as exc:  # not serving now: say so where the shares would be
            self.batch_reasons.value = self._html(f"batches: {_one_line(exc)}")
            return
        since = self._reasons_at_apply
        if since is not None and any(n < since.get(reason, (0, 0))[0] for reason, (n, _) in totals.items()):
            since = None  # reloaded since the Apply, outside the panel: its counts start again from the load
        if since is not None:
            totals = {reason: (n - since.get(reason, (0, 0))[0], rows - since.get(reason, (0, 0))[1])
                      for reason, (n, rows) in totals.items()}
        batches = sum(n for n, _ in totals.values())
        when = "since Apply" if since is not None else "since load"
        if not batches:
            text = f"batches {when}: none yet"
        else:
            shares = sorted(((n, reason) for reason, (n, _) in totals.items() if n > 0), reverse=True)
            parts = ", ".join(f"{100 * n / batches:.0f}% {_REASON_LABELS.get(reason, reason)}" for n, reason in shares)
            rows = sum(r for _, r in totals.values())
            text = f"batches {when}: {parts}; mean {rows / batches:.1f} rows ({batches:,})"
        self.batch_reasons.value = (f'<div style="font-size:85%;line-height:1.35;color:#555" '
                                    f'title="{html.escape(_REASONS_TIP)}">{html.escape(text)}</div>')
