"""The tuning panel's widgets and their layout (see :mod:`triton_nb.notebook.widgets`).

The knobs are grouped in tabs whose grid cells wrap to the output area's width, every widget sized
relative to its container: nothing runs past the output area's edge on a laptop's notebook (1280 or
1024 px wide), and labels have the room their text takes.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import ipywidgets as w

from triton_nb.perf.options import COMPRESSIONS

__all__ = ["FIL_OPTIONS", "PanelLayout"]

#: FIL engine parameters offered as dropdowns (Triton FIL's allowed values).
FIL_OPTIONS: dict[str, tuple[str, ...]] = {
    "storage_type": ("AUTO", "DENSE", "SPARSE", "SPARSE8"),
    "algo": ("ALGO_AUTO", "NAIVE", "TREE_REORG", "BATCH_TREE_REORG"),
    "layout": ("depth_first", "breadth_first", "layered"),
}
_MAX_INSTANCES = 8
_MAX_CONCURRENCY = 64
#: The request data the Payload tab offers: (shown, input_data).
_DATA_CHOICES = {"fraud": "generated card transactions", "random": "random tensors", "zero": "zeros",
                 "given": "the data given"}
# Widths: a knob takes a grid cell of at least _CELL_PX (its description _LABEL_PX of it); the tabs
# wrap the cells to the output area's width, so nothing runs past its edge at 1024 px.
_CELL_PX = 320
# At most the container's width less the 2 px margins every widget has (a width of 100% plus its
# margins would run past the output area's edge)
_FIT = "calc(100% - 4px)"
_LABEL_PX = "140px"


def _export_default(repository: Path) -> str:
    """``<repository>-tuned``: a relative folder is taken beside the served repository (see
    :meth:`Tuner._on_export`), so the default names no path of the machine."""
    return f"{repository.name}-tuned"


def _grid(layout_cells: list[w.Widget]) -> w.GridBox:
    return w.GridBox(layout_cells, layout=w.Layout(
        grid_template_columns=f"repeat(auto-fill, minmax(min({_CELL_PX}px, 100%), 1fr))", grid_gap="2px 16px",
        width="auto", padding="4px 0"))



class PanelLayout:
    """Builds the panel's widgets for :class:`~triton_nb.notebook.widgets.Tuner` (its state and
    handlers are the Tuner's)."""

    server: Any
    model: str
    tuned_model: str
    batching: bool
    limit: int
    fil: bool
    cache: bool
    repeat_ratio: float
    _accepted_data: str
    _initial_data: str
    _given: Any

    def _build(self, knobs: dict[str, Any]) -> None:
        style = {"description_width": _LABEL_PX}
        cell = w.Layout(width="auto", min_width="0")

        def layout() -> w.Layout:
            return w.Layout(width="auto", min_width="0")

        c: dict[str, w.Widget] = {}
        c["max_batch_size"] = w.IntSlider(
            value=max(1, knobs.get("max_batch_size", 1)), min=1, max=max(1, self.limit), readout=True,
            continuous_update=False, description="max batch size", style=style, layout=layout(),
            disabled=not self.batching)
        c["max_queue_delay_microseconds"] = w.BoundedIntText(
            value=knobs.get("max_queue_delay_microseconds", 0), min=0, max=10_000_000,
            description="queue delay (µs)", style=style, layout=layout(), disabled=not self.batching)
        c["preferred_batch_size"] = w.Text(
            value=",".join(map(str, knobs.get("preferred_batch_size", ()))), placeholder="e.g. 8,16",
            description="preferred sizes", style=style, layout=layout(), disabled=not self.batching)
        c["instance_count"] = w.IntSlider(
            value=min(max(1, knobs["instance_count"]), _MAX_INSTANCES), min=1, max=_MAX_INSTANCES, readout=True,
            continuous_update=False, description="instances", style=style, layout=layout())
        c["response_cache"] = w.Checkbox(
            value=bool(knobs.get("response_cache", False)), description="response cache", indent=False,
            layout=layout(), disabled=not self.cache,
            tooltip="response_cache { enable } of the tuned model" if self.cache
            else "the server has no response cache (start it with cache_size_bytes=N)")
        if self.fil:
            for key, options in FIL_OPTIONS.items():
                value = knobs[f"parameters.{key}"]
                c[f"parameters.{key}"] = w.Dropdown(options=list(options), value=value if value in options
                                                    else options[0], description=f"FIL {key}", style=style,
                                                    layout=layout())
        c["load"] = w.Dropdown(options=["concurrency", "request rate"], value="concurrency", description="load by",
                               style=style, layout=layout())
        c["concurrency"] = w.IntSlider(value=1, min=1, max=_MAX_CONCURRENCY, readout=True, continuous_update=False,
                                       description="concurrency", style=style, layout=layout())
        c["request_rate"] = w.BoundedFloatText(value=100.0, min=0.1, max=1e6, description="request rate (/s)",
                                               style=style, layout=layout())
        protocols = ["inprocess"] + [p for p in ("http", "grpc") if p in self.server.endpoints]
        c["protocol"] = w.Dropdown(options=protocols, value="inprocess", description="protocol", style=style,
                                   layout=layout())
        c["measurement_interval_ms"] = w.BoundedIntText(value=1000, min=50, max=60_000,
                                                        description="window (ms)", style=style, layout=layout(),
                                                        tooltip="the length of one measurement window")
        c["max_trials"] = w.IntSlider(value=3, min=1, max=10, readout=True, continuous_update=False,
                                      description="max windows", style=style, layout=layout())
        c["repeat_ratio"] = w.BoundedFloatText(value=self.repeat_ratio, min=0.0, max=0.99, step=0.05,
                                               description="repeated share", style=style, layout=layout(),
                                               tooltip="the share of requests that repeat an earlier one "
                                               "(for the response cache)")
        data_options = [(_DATA_CHOICES[key], key) for key in ("fraud", "random", "zero")
                        if key != "fraud" or self._accepted_data == "fraud" or self._initial_data == "fraud"]
        if self._given is not None:
            data_options.insert(0, (_DATA_CHOICES["given"], "given"))
        c["input_data"] = w.Dropdown(options=data_options, value=self._initial_data, description="request data",
                                     style=style, layout=layout())
        c["input_tensor_format"] = w.Dropdown(options=["binary", "json"], value="binary", description="request tensors",
                                              style=style, layout=layout(), tooltip="HTTP: binary or JSON tensors")
        c["output_tensor_format"] = w.Dropdown(options=["binary", "json"], value="binary",
                                               description="response tensors", style=style, layout=layout())
        c["compression"] = w.Dropdown(options=list(COMPRESSIONS), value="none", description="compression",
                                      style=style, layout=layout(),
                                      tooltip="HTTP: the request bodies (Content-Encoding); gRPC: its messages")
        c["response_compression"] = w.Dropdown(options=list(COMPRESSIONS), value="none",
                                               description="answers zipped", style=style, layout=layout(),
                                               tooltip="HTTP: Accept-Encoding (the client decompresses)")
        c["sweep_delays"] = w.Text(value="0,100,500", description="delays (µs)", style=style, layout=layout(),
                                   disabled=not self.batching, tooltip="the queue delays a sweep tries")
        c["sweep_instances"] = w.Text(value="1,2", description="instances", style=style, layout=layout(),
                                      tooltip="the instance counts a sweep tries")
        c["sweep_cache"] = w.Checkbox(value=False, description="response cache off and on", indent=False,
                                      layout=layout(), disabled=not self.cache)
        c["sweep_formats"] = w.Checkbox(value=False, description="request tensors binary and json", indent=False,
                                        layout=layout())
        c["sweep_compression"] = w.Checkbox(value=False, description="compression none and gzip", indent=False,
                                            layout=layout())
        c["replay_url"] = w.Text(value="", placeholder="host:port, or start", description="Triton URL",
                                 style=style, layout=layout(),
                                 tooltip="a running tritonserver (explicit model control), or 'start': start the "
                                         "nvidia-pytriton wheel's tritonserver over this repository's Python twin")
        c["replay_top"] = w.IntSlider(value=3, min=1, max=10, readout=True, description="top configs", style=style,
                                      layout=layout())
        c["replay_rounds"] = w.IntSlider(value=2, min=1, max=5, readout=True, description="rounds", style=style,
                                         layout=layout())
        c["export_folder"] = w.Text(value=_export_default(Path(self.server.repository)),
                                    description="export to", style={"description_width": "initial"},
                                    tooltip="a folder beside the served repository (a name), or an absolute path",
                                    layout=w.Layout(width="320px", max_width=_FIT))
        self.controls = c

        self.buttons = {
            "apply": w.Button(description="Apply", button_style="primary", tooltip="change the serving model live"),
            "measure": w.Button(description="Measure", button_style="info", tooltip="measure at the current load"),
            "sweep": w.Button(description="Sweep", button_style="warning",
                              tooltip="measure every config of the Sweep tab"),
            "save": w.Button(description="Save config", button_style="success",
                             tooltip=f"write {self.tuned_model}/config.pbtxt (the sweep's best, else the knobs "
                             f"in force)"),
            "export": w.Button(description="Export", tooltip="copy the repository to the folder given, with the "
                               "config Save config writes"),
            "replay": w.Button(description="Replay on Triton", tooltip="measure the latest sweep's best configs "
                               "again on the tritonserver at the URL"),
        }
        for name, handler in (("apply", self._on_apply), ("measure", self._on_measure), ("sweep", self._on_sweep),
                              ("save", self._on_save), ("export", self._on_export), ("replay", self._on_replay)):
            button = self.buttons[name]
            button.layout = w.Layout(width="auto", min_width="96px")
            button.on_click(self._guarded(handler))

        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="200px", max_width=_FIT))
        self.message = "ready"  # the status line, as plain text
        self.status = w.HTML(value=self._html(self.message), layout=w.Layout(flex="1 1 260px", min_width="0"))
        self.image = w.Image(format="png", layout=w.Layout(max_width=_FIT, height="auto"))
        self.stages_image = w.Image(format="png", layout=w.Layout(max_width=_FIT, height="auto"))
        self.in_view = w.Dropdown(options=[("latest point", 0)], value=0, description="stages of",
                                  style={"description_width": "initial"},
                                  layout=w.Layout(width="auto", max_width="380px"))
        self.in_view.observe(self._on_view, names="value")
        self.table = w.HTML(value="")
        self.replay_view = w.HTML(value="")
        self.batch_reasons = w.HTML(value="", layout=w.Layout(width="auto", min_width="0"))

        batching = [c["max_batch_size"], w.VBox([c["max_queue_delay_microseconds"], self.batch_reasons], layout=cell),
                    c["preferred_batch_size"], c["instance_count"], c["response_cache"],
                    *(c[n] for n in c if n.startswith("parameters."))]
        load = [c[n] for n in ("load", "concurrency", "request_rate", "protocol", "measurement_interval_ms",
                               "max_trials", "repeat_ratio")]
        payload = [c[n] for n in ("input_data", "input_tensor_format", "output_tensor_format", "compression",
                                  "response_compression")]
        note = w.HTML(value='<span style="font-size:85%;color:#555">each config at the Load tab\'s concurrency; '
                            'the original config comes back at the end</span>', layout=w.Layout(min_width="0"))
        sweep = [c["sweep_delays"], c["sweep_instances"], c["sweep_cache"], c["sweep_formats"],
                 c["sweep_compression"], note]
        replay_note = w.HTML(value='<span style="font-size:85%;color:#555">a tritonserver started with '
                                   '--model-control-mode=explicit on this repository; replays the latest sweep</span>',
                             layout=w.Layout(min_width="0"))
        replay_tab = [c["replay_url"], c["replay_top"], c["replay_rounds"],
                      w.HBox([self.buttons["replay"]], layout=w.Layout(min_width="0")), replay_note]
        self.tabs = w.Tab(children=[_grid(batching), _grid(load), _grid(payload), _grid(sweep), _grid(replay_tab)],
                          layout=w.Layout(width="auto"))
        for index, title in enumerate(("Batching", "Load", "Payload", "Sweep", "Replay")):
            self.tabs.set_title(index, title)

        title = self.model if self.tuned_model == self.model else f"{self.model} — knobs of {self.tuned_model}"
        wrap = w.Layout(display="flex", flex_flow="row wrap", align_items="center", width="auto", grid_gap="4px")
        self.widget = w.VBox([
            w.HTML(value=f"<b>Tuning {html.escape(title)}</b>"),
            self.tabs,
            w.Box([*(self.buttons[n] for n in ("apply", "measure", "sweep", "save", "export")), c["export_folder"]],
                  layout=wrap),
            w.Box([self.progress, self.status], layout=wrap),
            w.Box([w.Box([self.image], layout=w.Layout(flex="1 1 480px", min_width="0", max_width=_FIT)),
                   w.VBox([self.in_view, self.stages_image], layout=w.Layout(flex="1 1 300px", min_width="0",
                                                                             max_width=_FIT))],
                  layout=w.Layout(display="flex", flex_flow="row wrap", width="auto", align_items="flex-start")),
            w.Box([self.table], layout=w.Layout(width="auto", overflow="auto")),
            w.Box([self.replay_view], layout=w.Layout(width="auto", overflow="auto")),
        ], layout=w.Layout(width="auto"))
        self.widget.add_class("triton-nb-tuner")

