"""FIL backend throughput: triton_nb's FilBackend vs the tree-inference engines it could be.

A 200-tree, depth-8 XGBoost binary classifier is trained on 15 fraud features (the synthetic
TabFormer generator and the example's preprocessing), exported as a FIL model folder and loaded
into :class:`triton_nb.backends.fil.FilBackend`. Once the backend's compiled engine is ready,
for each batch size the rows/s of ``FilBackend.execute`` (one request of that many rows, FIL's
full output: the class with threshold 0.5) are measured against, on the same rows:

* ``xgboost`` — ``Booster.inplace_predict`` (all cores);
* ``gtil`` — ``treelite.gtil.predict`` (all cores);
* ``tl2cgen`` — ``tl2cgen.export_lib`` + ``tl2cgen.Predictor.predict(tl2cgen.DMatrix(x))``
  (all cores; the library is compiled here, with tl2cgen's own gcc recipe).

Each side runs for ``--seconds`` in each of ``--rounds`` rounds, rounds interleaved, and the best
round counts, so the ratios hold on a noisy machine even when absolute times wander.

    python bench/bench_fil.py [--seconds 0.2] [--rounds 5] [--trees 200] [--depth 8]

Target: FilBackend >= 0.9x the fastest engine at every batch size.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import treelite
import xgboost as xgb

from triton_nb.backends.base import ModelContext
from triton_nb.backends.fil import FilBackend
from triton_nb.fraud import FraudPreprocessor, generate_transactions
from triton_nb.fraud.data import label_array
from triton_nb.repository.config import effective_config, load_config
from triton_nb.repository.export import export_tree_model
from triton_nb.tensors import InferRequest

BATCH_SIZES = (1, 8, 64, 512, 4096)
TARGET = 0.9


def rows_per_second(function: Callable[[], object], batch: int, seconds: float) -> float:
    function()  # warm-up
    calls = 0
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        function()
        calls += 1
        now = time.perf_counter()
        if now >= deadline:
            return calls * batch / (now - started)


def train(trees: int, depth: int) -> tuple[xgb.Booster, np.ndarray]:
    frame = generate_transactions(60_000, seed=0)
    features = FraudPreprocessor().fit(frame).transform(frame)
    labels = label_array(frame)
    params = {"objective": "binary:logistic", "tree_method": "hist", "max_depth": depth, "learning_rate": 0.1,
              "seed": 0, "verbosity": 0}
    booster = xgb.train(params, xgb.DMatrix(features, label=labels), num_boost_round=trees)
    return booster, features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.2, help="time per side per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best of each side counts")
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--depth", type=int, default=8)
    args = parser.parse_args()

    import tl2cgen

    booster, features = train(args.trees, args.depth)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rng = np.random.default_rng(1)
    serving = np.ascontiguousarray(features[rng.choice(len(features), max(BATCH_SIZES), replace=False)])

    with tempfile.TemporaryDirectory(prefix="bench_fil-") as tmp:
        os.environ.setdefault("TRITON_NB_CACHE_DIR", str(Path(tmp) / "cache"))
        folder = export_tree_model(booster, Path(tmp) / "repo", name="fraud_trees")
        config = effective_config(load_config(folder), folder.name)
        context = ModelContext(name=folder.name, version=1, config=config, model_path=folder,
                               version_path=folder / "1", repository_path=folder.parent, instance_name="fraud_trees_0")
        started = time.perf_counter()
        backend = FilBackend(context)
        loaded = time.perf_counter() - started
        ready = backend.wait_compiled(timeout_s=600)
        print(f"FilBackend: loaded in {loaded:.2f} s; compiled engine {backend.compile_state} after "
              f"{time.perf_counter() - started:.1f} s (from cache: {backend.compiled_from_cache}); {threads} threads")
        if not ready:
            print("warning: the compiled engine is not in use; results show the other engines only")

        xgb_booster = xgb.Booster(model_file=str(folder / "1" / "xgboost.json"))
        xgb_booster.set_param({"nthread": threads})
        tl_model = treelite.frontend.load_xgboost_model(folder / "1" / "xgboost.json", format_choice="json")
        started = time.perf_counter()
        libpath = Path(tmp) / f"baseline{'.dylib' if os.uname().sysname == 'Darwin' else '.so'}"
        tl2cgen.export_lib(tl_model, toolchain="gcc", libpath=str(libpath), params={"parallel_comp": threads},
                           nthread=threads)
        predictor = tl2cgen.Predictor(str(libpath), nthread=threads)
        print(f"tl2cgen baseline library compiled in {time.perf_counter() - started:.1f} s")

        print(f"\n{'batch':>6} {'FilBackend':>12} {'(engine)':>10} {'xgboost':>12} {'gtil':>12} {'tl2cgen':>12} "
              f"{'vs fastest':>11} {'target':>7}")
        all_ok = True
        for batch in BATCH_SIZES:
            x = np.ascontiguousarray(serving[:batch])
            request = [InferRequest("fraud_trees", {"input__0": x})]
            sides: dict[str, Callable[[], object]] = {
                "FilBackend": lambda request=request: backend.execute(request),
                "xgboost": lambda x=x: xgb_booster.inplace_predict(x, validate_features=False),
                "gtil": lambda x=x: treelite.gtil.predict(tl_model, x, nthread=threads),
                "tl2cgen": lambda x=x: predictor.predict(tl2cgen.DMatrix(x)),
            }
            # Same answers first: FIL's class output from every engine's probabilities.
            expected = (xgb_booster.inplace_predict(x, validate_features=False) > 0.5).astype(np.float32)
            got = backend.execute(request)[0].outputs["output__0"].ravel()
            np.testing.assert_array_equal(got, expected)
            for name in ("gtil", "tl2cgen"):
                np.testing.assert_allclose(np.asarray(sides[name]()).ravel(),
                                           xgb_booster.inplace_predict(x, validate_features=False), atol=1e-5)
            best = dict.fromkeys(sides, 0.0)
            for _ in range(args.rounds):
                for name, function in sides.items():
                    best[name] = max(best[name], rows_per_second(function, batch, args.seconds))
            fastest = max(best["xgboost"], best["gtil"], best["tl2cgen"])
            ratio = best["FilBackend"] / fastest
            ok = ratio >= TARGET
            all_ok &= ok
            print(f"{batch:>6} {best['FilBackend']:>12,.0f} {backend.engine_for(batch):>10} {best['xgboost']:>12,.0f} "
                  f"{best['gtil']:>12,.0f} {best['tl2cgen']:>12,.0f} {ratio:>10.2f}x {TARGET:>6.1f}x "
                  f"{'ok' if ok else 'BELOW'}")
        backend.finalize()
        print("\nrows/s; 'vs fastest' = FilBackend / max(xgboost, gtil, tl2cgen)")
        print("all batch sizes at target" if all_ok else "some batch sizes below target")


if __name__ == "__main__":
    main()
