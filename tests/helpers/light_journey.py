"""The core journey — train, export, serve (in-process, HTTP, gRPC), measure, tune (perf.tune and the Tuner
panel) — run without any extra.

Run as a script in a fresh interpreter: ``python tests/helpers/light_journey.py OUT_DIR [--block]
[--models REPO]``. ``--block`` makes every package of the optional extras (and pyarrow, which only
the dask extra brings) fail to import, as if ``pip install triton-nb`` had installed the core only;
without it the script proves the same in an environment that really has only the core.
``--models REPO`` serves a repository the caller made with the extras (an ONNX model, a LightGBM
model with SHAP output) and reports each model's state and reason. The script prints one JSON
object: what each step gave, and the error line of each feature asked for without its extra.
It imports nothing from the tests, so it also runs under an interpreter without pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.util
import io
import json
import sys
import traceback
from pathlib import Path
from typing import Any

#: Top-level modules of the extras' packages (dask, lightgbm, onnx, sagemaker, gpu) and pyarrow.
BLOCKED = ("dask", "distributed", "lightgbm", "onnx", "onnxmltools", "skl2onnx", "onnxruntime", "onnxconverter_common",
           "boto3", "botocore", "pyarrow", "cudf", "cuml", "cupy")


class _Blocker(importlib.abc.MetaPathFinder):
    """Refuses the optional modules, as an interpreter without them installed would."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named '{fullname}'", name=fullname)
        return None


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ImportError:
        return True


def _error_line(call: Any) -> str:
    """The message of the error ``call`` raises (the journey fails when it raises none)."""
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError(f"{call} did not fail without its extra")


def run(out: Path, block: bool, models: Path | None) -> dict[str, Any]:
    if block:
        sys.meta_path.insert(0, _Blocker())
    import numpy as np

    import triton_nb
    import triton_nb.serving
    from triton_nb import cli, fraud, perf, serve
    from triton_nb.fraud import request_tensors
    from triton_nb.repository import export_fraud_repository
    from triton_nb.transport import connect

    report: dict[str, Any] = {"version": triton_nb.__version__}
    with contextlib.redirect_stdout(io.StringIO()) as help_text:
        try:
            cli.main(["--help"])
        except SystemExit as exit_:
            report["cli_help_exit"] = exit_.code
    report["cli_help_lines"] = len(help_text.getvalue().splitlines())
    with contextlib.redirect_stdout(io.StringIO()) as versions:
        triton_nb.show_versions()
    report["show_versions"] = versions.getvalue()

    frame = fraud.generate_transactions(3000, seed=3, fraud_rate=0.05)
    model = fraud.train_fraud_model(frame, num_boost_round=8, early_stopping_rounds=None, progress=False, nthread=2)
    repository = export_fraud_repository(model, out / "repository")
    holdout = fraud.generate_transactions(64, seed=4)
    expected = model.predict(holdout)
    with serve(repository, http_port=0, grpc_port=0) as server:
        answers = {"inprocess": server.client().infer("ensemble", holdout).as_numpy("predictions")}
        for protocol in ("http", "grpc"):
            with connect(server, protocol) as transport:
                answers[protocol] = transport.infer("ensemble", request_tensors(holdout),
                                                    outputs=["predictions"])["predictions"]
        report["agreement"] = {name: float(np.mean(np.asarray(values).ravel() == expected.ravel()))
                               for name, values in answers.items()}
        measured = perf.measure(server, "ensemble", concurrency_range=[2], input_data="fraud",
                                measurement_interval_ms=300, max_trials=2)
        report["throughput_infer_per_sec"] = float(measured["throughput_infer_per_sec"].iloc[0])
        tuned = perf.tune(server, "ensemble", {"max_queue_delay_microseconds": [0, 500]}, tuned_model="fil",
                          concurrency_range=[2], input_data="fraud", measurement_interval_ms=300, max_trials=2,
                          progress=False)
        report["tune_recommended"] = tuned.recommended
        panel = server.tune("ensemble", tuned_model="fil")
        panel.controls["measurement_interval_ms"].value = 300
        panel.buttons["measure"].click()
        panel.wait(60)
        report["panel_points"] = len(panel.points)
        report["panel_errors"] = int(panel.points["errors"].sum()) if len(panel.points) else -1

    if _absent("onnx") and _absent("dask"):  # blocked here, or really not installed
        report["missing"] = {
            "onnx_export": _error_line(lambda: export_fraud_repository(
                model, out / "onnx_repository", model_backend="onnxruntime")),
            "dask_training": _error_line(lambda: fraud.train_fraud_model(
                frame, num_boost_round=2, progress=False, client=object())),
        }
    if models is not None:
        with serve(models) as server:
            report["models"] = {entry["name"]: {"state": entry.get("state"), "reason": entry.get("reason", "")}
                                for entry in server.repository_index()}
    report["optional_modules_loaded"] = sorted(
        name for name in sys.modules if name.partition(".")[0] in BLOCKED)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--models", type=Path)
    args = parser.parse_args()
    try:
        report = run(args.out, args.block, args.models)
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1) from None
    print(json.dumps(report))


if __name__ == "__main__":
    main()
