"""Triton's FIL backend, in process: tree models served on CPU with FIL's semantics.

A FIL model folder holds ``config.pbtxt`` and ``<version>/<file>``, the file chosen by the
``model_type`` parameter (``xgboost.json``, ``xgboost.ubj``, ``xgboost.model``, ``model.txt``,
``checkpoint.tl``). The file is parsed with Treelite, exactly as FIL parses it, so a file FIL
would refuse fails the load here too; the native library (XGBoost, LightGBM) loads it as well
when it is installed, for speed and for SHAP values.

Engines
-------
Up to four engines predict the same model, all giving the same float32 numbers:

* ``xgboost`` — XGBoost's predictor (XGBoost models), called through its C API
  (``XGBoosterPredictFromDense``, what ``inplace_predict`` calls, without its ~50 µs of Python per
  call) once checked against ``inplace_predict``: blocked traversal, the fastest from a few
  hundred rows up, but ~80 µs of fixed cost per call;
* ``lightgbm`` — ``Booster.predict`` (LightGBM models);
* ``gtil`` — Treelite's reference predictor, available for every model as soon as it loads;
* ``tl2cgen`` — the trees compiled to C by tl2cgen, plus a small dense-batch entry point of ours
  (:data:`_SHIM_SOURCE`) called through ctypes: no DMatrix, no per-call allocation in Python,
  rows split over OpenMP threads (the OpenMP runtime XGBoost or Treelite already use, see
  :func:`_openmp_runtime`). A few µs per row at batch 1, where the others cost 40-200 µs.

Which engine answers a batch is decided by measurement, not by a fixed rule (the crossover
between compiled if-else code and XGBoost's predictor moves with tree depth, tree count, feature
count, threads and the machine's load). At load, and again once the compiled library is ready,
every engine predicts 1, 8, 64, 512 and 4096 rows of synthetic data (values drawn between the
model's own split thresholds, 2% missing): the fastest (minimum over a few calls) wins each size
band, a band running from the geometric mean of its size and the next smaller one to that with
the next larger one. The compiled engine takes part twice, single-threaded and with
``cpu_nthread`` threads. The same pass checks that every engine agrees with the reference
(``inplace_predict``, LightGBM's ``predict``, else GTIL) to 1e-5 and drops one that does not.
While serving, :class:`_Selector` keeps timing the batches and now and then re-measures the other
engines on a live batch (~2% of the time at most), so the choice follows a machine that gets
busier or quieter.

Compilation runs in a background thread (C generation with tl2cgen, then the system C compiler
at low priority, one process per translation unit, killed on :meth:`FilBackend.finalize`);
serving never waits for it. Libraries are cached under ``$TRITON_NB_CACHE_DIR/tl2cgen`` (else
``$XDG_CACHE_HOME/triton_nb/tl2cgen``, else ``~/.cache/triton_nb/tl2cgen``), named by a hash of
the model file, its model_type, the tl2cgen and Treelite versions, the compiler and its flags,
and published with an atomic rename; a cached library is picked up synchronously at load. No C
compiler, no tl2cgen or no writable cache: the other engines serve, and a message is logged
once.

``KIND_GPU`` instances use XGBoost on CUDA (XGBoost models, when a CUDA device answers) or cuML's
FIL; when neither is there the load fails and says so.

SHAP values (an output named ``treeshap_output``) come from XGBoost (``pred_contribs``) or
LightGBM (``pred_contrib``), as FIL lays them out: ``num_features + 1`` values per row with the
bias last, ``[num_classes, num_features + 1]`` for a multiclass model. A Treelite checkpoint has
no CPU TreeSHAP here, so declaring that output fails its load.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import ctypes
import hashlib
import itertools
import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from triton_nb._native_logs import native_stderr_to_logging, route_native_logs
from triton_nb._optional import optional_module, xgboost_cuda_available
from triton_nb.backends.base import Backend, ModelContext
from triton_nb.repository.fil_semantics import FilSettings, fil_output
from triton_nb.errors import InvalidArgumentError, NotFoundError, UnavailableError
from triton_nb.repository.config import FIL_MODEL_FILENAMES, fil_parameters, model_filename
from triton_nb.tensors import InferRequest, InferResponse

__all__ = ["ENGINES", "FilBackend", "cache_directory"]

log = logging.getLogger(__name__)

#: Engine names, as :meth:`FilBackend.engine_for` reports them and ``engine=`` forces them.
ENGINES = ("xgboost", "lightgbm", "gtil", "tl2cgen")

_INPUT = "input__0"
_OUTPUT = "output__0"
_SHAP = "treeshap_output"

#: Batch sizes timed at calibration; a batch uses the engine that won the nearest size (in log scale).
_CALIBRATION_SIZES = (1, 8, 64, 512, 4096)
_BAND_EDGES = tuple(math.ceil(math.sqrt(a * b)) for a, b in itertools.pairwise(_CALIBRATION_SIZES))
_CALIBRATION_REPS = 7  # at most, per engine and size ...
_CALIBRATION_BUDGET_S = 0.025  # ... stopping once an engine has spent this long at one size (after 2 reps)
_AGREEMENT_ROWS = 512
_RTOL = _ATOL = 1e-5

# Compilation. -O1: on tl2cgen's deeply nested if-else code it compiles twice as fast as -O3 and
# the code runs as fast or faster (measured: 200 trees of depth 8, gcc 12).
_COMPILE_FLAGS = ("-O1", "-fPIC", "-std=c99")
_TREES_PER_UNIT = 8  # translation units of ~8 trees compile fastest in parallel
_MAX_UNITS = 64
_POLL_S = 0.02

_SHIM_VERSION = 1
# Our entry point, compiled into the library next to tl2cgen's code: a dense float32 batch in,
# ``rows x (N_TARGET * MAX_N_CLASS)`` float32 out. NaN means missing (tl2cgen marks a missing
# feature with ``missing = -1``). Rows are split in contiguous chunks over ``nthread`` OpenMP
# threads; ``predict`` accumulates into its result, which is zeroed for every row.
_SHIM_SOURCE = r"""
#include "header.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#ifndef TNB_LEAF_T
#define TNB_LEAF_T float
#endif
#define TNB_NOUT (N_TARGET * MAX_N_CLASS)

