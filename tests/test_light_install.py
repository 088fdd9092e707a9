"""``pip install triton-nb`` without extras: the core journey runs, and each extra's feature fails
with one line that names the ``pip install 'triton-nb[...]'`` which adds it.

A fresh virtual environment per run would need the network and minutes; instead the journey runs
in a subprocess of this interpreter in which every extra's packages (and pyarrow) fail to import
(tests/helpers/light_journey.py), as they would were they not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from triton_nb.repository import export_tree_model

ROOT = Path(__file__).resolve().parents[1]
JOURNEY = ROOT / "tests" / "helpers" / "light_journey.py"


def _journey(out: Path, *options: str) -> dict:
    done = subprocess.run([sys.executable, str(JOURNEY), str(out), "--block", *options], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _one_line_naming(message: str, extra: str) -> None:
    assert "\n" not in message, message
    assert message.endswith(f"Install it with: pip install 'triton-nb[{extra}]'"), message


@pytest.fixture(scope="module")
def extras_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Models made here, where the extras are installed, for the journey to serve without them."""
    import lightgbm
    import xgboost

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    repository = tmp_path_factory.mktemp("extras_models")
    xgb_model = xgboost.XGBClassifier(n_estimators=4, max_depth=2, n_jobs=1).fit(x, y)
    lgb_model = lightgbm.LGBMClassifier(n_estimators=4, num_leaves=4, verbose=-1, n_jobs=1).fit(x, y)
    export_tree_model(xgb_model, repository, name="xgb_onnx", model_backend="onnxruntime")
    export_tree_model(lgb_model, repository, name="lgb", model_type="lightgbm")
    export_tree_model(lgb_model, repository, name="lgb_shap", model_type="lightgbm", treeshap_output=True)
    return repository


@pytest.mark.slow
def test_core_journey_runs_with_every_extra_blocked(tmp_path, extras_models):
    report = _journey(tmp_path, "--models", str(extras_models))
    # train -> export -> serve: every front end answers as XGBoost predicts
    assert report["agreement"] == {"inprocess": 1.0, "http": 1.0, "grpc": 1.0}
    assert report["throughput_infer_per_sec"] > 0
    assert report["tune_recommended"] is not None  # perf.tune's sweep recommends a delay
    assert report["panel_points"] == 1 and report["panel_errors"] == 0  # the Tuner measured the ensemble
    assert report["cli_help_exit"] == 0 and report["cli_help_lines"] > 5
    assert "[onnx] exporting tree models as ONNX" in report["show_versions"]
    assert report["optional_modules_loaded"] == []

    # each feature asked for without its extra: one line with the pip command
    missing = report["missing"]
    _one_line_naming(missing["onnx_export"], "onnx")
    assert "model 'fil'" in missing["onnx_export"] and "'onnx'" in missing["onnx_export"]
    _one_line_naming(missing["dask_training"], "dask")
    assert "Dask cluster" in missing["dask_training"]

    # a model whose backend is missing is UNAVAILABLE with that line; the others still load
    models = report["models"]
    assert models["xgb_onnx"]["state"] == "UNAVAILABLE"
    _one_line_naming(models["xgb_onnx"]["reason"], "onnx")
    assert "model 'xgb_onnx'" in models["xgb_onnx"]["reason"]
    # FIL serves LightGBM's model.txt through Treelite without lightgbm; only its SHAP values need it
    assert models["lgb"]["state"] == "READY", models["lgb"]
    assert models["lgb_shap"]["state"] == "UNAVAILABLE"
    _one_line_naming(models["lgb_shap"]["reason"], "lightgbm")
    assert "'lgb_shap'" in models["lgb_shap"]["reason"]


def test_fil_lightgbm_engine_without_lightgbm_names_the_extra(tmp_path, monkeypatch):
    # in process, LightGBM made to look absent to the FIL backend only (the journey above blocks imports)
    import lightgbm

    from triton_nb._optional import optional_module
    from triton_nb.backends.base import ModelContext
    from triton_nb.backends.fil import FilBackend, backend, loading
    from triton_nb.errors import MissingDependencyError
    from triton_nb.repository.config import effective_config, load_config

    def without_lightgbm(name: str):
        return None if name == "lightgbm" else optional_module(name)

    monkeypatch.setattr(loading, "optional_module", without_lightgbm)
    monkeypatch.setattr(backend, "optional_module", without_lightgbm)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 3)).astype(np.float32)
    model = lightgbm.LGBMClassifier(n_estimators=3, num_leaves=4, verbose=-1, n_jobs=1).fit(x, x[:, 0] > 0)
    folder = export_tree_model(model, tmp_path, name="lgb", model_type="lightgbm")
    config = effective_config(load_config(folder), "lgb")
    context = ModelContext(name="lgb", version=1, config=config, model_path=folder, version_path=folder / "1",
                           repository_path=tmp_path, instance_name="lgb_0", instance_kind="KIND_CPU")
    with pytest.raises(MissingDependencyError) as raised:
        FilBackend(context, engine="lightgbm", compile=False)
    assert str(raised.value) == ("model 'lgb' version 1 (engine 'lightgbm') needs the optional package 'lightgbm', "
                                 "which is not installed. Install it with: pip install 'triton-nb[lightgbm]'")
    served = FilBackend(context, compile=False)  # Treelite's engine serves the same file
    try:
        assert served.model.lightgbm is None
    finally:
        served.finalize()
