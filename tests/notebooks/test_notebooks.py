"""The step-through notebooks run top to bottom on a fresh kernel, with small parameters injected the
way papermill does it (see notebook_run.py), and leave no server or thread behind: a cell appended
to each checks that no ``triton-nb`` thread is left after its last cell (``server.stop()`` in those
that start a server)."""

from __future__ import annotations

import re

import nbformat
import pytest

from tests.notebooks.notebook_run import run


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("notebooks")


# a person clicks Measure on the Tuner panel; the test clicks it before the notebook stops the server,
# then prints the status line and the point it added
CLICK_MEASURE = """\
tuner.controls["measurement_interval_ms"].value = MEASUREMENT_INTERVAL_MS
tuner.buttons["measure"].click()
tuner.wait(120)
print(tuner.message)
print(tuner.points[["source", "protocol", "concurrency", "throughput_infer_per_sec", "latency_p50_us",
                    "latency_p99_us", "errors"]].round(1).to_string(index=False))"""


def outputs(book: nbformat.NotebookNode) -> str:
    text = []
    for cell in book.cells:
        for output in cell.get("outputs", []):
            text.append(output.get("text", ""))
            text.append(str(output.get("data", {}).get("text/plain", "")))
    return "\n".join(text)


# in order: each notebook starts from what the one before saved
def test_01_train(workdir):
    book = run("01_train_fraud_model.ipynb", workdir)
    assert (workdir / "work" / "model" / "xgboost.json").is_file()
    assert any("image/png" in o.get("data", {})
               for cell in book.cells for o in cell.get("outputs", []))  # the evaluation plots


def test_02_export(workdir):
    book = run("02_export_model_repository.ipynb", workdir)
    repository = workdir / "work" / "model_repository"
    assert {p.name for p in repository.iterdir()} >= {"preprocessing", "fil", "ensemble"}
    assert (workdir / "work" / "model.tar.gz").is_file()
    assert "backend: \"fil\"" in outputs(book)


def test_03_serve_and_infer(workdir):
    book = run("03_serve_and_infer.ipynb", workdir)
    text = outputs(book)
    assert "NOT FRAUD" in text  # %%triton_infer labelled the ensemble's answers
    assert "{'http': True, 'grpc': True}" in text  # tritonclient over both agrees with in-process
    assert "'failed': 0" in text and "server stopped; no threads left" in text
    assert re.search(r"ensemble\s+\d+\s+0\.75\b", text), text  # 48 of 64 repeated requests from the cache
    # the AWS sample's two boto3 calls through the SageMaker endpoint agree, and the payloads were measured
    assert "the same answers: True" in text
    table = re.findall(r"^\s*(1|64)\s+(json|binary)\s+(\d+)\.0\s+(\d+)\.0\s+\d+\.0\s+0\s*$", text, re.MULTILINE)
    assert [(rows, body) for rows, body, _, _ in table] == [("1", "json"), ("1", "binary"), ("64", "json"),
                                                            ("64", "binary")], text
    sent = {(rows, body): int(request) for rows, body, request, _ in table}
    assert sent["64", "binary"] > sent["1", "binary"]


def test_04_tune_batching(workdir):
    book = run("04_tune_batching.ipynb", workdir, before_stop=(CLICK_MEASURE,))
    text = outputs(book)
    assert "max_queue_delay_microseconds" in text and "server stopped; no threads left" in text
    widget_views = [o for cell in book.cells for o in cell.get("outputs", [])
                    if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widget_views  # the Tuner panel was displayed
    # the cell that clicks Measure prints the Tuner's status line, then the point it added
    measure_cell = next(cell for cell in book.cells if cell.source == CLICK_MEASURE)
    printed = "".join(o.get("text", "") for o in measure_cell.outputs if o.get("name") == "stdout").splitlines()
    assert len(printed) == 3, printed  # the status line, the table's header, one point
    status = re.fullmatch(r"measured (?P<config>.+): (?P<throughput>[\d,]+) infer/s, p50 (?P<p50>[\d.]+) ms, "
                          r"p99 (?P<p99>[\d.]+) ms \([\d.]+ s\)", printed[0])
    assert status, printed[0]  # not "error: ..." or "busy: ...": the measurement finished
    assert "delay_us=" in status["config"] and "instances=" in status["config"]
    assert printed[1].split() == ["source", "protocol", "concurrency", "throughput_infer_per_sec",
                                  "latency_p50_us", "latency_p99_us", "errors"]
    source, protocol, concurrency, throughput, p50_us, p99_us, errors = printed[2].split()
    assert (source, protocol, int(concurrency), int(errors)) == ("measure", "inprocess", 1, 0)
    assert float(throughput) > 0 and 0 < float(p50_us) <= float(p99_us)
    # the status line reports the point in the table (rounded to whole infer/s and 0.01 ms)
    assert abs(float(status["throughput"].replace(",", "")) - float(throughput)) <= 0.55
    assert abs(float(status["p50"]) - float(p50_us) / 1e3) <= 0.006
    assert abs(float(status["p99"]) - float(p99_us) / 1e3) <= 0.006


def test_05_stateful_model(workdir):
    book = run("05_stateful_model.ipynb", workdir)
    text = outputs(book)
    model = workdir / "work" / "stateful_repository" / "card_count"
    assert (model / "config.pbtxt").is_file() and (model / "1" / "model.py").is_file()  # the %%writefile cells
    # the running count per card: card 1001's third request has seen 25 + 40 + 3, card 2002's second 9.5 + 120
    assert re.search(r"1001\s+3\.0\s+3\s+68\.0", text) and re.search(r"2002\s+120\.0\s+2\s+129\.5", text), text
    assert "server stopped; no threads left" in text
