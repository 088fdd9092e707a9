"""The engines that predict a loaded model, each wrapped as a :class:`Candidate`.

A candidate is one engine at one thread count, with a ``predict`` that takes a C-contiguous
float32 batch and returns ``(rows, outputs)`` float32. Every engine gives the same numbers; which
one serves a batch is for :mod:`.calibration` to decide. Here are the engines that need nothing
built: XGBoost's ``inplace_predict`` (the reference for XGBoost models) and the same call through
XGBoost's C API, LightGBM's ``Booster.predict`` and Treelite's GTIL. The compiled engine comes
from :mod:`.compiled`, which builds its library first.

Imports from this package: none.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Candidate:
    """One way to predict: an engine at a thread count. ``predict`` returns ``(rows, outputs)`` float32."""

    engine: str
    threads: int
    predict: Callable[[np.ndarray], np.ndarray]

    @property
    def label(self) -> str:
        return f"{self.engine}/{self.threads}"


def as_rows(predictions: Any, rows: int) -> np.ndarray:
    return np.asarray(predictions, dtype=np.float32).reshape(rows, -1)


def xgboost_candidate(booster: Any, threads: int) -> Candidate:
    """``Booster.inplace_predict``, XGBoost's public API (the reference for XGBoost models)."""
    booster.set_param({"nthread": threads})

    def predict(x: np.ndarray) -> np.ndarray:
        return as_rows(booster.inplace_predict(x, validate_features=False), x.shape[0])

    return Candidate("xgboost", threads, predict)


def xgboost_direct_candidate(booster: Any, threads: int) -> Candidate | None:
    """The same prediction through XGBoost's C API (``XGBoosterPredictFromDense``), which
    ``inplace_predict`` calls after ~40-80 µs of Python work per call (type checks, JSON, a ctypes
    class built per call): 10% of a 512-row batch. None when this XGBoost does not offer it; the
    caller checks it agrees with :func:`xgboost_candidate` before using it."""
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

    return Candidate("xgboost", threads, predict)


def lightgbm_candidate(booster: Any, threads: int) -> Candidate:
    def predict(x: np.ndarray) -> np.ndarray:
        return as_rows(booster.predict(x, num_threads=threads), x.shape[0])

    return Candidate("lightgbm", threads, predict)


def gtil_candidate(tl_model: Any, threads: int) -> Candidate:
    from treelite import gtil

    def predict(x: np.ndarray) -> np.ndarray:
        return as_rows(gtil.predict(tl_model, x, nthread=threads), x.shape[0])

    return Candidate("gtil", threads, predict)
