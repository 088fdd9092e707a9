"""The tuning panel (``triton_nb.notebook.widgets.Tuner``), driven without a browser: controls set,
buttons clicked."""

from __future__ import annotations

import html
import re
import sys
import threading

import ipywidgets
import numpy as np
import pytest

from tests.helpers.scale_models import write_scale_model
from triton_nb import serve
from triton_nb.notebook import widgets as widgets_module
from triton_nb.notebook.widgets import Tuner
from triton_nb.repository.config import load_config

FAST = {"measurement_interval_ms": 150, "max_trials": 3}


@pytest.fixture
def server(tmp_path):
    write_scale_model(tmp_path, max_batch_size=8)
    server = serve(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def calls(monkeypatch):
    """Every call of ``measure`` from the panel, with the thread it ran on."""
    seen: list[threading.Thread] = []
    real = widgets_module.measure

    def recording(*args, **kwargs):
        seen.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(widgets_module, "measure", recording)
    return seen


def make_tuner(server, **options) -> Tuner:
    tuner = server.tune("scale", **options)
    for name, value in FAST.items():
        tuner.controls[name].value = value
    return tuner


def markers(tuner: Tuner) -> int:
    if not tuner.figure.axes:  # the empty state: a message, no axes
        return 0
    ax = tuner.figure.axes[0]
    return sum(len(line.get_xdata()) for line in ax.lines if line.get_marker() not in (None, "None", ""))


def status(tuner: Tuner) -> str:
    assert html.escape(tuner.message) in tuner.status.value  # the widget shows the same line
    return tuner.message


def test_the_panel_shows_the_models_knobs_and_displays_itself(server):
    tuner = make_tuner(server)
    assert isinstance(tuner, Tuner) and tuner.tuned_model == "scale"
    c = tuner.controls
    assert c["max_batch_size"].value == 8 and c["max_batch_size"].max == 8
    assert c["max_queue_delay_microseconds"].value == 2000
    assert c["instance_count"].value == 1 and c["instance_count"].max == 8
    assert list(c["protocol"].options) == ["inprocess"]  # no network endpoints on this server
    assert not any(name.startswith("parameters.") for name in c)  # not a FIL model
    assert set(tuner.buttons) == {"apply", "measure", "sweep", "save", "export", "replay"}
    assert "triton-nb-tuner" in tuner.widget._dom_classes  # the browser test finds the panel by it
    assert [tuner.tabs.get_title(i) for i in range(5)] == ["Batching", "Load", "Payload", "Sweep", "Replay"]
    bundle = tuner._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert tuner.points.empty and markers(tuner) == 0


def test_the_empty_plot_says_what_to_do(server):
    tuner = make_tuner(server)
    assert tuner.figure.axes == []  # no empty 0..1 frame
    text = " ".join(t.get_text() for t in tuner.figure.texts)
    assert "Press Measure" in text and "Sweep" in text
    assert bytes(tuner.image.value).startswith(b"\x89PNG") and tuner.table.value == ""


def _widgets(root):
    yield root
    for child in getattr(root, "children", ()):
        yield from _widgets(child)


def test_every_slider_shows_its_value_and_nothing_has_a_fixed_wide_width(server):
    tuner = make_tuner(server)
    sliders = [c for c in tuner.controls.values() if isinstance(c, ipywidgets.IntSlider)]
    assert {"max_batch_size", "instance_count", "concurrency", "max_trials"} <= {
        name for name, c in tuner.controls.items() if c in sliders}
    assert all(s.readout for s in sliders)
    for widget in _widgets(tuner.widget):  # the panel follows the output area's width: no wide fixed sizes
        width = getattr(getattr(widget, "layout", None), "width", None) or ""
        assert not (width.endswith("px") and int(width[:-2]) > 400), (widget, width)


def test_apply_changes_the_serving_model_live(server):
    tuner = make_tuner(server)
    tuner.controls["max_queue_delay_microseconds"].value = 150
    tuner.controls["preferred_batch_size"].value = "2, 4"
    tuner.controls["instance_count"].value = 2
    tuner.buttons["apply"].click()
    assert tuner.wait(10)
    config = server.model_config("scale")
    assert config.dynamic_batching.max_queue_delay_microseconds == 150
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    assert config.instance_group[0].count == 2
    assert "applied" in status(tuner) and "error" not in status(tuner)
    x = np.ones((1, 2), np.float32)
    assert server.client().infer("scale", {"X": x}).as_numpy("Y").tolist() == [[2.0, 2.0]]  # still serving


def test_measure_runs_in_a_thread_and_overlays_configs(server, calls, monkeypatch):
    tuner = make_tuner(server)
    entered, release = threading.Event(), threading.Event()
    recording = widgets_module.measure

    def held(*args, **kwargs):
        entered.set()
        assert release.wait(30), "the click did not return while the measurement was running"
        return recording(*args, **kwargs)

    monkeypatch.setattr(widgets_module, "measure", held)
    tuner.buttons["measure"].click()
    # the click has returned while the measurement is held: it runs in the background, the kernel is not blocked
    assert entered.wait(30)
    assert tuner.busy
    release.set()
    assert tuner.wait(20)
    assert len(calls) == 1 and calls[0] is not threading.main_thread()
    points = tuner.points
    assert len(points) == 1 and points["throughput_infer_per_sec"].iloc[0] > 0
    assert points["protocol"].iloc[0] == "inprocess" and points["concurrency"].iloc[0] == 1
    assert points["knobs"].iloc[0]["max_queue_delay_microseconds"] == 2000
    assert markers(tuner) == 1
    assert "measured" in status(tuner)

    tuner.controls["max_queue_delay_microseconds"].value = 0
    tuner.controls["concurrency"].value = 2
    tuner.buttons["apply"].click()
    tuner.buttons["measure"].click()
    assert tuner.wait(20)
    points = tuner.points
    assert len(points) == 2 and points["config"].nunique() == 2  # two configs, both on the plot
    assert list(points["concurrency"]) == [1, 2]
    assert markers(tuner) == 2
    assert len(tuner.figure.axes[0].get_legend().get_texts()) == 2
    assert "<table" in tuner.table.value


def test_request_rate_load(server):
    tuner = make_tuner(server)
    tuner.controls["load"].value = "request rate"
    tuner.controls["request_rate"].value = 200.0
    tuner.buttons["measure"].click()
    assert tuner.wait(20)
    assert tuner.points["request_rate"].iloc[0] == 200.0, status(tuner)


def test_a_second_click_while_running_is_ignored(server, calls):
    tuner = make_tuner(server)
    tuner.buttons["measure"].click()
    tuner.buttons["measure"].click()
    assert "busy" in status(tuner) and "ignored" in status(tuner)
    tuner.buttons["sweep"].click()
    tuner.buttons["apply"].click()
    assert "ignored" in status(tuner)
    assert tuner.wait(20)
    assert len(calls) == 1 and len(tuner.points) == 1


def test_sweep_adds_points_as_they_come_and_restores(server):
    tuner = make_tuner(server)
    tuner.controls["sweep_delays"].value = "0,500"
    tuner.controls["sweep_instances"].value = "1,2"
    tuner.buttons["sweep"].click()
    assert tuner.busy
    assert tuner.wait(30)
    points = tuner.points
    assert len(points) == 4, status(tuner)
    assert set(points["source"]) == {"sweep"} and points["config"].nunique() == 4
    assert markers(tuner) == 4
    assert tuner.progress.value == 4 and "sweep done" in status(tuner)
    config = server.model_config("scale")  # the original config is back
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000 and config.instance_group[0].count == 1

    tuner.buttons["save"].click()  # the sweep's best
    best = tuner.result.recommended
    written = load_config(server.repository / "scale" / "config.pbtxt")
    assert written.dynamic_batching.max_queue_delay_microseconds == best["max_queue_delay_microseconds"]
    assert written.instance_group[0].count == best["instance_count"]
    assert str(server.repository / "scale" / "config.pbtxt") in status(tuner)


def test_save_config_writes_the_knobs_in_force(server):
    tuner = make_tuner(server)
    tuner.controls["max_queue_delay_microseconds"].value = 300
    tuner.controls["preferred_batch_size"].value = "4,8"
    tuner.controls["instance_count"].value = 3
    tuner.buttons["apply"].click()
    tuner.buttons["save"].click()
    path = server.repository / "scale" / "config.pbtxt"
    assert str(path) in status(tuner)
    written = load_config(path)
    assert written.dynamic_batching.max_queue_delay_microseconds == 300
    assert list(written.dynamic_batching.preferred_batch_size) == [4, 8]
    assert written.instance_group[0].count == 3
    assert written.parameters["factor"].string_value == "2.0"  # the rest of the file is kept


@pytest.mark.parametrize(("control", "value", "message"), [
    ("preferred_batch_size", "a,b", r"preferred sizes: 'a' is not a whole number"),
    ("preferred_batch_size", "16", r"preferred sizes \[16\] exceed the max batch size 8"),
    ("sweep_instances", "0", r"sweep instances: 0 must be >= 1"),
])
def test_bad_values_show_one_line_and_raise_nothing(server, control, value, message):
    tuner = make_tuner(server)
    tuner.controls[control].value = value
    tuner.buttons["sweep" if control.startswith("sweep") else "apply"].click()
    assert tuner.wait(5)
    assert re.search(message, status(tuner)) and "error" in status(tuner)
    assert "\n" not in status(tuner)
    assert server.model_config("scale").dynamic_batching.max_queue_delay_microseconds == 2000  # unchanged


def test_max_batch_size_cannot_go_over_the_models_limit(server):
    tuner = make_tuner(server)
    tuner.controls["max_batch_size"].value = 64  # the slider stops at the limit
    assert tuner.controls["max_batch_size"].value == 8
    tuner.controls["max_batch_size"].value = 4
    tuner.controls["preferred_batch_size"].value = "8"
    tuner.buttons["apply"].click()
    assert "exceed the max batch size 4" in status(tuner)
    tuner.controls["preferred_batch_size"].value = "4"
    tuner.buttons["apply"].click()
    assert server.model_config("scale").max_batch_size == 4


def test_errors_in_the_thread_reach_the_status(server, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the load generator fell over\nsecond line")

    monkeypatch.setattr(widgets_module, "measure", broken)
    tuner = make_tuner(server)
    tuner.buttons["measure"].click()
    assert tuner.wait(5)
    assert "error: the load generator fell over" in status(tuner) and "second line" not in status(tuner)
    assert tuner.points.empty


def test_an_ensemble_tunes_its_last_step(tmp_path):
    write_scale_model(tmp_path, name="first")
    write_scale_model(tmp_path, name="second")
    (tmp_path / "pipe" / "1").mkdir(parents=True)
    (tmp_path / "pipe" / "config.pbtxt").write_text("""
name: "pipe"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "first" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "mid" } },
  { model_name: "second" model_version: -1 input_map { key: "X" value: "mid" } output_map { key: "Y" value: "Y" } }
] }
""")
    with serve(tmp_path, http_port=0) as server:
        tuner = Tuner(server, "pipe")
        assert tuner.tuned_model == "second"
        assert list(tuner.controls["protocol"].options) == ["inprocess", "http"]
        assert Tuner(server, "pipe", tuned_model="first").tuned_model == "first"
        tuner.controls["max_queue_delay_microseconds"].value = 50
        tuner.buttons["apply"].click()
        assert server.model_config("second").dynamic_batching.max_queue_delay_microseconds == 50
        assert server.model_config("first").dynamic_batching.max_queue_delay_microseconds == 2000
        for name, value in FAST.items():
            tuner.controls[name].value = value
        tuner.controls["protocol"].value = "http"
        tuner.buttons["measure"].click()
        assert tuner.wait(30)
        assert tuner.points["protocol"].iloc[0] == "http", status(tuner)


def test_fil_engine_options_reload_the_model(tmp_path, monkeypatch):
    import xgboost as xgb

    from triton_nb.repository.export import export_tree_model

    monkeypatch.setenv("TRITON_NB_FIL_COMPILE", "0")  # no background compiler in this test
    rng = np.random.default_rng(0)
    X = rng.random((200, 4), dtype=np.float32)
    model = xgb.XGBClassifier(n_estimators=5, max_depth=3, n_jobs=1).fit(X, (X[:, 0] > 0.5).astype(int))
    export_tree_model(model, tmp_path, name="trees")
    with serve(tmp_path) as server:
        tuner = Tuner(server, "trees")
        assert tuner.controls["parameters.storage_type"].value == "AUTO"
        assert "DENSE" in tuner.controls["parameters.storage_type"].options
        tuner.controls["parameters.storage_type"].value = "DENSE"
        tuner.controls["instance_count"].value = 2
        tuner.buttons["apply"].click()  # a reload: in the background
        assert tuner.wait(30)
        config = server.model_config("trees")
        assert config.parameters["storage_type"].string_value == "DENSE", status(tuner)
        assert config.instance_group[0].count == 2
        assert "storage_type=DENSE" in status(tuner)
        tuner.buttons["save"].click()
        assert load_config(tmp_path / "trees").parameters["storage_type"].string_value == "DENSE"


def test_the_payload_is_a_knob_of_measure_and_sweep(tmp_path):
    write_scale_model(tmp_path, max_batch_size=8)
    with serve(tmp_path, http_port=0, grpc_port=0) as server:
        tuner = make_tuner(server)
        tuner.controls["protocol"].value = "http"
        tuner.controls["input_tensor_format"].value = "json"
        tuner.controls["compression"].value = "gzip"
        tuner.buttons["measure"].click()
        assert tuner.wait(30)
        point = tuner.points.iloc[-1]
        assert "in=json" in point["config"] and "req_zip=gzip" in point["config"], status(tuner)
        assert point["knobs"]["request_compression"] == "gzip"

        tuner.controls["input_tensor_format"].value = "binary"
        tuner.controls["compression"].value = "none"
        tuner.controls["sweep_delays"].value = "0,500"
        tuner.controls["sweep_instances"].value = "1"
        tuner.controls["sweep_formats"].value = True
        tuner.buttons["sweep"].click()
        assert tuner.wait(60)
        swept = tuner.points[tuner.points["source"] == "sweep"]
        assert len(swept) == 4 and swept["config"].nunique() == 4, status(tuner)
        assert swept["config"].str.contains("in=json").sum() == 2  # format x delay, labelled on the plot
        legend = [text.get_text() for text in tuner.figure.axes[0].get_legend().get_texts()]
        assert sum("in=json" in label for label in legend) >= 2
        assert set(tuner.result.recommended) >= {"input_tensor_format", "max_queue_delay_microseconds"}
        config = server.model_config("scale")  # the server's config came back; the payload never touched it
        assert config.dynamic_batching.max_queue_delay_microseconds == 2000

        tuner.controls["protocol"].value = "grpc"
        tuner.controls["compression"].value = "gzip"
        tuner.buttons["measure"].click()
        assert tuner.wait(30)
        assert "grpc_zip=gzip" in tuner.points["config"].iloc[-1], status(tuner)

        tuner.controls["protocol"].value = "inprocess"
        tuner.buttons["sweep"].click()  # the payload swept in-process: one line, nothing raised
        assert "in-process calls have no wire format" in status(tuner)


def readout(tuner: Tuner) -> str:
    """The batch-reasons line as text."""
    return html.unescape(re.sub(r"<[^>]+>", "", tuner.batch_reasons.value))


def test_why_batches_left_shows_under_the_queue_delay_knob(server):
    stats = server.stats.model("scale", 1)  # counts as the batcher would have made them
    for reason, rows, batches in (("max_queue_delay", 4, 6), ("max_batch_size", 8, 3), ("instance_free", 2, 1)):
        for _ in range(batches):
            stats.count_batch(reason, rows)
    tuner = make_tuner(server)
    batching_tab = tuner.tabs.children[0]
    delay_cell = next(cell for cell in batching_tab.children if tuner.batch_reasons in getattr(cell, "children", ()))
    assert list(delay_cell.children) == [tuner.controls["max_queue_delay_microseconds"], tuner.batch_reasons]
    assert readout(tuner) == "batches since load: 60% delay, 30% full, 10% free instance; mean 5.0 rows (10)"

    tuner.controls["max_queue_delay_microseconds"].value = 0
    tuner.buttons["apply"].click()
    assert readout(tuner) == "batches since Apply: none yet"  # the new knobs' batches only
    tuner.buttons["measure"].click()  # one request at a time, no delay: each leaves as the instance takes it
    assert tuner.wait(20), status(tuner)
    text = readout(tuner)
    assert re.fullmatch(r"batches since Apply: 100% free instance; mean 1\.0 rows \([\d,]+\)", text), text


def table_rows(tuner: Tuner) -> list[list[str]]:
    """The ranking table's rows as cell texts."""
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", tuner.table.value)[1:]  # after the header
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in rows]


def test_a_sweep_shows_each_point_while_it_runs_and_ranks_them(server, monkeypatch):
    tune_module = sys.modules["triton_nb.perf.tune"]  # the module (triton_nb.perf.tune is the function)
    real = tune_module.measure
    second, release = threading.Event(), threading.Event()
    calls = []

    def held(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first config's point is out: hold the second config's run
            second.set()
            assert release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(tune_module, "measure", held)
    tuner = make_tuner(server)
    empty = tuner.image.value
    tuner.controls["sweep_delays"].value = "0,500"
    tuner.controls["sweep_instances"].value = "1,2"
    tuner.buttons["sweep"].click()
    assert second.wait(30)  # the first config measured and shown (on_point runs before the next config)
    assert tuner.busy, "the sweep ended before the check: it should be held"
    assert len(tuner.points) == 1 and markers(tuner) == 1, status(tuner)
    assert bytes(tuner.image.value) != bytes(empty) and len(table_rows(tuner)) == 1
    assert status(tuner).startswith("sweep: 1 of 4 configs measured")
    release.set()
    assert tuner.wait(60)
    rows = table_rows(tuner)
    throughputs = [float(row[4].replace(",", "")) for row in rows]
    assert [row[0] for row in rows] == ["1", "2", "3", "4"] and throughputs == sorted(throughputs, reverse=True)
    best = tuner.result.recommended
    starred = [row for row in rows if "★ recommended" in row[2]]
    assert len(starred) == 1 and starred[0][0] == "1", rows
    assert f"delay {best['max_queue_delay_microseconds']}µs ×{best['instance_count']}" in starred[0][2]
    assert "sweep done" in status(tuner) and f"recommended #{starred[0][1]}" in status(tuner)


def test_the_ranking_puts_failed_points_last(server):
    import pandas as pd

    from triton_nb.notebook import _tuner_view as view

    points = pd.DataFrame({"point": [1, 2, 3, 4], "throughput_infer_per_sec": [50.0, 900.0, 0.0, 400.0],
                           "errors": [0, 3, 12, 0]})
    ranked = view.ranked(points)
    assert list(ranked["point"]) == [4, 1, 2, 3] and list(ranked["rank"]) == [1, 2, 0, 0]


def test_short_labels_name_what_differs():
    from triton_nb.notebook._tuner_view import short_labels

    base = {"max_batch_size": 4096, "max_queue_delay_microseconds": 100, "preferred_batch_size": (),
            "instance_count": 1, "parameters.storage_type": "AUTO"}
    labels = short_labels([base, {**base, "instance_count": 2}, {**base, "max_queue_delay_microseconds": 0,
                                                                   "input_tensor_format": "json"}])
    assert labels == ["delay 100µs ×1", "delay 100µs ×2", "delay 0µs ×1 in=json"]
    assert short_labels([base]) == ["delay 100µs ×1"]  # one config: what one tunes first


def test_failing_requests_are_reported_loudly_with_the_first_error(server):
    import pandas as pd

    nan = float("nan")
    tuner = make_tuner(server, input_data=pd.DataFrame({"X": [[nan, nan]] * 32}))
    assert tuner.controls["input_data"].value == "given"
    tuner.buttons["measure"].click()
    assert tuner.wait(30)
    message = status(tuner)
    assert "requests FAILED" in message and "first error:" in message and "X has NaN" in message, message
    assert "#b00020" in tuner.status.value and tuner.progress.bar_style == "danger"
    point = tuner.points.iloc[0]
    assert point["errors"] > 0 and "X has NaN" in point["first_error"]
    assert table_rows(tuner)[0][0] == "–"  # unranked


def test_an_ensemble_of_the_fraud_example_gets_transactions_by_default(trained, tmp_path, monkeypatch):
    from triton_nb.repository import export_fraud_repository

    monkeypatch.setenv("TRITON_NB_FIL_COMPILE", "0")
    root = export_fraud_repository(trained, tmp_path / "repo")
    with serve(root) as server:
        tuner = server.tune("ensemble", tuned_model="fil")  # README's call
        assert tuner.input_data == "fraud" and tuner.controls["input_data"].value == "fraud"
        for name, value in FAST.items():
            tuner.controls[name].value = value
        tuner.buttons["measure"].click()
        assert tuner.wait(60)
        point = tuner.points.iloc[-1]
        assert point["errors"] == 0 and point["throughput_infer_per_sec"] > 0, status(tuner)
        assert list(point["stages"]) == ["preprocessing", "fil"]  # the composing models' stages
        assert point["stages"]["fil"]["compute_infer"] > 0
        assert "measured #1" in status(tuner)

        tuner.controls["input_data"].value = "random"  # what the panel sent before: the ensemble refuses it
        tuner.buttons["measure"].click()
        assert tuner.wait(60)
        assert "requests FAILED" in status(tuner) and "first error:" in status(tuner), status(tuner)
        assert "Amount" in tuner.points.iloc[-1]["first_error"]


def test_default_input_data_follows_the_models_inputs():
    from triton_nb.fraud import RAW_INPUT_COLUMNS

    fraud_inputs = {"input": [{"name": name} for name in RAW_INPUT_COLUMNS]}
    assert widgets_module.default_input_data(fraud_inputs) == "fraud"
    assert widgets_module.default_input_data({"input": [{"name": "X"}]}) == "random"
    assert widgets_module.default_input_data({"input": [{"name": "Amount"}, {"name": "X"}]}) == "random"


def test_export_writes_the_repository_with_the_chosen_config(server, tmp_path_factory):
    tuner = make_tuner(server)
    tuner.controls["max_queue_delay_microseconds"].value = 700
    tuner.buttons["apply"].click()
    target = tmp_path_factory.mktemp("export") / "exported"
    tuner.controls["export_folder"].value = str(target)
    tuner.buttons["export"].click()
    assert tuner.wait(30)
    assert str(target) in status(tuner) and "error" not in status(tuner)
    written = load_config(target / "scale" / "config.pbtxt")
    assert written.dynamic_batching.max_queue_delay_microseconds == 700
    assert (target / "scale" / "1" / "model.py").is_file()
    assert load_config(server.repository / "scale").dynamic_batching.max_queue_delay_microseconds == 2000
    tuner.buttons["export"].click()  # the folder is there now: refused, nothing overwritten
    assert "exists and is not an empty folder" in status(tuner)
    tuner.controls["export_folder"].value = str(server.repository / "inside")
    tuner.buttons["export"].click()
    assert "inside the served repository" in status(tuner)
    # the default is a name, taken beside the served repository (no path of the machine shown)
    default = make_tuner(server).controls["export_folder"].value
    assert default == f"{server.repository.name}-tuned"
    tuner.controls["export_folder"].value = default
    tuner.buttons["export"].click()
    assert tuner.wait(30)
    assert load_config(server.repository.parent / default / "scale" / "config.pbtxt")


def test_replay_runs_perf_replay_on_the_latest_sweep(server, monkeypatch):
    import pandas as pd

    from triton_nb.perf import ReplayResult

    tuner = make_tuner(server)
    tuner.controls["replay_url"].value = "localhost:8000"
    tuner.buttons["replay"].click()
    assert "run a Sweep first" in status(tuner)

    tuner.controls["sweep_delays"].value = "0,500"
    tuner.controls["sweep_instances"].value = "1"
    tuner.buttons["sweep"].click()
    assert tuner.wait(30)
    swept = tuner.last_sweep
    calls = []

    def fake_replay(result, url, **options):
        calls.append((result, url, options))
        assert threading.current_thread() is not threading.main_thread()
        labels = list(result.ranking["config"])
        comparison = pd.DataFrame({
            "config": labels, "recommended": [True, False], "sweep_rank": [1, 2],
            "sweep_concurrency": [1, 1], "sweep_throughput_infer_per_sec": [900.0, 800.0],
            "sweep_latency_p99_us": [1500.0, 1700.0], "triton_rank": [2, 1], "triton_concurrency": [1, 1],
            "triton_throughput_infer_per_sec": [450.0, 500.0], "triton_latency_p99_us": [2500.0, 2400.0],
            "triton_feasible": [True, True]})
        options["on_point"]({"config": labels[0], "round": 1})
        return ReplayResult(comparison=comparison, pick_vs_best=0.9, recommended=labels[0], triton_best=labels[1],
                            measurements=pd.DataFrame(), url=url, tuned_models=("scale",), rounds=options["rounds"])

    monkeypatch.setattr(widgets_module, "replay", fake_replay)
    tuner.controls["replay_top"].value = 2
    tuner.controls["replay_rounds"].value = 1
    tuner.buttons["apply"].click()  # an Apply between: Replay still takes the latest sweep
    tuner.buttons["replay"].click()
    assert tuner.wait(10)
    assert len(calls) == 1 and calls[0][0] is swept and calls[0][1] == "localhost:8000"
    assert calls[0][2]["top"] == 2 and calls[0][2]["rounds"] == 1
    shown = html.unescape(re.sub(r"<[^>]+>", " ", tuner.replay_view.value))
    assert "pick vs best on real Triton: 0.90" in shown and "Triton rank" in shown and "sweep rank" in shown
    assert "0.90 of the best throughput" in status(tuner) and tuner.replay_result.pick_vs_best == 0.9

    tuner.controls["replay_url"].value = "start"  # the wheel's tritonserver over the served repository
    tuner.buttons["replay"].click()
    assert tuner.wait(10)
    assert calls[-1][1] is None and calls[-1][2]["model_repository"] == server.repository

    tuner.controls["replay_url"].value = " "
    tuner.buttons["replay"].click()
    assert "give the URL" in status(tuner) and "'start'" in status(tuner)
