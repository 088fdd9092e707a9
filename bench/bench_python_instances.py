"""Python-model instances as threads against processes, on the fraud preprocessing model as exported.

One run: a fraud model is trained on generated transactions, the repository exported to disk, and
its ``preprocessing`` model (the Python backend's label encoders, loaded from the exported files)
served alone with 2 instances — once with ``python_instances="thread"``, once with ``"process"`` —
in this process, loaded through the in-process API with transactions the encoders never saw (one
row per request, the next row each time). The two kinds alternate over ``--rounds`` rounds and each
figure is the median of its rounds.

* 64 in flight: requests per second; the target is process >= 1.6x thread (two processes use two
  cores; two threads share one interpreter lock);
* 1 in flight: p50 latency; the difference is what a process instance adds to a batch of one row
  (the shared-memory hand-off and two messages).

The exported preprocessing is lean (a dictionary look-up per value once its tables have learned the
spellings), so the server's own work per request is a large share of the whole and a second core
can only take the model's share. For contrast, the same two measurements on ``busy``: a Python
model doing ``--busy-us`` of pure-Python work per request, what processes are for.

Then a second *thread* instance, where both instances always have a batch (max_batch_size 32 at
64 in flight), loaded by the perf engine: 2 instances against 1, with the request path's locks as
they are and with threading's plain locks patched back in (as before ``triton_nb._locks``). Two
threads answering batches at once, each answer sending the next request, made the plain locks a
convoy; a second instance should cost next to nothing (threads share one core's worth of Python).

    python bench/bench_python_instances.py [--seconds 4] [--rounds 3] [--instances 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from triton_nb import serve
from triton_nb.fraud import generate_transactions, request_tensors, train_fraud_model
from triton_nb.perf import load as load_module
from triton_nb.repository import export_fraud_repository
from triton_nb.repository.config import load_config, save_config
from triton_nb.server.scheduling import batcher
from triton_nb.tensors import InferRequest

TARGET_RATIO = 1.6
STREAM_ROWS = 4096

BUSY_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Pure-Python work per request (a stand-in for rules engines, parsers, feature code)."""

    def initialize(self, args):
        import json
        self.loops = int(json.loads(args["model_config"])["parameters"]["loops"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            total = 0
            for i in range(self.loops):
                total += i * i % 7
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + np.float32(total % 3))]))
        return responses