int32_t triton_nb_shim_version(void) { return TNB_SHIM_VERSION; }
int32_t triton_nb_num_outputs(void) { return TNB_NOUT; }

static void tnb_rows(const float* x, int64_t begin, int64_t end, int32_t ncol, int32_t nfeat,
                     union Entry* buf, float* out) {
  TNB_LEAF_T res[TNB_NOUT];
  for (int64_t i = begin; i < end; ++i) {
    const float* row = x + i * (int64_t)ncol;
    for (int32_t j = 0; j < nfeat; ++j) {
      if (j < ncol && !isnan(row[j])) {
        buf[j].fvalue = row[j];
      } else {
        buf[j].missing = -1;
      }
    }
    for (int k = 0; k < TNB_NOUT; ++k) res[k] = (TNB_LEAF_T)0;
    predict(buf, 0, res);
    float* o = out + i * (int64_t)TNB_NOUT;
    for (int k = 0; k < TNB_NOUT; ++k) o[k] = (float)res[k];
  }
}

int triton_nb_predict(const float* x, int64_t nrow, int32_t ncol, int32_t nthread, float* out) {
  int32_t nfeat = get_num_feature();
  if (nfeat < 1) nfeat = 1;
#ifdef _OPENMP
  if (nthread > 1 && nrow > 1) {
    int failed = 0;
    if ((int64_t)nthread > nrow) nthread = (int32_t)nrow;
#pragma omp parallel num_threads(nthread)
    {
      union Entry* buf = (union Entry*)malloc(sizeof(union Entry) * (size_t)nfeat);
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      int64_t chunk = (nrow + nt - 1) / nt;
      int64_t b = (int64_t)t * chunk, e = b + chunk < nrow ? b + chunk : nrow;
      if (!buf) {
#pragma omp atomic write
        failed = 1;
      } else if (b < e) {
        tnb_rows(x, b, e, ncol, nfeat, buf, out);
      }
      free(buf);
    }
    return failed ? -1 : 0;
  }
#endif
  union Entry* buf = (union Entry*)malloc(sizeof(union Entry) * (size_t)nfeat);
  if (!buf) return -1;
  tnb_rows(x, 0, nrow, ncol, nfeat, buf, out);
  free(buf);
  return 0;
}
"""

_logged_once: set[str] = set()
_logged_lock = threading.Lock()


def _log_once(key: str, level: int, message: str, *args: Any) -> None:
    with _logged_lock:
        if key in _logged_once:
            return
        _logged_once.add(key)
    log.log(level, message, *args)


# --------------------------------------------------------------------------------------------
# Loading the model file
# --------------------------------------------------------------------------------------------


@dataclass
class _LoadedModel:
    """One model file, parsed by Treelite and (when possible) by its native library."""

    path: Path
    model_type: str
    file_hash: str
    treelite: Any  # treelite.Model
    num_feature: int
    num_outputs: int  # values per row: 1 (binary, regression) or the number of classes
    xgboost: Any | None = None  # xgboost.Booster that predicts probabilities
    lightgbm: Any | None = None  # lightgbm.Booster


def _describe_load_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    # XGBoost and Treelite prefix messages with "[time] file:line:"; the first line says what failed.
    lines = [line.strip() for line in text if line.strip() and not line.strip().startswith("Stack trace")]
    message = lines[0] if lines else type(exc).__name__
    return re.sub(r"^\[[0-9:]+\]\s+\S+:\d+:\s*", "", message)[:500]


def _other_files_hint(version_dir: Path, model_type: str) -> str:
    """A model_type that does not match the file written is the usual cause of a missing file: name
    the FIL files the folder does hold, and the model_type that loads each."""
    present = [(other, name) for other, name in FIL_MODEL_FILENAMES.items()
               if other != model_type and (version_dir / name).is_file()]
    if not present:
        return ""
    listed = ", ".join(f"'{name}' (model_type '{other}')" for other, name in present)
    return f"; the version folder holds {listed}"


def _sniff_model_type(data: bytes) -> str | None:
    """The model_type a file's first bytes look like, when they say (binary formats mostly do not)."""
    head = data[:4096].lstrip()
    if head.startswith(b"{"):
        rest = head[1:].lstrip()
        if rest[:1] in (b'"', b"}"):
            return "xgboost_json"
        if rest[:1] and rest[:1] in b"UiIlL$#":  # UBJSON: a key's length marker follows the brace
            return "xgboost_ubj"
        return None
    if head.startswith(b"tree\n") or b"\nmax_feature_idx=" in head:
        return "lightgbm"
    return None


def _content_hint(data: bytes, model_type: str) -> str:
    """What a file that fails to load looks like: Treelite's own message for a file in another format
    is often a C++ detail (``basic_string::_M_replace_aux``), and a truncated file names no cause."""
    sniffed = _sniff_model_type(data)
    if sniffed is not None and sniffed != model_type:
        return f" (the file looks like model_type '{sniffed}', not '{model_type}')"
    if sniffed == "xgboost_json" and not data.rstrip().endswith(b"}"):
        return " (the JSON ends before it is complete: is the file truncated?)"
    if not data.strip():
        return " (the file is empty)"
    return ""


def _load_treelite(path: Path, model_type: str, allow_unknown_field: bool) -> Any:
    import treelite

    route_native_logs()

    if model_type == "xgboost_json":
        return treelite.frontend.load_xgboost_model(
            path, format_choice="json", allow_unknown_field=allow_unknown_field
        )
    if model_type == "xgboost_ubj":
        return treelite.frontend.load_xgboost_model(
            path, format_choice="ubjson", allow_unknown_field=allow_unknown_field
        )
    if model_type == "xgboost":
        return treelite.frontend.load_xgboost_model_legacy_binary(path)
    if model_type == "lightgbm":
        return treelite.frontend.load_lightgbm_model(path)
    return treelite.Model.deserialize(path)


