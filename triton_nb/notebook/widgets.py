"""The tuning panel: ``triton_nb.widgets.Tuner(server, "ensemble")`` (or ``server.tune("ensemble")``).

An ipywidgets panel over a running in-kernel server. Controls set the tuned model's batching knobs
(max batch size, queue delay, preferred batch sizes, instance count; FIL engine parameters for a
FIL model; its response cache on a server started with ``cache_size_bytes``), the load
(concurrency or request rate, protocol, measurement length, the share of repeated requests) and
the payload — client-side knobs that change how requests travel, never the server: the request
and response tensor format (binary or JSON, HTTP), compression (of requests over HTTP, or gRPC's
message compression) and compressed answers (HTTP):

* **Apply** changes the serving model live (``update_batching``: from the next batch, no reload, no
  request dropped; ``update_response_cache`` for the response cache); changed FIL parameters reload
  the model beside the serving one (in the background thread).
* **Measure** runs :func:`triton_nb.perf.measure` at the current load in a background thread (the
  kernel stays responsive) and adds a point — one per click — to the plot and the table; earlier
  configs stay on the plot for comparison.
* **Sweep** runs :func:`triton_nb.perf.tune` over the delays and instance counts typed in (and the
  response cache off and on, the request tensor format binary and JSON, compression off and gzip,
  when ticked), adding points as they are measured; the original config comes back at the end.
  Points are labelled with their knobs, the payload's among them when not the default
  (``delay_us=100 instances=2 in=json``).
* **Save config** writes ``config.pbtxt`` into the repository folder of the tuned model: the sweep's
  recommendation when the latest action was a sweep that found one, else the knobs in force.

Under the queue delay knob, one line says why the tuned model's batches left — the shares of the
batcher's reasons (the statistics' ``triton_nb_batch_reasons``) and the mean rows per batch — since
the last Apply (before any, since the model loaded): "batches since Apply: 62% delay, 30% full,
8% free instance; mean 37.0 rows (1,204)". It is read again with each measured point and at Apply.

One background action at a time: a click while one runs is ignored, with a message. Errors (bad
input, refused knobs, a failed measurement) show as one line in the status and are never raised
from a callback or lost in a thread. Plots use Matplotlib's object API (no pyplot state) and are
shown as PNG in an ``ipywidgets.Image``, which a background thread may update safely.
"""

from __future__ import annotations

import html
import io
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as w
import pandas as pd
from matplotlib.figure import Figure

from triton_nb.errors import InvalidArgumentError
from triton_nb.perf.measure import WIRE_OPTIONS, measure
from triton_nb.perf.plots import plot_throughput_vs_latency
from triton_nb.perf.tune import BATCHING_KNOBS, CLIENT_KNOBS, config_label, config_with_knobs, knobs_of, tune
from triton_nb.server.stats import BATCH_REASONS_KEY, BatchReason

__all__ = ["FIL_OPTIONS", "Tuner"]

#: FIL engine parameters offered as dropdowns (Triton FIL's allowed values).
FIL_OPTIONS: dict[str, tuple[str, ...]] = {
    "storage_type": ("AUTO", "DENSE", "SPARSE", "SPARSE8"),
    "algo": ("ALGO_AUTO", "NAIVE", "TREE_REORG", "BATCH_TREE_REORG"),
    "layout": ("depth_first", "breadth_first", "layered"),
}
_FIL_DEFAULTS = {"storage_type": "AUTO", "algo": "ALGO_AUTO", "layout": "depth_first"}
_POINT_COLUMNS = ["config", "knobs", "source", "protocol", "concurrency", "request_rate",
                  "throughput_infer_per_sec", "latency_p50_us", "latency_p99_us", "errors"]
_MAX_INSTANCES = 8
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
_MAX_CONCURRENCY = 64


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


