"""How accurate is triton_nb's perf tool itself? Two checks, one run.

1. In-process overhead: ``measure`` on a no-op model (it echoes its input) against a bare loop of
   ``server.infer`` calls on the same model; the difference in p50 latency is what the tool's own
   load threads and bookkeeping add.
2. HTTP agreement: ``measure`` over HTTP (its load generator runs in a process of its own) and
   ``wrk`` with the same binary request body, on the same server (``triton-nb serve`` in another
   process) at the same concurrency; the throughput ratio should be within 15%.

In both, the two sides alternate over ``--rounds`` rounds and the medians are compared.

    python bench/bench_perf_tool.py [--duration-s 6] [--concurrency 1,8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
from serve_process import triton_nb_serve

REPO_ROOT = Path(__file__).resolve().parents[1]

NOOP_CONFIG = """
name: "noop"
backend: "python"
max_batch_size: 64
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { }
"""

NOOP_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                .as_numpy())]) for r in requests]
"""

WRK_SCRIPT = """
wrk.method = "POST"
local f = io.open("{body}", "rb"); wrk.body = f:read("*all"); f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = "{header}"
"""


def write_repository(root: Path) -> Path:
    (root / "noop" / "1").mkdir(parents=True)
    (root / "noop" / "config.pbtxt").write_text(NOOP_CONFIG)
    (root / "noop" / "1" / "model.py").write_text(textwrap.dedent(NOOP_MODEL))
    return root


def in_process_overhead(repo: Path, duration_s: float, rounds: int) -> None:
    import triton_nb
    from triton_nb.perf import measure
    from triton_nb.tensors import InferRequest

    x = np.ones((1, 4), np.float32)

    def bare_p50(server) -> float:
        latencies = []
        end = time.perf_counter() + duration_s
        while time.perf_counter() < end:
            started = time.perf_counter_ns()
            server.infer(InferRequest("noop", {"X": x}))
            latencies.append(time.perf_counter_ns() - started)
        return float(np.percentile(latencies, 50)) / 1e3

    def tool_p50(server) -> float:
        tool = measure(server, "noop", concurrency_range=[1], input_data="zero",
                       measurement_interval_ms=int(duration_s * 1000 / 3), warmup_ms=500)
        return float(tool["latency_p50_us"].iloc[0])

    print(f"in-process, no-op model, 1 in flight, {duration_s:g} s per measurement, median of {rounds} "
          f"alternated rounds")
    print(f"{'round':>6} | {'bare server.infer p50 us':>24} | {'measure() p50 us':>16} | {'added us':>8}")
    bare, tool = [], []
    with triton_nb.serve(repo) as server:
        for _ in range(200):
            server.infer(InferRequest("noop", {"X": x}))
        for index in range(rounds):
            # alternated, and each round starts with the other side, so neither always runs first on a
            # machine whose load drifts; medians kept, as in the HTTP part
            sides = (bare_p50, tool_p50) if index % 2 == 0 else (tool_p50, bare_p50)
            got = {side: side(server) for side in sides}
            bare.append(got[bare_p50])
            tool.append(got[tool_p50])
            print(f"{index + 1:>6} | {bare[-1]:>24.1f} | {tool[-1]:>16.1f} | {tool[-1] - bare[-1]:>8.1f}")
    bare_median, tool_median = float(np.median(bare)), float(np.median(tool))
    print(f"{'median':>6} | {bare_median:>24.1f} | {tool_median:>16.1f} | {tool_median - bare_median:>8.1f}")
    print(f"-> the tool adds {tool_median - bare_median:.1f} us per request (median against median)")