def _load_xgboost(data: bytes, path: Path) -> Any | None:
    """The file as an ``xgboost.Booster`` predicting probabilities, or None when XGBoost cannot read
    what Treelite could (the legacy binary format, which XGBoost 3 dropped, or fields this XGBoost
    does not know): Treelite's engines serve it then."""
    import xgboost as xgb

    booster = xgb.Booster()
    try:
        booster.load_model(bytearray(data))
    except xgb.core.XGBoostError as exc:
        _log_once(f"xgb-unreadable:{path}", logging.WARNING, "XGBoost cannot read %s (%s); Treelite serves it",
                  path, _describe_load_error(exc))
        return None
    if json.loads(booster.save_config())["learner"]["objective"]["name"] == "multi:softmax":
        # FIL (Treelite) answers a multi:softmax model with its class probabilities, as softprob would.
        booster.set_param({"objective": "multi:softprob"})
    return booster


def _model_outputs(tl_model: Any) -> tuple[int, int]:
    """``(num_target, values per row)`` of a Treelite model."""
    header = tl_model.get_header_accessor()
    num_target = int(np.asarray(header.get_field("num_target")).reshape(-1)[0])
    num_class = np.asarray(header.get_field("num_class")).reshape(-1)
    return num_target, int(num_class.max()) if num_class.size else 1


def _load_model(context: ModelContext, model_type: str, parameters: dict[str, str]) -> _LoadedModel:
    filename = model_filename(context.config) or FIL_MODEL_FILENAMES[model_type]
    path = Path(context.version_path) / filename
    where = f"model '{context.name}' version {context.version}"
    if not path.is_file():
        raise NotFoundError(
            f"{where}: FIL model file '{path}' is missing (model_type '{model_type}' loads '{filename}' "
            f"from the version folder){_other_files_hint(path.parent, model_type)}"
        )
    data = path.read_bytes()

    def invalid(exc: BaseException) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{where}: cannot load FIL model file '{path}' as model_type '{model_type}': {_describe_load_error(exc)}"
            f"{_content_hint(data, model_type)}"
        )

    try:
        tl_model = _load_treelite(path, model_type, parameters.get("xgboost_allow_unknown_field") == "true")
    except Exception as exc:
        raise invalid(exc) from exc
    num_target, num_outputs = _model_outputs(tl_model)
    if num_target != 1:
        raise InvalidArgumentError(
            f"{where}: '{path}' is a multi-target model ({num_target} targets); FIL serves single-target models"
        )
    loaded = _LoadedModel(
        path=path,
        model_type=model_type,
        file_hash=hashlib.sha256(data).hexdigest(),
        treelite=tl_model,
        num_feature=int(tl_model.num_feature),
        num_outputs=num_outputs,
    )
    if model_type.startswith("xgboost"):
        loaded.xgboost = _load_xgboost(data, path)
    elif model_type == "lightgbm" and (lgb := optional_module("lightgbm")) is not None:
        try:
            loaded.lightgbm = lgb.Booster(model_str=data.decode("utf-8", errors="replace"))
        except Exception as exc:  # Treelite read it: its engines serve it
            _log_once(f"lgb-unreadable:{path}", logging.WARNING, "LightGBM cannot read %s (%s); Treelite serves it",
                      path, _describe_load_error(exc))
    return loaded


# --------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    """One way to predict: an engine at a thread count. ``predict`` returns ``(rows, outputs)`` float32."""

    engine: str
    threads: int
    predict: Callable[[np.ndarray], np.ndarray]

    @property
    def label(self) -> str:
        return f"{self.engine}/{self.threads}"


def _as_rows(predictions: Any, rows: int) -> np.ndarray:
    return np.asarray(predictions, dtype=np.float32).reshape(rows, -1)


def _xgboost_candidate(booster: Any, threads: int) -> _Candidate:
    """``Booster.inplace_predict``, XGBoost's public API (the reference for XGBoost models)."""
    booster.set_param({"nthread": threads})

    def predict(x: np.ndarray) -> np.ndarray:
        return _as_rows(booster.inplace_predict(x, validate_features=False), x.shape[0])

    return _Candidate("xgboost", threads, predict)


def _xgboost_direct_candidate(booster: Any, threads: int) -> _Candidate | None:
    """The same prediction through XGBoost's C API (``XGBoosterPredictFromDense``), which
    ``inplace_predict`` calls after ~40-80 µs of Python work per call (type checks, JSON, a ctypes
    class built per call): 10% of a 512-row batch. None when this XGBoost does not offer it; the
    caller checks it agrees with :func:`_xgboost_candidate` before using it."""
    try:
        from xgboost import core

        function = core._LIB.XGBoosterPredictFromDense
        check = core._check_call
        args = core.make_jcargs(type=0, training=False, iteration_begin=0, iteration_end=0, missing=float("nan"),
                                strict_shape=False, cache_id=0)
    except (ImportError, AttributeError, TypeError):
        return None
    booster.set_param({"nthread": threads})
    no_proxy = ctypes.c_void_p()
    float_p, ulong_p = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_uint64)

    def predict(x: np.ndarray) -> np.ndarray:
        rows, columns = x.shape
        interface = b'{"data": [%d, true], "shape": [%d, %d], "typestr": "<f4", "version": 3}' % (
            x.ctypes.data, rows, columns)
        shape, dims, values = ulong_p(), ctypes.c_uint64(), float_p()
        check(function(booster.handle, interface, args, no_proxy, ctypes.byref(shape), ctypes.byref(dims),
                       ctypes.byref(values)))
        size = 1
        for axis in range(dims.value):
            size *= shape[axis]
        # The result lives in a per-thread buffer of the booster: copy it out before the next call.
        out = np.empty(size, dtype=np.float32)
        ctypes.memmove(out.ctypes.data, values, size * 4)
        return out.reshape(rows, -1)

    return _Candidate("xgboost", threads, predict)