class Tuner:
    """The tuning panel for ``model`` served by an in-kernel ``server`` (see the module).

    ``tuned_model``: the model whose knobs change; by default ``model`` itself, or for an ensemble
    its last step. ``input_data``: what the measurements send (as :func:`triton_nb.perf.measure`);
    ``repeat_ratio``: the initial share of repeated requests (the "repeated requests" control,
    :func:`triton_nb.perf.measure`'s ``repeat_ratio``), for measuring the response cache.

    For code and tests: :attr:`widget` (the root VBox), :attr:`controls` and :attr:`buttons`
    (name -> widget), :attr:`points` (a DataFrame, one row per measured point), :attr:`status`,
    :attr:`message` (the status line as text), :attr:`figure` and :meth:`wait`.
    """

    def __init__(self, server: Any, model: str, *, tuned_model: str | None = None,
                 input_data: Any = "random", repeat_ratio: float = 0.0) -> None:
        self.server = server
        self.model = model
        self.input_data = input_data
        self.repeat_ratio = repeat_ratio
        # the response cache knob needs a server with a cache
        self.cache = getattr(server, "cache_size_bytes", None) is not None
        self.tuned_model = tuned_model or self._default_tuned_model(model)
        loaded = server.input_config(self.tuned_model)  # the configured config: its limits
        self.batching = loaded.max_batch_size > 0
        self.limit = int(loaded.max_batch_size)
        self.fil = loaded.backend == "fil"
        self.result: Any = None  # the latest sweep's TuneResult, until the next Apply
        self._points: list[dict[str, Any]] = []
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._running = ""
        # the batch reasons' totals at the last Apply (None: count from the load)
        self._reasons_at_apply: dict[str, tuple[int, int]] | None = None
        self.figure = Figure(figsize=(6.4, 3.6))
        self._build()
        self._redraw()

    # ------------------------------------------------------------------ set-up
    def _default_tuned_model(self, model: str) -> str:
        config = self.server.model_config_json(model)
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

    def _build(self) -> None:
        knobs = self._live_knobs()
        style = {"description_width": "150px"}
        layout = w.Layout(width="420px")
        c: dict[str, w.Widget] = {}
        c["max_batch_size"] = w.IntSlider(
            value=max(1, knobs.get("max_batch_size", 1)), min=1, max=max(1, self.limit),
            description="max batch size", style=style, layout=layout, disabled=not self.batching)
        c["max_queue_delay_microseconds"] = w.BoundedIntText(
            value=knobs.get("max_queue_delay_microseconds", 0), min=0, max=10_000_000,
            description="queue delay (µs)", style=style, layout=layout, disabled=not self.batching)
        c["preferred_batch_size"] = w.Text(
            value=",".join(map(str, knobs.get("preferred_batch_size", ()))), placeholder="e.g. 8,16",
            description="preferred sizes", style=style, layout=layout, disabled=not self.batching)
        c["instance_count"] = w.IntSlider(
            value=min(max(1, knobs["instance_count"]), _MAX_INSTANCES), min=1, max=_MAX_INSTANCES,
            description="instances", style=style, layout=layout)
        c["response_cache"] = w.Checkbox(
            value=bool(knobs.get("response_cache", False)), description="response cache", style=style,
            layout=layout, disabled=not self.cache,
            tooltip="response_cache { enable } of the tuned model" if self.cache
            else "the server has no response cache (start it with cache_size_bytes=N)")
        if self.fil:
            for key, options in FIL_OPTIONS.items():
                c[f"parameters.{key}"] = w.Dropdown(
                    options=list(options), value=knobs[f"parameters.{key}"] if knobs[f"parameters.{key}"] in options
                    else options[0], description=f"FIL {key}", style=style, layout=layout)
        c["load"] = w.ToggleButtons(options=["concurrency", "request rate"], value="concurrency",
                                    description="load", style=style)
        c["concurrency"] = w.IntSlider(value=1, min=1, max=_MAX_CONCURRENCY, description="concurrency",
                                       style=style, layout=layout)
        c["request_rate"] = w.BoundedFloatText(value=100.0, min=0.1, max=1e6, description="request rate (/s)",
                                               style=style, layout=layout)
        protocols = ["inprocess"] + [p for p in ("http", "grpc") if p in self.server.endpoints]
        c["protocol"] = w.Dropdown(options=protocols, value="inprocess", description="protocol", style=style,
                                   layout=layout)
        c["measurement_interval_ms"] = w.BoundedIntText(value=1000, min=50, max=60_000,
                                                        description="measurement (ms)", style=style, layout=layout)
        c["max_trials"] = w.IntSlider(value=3, min=1, max=10, description="max windows", style=style, layout=layout)
        c["repeat_ratio"] = w.BoundedFloatText(value=self.repeat_ratio, min=0.0, max=0.99, step=0.05,
                                               description="repeated requests", style=style, layout=layout)
        c["sweep_delays"] = w.Text(value="0,100,500", description="sweep delays (µs)", style=style, layout=layout,
                                   disabled=not self.batching)
        c["sweep_instances"] = w.Text(value="1,2", description="sweep instances", style=style, layout=layout)
        c["sweep_cache"] = w.Checkbox(value=False, description="sweep cache off/on", style=style, layout=layout,
                                      disabled=not self.cache)
        c["input_tensor_format"] = w.Dropdown(options=["binary", "json"], value="binary", description="request tensors",
                                              style=style, layout=layout, tooltip="HTTP: binary or JSON tensors")
        c["output_tensor_format"] = w.Dropdown(options=["binary", "json"], value="binary",
                                               description="response tensors", style=style, layout=layout)
        c["compression"] = w.Dropdown(options=["none", "gzip", "deflate"], value="none", description="compression",
                                      style=style, layout=layout,
                                      tooltip="HTTP: the request bodies (Content-Encoding); gRPC: its messages")
        c["response_compression"] = w.Dropdown(options=["none", "gzip", "deflate"], value="none",
                                               description="compressed answers", style=style, layout=layout,
                                               tooltip="HTTP: Accept-Encoding (the client decompresses)")
        c["sweep_formats"] = w.Checkbox(value=False, description="sweep request tensors binary/json", style=style,
                                        layout=layout)
        c["sweep_compression"] = w.Checkbox(value=False, description="sweep compression none/gzip", style=style,
                                            layout=layout)
        self.controls = c

        self.buttons = {
            "apply": w.Button(description="Apply", button_style="primary", tooltip="change the serving model live"),
            "measure": w.Button(description="Measure", button_style="info", tooltip="measure at the current load"),
            "sweep": w.Button(description="Sweep", tooltip="measure every delay x instance count"),
            "save": w.Button(description="Save config", button_style="success",
                             tooltip=f"write {self.tuned_model}/config.pbtxt"),
        }
        self.buttons["apply"].on_click(self._guarded(self._on_apply))
        self.buttons["measure"].on_click(self._guarded(self._on_measure))
        self.buttons["sweep"].on_click(self._guarded(self._on_sweep))
        self.buttons["save"].on_click(self._guarded(self._on_save))

        self.progress = w.IntProgress(value=0, min=0, max=1, description="", layout=w.Layout(width="420px"))
        self.message = "ready"  # the status line, as plain text
        self.status = w.HTML(value=self._html(self.message))
        self.image = w.Image(format="png", layout=w.Layout(width="600px"))
        self.table = w.HTML(value="")
        self.batch_reasons = w.HTML(value="", layout=w.Layout(width="420px"))
        title = self.model if self.tuned_model == self.model else f"{self.model} (tuning {self.tuned_model})"
        knob_box = w.VBox([c["max_batch_size"], c["max_queue_delay_microseconds"], self.batch_reasons]
                          + [c[n] for n in ("preferred_batch_size", "instance_count", "response_cache")]
                          + [c[n] for n in c if n.startswith("parameters.")])
        load_box = w.VBox([c[n] for n in ("load", "concurrency", "request_rate", "protocol",
                                          "measurement_interval_ms", "max_trials", "repeat_ratio", "sweep_delays",
                                          "sweep_instances", "sweep_cache")])
        payload_box = w.VBox([c[n] for n in ("input_tensor_format", "output_tensor_format", "compression",
                                             "response_compression", "sweep_formats", "sweep_compression")])
        self.widget = w.VBox([
            w.HTML(value=f"<b>Tuning {html.escape(title)}</b>"),
            w.HBox([knob_box, load_box, payload_box]),
            w.HBox(list(self.buttons.values())),
            w.HBox([self.progress, self.status]),
            self.image,
            self.table,
        ])

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # ------------------------------------------------------------------ state for callers
    @property
    def points(self) -> pd.DataFrame:
        """One row per measured point: config label, knobs, protocol, load, throughput, p50, p99."""
        with self._lock:
            return pd.DataFrame(list(self._points), columns=_POINT_COLUMNS)

    @property
    def busy(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Join the background action, if any; True when none is running any more."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.busy

    # ------------------------------------------------------------------ status
    @staticmethod
    def _html(message: str, error: bool = False) -> str:
        color = "#b00020" if error else "inherit"
        return f'<span style="color:{color}">{html.escape(message)}</span>'

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
                self.progress.bar_style = "success"

        with self._lock:
            if self.busy:  # two clicks racing: the second is ignored
                self._say(f"busy: a {self._running} is running — {name} ignored (wait for it to finish)")
                return
            self._running = name
            self.progress.bar_style = "info"
            self._thread = threading.Thread(target=run, name=f"triton-nb-tuner-{name}", daemon=True)
            self._thread.start()

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
            raise InvalidArgumentError(f"repeated requests: {ratio} must be at least 0 and below 1")
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

        def work() -> None:
            knobs = {**self._live_knobs(), **wire}
            what = ", ".join(f"{k.removesuffix('_range')} {v[0]:g}" for k, v in load.items())
            self._say(f"measuring {self.model} at {what} over {protocol} ({config_label(knobs)}) …")
            self.progress.max, self.progress.value = 1, 0
            started = time.monotonic()
            frame = measure(self.server, self.model, protocol=protocol, input_data=self.input_data, **load, **timing,
                            **wire)
            point = self._add_point(frame.iloc[0].to_dict(), knobs, "measure")
            self.progress.value = 1
            self._say(f"measured {point['config']}: {point['throughput_infer_per_sec']:,.0f} infer/s, "
                      f"p50 {point['latency_p50_us'] / 1e3:.2f} ms, p99 {point['latency_p99_us'] / 1e3:.2f} ms "
                      f"({time.monotonic() - started:.1f} s)")

        self._start("measurement", work)

    def _on_sweep(self) -> None:
        if self._refuse_if_busy("Sweep"):
            return
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
        protocol = self.controls["protocol"].value
        wire = self._wire(protocol)
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
        concurrency = int(self.controls["concurrency"].value)
        timing = self._timing()
        timing.pop("warmup_ms")
        total = 1
        for values in grid.values():
            total *= len(values)

        def on_point(row: dict[str, Any]) -> None:
            # called while the config is applied; the payload's knobs come with the row
            self._add_point(row, {**self._live_knobs(), **self._client_of(row)}, "sweep")
            self.progress.value = min(self.progress.value + 1, self.progress.max)
            self._say(f"sweep: {self.progress.value}/{total} configs measured …")

        def work() -> None:
            self.progress.max, self.progress.value = total, 0
            self._say(f"sweep: {total} configs of {self.tuned_model} at concurrency {concurrency} …")
            result = tune(self.server, self.model, grid, concurrency_range=[concurrency],
                          tuned_model=self.tuned_model, protocol=protocol, input_data=self.input_data,
                          progress=False, on_point=on_point, wire=wire, **timing)
            self.result = result
            best = result.recommended
            outcome = f"best {config_label(best)} (Save config writes it)" if best else "no config met the constraints"
            self._say(f"sweep done: {len(result.measurements)} points; {outcome}")

        self._start("sweep", work)

    def config_path(self) -> Path:
        """Where Save config writes: ``<repository>/<tuned model>/config.pbtxt``."""
        return Path(self.server.repository) / self.tuned_model / "config.pbtxt"

    def _on_save(self) -> None:
        if self._refuse_if_busy("Save config"):
            return
        from triton_nb.repository.config import config_from_json, config_to_json, load_config, save_config

        path = self.config_path()
        if self.result is not None and self.result.recommended is not None:
            written = self.result.write_config(path)
            self._say(f"saved the sweep's best ({config_label(self.result.recommended)}) to {written}")
            return
        knobs = self._live_knobs()
        base = config_to_json(load_config(path)) if path.is_file() else self.server.model_config_json(self.tuned_model)
        config = config_with_knobs(base, knobs)
        written = save_config(config_from_json(config, source=f"{self.tuned_model} config"), path)
        self._say(f"saved {config_label(knobs)} to {written}")

    # ------------------------------------------------------------------ points, plot, table
    def _add_point(self, row: dict[str, Any], knobs: dict[str, Any], source: str) -> dict[str, Any]:
        point = {
            "config": config_label(knobs),
            "knobs": dict(knobs),
            "source": source,
            "protocol": row.get("protocol"),
            "concurrency": row.get("concurrency"),
            "request_rate": row.get("request_rate"),
            "throughput_infer_per_sec": float(row["throughput_infer_per_sec"]),
            "latency_p50_us": float(row["latency_p50_us"]),
            "latency_p99_us": float(row["latency_p99_us"]),
            "errors": row.get("errors", 0),
        }
        with self._lock:
            self._points.append(point)
        self._redraw()
        return point

    def _redraw(self) -> None:
        points = self.points
        with self._lock:
            figure = self.figure
            figure.clear()
            ax = figure.subplots()
            if not points.empty:
                # the report's chart (latency across, throughput up), the config measured last in full colour
                plot_throughput_vs_latency(points, latency="latency_p99_us", spread_from="latency_p50_us",
                                           highlight=points["config"].iloc[-1], ax=ax)
                ax.legend(fontsize=7, loc="best")
            else:
                ax.set_xlabel("p99 latency (ms)")
                ax.set_ylabel("throughput (infer/s)")
                ax.text(0.5, 0.5, "click Measure or Sweep", ha="center", va="center", transform=ax.transAxes,
                        color="gray")
            ax.set_title(f"{self.model}: p99 (marker) and p50..p99 (bar) per config", fontsize=9)
            figure.tight_layout()
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=80)
        self.image.value = buffer.getvalue()
        self.table.value = self._table_html(points)
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
        self.batch_reasons.value = (f'<span style="font-size:85%;color:#555" title="{html.escape(_REASONS_TIP)}">'
                                    f"{html.escape(text)}</span>")

    @staticmethod
    def _table_html(points: pd.DataFrame) -> str:
        if points.empty:
            return ""
        shown = points[["config", "source", "protocol", "concurrency", "request_rate"]].copy()
        shown["infer/s"] = points["throughput_infer_per_sec"].round(1)
        shown["p50 ms"] = (points["latency_p50_us"] / 1e3).round(3)
        shown["p99 ms"] = (points["latency_p99_us"] / 1e3).round(3)
        shown["errors"] = points["errors"]
        return shown.to_html(index=False, na_rep="", border=0)
