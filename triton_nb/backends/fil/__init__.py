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
  (``triton_nb_shim.c``) called through ctypes: no DMatrix, no per-call allocation in Python,
  rows split over OpenMP threads (the OpenMP runtime XGBoost or Treelite already use, see
  :func:`.compiled._openmp_runtime`). A few µs per row at batch 1, where the others cost 40-200 µs.

Which engine answers a batch is decided by measurement, not by a fixed rule (the crossover
between compiled if-else code and XGBoost's predictor moves with tree depth, tree count, feature
count, threads and the machine's load). At load, and again once the compiled library is ready,
every engine predicts 1, 8, 64, 512 and 4096 rows of synthetic data (values drawn between the
model's own split thresholds, 2% missing): the fastest (minimum over a few calls) wins each size
band, a band running from the geometric mean of its size and the next smaller one to that with
the next larger one. The compiled engine takes part twice, single-threaded and with
``cpu_nthread`` threads. The same pass checks that every engine agrees with the reference
(``inplace_predict``, LightGBM's ``predict``, else GTIL) to 1e-5 and drops one that does not.
While serving, :class:`.calibration.Selector` keeps timing the batches and now and then re-measures the other
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

Modules
-------
Each module imports only those above it in this list, so the package reads top to bottom:

* :mod:`.common` — the logger (named ``triton_nb.backends.fil``), a log-once helper and the
  exception that cancels a build or a calibration;
* :mod:`.loading` — the model file, parsed by Treelite and by its native library;
* :mod:`.engines` — the engines that need nothing built, as candidates (engine, threads, predict);
* :mod:`.compiled` — the ``tl2cgen`` engine: building, caching and loading the compiled library,
  with its C entry point ``triton_nb_shim.c`` (package data);
* :mod:`.calibration` — timing the candidates and choosing one per batch size while serving;
* :mod:`.backend` — :class:`FilBackend`, which puts them together.

Names with a leading underscore are private to this package: its modules share them with one
another, and nothing outside the package (the tests aside) uses them.
"""

from triton_nb.backends.fil.backend import ENGINES, FilBackend
from triton_nb.backends.fil.compiled import cache_directory

__all__ = ["ENGINES", "FilBackend", "cache_directory"]
