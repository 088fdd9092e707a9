"""Soak: the fraud ensemble under sustained load, in-process and over HTTP, with dynamic batching.

For each path, ``--concurrency`` requests stay in flight for ``--duration-s`` seconds (after a
warm-up): every request must be answered, none may fail, the server's resident memory may grow
only within ``--rss-bound-mb`` after the warm-up, and its thread count must not grow.

* in-process: 256 threads in this process calling ``server.infer`` (the in-kernel path);
* HTTP: ``triton-nb serve`` in a process of its own, loaded by triton_nb's load generator (another
  process), memory and threads read from /proc.

    python bench/bench_soak.py [--duration-s 60] [--concurrency 256] [--rss-bound-mb 64]
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

from serve_process import triton_nb_serve

REPO_ROOT = Path(__file__).resolve().parents[1]


def _proc_status(pid: int) -> tuple[float, int]:
    """(resident MB, threads) of a process, from /proc."""
    text = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(re.search(r"VmRSS:\s+(\d+)", text).group(1))
    threads = int(re.search(r"Threads:\s+(\d+)", text).group(1))
    return rss_kb / 1024, threads


def _soak(load, pid: int, warmup_s: float, duration_s: float) -> dict:
    """Run ``load``; sample the server process after the warm-up and at the end."""
    load.start()
    try:
        time.sleep(warmup_s)
        load.take()
        rss_start, threads_start = _proc_status(pid)
        answered = failed = 0
        peak_threads = threads_start
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            time.sleep(1.0)
            done = load.take()
            answered += len(done)
            failed += int((~done.ok).sum())
            peak_threads = max(peak_threads, _proc_status(pid)[1])
        rss_end, threads_end = _proc_status(pid)
    finally:
        load.stop()
    done = load.take()  # what was in flight at the end is answered too
    answered += len(done)
    failed += int((~done.ok).sum())
    return {"answered": answered, "failed": failed, "rss_start_mb": rss_start, "rss_end_mb": rss_end,
            "threads_start": threads_start, "threads_end": threads_end, "threads_peak": peak_threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--rss-bound-mb", type=float, default=64.0)
    parser.add_argument("--rows", type=int, default=50_000, help="training rows of the model served")
    args = parser.parse_args()

    import triton_nb
    from triton_nb import fraud
    from triton_nb.perf.inputs import request_inputs
    from triton_nb.perf.load import InProcessLoad, NetworkLoad
    from triton_nb.repository import export_fraud_repository

    work = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    model = fraud.train_fraud_model(fraud.generate_transactions(args.rows, seed=0), progress=False)
    repository = export_fraud_repository(model, work / "repo")
    frame = fraud.generate_transactions(2_000, seed=1)
    results = {}

    with triton_nb.serve(repository) as server:
        requests = request_inputs(server.model_config_json("ensemble"), frame, count=256)
        load = InProcessLoad(server, "ensemble", requests, concurrency=args.concurrency)
        results["in-process"] = _soak(load, os.getpid(), args.warmup_s, args.duration_s)

    with triton_nb_serve(repository) as (process, endpoints):
        from triton_nb.transport import HttpTransport

        url = endpoints["http"]
        requests = request_inputs(HttpTransport(url).model_config_json("ensemble"), frame, count=256)
        load = NetworkLoad("http", url, "ensemble", requests, concurrency=args.concurrency)
        results["HTTP"] = _soak(load, process.pid, args.warmup_s, args.duration_s)

    print(f"\nfraud ensemble, {args.concurrency} in flight, {args.duration_s:g} s after a {args.warmup_s:g} s warm-up")
    print(f"{'path':>10} | {'answered':>9} | {'failed':>6} | {'req/s':>7} | {'RSS MB start->end':>18} | "
          f"{'growth':>7} | {'threads start/peak/end':>22} | ok")
    for path, r in results.items():
        growth = r["rss_end_mb"] - r["rss_start_mb"]
        ok = (r["failed"] == 0 and r["answered"] > 0 and growth <= args.rss_bound_mb
              and r["threads_end"] <= r["threads_start"])
        print(f"{path:>10} | {r['answered']:>9,} | {r['failed']:>6} | {r['answered'] / args.duration_s:>7,.0f} | "
              f"{r['rss_start_mb']:>8.0f} -> {r['rss_end_mb']:<7.0f} | {growth:>+6.1f} | "
              f"{r['threads_start']:>6}/{r['threads_peak']}/{r['threads_end']:<10} | {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
