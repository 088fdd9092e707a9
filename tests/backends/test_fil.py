"""FilBackend: Triton's FIL backend on CPU — FIL's outputs from every engine, SHAP values, the
background tl2cgen compilation and its cache, and clear load failures."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest
import xgboost as xgb
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

from triton_nb._optional import optional_module, xgboost_cuda_available
from triton_nb.backends.base import ModelContext
from triton_nb.backends.fil import FilBackend, common, compiled
from triton_nb.backends.fil.calibration import CALIBRATION_SIZES, Selector
from triton_nb.backends.fil.engines import Candidate
from triton_nb.errors import InvalidArgumentError, NotFoundError, UnavailableError
from triton_nb.repository.config import effective_config, fil_parameters, load_config, save_config
from triton_nb.repository.export import export_tree_model
from triton_nb.repository.fil_semantics import FilSettings, answer_row_dims, fil_output
from triton_nb.tensors import InferRequest

FEATURES = 6


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory):
    """One compiled-library cache for the whole session: each model compiles once."""
    path = tmp_path_factory.mktemp("fil-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_NB_CACHE_DIR", str(path))
        patch.delenv("TRITON_NB_FIL_COMPILE", raising=False)
        yield path / "tl2cgen"


@pytest.fixture(scope="session")
def data():
    X, y = make_classification(n_samples=600, n_features=FEATURES, n_informative=4, n_classes=3, random_state=0)
    X = X.astype(np.float32)
    rng = np.random.default_rng(0)
    test = X[:200].copy()
    test[rng.random(test.shape) < 0.05] = np.nan  # missing values take each tree's default branch
    return X, y, (y > 0).astype(int), test


@pytest.fixture(scope="session")
def models(data):
    X, y3, y2, _ = data
    target = X[:, 0] * 3 + X[:, 1] ** 2
    return {
        "xgb_binary": xgb.XGBClassifier(n_estimators=20, max_depth=4, n_jobs=2).fit(X, y2),
        "xgb_multi": xgb.XGBClassifier(n_estimators=10, max_depth=3, n_jobs=2).fit(X, y3),
        "xgb_reg": xgb.XGBRegressor(n_estimators=20, max_depth=4, n_jobs=2).fit(X, target),
        "lgb_binary": lgb.LGBMClassifier(n_estimators=20, num_leaves=15, verbose=-1, n_jobs=2).fit(X, y2),
        "lgb_multi": lgb.LGBMClassifier(n_estimators=10, num_leaves=7, verbose=-1, n_jobs=2).fit(X, y3),
        "rf_binary": RandomForestClassifier(n_estimators=10, max_depth=5, random_state=0).fit(X, y2),
        "rf_multi": RandomForestClassifier(n_estimators=10, max_depth=5, random_state=0).fit(X, y3),
        "rf_reg": RandomForestRegressor(n_estimators=10, max_depth=5, random_state=0).fit(X, target),
    }


@pytest.fixture
def load(tmp_path):
    """load(model, **export options, engine=..., compile=..., kind=...) -> a FilBackend, finalized at teardown."""
    backends: list[FilBackend] = []

    def make(model, *, name="m", engine=None, compile=True, kind="KIND_CPU", folder=None, **export):
        if folder is None:
            folder = export_tree_model(model, tmp_path / "repo", name=name, overwrite=True, **export)
        backend = FilBackend(_context(folder, kind), engine=engine, compile=compile)
        backends.append(backend)
        return backend

    yield make
    for backend in backends:
        backend.finalize()


def _context(folder: Path, kind: str = "KIND_CPU") -> ModelContext:
    config = effective_config(load_config(folder), folder.name)
    return ModelContext(name=folder.name, version=1, config=config, model_path=folder, version_path=folder / "1",
                        repository_path=folder.parent, instance_name=f"{folder.name}_0", instance_kind=kind)


def _run(backend: FilBackend, x: np.ndarray, name: str = "output__0") -> np.ndarray:
    (response,) = backend.execute([InferRequest("m", {"input__0": x})])
    assert response.error is None
    return response.outputs[name]


def _settings(backend: FilBackend) -> FilSettings:
    config = backend.context.config
    return FilSettings.from_parameters(fil_parameters(config), [o.name for o in config.output])


# --------------------------------------------------------------------------- FIL outputs vs the native libraries


def test_xgboost_binary_class_with_threshold_and_probabilities(models, data, load):
    model, x = models["xgb_binary"], data[3]
    p = model.get_booster().inplace_predict(x)
    backend = load(model, threshold=0.3)
    got = _run(backend, x)
    assert got.dtype == np.float32 and got.shape == (len(x),)  # dims [1], squeezed as FIL does
    np.testing.assert_array_equal(got, fil_output(p, _settings(backend))[:, 0])
    np.testing.assert_array_equal(got, (p > 0.3).astype(np.float32))
    for width in (1, 2):
        backend = load(model, name=f"p{width}", predict_proba=True, proba_width=width)
        got = _run(backend, x)
        assert got.shape == ((len(x),) if width == 1 else (len(x), width))
        np.testing.assert_allclose(got.reshape(len(x), -1), fil_output(p, _settings(backend), width), atol=1e-6)
    np.testing.assert_allclose(got, np.column_stack([1 - p, p]), atol=1e-6)


def test_xgboost_multiclass_and_regression(models, data, load):
    x = data[3]
    model = models["xgb_multi"]
    p = model.get_booster().inplace_predict(x)
    np.testing.assert_array_equal(_run(load(model), x), p.argmax(axis=1).astype(np.float32))
    np.testing.assert_allclose(_run(load(model, name="proba", predict_proba=True), x), p, atol=1e-6)

    regressor = models["xgb_reg"]
    got = _run(load(regressor, name="reg"), x)
    assert got.shape == (len(x),)
    np.testing.assert_allclose(got, regressor.get_booster().inplace_predict(x), rtol=1e-5, atol=1e-5)


def test_lightgbm_binary(models, data, load):
    model, x = models["lgb_binary"], data[3]
    p = model.booster_.predict(x)
    backend = load(model, threshold=0.3)
    assert backend.settings.model_type == "lightgbm"
    np.testing.assert_array_equal(_run(backend, x), fil_output(p, _settings(backend))[:, 0])
    np.testing.assert_allclose(_run(load(model, name="proba", predict_proba=True), x),
                               np.column_stack([1 - p, p]), atol=1e-6)


# rapids-triton's squeeze_output (which FIL turns on): a batch dim in front unless the dims start with -1,
# then every dim of size 1 erased. (output kind, configured dims, the answer's shape for 7 rows)
_FIL_SHAPES = [
    ("class", [1], (7,)),
    ("class", [-1], (7,)),
    ("class", [1, 1], (7,)),
    ("proba", [2], (7, 2)),
    ("proba", [1, 2], (7, 2)),
    ("proba", [2, 1], (7, 2)),
    ("proba", [-1, 2], (7, 2)),
    ("multiclass", [3], (7, 3)),
    ("regression", [1], (7,)),
    ("shap", [FEATURES + 1], (7, FEATURES + 1)),
    ("multiclass shap", [3, FEATURES + 1], (7, 3, FEATURES + 1)),
    ("shap", [1, FEATURES + 1], (7, FEATURES + 1)),
]


@pytest.mark.parametrize(("kind", "dims", "shape"), _FIL_SHAPES, ids=[f"{k}-{d}" for k, d, _ in _FIL_SHAPES])
def test_answers_have_fil_squeezed_shapes(models, data, load, backends, tmp_path, kind, dims, shape):
    """FIL and its Python twin (the exported stand-in for Triton builds without FIL) answer in the same
    squeezed shape, with the values of the unsqueezed answer."""
    x = data[3][:7]
    model = models["xgb_multi" if "multiclass" in kind else "xgb_reg" if kind == "regression" else "xgb_binary"]
    name = "treeshap_output" if "shap" in kind else "output__0"
    answers = {}
    for model_backend in ("fil", "python"):
        folder = export_tree_model(model, tmp_path / model_backend, name="shapes", model_backend=model_backend,
                                   predict_proba=kind not in ("class", "regression"),
                                   treeshap_output="shap" in kind, overwrite=True)
        config = load_config(folder)
        output = next(o for o in config.output if o.name == name)
        output.ClearField("dims")
        output.dims.extend(dims)
        save_config(config, folder)
        backend = load(None, folder=folder) if model_backend == "fil" else backends(folder)
        (response,) = backend.execute([InferRequest("shapes", {"input__0": x})])
        assert response.error is None, response.error
        answers[model_backend] = response.outputs[name]
    assert answers["fil"].shape == answers["python"].shape == shape
    np.testing.assert_allclose(answers["fil"], answers["python"], rtol=1e-5, atol=1e-5)
    if kind == "proba":
        p = model.get_booster().inplace_predict(x)
        np.testing.assert_allclose(answers["fil"], np.column_stack([1 - p, p]), atol=1e-6)


@pytest.mark.parametrize("rows", [1, 63, 64, 300])
def test_the_python_twin_agrees_with_xgboost_on_one_thread_and_on_all(models, data, backends, tmp_path, rows):
    """The twin predicts batches under 64 rows on one thread and larger ones on cpu_nthread (all):
    both boosters give XGBoost's own answer."""
    x = np.resize(data[3], (rows, data[3].shape[1])).astype(np.float32)
    model = models["xgb_binary"]
    folder = export_tree_model(model, tmp_path / "twin", name="twin", model_backend="python", predict_proba=True)
    (response,) = backends(folder).execute([InferRequest("twin", {"input__0": x})])
    assert response.error is None, response.error
    p = model.get_booster().inplace_predict(x)
    np.testing.assert_allclose(response.outputs["output__0"], np.column_stack([1 - p, p]), atol=1e-6)