def _lightgbm_candidate(booster: Any, threads: int) -> _Candidate:
    def predict(x: np.ndarray) -> np.ndarray:
        return _as_rows(booster.predict(x, num_threads=threads), x.shape[0])

    return _Candidate("lightgbm", threads, predict)


def _gtil_candidate(tl_model: Any, threads: int) -> _Candidate:
    from treelite import gtil

    def predict(x: np.ndarray) -> np.ndarray:
        return _as_rows(gtil.predict(tl_model, x, nthread=threads), x.shape[0])

    return _Candidate("gtil", threads, predict)


class _CompiledLibrary:
    """A shared library built from the model by tl2cgen, with our dense-batch entry point."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        if self._lib.triton_nb_shim_version() != _SHIM_VERSION:
            raise RuntimeError(f"{path} was built for another version of triton_nb")
        self._lib.triton_nb_num_outputs.restype = ctypes.c_int32
        self._lib.get_num_feature.restype = ctypes.c_int32
        self.num_outputs = int(self._lib.triton_nb_num_outputs())
        self.num_feature = int(self._lib.get_num_feature())
        fn = self._lib.triton_nb_predict
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        self._predict = fn  # ctypes releases the GIL for the call

    def candidate(self, threads: int) -> _Candidate:
        fn = self._predict
        num_outputs = self.num_outputs

        def predict(x: np.ndarray) -> np.ndarray:
            rows = x.shape[0]
            out = np.empty((rows, num_outputs), dtype=np.float32)
            if fn(x.ctypes.data, rows, x.shape[1], threads, out.ctypes.data) != 0:
                raise MemoryError("the compiled tree model could not allocate its work buffer")
            return out

        return _Candidate("tl2cgen", threads, predict)


# --------------------------------------------------------------------------------------------
# Compiling with tl2cgen, cached on disk
# --------------------------------------------------------------------------------------------


def cache_directory() -> Path:
    """Where compiled tree libraries are cached: ``$TRITON_NB_CACHE_DIR/tl2cgen``, else
    ``$XDG_CACHE_HOME/triton_nb/tl2cgen``, else ``~/.cache/triton_nb/tl2cgen``."""
    root = os.environ.get("TRITON_NB_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "tl2cgen"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "triton_nb" / "tl2cgen"


def _tl2cgen() -> Any | None:
    """The tl2cgen module, or None (a seam for tests)."""
    module = optional_module("tl2cgen")
    if module is not None:
        route_native_logs()
    return module


def _find_compiler() -> list[str] | None:
    """The C compiler command: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH (None: none)."""
    if sys.platform == "win32":
        return None
    env = os.environ.get("CC", "").strip()
    if env:
        args = shlex.split(env)
        found = shutil.which(args[0])
        return [found, *args[1:]] if found else None
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


@dataclass(frozen=True)
class _CompilerInfo:
    identity: str  # the command and the first line of its --version
    openmp: bool  # -fopenmp compiles and links
    gcc: bool  # GCC proper (its OpenMP code calls libgomp), not clang


_compiler_info: dict[tuple[str, ...], _CompilerInfo | None] = {}
_compiler_info_lock = threading.Lock()


def _compiler_identity(compiler: Sequence[str]) -> _CompilerInfo | None:
    """What a compiler is and whether OpenMP works with it, probed once per process; None: unusable."""
    key = tuple(compiler)
    with _compiler_info_lock:
        if key in _compiler_info:
            return _compiler_info[key]
        try:
            version = subprocess.run([*key, "--version"], capture_output=True, text=True, timeout=30, check=True)
            text = version.stdout.strip()
            with tempfile.TemporaryDirectory(prefix="triton_nb-omp-") as tmp:
                source = Path(tmp) / "probe.c"
                source.write_text("#include <omp.h>\nint probe(void) { return omp_get_max_threads(); }\n")
                probe = subprocess.run(
                    [*key, "-shared", "-fPIC", "-fopenmp", "-o", str(Path(tmp) / "probe.so"), str(source)],
                    capture_output=True, timeout=60,
                )
            lowered = text.lower()
            result: _CompilerInfo | None = _CompilerInfo(
                identity=f"{' '.join(key)}: {text.splitlines()[0] if text else ''}",
                openmp=probe.returncode == 0,
                gcc="clang" not in lowered and ("gcc" in lowered or "free software foundation" in lowered),
            )
        except (OSError, subprocess.SubprocessError):
            result = None
        _compiler_info[key] = result
        return result


def _bundled_openmp(package: str) -> Path | None:
    """The libgomp a manylinux wheel of ``package`` bundles (``<site-packages>/<package>.libs``)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        return None
    libs = Path(spec.origin).resolve().parent.parent / f"{package}.libs"
    found = sorted(libs.glob("libgomp*.so*")) if libs.is_dir() else []
    return found[0] if found else None


def _openmp_runtime(model: _LoadedModel, compiler: _CompilerInfo) -> Path | None:
    """The OpenMP runtime to link the compiled model against: the one its other engines use.

    XGBoost and Treelite wheels bundle their own libgomp. Two OpenMP runtimes in one process each
    keep a team of threads spinning for a while after every parallel region, and on a machine with
    few cores each team then waits for the other's spinning threads to be descheduled: measured
    on 2 cores, 64 rows took 3.4 ms instead of 0.2 ms right after an XGBoost call. Sharing one
    runtime shares one (already warm) thread team. LightGBM uses the system's libgomp, which
    ``-fopenmp`` links by default (None here).
    """
    if not (compiler.openmp and compiler.gcc and sys.platform.startswith("linux")):
        return None
    if model.xgboost is not None:
        return _bundled_openmp("xgboost")
    if model.lightgbm is None:
        return _bundled_openmp("treelite")
    return None


class _Cancelled(Exception):
    pass