'''

BUSY_CONFIG = """
name: "busy"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 100 }}
parameters {{ key: "loops" value: {{ string_value: "{loops}" }} }}
"""


def prepare(work: Path, instances: int, busy_us: float) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """The exported preprocessing model alone (``instances`` instances), and unseen rows as requests."""
    model = train_fraud_model(generate_transactions(20_000, seed=0), num_boost_round=10, progress=False)
    export_fraud_repository(model, work / "full")
    repo = work / "repo"
    repo.mkdir()
    shutil.copytree(work / "full" / "preprocessing", repo / "preprocessing")
    config = load_config(repo / "preprocessing")
    config.instance_group[0].count = instances
    save_config(config, repo / "preprocessing")
    loops = _loops_for(busy_us)
    (repo / "busy" / "1").mkdir(parents=True)
    (repo / "busy" / "config.pbtxt").write_text(BUSY_CONFIG.format(instances=instances, loops=loops))
    (repo / "busy" / "1" / "model.py").write_text(BUSY_MODEL)
    frame = generate_transactions(STREAM_ROWS, seed=11)  # cardholders and merchants the encoders never saw
    rows = [request_tensors(frame.iloc[i:i + 1]) for i in range(len(frame))]
    return repo, rows


def _loops_for(busy_us: float) -> int:
    """Loop iterations of the busy model's work that take about ``busy_us`` here."""
    began = time.perf_counter()
    total = 0
    for i in range(200_000):
        total += i * i % 7
    per_loop_us = (time.perf_counter() - began) / 200_000 * 1e6
    return max(1, int(busy_us / per_loop_us))


def _batch_compute_ns(server, model: str) -> int:
    """The time the model's instances spent executing batches so far (each batch once)."""
    (stats,) = server.statistics(model)["model_stats"]
    return sum(int(b["compute_infer"]["ns"]) for b in stats["batch_stats"])


def throughput(server, model: str, rows: list[dict[str, np.ndarray]], in_flight: int,
               seconds: float) -> tuple[float, float]:
    """Requests per second with ``in_flight`` requests kept in flight (a closed loop), and the
    share of the window the model's instances spent executing batches."""
    done = threading.Semaphore(0)
    counter = iter(range(1 << 62))
    stop = threading.Event()
    # one entry per answer: list.append is atomic, so counting takes no lock (a lock taken per
    # answer by two answering threads would be this loop's own convoy: triton_nb._locks)
    completed: list[None] = []

    def send() -> None:
        index = next(counter)
        future = server.infer_async(InferRequest(model, rows[index % len(rows)]))
        future.add_done_callback(finish)

    def finish(future) -> None:
        future.result()  # a failed request ends the run with its error
        completed.append(None)
        if stop.is_set():
            done.release()
        else:
            send()  # from the thread that answered: no thread per request

    for _ in range(in_flight):
        send()
    time.sleep(seconds / 4)  # warm-up
    busy_before = _batch_compute_ns(server, model)
    first, began = len(completed), time.perf_counter()
    time.sleep(seconds)
    last, ended = len(completed), time.perf_counter()
    busy = (_batch_compute_ns(server, model) - busy_before) / 1e9
    stop.set()
    for _ in range(in_flight):
        done.acquire(timeout=60)
    return (last - first) / (ended - began), busy / (ended - began)


def p50_us(server, model: str, rows: list[dict[str, np.ndarray]], seconds: float) -> float:
    latencies = []
    deadline = time.perf_counter() + seconds
    index = 0
    while time.perf_counter() < deadline:
        began = time.perf_counter_ns()
        server.infer(InferRequest(model, rows[index % len(rows)]))
        latencies.append((time.perf_counter_ns() - began) / 1e3)
        index += 1
    return statistics.median(latencies[len(latencies) // 10:])


SECOND_INSTANCE_BATCH = 32  # a max_batch_size that 64 in flight fills twice over: both instances busy


@contextlib.contextmanager
def plain_locks() -> Iterator[None]:
    """Servers and loads made meanwhile take threading's own locks on the request path (as before
    triton_nb._locks): a contended acquire queues on the lock and is handed it asleep."""
    saved = batcher.YieldingLock, load_module.YieldingLock

    def plain(reentrant: bool = False):
        return threading.RLock() if reentrant else threading.Lock()

    batcher.YieldingLock = load_module.YieldingLock = plain
    try:
        yield
    finally:
        batcher.YieldingLock, load_module.YieldingLock = saved


def perf_rate(server, model: str, rows: list[dict[str, np.ndarray]], in_flight: int, seconds: float) -> float:
    """Requests per second of the perf engine's in-process closed loop (what ``triton-nb perf``, the
    demo's sweep and the Tuner run): each answer sends the next request from the answering thread."""
    load = load_module.InProcessLoad(server, model, rows, concurrency=in_flight)
    load.start()
    try:
        time.sleep(seconds / 4)  # warm-up
        load.take()
        began = time.perf_counter()
        time.sleep(seconds)
        done = load.take()
        elapsed = time.perf_counter() - began
    finally:
        load.stop()
    if not done.ok.all():
        raise SystemExit(f"{model}: {int((~done.ok).sum())} requests failed")
    return len(done.ok) / elapsed


def second_instance(work: Path, repo: Path, rows: list[dict[str, np.ndarray]], in_flight: int, seconds: float,
                    rounds: int) -> None:
    """The exported preprocessing at max_batch_size 32 with 1 and 2 thread instances, loaded by the
    perf engine; the request path's locks as they are, and threading's plain ones (as before)."""
    repos = {}
    for count in (1, 2):
        repos[count] = work / f"second-{count}"
        shutil.copytree(repo / "preprocessing", repos[count] / "preprocessing")
        config = load_config(repos[count] / "preprocessing")
        config.max_batch_size = SECOND_INSTANCE_BATCH
        config.instance_group[0].count = count
        save_config(config, repos[count] / "preprocessing")
    variants = {"yielding locks (now)": contextlib.nullcontext, "plain locks (before)": plain_locks}
    rates: dict[tuple[str, int], list[float]] = {(v, c): [] for v in variants for c in (1, 2)}
    for round_index in range(rounds):
        order = list(variants) if round_index % 2 == 0 else list(variants)[::-1]
        for variant in order:
            for count in (1, 2):
                with variants[variant](), serve(repos[count], python_instances="thread") as server:
                    for row in rows[:64]:
                        server.infer(InferRequest("preprocessing", row))
                    rates[(variant, count)].append(perf_rate(server, "preprocessing", rows, in_flight, seconds))
                print(f"round {round_index + 1} {variant}, {count} thread instance(s) at max_batch_size "
                      f"{SECOND_INSTANCE_BATCH}: {rates[(variant, count)][-1]:,.0f} req/s", flush=True)
    print(f"\na second thread instance, the exported preprocessing at max_batch_size {SECOND_INSTANCE_BATCH}, "
          f"{in_flight} in flight from the perf engine, medians of {rounds} rounds:")
    for variant in variants:
        one, two = (statistics.median(rates[(variant, c)]) for c in (1, 2))
        print(f"  {variant}: 1 instance {one:,.0f} req/s, 2 instances {two:,.0f} req/s: {two / one:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per point")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--busy-us", type=float, default=500.0, help="pure-Python work per request of 'busy'")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-python-instances-"))
    try:
        repo, rows = prepare(work, args.instances, args.busy_us)
        loads = {"preprocessing": rows, "busy": [{"X": np.full((1, 4), i, np.float32)} for i in range(64)]}
        results = {(model, kind): {"rps": [], "p50": [], "busy": []} for model in loads
                   for kind in ("thread", "process")}
        for round_index in range(args.rounds):
            kinds = ("thread", "process") if round_index % 2 == 0 else ("process", "thread")
            for kind in kinds:
                with serve(repo, python_instances=kind) as server:
                    for model, requests in loads.items():
                        for row in requests[:64]:  # every instance warm, the encoders' tables filled a little
                            server.infer(InferRequest(model, row))
                        figures = results[(model, kind)]
                        rps, busy = throughput(server, model, requests, args.in_flight, args.seconds)
                        figures["rps"].append(rps)
                        figures["busy"].append(busy)
                        figures["p50"].append(p50_us(server, model, requests, args.seconds / 2))
                        print(f"round {round_index + 1} {model} {kind}: {figures['rps'][-1]:,.0f} req/s at "
                              f"{args.in_flight} in flight, p50 {figures['p50'][-1]:.0f} us at 1", flush=True)
        print(f"\n{args.instances} instances, {args.in_flight} in flight and 1 in flight, medians of {args.rounds} "
              "rounds:")
        for model in loads:
            thread_rps, process_rps = (statistics.median(results[(model, k)]["rps"]) for k in ("thread", "process"))
            thread_p50, process_p50 = (statistics.median(results[(model, k)]["p50"]) for k in ("thread", "process"))
            ratio = process_rps / thread_rps
            what = ("the exported preprocessing, one unseen row per request" if model == "preprocessing"
                    else f"busy, {args.busy_us:.0f} us of Python per request")
            verdict = f" (target >= {TARGET_RATIO}x: {'met' if ratio >= TARGET_RATIO else 'MISSED'})"
            print(f"  {what}: thread {thread_rps:,.0f} req/s, process {process_rps:,.0f} req/s: {ratio:.2f}x"
                  f"{verdict if model == 'preprocessing' else ''}; p50 at 1 in flight thread {thread_p50:.0f} us, "
                  f"process {process_p50:.0f} us (+{process_p50 - thread_p50:.0f} us)")
            # Threads share one interpreter lock: the model's execute and the server's own work (queueing,
            # batching, answering) take turns on one core. Processes can take the model's share away, not
            # the rest, so even with a free hand-off and cores to spare they give at most 1 / (1 - share).
            share = min(statistics.median(results[(model, "thread")]["busy"]), 0.999)
            bound = min(args.instances, os.cpu_count() or 1, 1 / (1 - share))
            print(f"    with threads the model's execute took {share:.0%} of the time, the server's own work the "
                  f"rest: {args.instances} processes on {os.cpu_count()} cores could give at most {bound:.2f}x "
                  "with a free hand-off")
        print()
        second_instance(work, repo, rows, args.in_flight, args.seconds, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
