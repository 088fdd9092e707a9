"""The FIL backend itself: :class:`FilBackend`, one instance of a FIL model.

It reads the FIL parameters of the model's config, loads the model file (:mod:`.loading`), makes
the candidates that need nothing built (:mod:`.engines`), checks each against the reference
predictions, picks up a compiled library from the cache or starts building one in a background
thread (:mod:`.compiled`), and lets :mod:`.calibration` choose the engine for each batch.
``execute`` concatenates the requests' rows into one batch, predicts it and applies FIL's output
semantics (:func:`~triton_nb.repository.fil_semantics.fil_output`).

Imports from this package: every other module; none of them imports this one.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from triton_nb._deprecation import no_unknown, renamed
from triton_nb._optional import optional_module, xgboost_cuda_available
from triton_nb.backends.base import Backend, ModelContext
from triton_nb.backends.fil.calibration import (
    BAND_EDGES,
    CALIBRATION_SIZES,
    Selector,
    calibration_data,
    time_candidates,
)
from triton_nb.backends.fil.common import Cancelled, log, log_once
from triton_nb.backends.fil.compiled import Builder, CompiledLibrary
from triton_nb.backends.fil.engines import (
    Candidate,
    as_rows,
    gtil_candidate,
    lightgbm_candidate,
    xgboost_candidate,
    xgboost_direct_candidate,
)
from triton_nb.backends.fil.loading import load_tree_model
from triton_nb.errors import InvalidArgumentError, MissingDependencyError, UnavailableError
from triton_nb.repository.config import fil_parameters
from triton_nb.repository.fil_semantics import FilSettings, answer_row_dims, fil_output
from triton_nb.tensors import InferRequest, InferResponse

__all__ = ["ENGINES", "FilBackend"]

#: Engine names, as :meth:`FilBackend.engine_for` reports them and ``engine=`` forces them.
ENGINES = ("xgboost", "lightgbm", "gtil", "tl2cgen")

_INPUT = "input__0"
_OUTPUT = "output__0"
_SHAP = "treeshap_output"

# Every candidate must give the reference's predictions on this many calibration rows, within these tolerances.
_AGREEMENT_ROWS = 512
_RTOL = _ATOL = 1e-5


def _default_threads() -> int:
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = max(1, os.cpu_count() or 1)
    return min(cores, _openmp_limit() or cores)


def _openmp_limit() -> int | None:
    """The most threads OpenMP gives this process (``OMP_NUM_THREADS``, ``OMP_THREAD_LIMIT``), or
    None when unset. Treelite refuses an ``nthread`` above it — and containers and CI runners often
    set ``OMP_NUM_THREADS=1``."""
    limits = []
    for name in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT"):
        first = os.environ.get(name, "").split(",")[0].strip()
        if first.isdigit() and int(first) > 0:
            limits.append(int(first))
    return min(limits) if limits else None


def _canonical(predictions: np.ndarray) -> np.ndarray:
    """``(rows, 1)`` -> ``(rows,)``: what :func:`fil_output` expects of a binary or regression model."""
    return predictions[:, 0] if predictions.shape[1] == 1 else predictions


def _compile_enabled() -> bool:
    return os.environ.get("TRITON_NB_FIL_COMPILE", "1").strip().lower() not in ("0", "false", "no", "off")


class FilBackend(Backend):
    """One instance of a FIL model, on CPU (or GPU, see the module docstring).

    ``engine`` forces one engine for every batch size (``"xgboost"``, ``"lightgbm"``, ``"gtil"``, or
    ``"tl2cgen"``, which is then compiled, or found in the cache, before the constructor returns), for
    tests and comparisons; by default engines are chosen by calibration. ``compile=False`` (or the
    environment variable ``TRITON_NB_FIL_COMPILE=0``) leaves the compiled engine out.

    Introspection: :attr:`engines`, :meth:`engine_for`, :attr:`compile_state` (``disabled``,
    ``unavailable``, ``compiling``, ``ready``, ``failed``, ``cancelled``), :attr:`compiled_from_cache`,
    :meth:`wait_compiled` and :attr:`timings` (seconds per call, by engine/threads and batch size).
    """

    accepts_carried = True  # a batch is one prediction call over its rows; it fails as a whole

    def __init__(self, context: ModelContext, *, engine: str | None = None, compile: bool = True) -> None:
        super().__init__(context)
        config = context.config
        self._where = f"model '{context.name}' version {context.version}"
        parameters = fil_parameters(config)
        try:
            self.settings = FilSettings.from_parameters(parameters, [o.name for o in config.output])
        except ValueError as exc:
            raise InvalidArgumentError(f"{self._where}: {exc}") from None
        if engine is not None and engine not in ENGINES:
            raise InvalidArgumentError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self.threads = self._threads(parameters)
        # Each output answers in FIL's shape, [rows, *row dims] with every dim of size 1 squeezed out
        # (answer_row_dims), not in the configured one: a client written here works on real FIL.
        try:
            self._outputs = {o.name: answer_row_dims(o.dims)
                             for o in config.output}
        except ValueError as exc:
            raise InvalidArgumentError(f"{self._where}: output {exc}") from None
        if _OUTPUT not in self._outputs:
            raise InvalidArgumentError(f"{self._where}: a FIL model must declare the output '{_OUTPUT}'")
        self._proba_width = 2 if int(np.prod(self._outputs[_OUTPUT])) == 2 else 1
        self.model = load_tree_model(context, self.settings.model_type, parameters)
        self._check_input()

        self.compile_state = "disabled"
        self.compiled_from_cache = False
        self.timings: dict[str, dict[int, float]] = {}
        self._stop = threading.Event()
        self._compile_done = threading.Event()
        self._thread: threading.Thread | None = None
        self._builder: Builder | None = None
        self._data = calibration_data(self.model.treelite, self.model.num_feature)
        self._candidates: list[Candidate] = []
        self._selector = Selector([])
        self._shap: Callable[[np.ndarray], np.ndarray] | None = None
        try:
            if context.instance_kind == "KIND_GPU":
                self._init_gpu()
            else:
                self._init_cpu(engine, compile and _compile_enabled())
            if self.settings.treeshap_output:
                self._shap = self._shap_function()
            self._check_outputs()
        except BaseException:
            self.finalize()
            raise
        if self._thread is not None:
            self._thread.start()
        else:
            self._compile_done.set()

    # ------------------------------------------------------------------ set-up

    def _threads(self, parameters: dict[str, str]) -> int:
        value = parameters.get("cpu_nthread", "").strip()
        if not value:
            return _default_threads()
        try:
            threads = int(value)
        except ValueError:
            raise InvalidArgumentError(
                f"{self._where}: parameter 'cpu_nthread' must be an integer, got '{value}'"
            ) from None
        if threads <= 0:
            return _default_threads()
        limit = _openmp_limit()
        if limit is not None and threads > limit:
            log.warning("%s: cpu_nthread %d is above the OpenMP limit of this process (%d); using %d",
                        self._where, threads, limit, limit)
            return limit
        return threads

    def _check_input(self) -> None:
        inputs = {i.name: list(i.dims) for i in self.context.config.input}
        if _INPUT not in inputs:
            raise InvalidArgumentError(f"{self._where}: a FIL model must declare the input '{_INPUT}'")
        dims = inputs[_INPUT]
        features = dims[-1] if dims else -1
        if features not in (-1, self.model.num_feature):
            raise InvalidArgumentError(
                f"{self._where}: input '{_INPUT}' has {features} features per row but '{self.model.path}' "
                f"expects {self.model.num_feature}"
            )

    def _init_cpu(self, engine: str | None, compile: bool) -> None:
        model = self.model
        if model.xgboost is not None:
            reference = xgboost_candidate(model.xgboost, self.threads)
        elif model.lightgbm is not None:
            reference = lightgbm_candidate(model.lightgbm, self.threads)
        else:
            reference = gtil_candidate(model.treelite, self.threads)
        self._expected = reference.predict(self._data[:_AGREEMENT_ROWS])
        if model.xgboost is not None:
            direct = xgboost_direct_candidate(model.xgboost, self.threads)
            if direct is not None and self._agrees(direct):
                reference = direct
        candidates = [reference]
        if reference.engine != "gtil":
            gtil = gtil_candidate(model.treelite, self.threads)
            if engine == "gtil" or self._agrees(gtil):
                candidates.append(gtil)

        if engine is not None and engine != "tl2cgen":
            forced = [c for c in candidates if c.engine == engine]
            if not forced and engine == "lightgbm" and model.model_type == "lightgbm" \
                    and optional_module("lightgbm") is None:
                raise MissingDependencyError("lightgbm", "lightgbm", f"{self._where} (engine 'lightgbm')")
            if not forced:
                raise InvalidArgumentError(f"{self._where}: engine '{engine}' cannot serve a {model.model_type} model")
            self._set_candidates(forced, calibrate=False)
            return
        self._candidates = candidates
        if engine == "tl2cgen":
            self._force_compiled()
            return
        if compile:
            builder = self._builder = Builder(model, self.threads, self._where)
            if not builder.available:
                self.compile_state = "unavailable"
                log_once(f"unavailable:{builder.reason}", logging.WARNING,
                          "FIL models are served without compiled trees: %s", builder.reason)
            else:
                cached = builder.cached()
                outcome = self._adopt(cached, from_cache=True) if cached is not None else "missing"
                if outcome == "disagrees":
                    self.compile_state = "failed"
                elif outcome != "ok":  # missing or unusable: build it, off the serving path
                    self.compile_state = "compiling"
                    self._thread = threading.Thread(
                        target=self._compile_in_background, daemon=True,
                        name=f"triton_nb-fil-compile[{self.context.instance_name}]",
                    )
        self._set_candidates(self._candidates, calibrate=True)

    def _force_compiled(self) -> None:
        builder = self._builder = Builder(self.model, self.threads, self._where)
        if not builder.available:
            raise UnavailableError(f"{self._where}: the tl2cgen engine is unavailable: {builder.reason}")
        from_cache = builder.cached() is not None
        try:
            path = builder.build()
        except (RuntimeError, OSError) as exc:
            raise UnavailableError(f"{self._where}: compiling the model with tl2cgen failed: {exc}") from exc
        outcome = self._adopt(path, from_cache=from_cache)
        if outcome != "ok":
            raise UnavailableError(f"{self._where}: the compiled library {path} is unusable ({outcome})")
        compiled = [c for c in self._candidates if c.engine == "tl2cgen"]
        # No calibration for a forced engine: one thread below 64 rows, all threads from there.
        self._candidates = compiled
        fixed = [0 if size < 64 else len(compiled) - 1 for size in CALIBRATION_SIZES]
        self._selector = Selector(compiled, fixed=fixed)

    def _adopt(self, path: Path, *, from_cache: bool) -> str:
        """Load a compiled library and add it to the candidates if it agrees with the reference.
        Returns "ok", "unloadable" (the file was removed) or "disagrees"."""
        try:
            library = CompiledLibrary(path)
        except (OSError, AttributeError, RuntimeError) as exc:
            # A damaged or foreign file: drop it so that a fresh one is built.
            log.warning("%s: ignoring compiled library %s: %s", self._where, path, exc)
            with contextlib.suppress(OSError):
                path.unlink()
            return "unloadable"
        new = [library.candidate(1)]
        if self.threads > 1:
            new.append(library.candidate(self.threads))
        if not all(self._agrees(candidate) for candidate in new):
            return "disagrees"
        self.compiled_from_cache = from_cache
        self._candidates = [*self._candidates, *new]
        self.compile_state = "ready"
        return "ok"

    def _agrees(self, candidate: Candidate) -> bool:
        got = candidate.predict(self._data[:_AGREEMENT_ROWS])
        expected = self._expected
        if got.shape == expected.shape and np.allclose(got, expected, rtol=_RTOL, atol=_ATOL, equal_nan=True):
            return True
        log_once(f"disagree:{self.model.file_hash}:{candidate.engine}", logging.WARNING,
                  "%s: engine '%s' disagrees with the reference predictions; not using it",
                  self._where, candidate.engine)
        return False

    def _set_candidates(self, candidates: list[Candidate], *, calibrate: bool,
                        stop: threading.Event | None = None) -> None:
        if not calibrate or len(candidates) == 1:
            timings: dict[str, dict[int, float]] = {}
            selector = Selector(candidates[:1])
        else:
            timings = time_candidates(candidates, self._data, stop)
            selector = Selector(candidates, timings)
            log.debug("%s: engines by batch size: %s", self._where,
                      {size: selector.best(band).label for band, size in enumerate(CALIBRATION_SIZES)})
        self._candidates = candidates
        self.timings = timings
        self._selector = selector  # one assignment: execute() sees the old selector or the new one

    def _compile_in_background(self) -> None:
        builder = self._builder
        assert builder is not None
        try:
            path = builder.build()
            if self._stop.is_set():
                raise Cancelled()
            before = self._candidates
            outcome = self._adopt(path, from_cache=False)
            if outcome == "ok":
                self.compile_state = "compiling"  # "ready" once calibrated
                self._set_candidates(self._candidates, calibrate=True, stop=self._stop)
                self.compile_state = "ready"
            else:
                self._candidates = before
                self.compile_state = "failed"
        except Cancelled:
            self.compile_state = "cancelled"
        except Exception as exc:  # the other engines keep serving
            self.compile_state = "failed"
            log_once(f"compile-failed:{builder.key}", logging.WARNING,
                      "%s: compiling with tl2cgen failed, serving with the other engines: %s", self._where, exc)
        finally:
            self._compile_done.set()

    def _init_gpu(self) -> None:
        model = self.model
        device = self.context.device_id
        if model.xgboost is not None and xgboost_cuda_available():  # pragma: no cover - needs a GPU
            booster = model.xgboost
            booster.set_param({"device": f"cuda:{device}"})

            def predict(x: np.ndarray) -> np.ndarray:
                with warnings.catch_warnings():  # host data for a CUDA booster: XGBoost copies it, and says so
                    warnings.simplefilter("ignore")
                    return as_rows(booster.inplace_predict(x, validate_features=False), x.shape[0])

            candidate = Candidate("xgboost", 0, predict)
        elif (cuml := optional_module("cuml")) is not None:  # pragma: no cover - needs a GPU
            if self.settings.treeshap_output:
                raise UnavailableError(
                    f"{self._where}: '{_SHAP}' on a GPU instance needs XGBoost with CUDA (cuML's FIL has no SHAP)"
                )
            candidate = self._cuml_candidate(cuml, device)
        else:
            raise UnavailableError(
                f"{self._where}: instance '{self.context.instance_name}' is KIND_GPU, but no GPU is available to it "
                "(XGBoost finds no usable CUDA device, and cuML is not installed); use KIND_CPU, or install cuML "
                "on a machine with a GPU"
            )
        self._set_candidates([candidate], calibrate=False)

    def _cuml_candidate(self, cuml: Any, device: int) -> Candidate:  # pragma: no cover - needs a GPU
        model = self.model
        classifier = self.settings.output_class
        try:
            forest = cuml.fil.ForestInference.load_from_treelite_model(
                model.treelite, is_classifier=classifier, device_id=device
            )
        except Exception as exc:
            raise UnavailableError(f"{self._where}: cuML's FIL cannot load '{model.path}': {exc}") from exc
        outputs = model.num_outputs

        def predict(x: np.ndarray) -> np.ndarray:
            if classifier:
                result = np.asarray(forest.predict_proba(x), dtype=np.float32).reshape(x.shape[0], -1)
                return result[:, -1:] if outputs == 1 else result
            return as_rows(forest.predict(x), x.shape[0])

        return Candidate("cuml", 0, predict)

    def _shap_function(self) -> Callable[[np.ndarray], np.ndarray]:
        model = self.model
        features, classes, threads = model.num_feature, model.num_outputs, self.threads
        per_row = (classes, features + 1) if classes > 1 else (features + 1,)
        if model.xgboost is not None:
            import xgboost as xgb

            booster = model.xgboost

            def shap(x: np.ndarray) -> np.ndarray:
                matrix = xgb.DMatrix(x, missing=np.nan, nthread=threads)
                # Binary/regression: (rows, features + 1); multiclass: (rows, classes, features + 1);
                # the bias is last, as in FIL.
                values = booster.predict(matrix, pred_contribs=True, validate_features=False)
                return np.asarray(values, dtype=np.float32).reshape(x.shape[0], *per_row)

            return shap
        if model.lightgbm is not None:
            booster = model.lightgbm

            def shap(x: np.ndarray) -> np.ndarray:
                # LightGBM lays a multiclass model's contributions out class by class, each block
                # features + 1 wide with the bias last: FIL's [classes, features + 1] once reshaped.
                values = booster.predict(x, pred_contrib=True, num_threads=threads)
                return np.asarray(values, dtype=np.float32).reshape(x.shape[0], *per_row)

            return shap
        if model.model_type == "lightgbm" and optional_module("lightgbm") is None:
            raise MissingDependencyError(
                "lightgbm", "lightgbm", f"{self._where}: output '{_SHAP}' (SHAP values of a LightGBM model)")
        if model.model_type == "treelite_checkpoint":
            reason = "triton_nb has no CPU TreeSHAP for Treelite checkpoints"
        elif model.model_type == "lightgbm":
            reason = "they are computed by LightGBM, which cannot read this file"
        else:
            reason = "they are computed by XGBoost, which cannot read this file"
        raise InvalidArgumentError(
            f"{self._where}: output '{_SHAP}' asks for SHAP values of '{model.path}' (model_type "
            f"'{model.model_type}'), but {reason}; serve the model as xgboost_json, xgboost_ubj or lightgbm, "
            f"or remove the '{_SHAP}' output from config.pbtxt"
        )

    def _check_outputs(self) -> None:
        """Fail the load when the declared output dims cannot hold what the model gives."""
        sample = self._data[:1]
        produced = {_OUTPUT: fil_output(_canonical(self._selector.best(0).predict(sample)), self.settings,
                                        self._proba_width)}
        if self._shap is not None:
            produced[_SHAP] = self._shap(sample)
        for name, values in produced.items():
            per_row = values.shape[1:]
            if int(np.prod(self._outputs[name])) != int(np.prod(per_row)):
                declared = next(list(o.dims) for o in self.context.config.output if o.name == name)
                raise InvalidArgumentError(
                    f"{self._where}: output '{name}' is declared with dims {declared}, but the model gives "
                    f"{list(per_row)} per row"
                )
        self._shapes = {name: self._outputs[name] for name in produced}

    # ------------------------------------------------------------------ introspection

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines that may serve this instance now."""
        return tuple(dict.fromkeys(c.engine for c in self._candidates))

    def engine_for(self, rows: int) -> str:
        """The engine a batch of ``rows`` rows goes to now."""
        return self._selector.best(bisect.bisect_right(BAND_EDGES, rows)).engine

    def wait_compiled(self, timeout_s: float | None = None, **deprecated: Any) -> bool:
        """Wait for the background compilation (and the calibration after it), at most ``timeout_s``
        seconds (None: as long as it takes); True when the compiled engine is in use. ``timeout``
        is the deprecated spelling of ``timeout_s``."""
        timeout_s = renamed("wait_compiled", deprecated, "timeout", "timeout_s", timeout_s, None)
        no_unknown("wait_compiled", deprecated)
        finished = self._compile_done.wait(timeout_s)
        return finished and self.compile_state == "ready"

    def wait_warm(self, timeout_s: float | None = None) -> bool:
        """Warm when the background compilation has ended, whichever way: a failed or disabled
        compile leaves the interpreted engines, which is this instance's steady speed."""
        return self._compile_done.wait(timeout_s)

    # ------------------------------------------------------------------ serving

    def execute(self, requests: list[InferRequest]) -> list[InferResponse]:
        name, version = self.context.name, self.context.version
        responses: list[InferResponse | None] = [None] * len(requests)
        arrays: list[np.ndarray] = []
        served: list[int] = []  # the indices of the requests that go into the batch
        features = self.model.num_feature
        for index, request in enumerate(requests):
            array = request.inputs.get(_INPUT)
            if array is not None and array.ndim == 1 and array.shape[0] == features:
                array = array.reshape(1, features)  # one row, answered as FIL answers a batch of one
            if array is None or array.ndim != 2 or array.shape[1] != features:
                got = "none" if array is None else f"shape {list(array.shape)}"
                responses[index] = InferResponse.failed(request, InvalidArgumentError(
                    f"{self._where}: input '{_INPUT}' must have shape [rows, {features}], got {got}"
                ), version)
                continue
            arrays.append(array)
            served.append(index)
        if arrays:
            x = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            if x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.aligned:
                # XGBoost's C API refuses data not aligned to its itemsize ("Input pointer misalignment");
                # a view into a request body can start anywhere
                x = np.require(x, np.float32, ("C", "A"))
            outputs = self._predict(x)
            start = 0
            for index, array in zip(served, arrays, strict=True):
                stop = start + array.shape[0]
                result = {key: value[start:stop] for key, value in outputs.items()}
                responses[index] = InferResponse(name, version, result, request_id=requests[index].request_id)
                start = stop
        return responses  # type: ignore[return-value]

    def _predict(self, x: np.ndarray) -> dict[str, np.ndarray]:
        rows = x.shape[0]
        shapes = self._shapes
        if rows == 0:
            return {key: np.zeros((0, *dims), dtype=np.float32) for key, dims in shapes.items()}
        selector = self._selector
        band = bisect.bisect_right(BAND_EDGES, rows)
        if selector.adaptive:
            index = selector.pick(band)
            started = time.perf_counter()
            predictions = selector.candidates[index].predict(x)
            selector.record(band, index, rows, time.perf_counter() - started)
        else:
            predictions = selector.best(band).predict(x)
        out = fil_output(_canonical(predictions), self.settings, self._proba_width)
        outputs = {_OUTPUT: out.reshape(rows, *shapes[_OUTPUT])}
        if self._shap is not None:
            outputs[_SHAP] = self._shap(x).reshape(rows, *shapes[_SHAP])
        return outputs

    def finalize(self) -> None:
        """Stop a compilation in progress (its compiler processes are killed) and join its thread."""
        self._stop.set()
        if self._builder is not None:
            self._builder.cancel()
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout=1.0)
            if thread.is_alive():  # inside tl2cgen's C code generation; it exits right after
                log.debug("%s: compile thread still finishing code generation", self._where)