_key_locks: dict[str, threading.Lock] = {}
_key_locks_guard = threading.Lock()
_live_builders: weakref.WeakSet[_Builder] = weakref.WeakSet()


def _key_lock(key: str) -> threading.Lock:
    with _key_locks_guard:
        return _key_locks.setdefault(key, threading.Lock())


@atexit.register
def _cancel_all_builds() -> None:
    for builder in list(_live_builders):
        builder.cancel()


class _Builder:
    """Finds or builds the compiled library of one model; cancellable from another thread.

    Builds of the same library inside this process are serialised (the second finds the first's
    result in the cache); across processes the atomic rename makes concurrent builds harmless.
    """

    def __init__(self, model: _LoadedModel, threads: int, label: str) -> None:
        self.model = model
        self.label = label
        self.jobs = max(1, threads)
        self.reason = ""  # why there is no library, when there is none
        self._stop = threading.Event()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._procs_lock = threading.Lock()
        self._launched = 0
        self.library_path: Path | None = None
        tl2cgen = _tl2cgen()
        compiler = _find_compiler()
        identity = _compiler_identity(compiler) if compiler else None
        if tl2cgen is None:
            self.reason = "tl2cgen is not installed (pip install tl2cgen)"
        elif compiler is None or identity is None:
            self.reason = "no working C compiler was found (set CC, or install gcc or clang)"
        if self.reason:
            self.compiler: list[str] = []
            self.openmp = False
            self.key = ""
            return
        import treelite

        assert compiler is not None and identity is not None and tl2cgen is not None
        self.compiler = compiler
        self.openmp = identity.openmp
        self.flags = [*_COMPILE_FLAGS, *(["-fopenmp"] if self.openmp else [])]
        self.runtime = _openmp_runtime(model, identity)
        digest = hashlib.sha256()
        for part in (model.file_hash, model.model_type, tl2cgen.__version__, treelite.__version__, identity.identity,
                     " ".join(self.flags), str(self.runtime), str(_SHIM_VERSION),
                     hashlib.sha256(_SHIM_SOURCE.encode()).hexdigest(), sys.platform, os.uname().machine):
            digest.update(part.encode())
            digest.update(b"\0")
        self.key = digest.hexdigest()[:32]
        self.library_path = cache_directory() / f"{self.key}{_library_suffix()}"
        _live_builders.add(self)

    @property
    def available(self) -> bool:
        return not self.reason

    def cached(self) -> Path | None:
        path = self.library_path
        return path if path is not None and path.is_file() else None

    def cancel(self) -> None:
        self._stop.set()
        with self._procs_lock:
            procs = list(self._procs)
        for proc in procs:
            with contextlib.suppress(OSError):
                proc.kill()

    def _check(self) -> None:
        if self._stop.is_set():
            raise _Cancelled()

    def build(self) -> Path:
        """The library's path, from the cache or compiled now (raises _Cancelled, RuntimeError)."""
        assert self.library_path is not None
        lock = _key_lock(self.key)
        while not lock.acquire(timeout=0.1):
            self._check()
        try:
            self._check()
            cached = self.cached()
            if cached is not None:
                return cached
            return self._compile()
        finally:
            lock.release()

    def _compile(self) -> Path:
        tl2cgen = _tl2cgen()
        assert tl2cgen is not None and self.library_path is not None
        cache = self.library_path.parent
        try:
            cache.mkdir(parents=True, exist_ok=True)
            _remove_stale_builds(cache)
            workdir = Path(tempfile.mkdtemp(prefix=f".build-{self.key}-", dir=cache))
        except OSError as exc:
            raise RuntimeError(f"cannot write the cache directory {cache}: {exc}") from exc
        try:
            units = max(1, min(_MAX_UNITS, math.ceil(self.model.treelite.num_tree / _TREES_PER_UNIT)))
            params = {"parallel_comp": units} if units > 1 else {}
            # TL2cgen's own Treelite writes to stderr when it reads the model (see _native_logs)
            with native_stderr_to_logging("tl2cgen"):
                tl2cgen.generate_c_code(self.model.treelite, str(workdir), params)
            self._check()
            header = (workdir / "header.h").read_text()
            match = re.search(r"void\s+predict\s*\(\s*union\s+Entry\s*\*\s*\w+\s*,\s*int\s+\w+\s*,\s*(\w+)\s*\*",
                              header)
            leaf_type = match.group(1) if match else "float"
            (workdir / "triton_nb_shim.c").write_text(_SHIM_SOURCE)
            defines = [f"-DTNB_LEAF_T={leaf_type}", f"-DTNB_SHIM_VERSION={_SHIM_VERSION}"]
            sources = sorted(workdir.glob("*.c"), key=lambda p: -p.stat().st_size)  # longest first
            objects = [source.with_suffix(".o") for source in sources]
            commands = [[*self.compiler, "-c", *self.flags, *defines, "-o", str(obj), str(src)]
                        for src, obj in zip(sources, objects, strict=True)]
            self._run_all(commands, workdir)
            target = workdir / f"model{_library_suffix()}"
            link = [*self.compiler, "-shared", *_COMPILE_FLAGS, "-o", str(target), *map(str, objects), "-lm"]
            default_link = [*link, *(["-fopenmp"] if self.openmp else [])]
            if self.runtime is None:
                self._run_all([default_link], workdir)
            else:
                # Link the OpenMP runtime the other engines use (see _openmp_runtime), not the system's.
                try:
                    self._run_all([[*link, str(self.runtime), f"-Wl,-rpath,{self.runtime.parent}"]], workdir)
                except RuntimeError as exc:
                    log.debug("%s: linking against %s failed (%s); using the default", self.label, self.runtime, exc)
                    self._run_all([default_link], workdir)
            self._check()
            os.replace(target, self.library_path)  # atomic: readers see no library or a whole one
            return self.library_path
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _run_all(self, commands: list[list[str]], workdir: Path) -> None:
        """Run the commands, ``self.jobs`` at a time, at low priority; raise on the first failure."""
        nice = shutil.which("nice")
        pending = list(commands)
        running: list[tuple[subprocess.Popen[bytes], Path]] = []
        try:
            while pending or running:
                self._check()
                while pending and len(running) < self.jobs:
                    command = pending.pop(0)
                    self._launched += 1
                    log_path = workdir / f"cc-{self._launched}.log"
                    with open(log_path, "wb") as log_file:
                        proc = subprocess.Popen(
                            [nice, "-n", "10", *command] if nice else command,
                            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, cwd=workdir,
                        )
                    with self._procs_lock:
                        self._procs.append(proc)
                    running.append((proc, log_path))
                    self._check()
                time.sleep(_POLL_S)
                for proc, log_path in list(running):
                    if proc.poll() is None:
                        continue
                    running.remove((proc, log_path))
                    with self._procs_lock:
                        self._procs.remove(proc)
                    self._check()
                    if proc.returncode != 0:
                        output = log_path.read_text(errors="replace").strip().splitlines()
                        raise RuntimeError(
                            f"the C compiler failed (exit {proc.returncode}): {' | '.join(output[-5:])[:800]}"
                        )
        finally:
            for proc, _ in running:
                with contextlib.suppress(OSError):
                    proc.kill()
                with contextlib.suppress(subprocess.SubprocessError):
                    proc.wait(timeout=5)
                with self._procs_lock, contextlib.suppress(ValueError):
                    self._procs.remove(proc)


