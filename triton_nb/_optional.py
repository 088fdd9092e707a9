"""Guarded imports of optional dependencies: the pyproject extras and the GPU libraries.

Nothing optional is imported at module top level anywhere in triton_nb, so ``pip install
triton-nb`` (the core: train, export, serve, tune) imports and runs without any extra. Code that
can use Dask, LightGBM, the ONNX tools, boto3, cuDF, cuML or CuPy asks here first, and gets
``None`` (or a one-line :class:`MissingDependencyError` that names the extra to install) when the
package or a CUDA device is not there.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from triton_nb.errors import MissingDependencyError

# module name -> the pyproject extra that installs it (the extras themselves: pyproject.toml and
# triton_nb._versions.EXTRAS). onnxruntime is the module of both onnxruntime ([onnx]) and
# onnxruntime-gpu ([gpu]); the CPU package is the one a missing module calls for.
_EXTRAS = {
    "dask": "dask",
    "distributed": "dask",
    "lightgbm": "lightgbm",
    "onnx": "onnx",
    "onnxmltools": "onnx",
    "skl2onnx": "onnx",
    "onnxruntime": "onnx",
    "boto3": "sagemaker",
    "cudf": "gpu",
    "cuml": "gpu",
    "cupy": "gpu",
}


@functools.cache
def optional_module(name: str) -> ModuleType | None:
    """Return the module, or ``None`` when it is missing or fails to import.

    GPU libraries raise all kinds of errors at import time on a machine without a driver
    (not only ImportError), so any exception means "not usable here".
    """
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def require_module(name: str, purpose: str) -> ModuleType:
    """Return the module or raise a :class:`MissingDependencyError` naming the extra."""
    module = optional_module(name)
    if module is None:
        raise MissingDependencyError(name, _EXTRAS.get(name, "dev"), purpose)
    return module


@functools.cache
def xgboost_cuda_available() -> bool:
    """True when this XGBoost build has CUDA support *and* a CUDA device answers.

    XGBoost has no public "device count" call, so we train one tiny round on the device; the
    result is cached for the process.
    """
    import json
    import warnings

    import numpy as np
    import xgboost as xgb

    if not xgb.build_info().get("USE_CUDA", False):
        return False
    data = xgb.DMatrix(np.zeros((2, 1), dtype=np.float32), label=np.array([0.0, 1.0]))
    with warnings.catch_warnings():
        # Without a GPU, CUDA builds warn "No visible GPU is found" and fall back to CPU.
        warnings.simplefilter("ignore")
        try:
            booster = xgb.train({"device": "cuda", "tree_method": "hist", "verbosity": 0}, data, num_boost_round=1)
        except xgb.core.XGBoostError:
            return False
    config = json.loads(booster.save_config())
    return str(config["learner"]["generic_param"].get("device", "cpu")).startswith("cuda")


@functools.cache
def cudf_gpu_available() -> bool:
    """True when cuDF imports and can place a column on a GPU."""
    cudf = optional_module("cudf")
    if cudf is None:
        return False
    try:
        cudf.Series([1])
    except Exception:
        return False
    return True