def load_headroom(duration_s: float, rounds: int, concurrency: int = 16) -> None:
    """The in-process load against a no-op model and against the fraud ensemble, at the same
    concurrency: were the load generator the bottleneck, the two rates would be close. Target:
    the no-op rate >= 5x the ensemble's."""
    import triton_nb
    from triton_nb import fraud
    from triton_nb.perf import measure
    from triton_nb.repository import export_fraud_repository

    repo = write_repository(Path(tempfile.mkdtemp(prefix="bench-perf-tool-headroom-")))
    model = fraud.train_fraud_model(fraud.generate_transactions(20_000, seed=0), num_boost_round=50, progress=False)
    export_fraud_repository(model, repo / "fraud")
    for name in ("preprocessing", "fil", "ensemble"):
        shutil.move(str(repo / "fraud" / name), str(repo / name))
    (repo / "fraud").rmdir()
    unseen = fraud.generate_transactions(2_000, seed=3)  # distinct rows, not seen in training
    print()
    print(f"in-process load headroom, {concurrency} in flight, {duration_s:g} s per measurement, median of "
          f"{rounds} alternated rounds")
    print(f"{'round':>6} | {'no-op infer/s':>13} | {'ensemble infer/s':>16} | {'ratio':>6}")
    rates: dict[str, list[float]] = {"noop": [], "ensemble": []}
    with triton_nb.serve(repo) as server:
        for _ in range(100):  # the FIL backend's compiled engine and the models warmed up
            server.client().infer("ensemble", unseen.head(1))
        for index in range(rounds):
            order = ("noop", "ensemble") if index % 2 == 0 else ("ensemble", "noop")
            for name in order:
                data = None if name == "noop" else unseen
                result = measure(server, name, concurrency_range=[concurrency],
                                 input_data="zero" if data is None else data,
                                 measurement_interval_ms=int(duration_s * 1000 / 3), warmup_ms=500)
                rates[name].append(float(result["throughput_infer_per_sec"].iloc[0]))
            print(f"{index + 1:>6} | {rates['noop'][-1]:>13,.0f} | {rates['ensemble'][-1]:>16,.0f} | "
                  f"{rates['noop'][-1] / rates['ensemble'][-1]:>5.1f}x")
    shutil.rmtree(repo, ignore_errors=True)
    noop, ensemble = float(np.median(rates["noop"])), float(np.median(rates["ensemble"]))
    verdict = "ok" if noop >= 5 * ensemble else "MISSED"
    print(f"{'median':>6} | {noop:>13,.0f} | {ensemble:>16,.0f} | {noop / ensemble:>5.1f}x   target >= 5x: {verdict}")


def http_agreement(repo: Path, levels: list[int], duration_s: float, wrk: str, rounds: int) -> None:
    from triton_nb.perf import measure
    from triton_nb.perf.inputs import encode_http

    with triton_nb_serve(repo) as (_, endpoints):
        url = endpoints["http"]
        work = Path(tempfile.mkdtemp(prefix="bench-perf-tool-"))
        body, header = encode_http("noop", {"X": np.zeros((1, 4), np.float32)})
        (work / "body.bin").write_bytes(body)
        script = work / "post.lua"
        script.write_text(WRK_SCRIPT.format(body=work / "body.bin", header=header))
        print(f"\nHTTP, no-op model on triton-nb serve ({url}), {duration_s:g} s per point, median of {rounds} "
              f"alternated rounds")
        print(f"{'in flight':>9} | {'measure() infer/s':>17} | {'wrk infer/s':>11} | {'ratio':>5} | within 15%")
        for level in levels:
            ours_rates, wrk_rates = [], []
            for _ in range(rounds):  # alternated, medians kept: the machine is shared and noisy
                ours = measure(url, "noop", concurrency_range=[level], protocol="http", input_data="zero",
                               measurement_interval_ms=int(duration_s * 1000 / 3), warmup_ms=1000)
                ours_rates.append(float(ours["throughput_infer_per_sec"].iloc[0]))
                out = subprocess.run([wrk, "-t1", f"-c{level}", f"-d{duration_s:g}s", "-s", str(script),
                                      f"http://{url}/v2/models/noop/infer"], capture_output=True, text=True).stdout
                wrk_rates.append(float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)))
            ours_rate, wrk_rate = float(np.median(ours_rates)), float(np.median(wrk_rates))
            ratio = ours_rate / wrk_rate
            print(f"{level:>9} | {ours_rate:>17,.0f} | {wrk_rate:>11,.0f} | {ratio:>5.2f} | "
                  f"{'yes' if abs(ratio - 1) <= 0.15 else 'NO'}")
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--wrk", default=shutil.which("wrk") or "/usr/bin/wrk")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternated rounds of each comparison, in-process and HTTP; medians are reported")
    args = parser.parse_args()
    if args.rounds < 1 or args.duration_s <= 0:
        parser.error("--rounds must be >= 1 and --duration-s > 0")
    if not os.access(args.wrk, os.X_OK):  # the HTTP part compares against wrk: fail before the first part runs
        parser.error(f"wrk not found at {args.wrk}")
    repo = write_repository(Path(tempfile.mkdtemp(prefix="bench-perf-tool-repo-")))
    in_process_overhead(repo, args.duration_s, args.rounds)
    load_headroom(args.duration_s, args.rounds)
    http_agreement(repo, [int(c) for c in args.concurrency.split(",")], args.duration_s, args.wrk, args.rounds)
    shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    main()