def _remove_stale_builds(cache: Path, age_s: float = 24 * 3600) -> None:
    """Remove build folders a killed process left behind (a day old: no build takes that long)."""
    now = time.time()
    for folder in cache.glob(".build-*"):
        with contextlib.suppress(OSError):
            if now - folder.stat().st_mtime > age_s:
                shutil.rmtree(folder, ignore_errors=True)


def _library_suffix() -> str:
    return ".dylib" if sys.platform == "darwin" else ".so"


# --------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------


def _calibration_data(tl_model: Any, num_feature: int, rows: int = max(_CALIBRATION_SIZES)) -> np.ndarray:
    """Rows whose values fall between the model's own split thresholds (so they walk realistic
    paths), with 2% missing values."""
    rng = np.random.default_rng(20240601)
    data = rng.standard_normal((rows, num_feature)).astype(np.float32)
    try:
        features, thresholds = [], []
        for tree in range(min(int(tl_model.num_tree), 64)):
            accessor = tl_model.get_tree_accessor(tree)
            internal = np.asarray(accessor.get_field("cleft")) >= 0
            features.append(np.asarray(accessor.get_field("split_index"))[internal])
            thresholds.append(np.asarray(accessor.get_field("threshold"), dtype=np.float64)[internal])
        split_features = np.concatenate(features) if features else np.zeros(0, dtype=np.int64)
        split_values = np.concatenate(thresholds) if thresholds else np.zeros(0)
        for feature in range(num_feature):
            values = np.unique(split_values[(split_features == feature) & np.isfinite(split_values)])
            if values.size == 0:
                continue
            spread = float(values[-1] - values[0]) or 1.0
            low = np.concatenate(([values[0] - 0.1 * spread], values))
            high = np.concatenate((values, [values[-1] + 0.1 * spread]))
            cell = rng.integers(0, low.size, rows)
            data[:, feature] = rng.uniform(low[cell], high[cell]).astype(np.float32)
    except Exception:  # an exotic model: normal noise still measures speed
        log.debug("calibration data from thresholds failed; using normal noise", exc_info=True)
    data[rng.random(data.shape) < 0.02] = np.nan
    return np.ascontiguousarray(data)


def _time_candidates(candidates: Sequence[_Candidate], data: np.ndarray,
                     stop: threading.Event | None = None) -> dict[str, dict[int, float]]:
    """Seconds per call of each candidate at each calibration size: the minimum over a few
    consecutive calls, after one warm-up call (consecutive, as a run of equal batches would be
    served, so one engine's threads do not measure another's)."""
    timings: dict[str, dict[int, float]] = {c.label: {} for c in candidates}
    for size in _CALIBRATION_SIZES:
        x = data[:size]
        for candidate in candidates:
            if stop is not None and stop.is_set():
                raise _Cancelled()
            start = time.perf_counter()
            candidate.predict(x)  # warm-up, timed only to size the budget
            best, spent = math.inf, time.perf_counter() - start
            for rep in range(_CALIBRATION_REPS):
                if rep >= 2 and spent >= _CALIBRATION_BUDGET_S:
                    break
                start = time.perf_counter()
                candidate.predict(x)
                elapsed = time.perf_counter() - start
                spent += elapsed
                best = min(best, elapsed)
            timings[candidate.label][size] = best
    return timings