def test_an_output_with_a_variable_dim_after_the_batch_is_refused_as_fil_refuses_it(models, load, tmp_path):
    folder = export_tree_model(models["xgb_binary"], tmp_path / "repo", name="var", predict_proba=True)
    config = load_config(folder)
    config.output[0].ClearField("dims")
    config.output[0].dims.extend([2, -1])
    save_config(config, folder)
    with pytest.raises(InvalidArgumentError, match=r"output dims \[2, -1\]: Backends with variable-shape outputs "
                                                   r"must request desired output shape"):
        load(None, folder=folder)


def test_answer_row_dims_follows_rapids_triton():
    assert answer_row_dims([1]) == ()
    assert answer_row_dims([2]) == (2,)
    assert answer_row_dims([1, 3, 1, 4]) == (3, 4)
    assert answer_row_dims([-1]) == ()
    assert answer_row_dims([-1, 1, 2]) == (2,)
    assert answer_row_dims([]) == ()
    with pytest.raises(ValueError, match="variable-shape"):
        answer_row_dims([1, -1])


def test_sklearn_forests_through_treelite_checkpoints(models, data, load):
    x = data[3]
    x_filled = np.nan_to_num(x)  # scikit-learn < 1.4 trees reject NaN; compare on complete rows
    binary = models["rf_binary"]
    backend = load(binary)
    assert backend.settings.model_type == "treelite_checkpoint"
    # A two-class model in Treelite: FIL answers by argmax over the two probabilities.
    np.testing.assert_array_equal(_run(backend, x_filled), binary.predict(x_filled).astype(np.float32))
    np.testing.assert_allclose(_run(load(binary, name="p", predict_proba=True), x_filled),
                               binary.predict_proba(x_filled), atol=1e-6)

    multi = models["rf_multi"]
    np.testing.assert_array_equal(_run(load(multi, name="mc"), x_filled),
                                  multi.predict(x_filled).astype(np.float32))
    np.testing.assert_allclose(_run(load(multi, name="mcp", predict_proba=True), x_filled),
                               multi.predict_proba(x_filled), atol=1e-6)

    regressor = models["rf_reg"]
    np.testing.assert_allclose(_run(load(regressor, name="reg"), x_filled), regressor.predict(x_filled),
                               rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- SHAP


def test_xgboost_shap_binary_and_multiclass(models, data, load):
    x = data[3]
    binary = models["xgb_binary"]
    backend = load(binary, treeshap_output=True)
    shap = _run(backend, x, "treeshap_output")
    assert shap.dtype == np.float32 and shap.shape == (len(x), FEATURES + 1)
    expected = binary.get_booster().predict(xgb.DMatrix(x), pred_contribs=True)
    np.testing.assert_allclose(shap, expected, rtol=1e-5, atol=1e-5)
    assert np.ptp(shap[:, -1]) == 0  # the bias is last: the same for every row
    margin = binary.get_booster().inplace_predict(x, predict_type="margin")
    np.testing.assert_allclose(shap.sum(axis=1), margin, rtol=1e-4, atol=1e-4)

    multi = models["xgb_multi"]
    shap = _run(load(multi, name="mc", treeshap_output=True, predict_proba=True), x, "treeshap_output")
    assert shap.shape == (len(x), 3, FEATURES + 1)
    np.testing.assert_allclose(shap, multi.get_booster().predict(xgb.DMatrix(x), pred_contribs=True),
                               rtol=1e-5, atol=1e-5)


def test_lightgbm_shap_is_bias_last_and_class_major(models, data, load):
    x = data[3]
    binary = models["lgb_binary"]
    shap = _run(load(binary, treeshap_output=True), x, "treeshap_output")
    assert shap.shape == (len(x), FEATURES + 1)
    np.testing.assert_allclose(shap, binary.booster_.predict(x, pred_contrib=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(shap.sum(axis=1), binary.booster_.predict(x, raw_score=True), rtol=1e-4, atol=1e-4)

    multi = models["lgb_multi"]
    shap = _run(load(multi, name="mc", treeshap_output=True), x, "treeshap_output")
    assert shap.shape == (len(x), 3, FEATURES + 1)
    # LightGBM's columns are class by class; each class's contributions sum to its raw score.
    np.testing.assert_allclose(shap.sum(axis=2), multi.booster_.predict(x, raw_score=True), rtol=1e-4, atol=1e-4)
    assert np.all(np.ptp(shap[:, :, -1], axis=0) == 0)


def test_treelite_checkpoint_with_shap_fails_at_load(models, load):
    with pytest.raises(InvalidArgumentError, match=r"treeshap_output.*treelite_checkpoint"):
        load(models["rf_reg"], treeshap_output=True)


# --------------------------------------------------------------------------- batching and engines


def test_requests_are_batched_together_and_split_back(models, data, load):
    x = data[3]
    backend = load(models["xgb_multi"], predict_proba=True, treeshap_output=True)
    sizes = (1, 5, 17)
    chunks = np.split(x[: sum(sizes)], np.cumsum(sizes)[:-1])
    requests = [InferRequest("m", {"input__0": chunk}, request_id=str(i), requested_outputs=["output__0"])
                for i, chunk in enumerate(chunks)]
    responses = backend.execute(requests)
    whole = backend.execute([InferRequest("m", {"input__0": x[: sum(sizes)]})])[0].outputs
    start = 0
    for size, request, response in zip(sizes, requests, responses, strict=True):
        assert response.error is None and response.request_id == request.request_id
        assert response.model_name == "m" and response.model_version == 1
        assert response.outputs["output__0"].shape == (size, 3)
        assert response.outputs["treeshap_output"].shape == (size, 3, FEATURES + 1)  # all outputs: the server filters
        np.testing.assert_allclose(response.outputs["output__0"], whole["output__0"][start:start + size], atol=1e-6)
        np.testing.assert_allclose(response.outputs["treeshap_output"], whole["treeshap_output"][start:start + size],
                                   atol=1e-5)
        start += size
    # A malformed request fails alone.
    bad, good = backend.execute([InferRequest("m", {"input__0": x[:2, :3]}), InferRequest("m", {"input__0": x[:2]})])
    assert isinstance(bad.error, InvalidArgumentError) and good.error is None


@pytest.mark.parametrize("name", ["xgb_binary", "xgb_multi", "xgb_reg", "lgb_binary", "lgb_multi", "rf_binary",
                                  "rf_multi", "rf_reg"])
def test_every_engine_gives_the_same_outputs(name, models, data, load):
    model, x = models[name], data[3]
    proba = "reg" not in name
    reference = load(model, compile=False, predict_proba=proba)
    engines = set(reference.engines) | {"tl2cgen"}
    assert "gtil" in engines
    outputs = {}
    for engine in sorted(engines):
        backend = load(model, name=f"m_{engine}", engine=engine, predict_proba=proba)
        assert backend.engines == (engine,)
        # Both sides of every size band: 1 row, a few, and many (the compiled engine uses threads from 64).
        outputs[engine] = np.concatenate([_run(backend, x[:1]), _run(backend, x[:7]), _run(backend, x)])
    first = next(iter(outputs.values()))
    for engine, got in outputs.items():
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, first, rtol=1e-5, atol=1e-5, err_msg=engine)


def test_the_compiled_engine_keeps_the_gil_for_small_batches_only(models, data, load):
    """Up to HOLD_GIL_MAX_ROWS rows the compiled model runs through its GIL-holding entry point,
    above through the releasing one, and both give the library's answers."""
    model, x = models["xgb_reg"], np.tile(data[3], (2, 1))
    backend = load(model, engine="tl2cgen")  # builds (or finds) the library, forced: no fallback engine
    library = compiled.CompiledLibrary(backend._builder.build())  # the cached library, at once
    calls: list[str] = []

    def recording(fn, label):
        def call(*args):
            calls.append(label)
            return fn(*args)
        return call

    library._predict = recording(library._predict, "releasing")
    library._predict_holding_gil = recording(library._predict_holding_gil, "holding")
    predict = library.candidate(1).predict
    expected = model.get_booster().inplace_predict(x)
    limit = compiled.HOLD_GIL_MAX_ROWS
    for rows, entry in ((1, "holding"), (limit, "holding"), (limit + 1, "releasing"), (len(x), "releasing")):
        calls.clear()
        got = predict(np.ascontiguousarray(x[:rows]))
        assert calls == [entry], rows
        np.testing.assert_allclose(got[:, 0], expected[:rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_xgboost_engine_takes_input_that_is_not_aligned(models, data, load, offset):
    """A binary tensor is a view into a request body at any offset; XGBoost's C API refuses float
    data not aligned to 4 bytes ("Input pointer misalignment"), so the backend aligns it first."""
    x = data[0][:5]
    backend = load(models["xgb_binary"], engine="xgboost", predict_proba=True)
    raw = bytearray(offset + x.nbytes)
    raw[offset:] = x.tobytes()
    misaligned = np.frombuffer(memoryview(raw)[offset:], dtype=np.float32).reshape(x.shape)
    assert not misaligned.flags.aligned
    np.testing.assert_array_equal(_run(backend, misaligned), _run(backend, x))


def test_the_selector_follows_a_lasting_change_but_not_an_outlier():
    fast, slow = Candidate("fast", 1, lambda x: x), Candidate("slow", 2, lambda x: x)
    sizes = CALIBRATION_SIZES
    selector = Selector([fast, slow], {"fast/1": {s: 1e-6 * s for s in sizes},
                                        "slow/2": {s: 2e-6 * s for s in sizes}})
    band, rows = 2, 64
    cost = [1e-6, 2e-6]

    def serve(batches):
        used = []
        for _ in range(batches):
            index = selector.pick(band)
            selector.record(band, index, rows, cost[index] * rows)
            used.append(index)
        return used

    assert selector.best(band) is fast
    used = serve(300)
    assert 0 < used.count(1) <= 300 * 0.05  # the other engine is re-measured, rarely
    selector.record(band, 0, rows, 100 * cost[0] * rows)  # one preempted batch
    assert selector.best(band) is fast
    cost[0] = 10e-6  # a lasting slowdown (say, another process now takes a core)
    serve(40)
    assert selector.best(band) is slow
    cost[0] = 1e-6
    serve(300)
    assert selector.best(band) is fast


def test_cpu_nthread_sets_the_threads(models, data, tmp_path, load):
    folder = export_tree_model(models["xgb_binary"], tmp_path / "repo", name="one")
    config = load_config(folder)
    config.parameters["cpu_nthread"].string_value = "1"
    save_config(config, folder)
    backend = load(None, folder=folder, compile=False)
    assert backend.threads == 1
    assert load(models["xgb_binary"], name="all", compile=False).threads >= 1


def test_a_process_limited_to_one_openmp_thread_still_loads_fil_models(models, tmp_path):
    # OMP_NUM_THREADS=1 (common in containers and CI) caps what Treelite accepts; OpenMP reads it when
    # the process starts, hence a fresh interpreter
    import subprocess
    import sys

    folder = export_tree_model(models["xgb_binary"], tmp_path / "repo", name="trees")
    script = ("import sys, numpy as np, triton_nb\n"
              "from triton_nb.tensors import InferRequest\n"
              "with triton_nb.serve(sys.argv[1]) as server:\n"
              "    x = np.zeros((3, server.input_config('trees').input[0].dims[0]), np.float32)\n"
              "    print(server.infer(InferRequest('trees', {'input__0': x})).outputs['output__0'].shape)\n")
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1", "TRITON_NB_FIL_COMPILE": "0"}
    done = subprocess.run([sys.executable, "-c", script, str(folder.parent)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("(3,)"), done.stdout  # dims [1]: squeezed, as FIL answers


# --------------------------------------------------------------------------- tl2cgen in the background


def test_compilation_runs_in_the_background_and_the_cache_is_reused(models, data, load, monkeypatch, cache_dir):
    model, x = models["xgb_reg"], data[3]
    for path in cache_dir.glob("*"):  # this model may have been compiled by another test
        path.unlink() if path.is_file() else shutil.rmtree(path)
    gate, entered = threading.Event(), threading.Event()
    compile_ = compiled.Builder._compile

    def gated(self):
        entered.set()
        assert gate.wait(30)  # were serving to wait for the compilation, this would time out and fail it
        return compile_(self)

    monkeypatch.setattr(compiled.Builder, "_compile", gated)
    backend = load(model)
    try:
        assert backend.compile_state == "compiling" and "tl2cgen" not in backend.engines
        expected = model.get_booster().inplace_predict(x)
        assert entered.wait(30)  # the compilation is under way, held at the gate
        np.testing.assert_allclose(_run(backend, x), expected, rtol=1e-5, atol=1e-5)  # served meanwhile
        # ... while the compilation was still held: serving did not wait for it
        assert backend.compile_state == "compiling" and not backend.wait_compiled(timeout_s=0)
    finally:
        gate.set()
    assert backend.wait_compiled(timeout_s=60), backend.compile_state
    with pytest.warns(DeprecationWarning, match=r"wait_compiled: timeout= is deprecated, use timeout_s="):
        assert backend.wait_compiled(timeout=1)  # the old spelling, for a release
    assert not backend.compiled_from_cache and "tl2cgen" in backend.engines
    assert backend.engine_for(1) == "tl2cgen"  # a compiled tree walk beats every call overhead at batch 1
    np.testing.assert_allclose(_run(backend, x[:1]), expected[:1], rtol=1e-5, atol=1e-5)
    libraries = list(cache_dir.glob("*.so"))
    assert len(libraries) == 1 and not list(cache_dir.glob(".build-*"))

    def no_compile(self):
        raise AssertionError("the second load must find the cached library")

    monkeypatch.setattr(compiled.Builder, "_compile", no_compile)
    second = load(model, name="again")
    assert second.compile_state == "ready" and second.compiled_from_cache and second._thread is None
    assert second.engine_for(1) == "tl2cgen"
    np.testing.assert_allclose(_run(second, x), expected, rtol=1e-5, atol=1e-5)


def test_instances_of_one_model_compile_it_once(models, data, load, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_NB_CACHE_DIR", str(tmp_path / "own-cache"))
    calls = []
    compile_ = compiled.Builder._compile

    def counted(self):
        calls.append(self.key)
        return compile_(self)

    monkeypatch.setattr(compiled.Builder, "_compile", counted)
    folder = export_tree_model(models["lgb_multi"], tmp_path / "repo", name="twice", predict_proba=True)
    first, second = load(None, folder=folder), load(None, folder=folder)
    assert first.wait_compiled(60) and second.wait_compiled(60)
    assert len(calls) == 1 and len(list((tmp_path / "own-cache" / "tl2cgen").glob("*.so"))) == 1
    x = data[3]
    np.testing.assert_allclose(_run(first, x[:3]), _run(second, x[:3]), atol=1e-6)


def test_finalize_stops_a_compilation_promptly(models, load, tmp_path, monkeypatch):
    # A "compiler" that hangs on every translation unit (but answers --version and links).
    fake = tmp_path / "slowcc"
    fake.write_text('#!/bin/sh\ncase " $* " in *" -c "*) exec sleep 60;; esac\nexec cc "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("TRITON_NB_CACHE_DIR", str(tmp_path / "own-cache"))
    backend = load(models["lgb_binary"])
    assert backend.compile_state == "compiling"
    deadline = time.monotonic() + 30
    while not backend._builder._procs and time.monotonic() < deadline:
        time.sleep(0.02)
    procs = list(backend._builder._procs)
    assert procs, "the compiler never started"
    backend.finalize()
    # finalize joins the compile thread for at most a second; on a loaded machine the thread may still
    # be removing its build folder then, so wait for it here: that it ended because the compilers were
    # killed (by a signal: a negative return code), not waited out for their 60 s, is checked below
    backend._thread.join(30)
    assert not backend._thread.is_alive()
    assert backend.compile_state == "cancelled"
    assert all(proc.poll() is not None and proc.returncode < 0 for proc in procs), [p.returncode for p in procs]
    ours = [t for t in threading.enumerate() if t.name.startswith("triton_nb-fil-compile") and t.is_alive()]
    assert ours == []
    assert not any(t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread())
    assert not list((tmp_path / "own-cache" / "tl2cgen").glob("*.so"))


def test_no_compiler_or_no_tl2cgen_falls_back_quietly(models, data, load, monkeypatch, caplog):
    x = data[3]
    expected = models["xgb_binary"].get_booster().inplace_predict(x)
    monkeypatch.setattr(common, "_logged_once", set())
    for seam in ("_find_compiler", "_tl2cgen"):
        with monkeypatch.context() as patch:
            patch.setattr(compiled, seam, lambda: None)
            caplog.clear()
            for name in ("a", "b"):
                backend = load(models["xgb_binary"], name=f"{seam}{name}", predict_proba=True, proba_width=1)
                assert backend.compile_state == "unavailable" and "tl2cgen" not in backend.engines
                assert backend.wait_compiled(0) is False
                np.testing.assert_allclose(_run(backend, x), expected, atol=1e-6)
            messages = [r.getMessage() for r in caplog.records if "without compiled trees" in r.getMessage()]
            assert len(messages) == 1  # logged once, not per load
            assert ("compiler" if seam == "_find_compiler" else "tl2cgen") in messages[0]


# --------------------------------------------------------------------------- load failures


def test_broken_model_files_fail_the_load_clearly(models, tmp_path, load):
    booster = models["xgb_binary"]
    folder = export_tree_model(booster, tmp_path / "repo", name="truncated")
    path = folder / "1" / "xgboost.json"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(InvalidArgumentError) as info:
        load(None, folder=folder)
    message = str(info.value)
    assert "'truncated'" in message and str(path) in message and "xgboost_json" in message

    folder = export_tree_model(booster, tmp_path / "repo", name="wrongtype")
    config = load_config(folder)
    config.parameters["model_type"].string_value = "lightgbm"
    save_config(config, folder)
    (folder / "1" / "xgboost.json").rename(folder / "1" / "model.txt")
    with pytest.raises(InvalidArgumentError) as info:
        load(None, folder=folder)
    message = str(info.value)
    assert "'wrongtype'" in message and "model.txt" in message and "'lightgbm'" in message

    folder = export_tree_model(booster, tmp_path / "repo", name="missing")
    (folder / "1" / "xgboost.json").unlink()
    with pytest.raises(NotFoundError) as info:
        load(None, folder=folder)
    message = str(info.value)
    assert "'missing'" in message and "xgboost.json" in message and "xgboost_json" in message


def test_output_dims_that_do_not_fit_the_model_fail_the_load(models, tmp_path, load):
    folder = export_tree_model(models["xgb_multi"], tmp_path / "repo", name="dims", predict_proba=True)
    config = load_config(folder)
    del config.output[0].dims[:]
    config.output[0].dims.append(2)  # three classes
    save_config(config, folder)
    with pytest.raises(InvalidArgumentError, match=r"output 'output__0'.*\[2\].*\[3\]"):
        load(None, folder=folder)


def test_kind_gpu_without_a_gpu_fails_clearly(models, load):
    if optional_module("cuml") is not None or xgboost_cuda_available():
        pytest.skip("this machine has a GPU engine")
    with pytest.raises(UnavailableError, match=r"model 'gpu'.*KIND_GPU.*no GPU"):
        load(models["xgb_binary"], name="gpu", kind="KIND_GPU")


# --------------------------------------------------------------------------- the legacy XGBoost binary format

LEGACY = Path(__file__).resolve().parent / "data" / "xgboost_legacy"


@pytest.mark.parametrize("model_type", ["xgboost", None], ids=["named", "FIL's default"])
def test_the_legacy_xgboost_binary_format_is_served_as_real_fil_serves_it(tmp_path, load, caplog, model_type):
    # data/xgboost_legacy: one booster written by XGBoost 1.7 as xgboost.model (the legacy binary
    # format, which XGBoost 3 can no longer write or read) and as xgboost.json. Its base_score, 0.3,
    # makes the binary file's first bytes non-UTF-8: XGBoost 3's refusal of such a file used to end
    # in a UnicodeDecodeError that marked the model UNAVAILABLE. Real FIL loads it through Treelite.
    reference = xgb.Booster(model_file=str(LEGACY / "xgboost.json"))
    folder = export_tree_model(reference, tmp_path / "repo", name="legacy", predict_proba=True)
    (folder / "1" / "xgboost.json").unlink()
    shutil.copy(LEGACY / "xgboost.model", folder / "1" / "xgboost.model")
    config = load_config(folder)
    if model_type is None:  # FIL reads model_type with the default "xgboost" (fil_backend's shared_state.h)
        del config.parameters["model_type"]
    else:
        config.parameters["model_type"].string_value = model_type
    save_config(config, folder)

    x = np.random.default_rng(1).normal(size=(64, FEATURES)).astype(np.float32)
    backend = load(None, folder=folder)
    got = _run(backend, x)
    np.testing.assert_allclose(got, fil_output(reference.inplace_predict(x), _settings(backend), got.shape[1]),
                               atol=1e-6)
    assert "XGBoost cannot read" in caplog.text and "Treelite serves it" in caplog.text
