"""In-process serving of the exported fraud ensemble against the raw floor.

The raw floor is the work itself with nothing around it: the same preprocessing
(``FraudPreprocessor.transform`` on Triton-style tensors) plus the fastest tree engine called
directly (the best of XGBoost ``inplace_predict``, Treelite GTIL and the FIL backend's own
engine choice, which includes a tl2cgen-compiled library once it is built). The server is the
exported repository (preprocessing -> fil ensemble) served by ``triton_nb.serve`` and called
with single-row requests through the in-process client:

* concurrency 1 — p50 latency, with ``max_queue_delay_microseconds`` 0 (nothing to wait for);
  target: <= 5x the floor's latency for one row;
* concurrency 64 threads, dynamic batching on — rows/s; target: >= 30% of the floor's rows/s
  at batch 64.

Both sides run in this process, on threads, in one run; ratios are printed.

    python bench/bench_server.py [--seconds 5] [--trees 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import treelite
import xgboost as xgb

from triton_nb import fraud, serve
from triton_nb.backends.base import ModelContext
from triton_nb.backends.fil import FilBackend
from triton_nb.repository import export_fraud_repository
from triton_nb.repository.config import effective_config, load_config
from triton_nb.server.types import InferRequest


def triton_tensors(rows) -> dict[str, np.ndarray]:
    return fraud.request_tensors(rows)


def best_seconds(function, repeats: int = 2000) -> float:
    for _ in range(50):
        function()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def floor(model: fraud.TrainedFraudModel, root: Path, rows) -> dict[int, float]:
    """Seconds for preprocessing + the fastest engine, per batch size."""
    preprocessor = model.preprocessor
    booster = xgb.Booster(model_file=str(root / "fil" / "1" / "xgboost.json"))
    tl_model = treelite.frontend.load_xgboost_model(str(root / "fil" / "1" / "xgboost.json"))
    folder = root / "fil"
    config = effective_config(load_config(folder), "fil")
    backend = FilBackend(ModelContext("fil", 1, config, folder, folder / "1", root, "fil_0"))
    deadline = time.monotonic() + 120
    while not getattr(backend, "compiled_ready", lambda: True)() and time.monotonic() < deadline:
        time.sleep(0.5)
    result = {}
    for batch in (1, 64):
        tensors = triton_tensors(rows.head(batch))
        features = preprocessor.transform(tensors)
        request = InferRequest("fil", {"input__0": features})
        engines = {
            "xgboost": lambda f=features: booster.inplace_predict(f),
            "gtil": lambda f=features: treelite.gtil.predict(tl_model, f),
            "fil-backend": lambda r=request: backend.execute([r]),
        }
        tree_s = min(best_seconds(fn, 300 if batch > 1 else 2000) for fn in engines.values())
        prep_s = best_seconds(lambda t=tensors: preprocessor.transform(t), 300 if batch > 1 else 2000)
        result[batch] = prep_s + tree_s
    backend.finalize()
    return result


def concurrency_1(client, one_row: dict[str, np.ndarray], seconds: float) -> float:
    latencies = []
    deadline = time.monotonic() + seconds
    for _ in range(200):
        client.infer("ensemble", one_row)
    while time.monotonic() < deadline:
        started = time.perf_counter()
        client.infer("ensemble", one_row)
        latencies.append(time.perf_counter() - started)
    return statistics.median(latencies)


def concurrency_n(client, one_row: dict[str, np.ndarray], threads: int, seconds: float) -> float:
    counts = [0] * threads
    stop = threading.Event()

    def loop(index: int) -> None:
        while not stop.is_set():
            client.infer("ensemble", one_row)
            counts[index] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(1.0)  # warm-up
    before = sum(counts)
    started = time.perf_counter()
    time.sleep(seconds)
    done = sum(counts) - before
    elapsed = time.perf_counter() - started
    stop.set()
    for worker in workers:
        worker.join()
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--trees", type=int, default=200)
    args = parser.parse_args()
    frame = fraud.generate_transactions(50_000, seed=0)
    model = fraud.train_fraud_model(frame, num_boost_round=args.trees, early_stopping_rounds=None, progress=False)
    root = export_fraud_repository(model, Path(tempfile.mkdtemp()) / "repo")
    rows = frame.sample(100, random_state=1)
    floors = floor(model, root, rows)
    one_row = triton_tensors(rows.head(1))
    with serve(root) as server:
        client = server.client()
        for name in ("preprocessing", "fil"):
            server.update_batching(name, max_queue_delay_microseconds=0)
        p50 = concurrency_1(client, one_row, args.seconds)
        throughputs = {}
        for delay_us in (500, 2000, 8000):  # what the tuner would try; the best counts
            for name in ("preprocessing", "fil"):
                server.update_batching(name, max_queue_delay_microseconds=delay_us)
            throughputs[delay_us] = concurrency_n(client, one_row, 64, args.seconds)
        best_delay, throughput = max(throughputs.items(), key=lambda item: item[1])
    floor_latency = floors[1]
    floor_rate = 64 / floors[64]
    print(f"model: {model.best_iteration + 1} trees, depth 8; 15 features")
    print(f"floor, one row:   {floor_latency * 1e6:8.1f} us   (preprocessing + fastest tree engine)")
    print(f"floor, batch 64:  {floor_rate:8,.0f} rows/s")
    ratio = p50 / floor_latency
    print(f"c=1  p50 latency: {p50 * 1e6:8.1f} us   = {ratio:.2f}x floor   target <= 5x   "
          f"{'ok' if ratio <= 5 else 'BELOW'}")
    share = throughput / floor_rate
    for delay_us, rate in throughputs.items():
        print(f"c=64, max_queue_delay_microseconds={delay_us}: {rate:8,.0f} rows/s")
    print(f"c=64 throughput:  {throughput:8,.0f} rows/s = {share:.0%} of floor (delay {best_delay} us)   "
          f"target >= 30%   {'ok' if share >= 0.3 else 'BELOW'}")


if __name__ == "__main__":
    main()