class _Selector:
    """Which candidate serves a batch: the cheapest per row in its size band, kept up to date.

    Each candidate has an estimate of its per-row cost in each band (in log scale), from the
    calibration first and then from the batches it serves: every sample moves the estimate half
    way towards it, a slower sample by at most 13% (so one preempted call hardly counts, while a
    lasting slowdown shows within a few batches). The cheapest estimate serves, switching only for
    a 10% gain; every other candidate is re-measured on a live batch now and then (engines give the
    same outputs, so that is safe), at intervals that keep the cost of all re-measuring to ~2% on
    average: ``(its cost / best cost - 1) * (candidates - 1) / 0.02`` batches, between 8 and 4096,
    brought forward when the best gets 10% slower. So when the machine gets busier — which hurts
    multi-threaded engines most — the choice follows.

    Only the serving thread calls :meth:`pick` and :meth:`record`; a recalibration replaces the
    whole selector.
    """

    _ALPHA = 0.5
    _MAX_RISE = 0.25  # log units per sample, before _ALPHA
    _SWITCH = math.log(0.9)
    _RESCHEDULE = math.log(1.1)  # the best got 10% slower: bring the re-measuring forward
    _OVERHEAD = 0.02  # of all re-measuring together, on average
    _MIN_INTERVAL, _MAX_INTERVAL = 8, 4096

    def __init__(self, candidates: Sequence[_Candidate], timings: dict[str, dict[int, float]] | None = None,
                 fixed: Sequence[int] | None = None) -> None:
        self.candidates = tuple(candidates)
        bands = len(_CALIBRATION_SIZES)
        count = len(self.candidates)
        self.adaptive = fixed is None and count > 1 and bool(timings)
        self._cost = [[0.0] * count for _ in range(bands)]  # log(seconds per row)
        self._calls = [0] * bands
        self._next_probe = [[0] * count for _ in range(bands)]
        self._soonest: list[float] = [math.inf] * bands  # the earliest re-measuring due in each band
        self._best = list(fixed) if fixed is not None else [0] * bands
        self._anchor = [0.0] * bands  # the best's cost when the re-measuring was last scheduled
        self._others = max(1, count - 1)
        if not self.adaptive:
            return
        assert timings is not None
        for band, size in enumerate(_CALIBRATION_SIZES):
            costs = self._cost[band]
            for index, candidate in enumerate(self.candidates):
                costs[index] = math.log(max(timings[candidate.label][size], 1e-9) / size)
            best = self._best[band] = min(range(count), key=costs.__getitem__)
            self._anchor[band] = costs[best]
            for index in range(count):
                if index != best:
                    self._next_probe[band][index] = self._interval(costs[index] - costs[best])
            self._update_soonest(band)

    def _interval(self, log_ratio: float) -> int:
        excess = math.exp(min(log_ratio, 20.0)) - 1.0
        return max(self._MIN_INTERVAL, min(self._MAX_INTERVAL, math.ceil(excess * self._others / self._OVERHEAD)))

    def _update_soonest(self, band: int) -> None:
        best = self._best[band]
        self._soonest[band] = min((due for i, due in enumerate(self._next_probe[band]) if i != best),
                                  default=math.inf)

    def best(self, band: int) -> _Candidate:
        return self.candidates[self._best[band]]

    def pick(self, band: int) -> int:
        """The candidate for the next batch in ``band``: the best, or one due for re-measuring."""
        best = self._best[band]
        if not self.adaptive:
            return best
        calls = self._calls[band] = self._calls[band] + 1
        if calls < self._soonest[band]:
            return best
        for index, due in enumerate(self._next_probe[band]):
            if index != best and calls >= due:
                return index
        return best

    def record(self, band: int, index: int, rows: int, seconds: float) -> None:
        """What serving a batch of ``rows`` rows with candidate ``index`` cost."""
        costs = self._cost[band]
        step = math.log(max(seconds, 1e-9) / rows) - costs[index]
        cost = costs[index] = costs[index] + self._ALPHA * min(step, self._MAX_RISE)
        best = self._best[band]
        if index == best:  # the usual case: nothing to do unless the best got clearly slower
            anchor = self._anchor[band]
            if cost < anchor:
                self._anchor[band] = cost
                return
            if cost < anchor + self._RESCHEDULE:
                return
        calls = self._calls[band]
        probes = self._next_probe[band]
        if index != best:
            probes[index] = calls + self._interval(costs[index] - costs[best])
        cheapest = min(range(len(costs)), key=costs.__getitem__)
        if cheapest != best and costs[cheapest] - costs[best] < self._SWITCH:
            self._best[band] = best = cheapest
        self._anchor[band] = costs[best]
        # A best that got slower (or a new best) brings the re-measuring of the others forward.
        for other, cost in enumerate(costs):
            if other != best:
                probes[other] = min(probes[other], calls + self._interval(cost - costs[best]))
        self._update_soonest(band)


# --------------------------------------------------------------------------------------------
# The backend
# --------------------------------------------------------------------------------------------


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

    rows_independent = True  # a batch is one prediction call over its rows; it fails as a whole

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
        self._batching = config.max_batch_size > 0
        self._outputs = {o.name: list(o.dims) for o in config.output}
        if _OUTPUT not in self._outputs:
            raise InvalidArgumentError(f"{self._where}: a FIL model must declare the output '{_OUTPUT}'")
        self._proba_width = 2 if (self._outputs[_OUTPUT] or [1])[-1] == 2 else 1
        self.model = _load_model(context, self.settings.model_type, parameters)
        self._check_input()

        self.compile_state = "disabled"
        self.compiled_from_cache = False
        self.timings: dict[str, dict[int, float]] = {}
        self._stop = threading.Event()
        self._compile_done = threading.Event()
        self._thread: threading.Thread | None = None
        self._builder: _Builder | None = None
        self._data = _calibration_data(self.model.treelite, self.model.num_feature)
        self._candidates: list[_Candidate] = []
        self._selector = _Selector([])
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
            reference = _xgboost_candidate(model.xgboost, self.threads)
        elif model.lightgbm is not None:
            reference = _lightgbm_candidate(model.lightgbm, self.threads)
        else:
            reference = _gtil_candidate(model.treelite, self.threads)
        self._expected = reference.predict(self._data[:_AGREEMENT_ROWS])
        if model.xgboost is not None:
            direct = _xgboost_direct_candidate(model.xgboost, self.threads)
            if direct is not None and self._agrees(direct):
                reference = direct
        candidates = [reference]
        if reference.engine != "gtil":
            gtil = _gtil_candidate(model.treelite, self.threads)
            if engine == "gtil" or self._agrees(gtil):
                candidates.append(gtil)

        if engine is not None and engine != "tl2cgen":
            forced = [c for c in candidates if c.engine == engine]
            if not forced:
                raise InvalidArgumentError(f"{self._where}: engine '{engine}' cannot serve a {model.model_type} model")
            self._set_candidates(forced, calibrate=False)
            return
        self._candidates = candidates
        if engine == "tl2cgen":
            self._force_compiled()
            return
        if compile:
            builder = self._builder = _Builder(model, self.threads, self._where)
            if not builder.available:
                self.compile_state = "unavailable"
                _log_once(f"unavailable:{builder.reason}", logging.WARNING,
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
        builder = self._builder = _Builder(self.model, self.threads, self._where)
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
        fixed = [0 if size < 64 else len(compiled) - 1 for size in _CALIBRATION_SIZES]
        self._selector = _Selector(compiled, fixed=fixed)

    def _adopt(self, path: Path, *, from_cache: bool) -> str:
        """Load a compiled library and add it to the candidates if it agrees with the reference.
        Returns "ok", "unloadable" (the file was removed) or "disagrees"."""
        try:
            library = _CompiledLibrary(path)
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

    def _agrees(self, candidate: _Candidate) -> bool:
        got = candidate.predict(self._data[:_AGREEMENT_ROWS])
        expected = self._expected
        if got.shape == expected.shape and np.allclose(got, expected, rtol=_RTOL, atol=_ATOL, equal_nan=True):
            return True
        _log_once(f"disagree:{self.model.file_hash}:{candidate.engine}", logging.WARNING,
                  "%s: engine '%s' disagrees with the reference predictions; not using it",
                  self._where, candidate.engine)
        return False

    def _set_candidates(self, candidates: list[_Candidate], *, calibrate: bool,
                        stop: threading.Event | None = None) -> None:
        if not calibrate or len(candidates) == 1:
            timings: dict[str, dict[int, float]] = {}
            selector = _Selector(candidates[:1])
        else:
            timings = _time_candidates(candidates, self._data, stop)
            selector = _Selector(candidates, timings)
            log.debug("%s: engines by batch size: %s", self._where,
                      {size: selector.best(band).label for band, size in enumerate(_CALIBRATION_SIZES)})
        self._candidates = candidates
        self.timings = timings
        self._selector = selector  # one assignment: execute() sees the old selector or the new one

    def _compile_in_background(self) -> None:
        builder = self._builder
        assert builder is not None
        try:
            path = builder.build()
            if self._stop.is_set():
                raise _Cancelled()
            before = self._candidates
            outcome = self._adopt(path, from_cache=False)
            if outcome == "ok":
                self.compile_state = "compiling"  # "ready" once calibrated
                self._set_candidates(self._candidates, calibrate=True, stop=self._stop)
                self.compile_state = "ready"
            else:
                self._candidates = before
                self.compile_state = "failed"
        except _Cancelled:
            self.compile_state = "cancelled"
        except Exception as exc:  # the other engines keep serving
            self.compile_state = "failed"
            _log_once(f"compile-failed:{builder.key}", logging.WARNING,
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
                    return _as_rows(booster.inplace_predict(x, validate_features=False), x.shape[0])

            candidate = _Candidate("xgboost", 0, predict)
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

    def _cuml_candidate(self, cuml: Any, device: int) -> _Candidate:  # pragma: no cover - needs a GPU
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
            return _as_rows(forest.predict(x), x.shape[0])

        return _Candidate("cuml", 0, predict)

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
        if model.model_type == "treelite_checkpoint":
            reason = "triton_nb has no CPU TreeSHAP for Treelite checkpoints"
        elif model.model_type == "lightgbm":
            reason = "they are computed by LightGBM, which is not installed"
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
            dims = self._outputs[name]
            per_row = values.shape[1:]
            size = int(np.prod(per_row))
            if -1 in dims:
                fixed = int(np.prod([d for d in dims if d != -1]))
                fits = dims.count(-1) == 1 and size % max(fixed, 1) == 0
            else:
                fits = int(np.prod(dims)) == size
            if not fits:
                raise InvalidArgumentError(
                    f"{self._where}: output '{name}' is declared with dims {dims}, but the model gives "
                    f"{list(per_row)} per row"
                )
        self._shapes = {name: tuple(self._outputs[name]) for name in produced}

    # ------------------------------------------------------------------ introspection

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines that may serve this instance now."""
        return tuple(dict.fromkeys(c.engine for c in self._candidates))

    def engine_for(self, rows: int) -> str:
        """The engine a batch of ``rows`` rows goes to now."""
        return self._selector.best(bisect.bisect_right(_BAND_EDGES, rows)).engine

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait for the background compilation (and the calibration after it); True when the
        compiled engine is in use."""
        finished = self._compile_done.wait(timeout)
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
        served: list[tuple[int, bool]] = []  # (request index, whether its input was one unbatched row)
        features = self.model.num_feature
        for index, request in enumerate(requests):
            array = request.inputs.get(_INPUT)
            single = False
            if array is not None and array.ndim == 1 and array.shape[0] == features:
                array, single = array.reshape(1, features), not self._batching
            if array is None or array.ndim != 2 or array.shape[1] != features:
                got = "none" if array is None else f"shape {list(array.shape)}"
                responses[index] = InferResponse.failed(request, InvalidArgumentError(
                    f"{self._where}: input '{_INPUT}' must have shape [rows, {features}], got {got}"
                ), version)
                continue
            arrays.append(array)
            served.append((index, single))
        if arrays:
            x = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            if x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.aligned:
                # XGBoost's C API refuses data not aligned to its itemsize ("Input pointer misalignment");
                # a view into a request body can start anywhere
                x = np.require(x, np.float32, ("C", "A"))
            outputs = self._predict(x)
            start = 0
            for (index, single), array in zip(served, arrays, strict=True):
                stop = start + array.shape[0]
                result = {key: value[start] if single else value[start:stop] for key, value in outputs.items()}
                responses[index] = InferResponse(name, version, result, request_id=requests[index].request_id)
                start = stop
        return responses  # type: ignore[return-value]

    def _predict(self, x: np.ndarray) -> dict[str, np.ndarray]:
        rows = x.shape[0]
        shapes = self._shapes
        if rows == 0:
            return {key: np.zeros((0, *(max(d, 0) for d in dims)), dtype=np.float32) for key, dims in shapes.items()}
        selector = self._selector
        band = bisect.bisect_right(_BAND_EDGES, rows)
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
