"""HTTP and gRPC front ends of triton_nb against real NVIDIA Triton, on the same fraud repository.

One run, one machine, one trained fraud model, served in turn by

* real Triton 2.51 (the ``tritonserver`` of PyPI's nvidia-pytriton, started by triton_nb.tritonserver);
  that build has no FIL backend, so the tree model is exported as its Python-backend twin
  (``model_backend="python"``);
* triton_nb (``triton-nb serve``, the command a deployment runs, in a process of its own so the
  load generators never share its GIL) on that very directory, Python-backend twin included: the
  like-for-like comparison, and the headline;
* triton_nb again on the default export, the tree model on triton_nb's FIL backend (what a user
  deploys, and what real Triton's build cannot serve): reported as rows of their own, against the
  same real Triton measurements.

Every request is one row to model ``ensemble``. What the rows are (``--inputs``):

* ``fixed`` — one row, one XGBoost flags as fraud, in every request: one body, one payload;
* ``distinct`` (the default) — ``--rows`` (4,096) transactions generated with ``--seed`` (not the training frame's
  seed 0: rows, cardholders and merchants the model never saw), shuffled so that consecutive requests
  come from different cardholders; each request carries the next row, cycled, as live traffic brings a
  new transaction each time. Every server gets the same sequence: each wrk run and each gRPC load
  process starts at the same row of it.

Load:

* HTTP — ``wrk`` (one thread, N connections) POSTing KServe v2 JSON bodies
  (``/v2/models/ensemble/infer``); in ``distinct`` mode a Lua script formats every row's request once,
  at start, and hands out the next one per request; throughput and the 50%/99% latencies are wrk's;
* gRPC — the same Python client for every server: grpc.aio in separate processes, each keeping
  its share of N requests in flight over one channel, sending pre-serialized
  ``ModelInferRequest``s (the next one each time, in ``distinct`` mode) through a generic unary-unary
  call (no per-request protobuf work on the client), recording each request's latency.

For each protocol and concurrency (1, 16, 32), and for each of triton_nb's two exports: infer/s,
p50 and p99, each as ours/theirs, against the real Triton medians of the same run. Targets: at
c=1 p50 <= real Triton's; at c>=16 throughput >= real Triton's with p99 <= real Triton's. Each
point is warmed up before it is measured. Before any load, every server must give XGBoost's
prediction over both protocols for the fixed row, or, in ``distinct`` mode, for a sample of the rows
(every row XGBoost flags as fraud, up to half of it, and rows spread over the rest).

The machine may have only two cores: the servers run one after the other, never together, and
the load generators stay small (one wrk thread, one gRPC process by default: a second one costs
the servers more CPU than it adds load). Each point prints the load generator's own CPU use. On a
busy machine (and by default) ``--rounds 3`` alternates the servers three times (each round starting
with the next one) and keeps each point's median round.

    python bench/bench_frontends.py [--duration-s 8] [--servers real,triton_nb,triton_nb_fil,triton_nb_process]
                                    [--concurrency 1,16,32] [--rounds 3] [--inputs distinct|fixed]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import resource
import shutil
import statistics
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from serve_process import triton_nb_serve

MODEL = "ensemble"
OUTPUT = "predictions"
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
TRAINING_SEED = 0  # the generated frame the model is trained on; distinct rows must come from another one
CHECKED_ROWS = 64  # distinct mode: rows each server must answer as XGBoost does before it is loaded
# what each --servers name serves: (printed name, tree model's backend in the directory it serves)
SERVERS = {
    "real": ("real Triton 2.51", "python"),
    "triton_nb": ("triton_nb, Python-backend twin", "python"),
    "triton_nb_fil": ("triton_nb, FIL backend", "fil"),
    # the same directory with every Python-model instance in a process of its own, as Triton runs them
    "triton_nb_process": ("triton_nb --python-instances process, Python-backend twin", "python"),
}
# the table's "tree model" column for triton_nb's rows
TREE_MODEL_LABELS = {"triton_nb": "python twin (same dir)", "triton_nb_fil": "FIL (ours only)",
                     "triton_nb_process": "python twin, process instances"}
#: extra ``triton-nb serve`` flags of a server
SERVE_FLAGS = {"triton_nb_process": ("--python-instances", "process")}


@dataclass
class Requests:
    """What the load sends, in this order (cycled when there are several): one KServe v2 JSON body and one
    serialized ``ModelInferRequest`` per row; and the rows checked before the load, as (index, XGBoost's
    prediction)."""

    label: str
    bodies: list[bytes]
    payloads: list[bytes]
    checks: list[tuple[int, float]]


@dataclass
class Point:
    """One measured configuration: completed requests per second and latency percentiles (seconds)."""

    rate: float
    p50: float
    p99: float
    errors: int = 0
    client_cpu: float = math.nan  # CPU seconds per second the load generator used while measuring
    # CPU seconds per second each of the server's processes used while measuring, by kind of process
    server_cpu: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- the request


def one_row_request(model, frame, seed: int):
    """The row every request sends (one XGBoost flags as fraud, when the sample has one, so that two
    servers agreeing is not just both giving the common answer), its tensors and XGBoost's prediction."""
    from triton_nb.fraud import request_tensors

    sample = frame.sample(2000, random_state=seed)
    predictions = model.predict(sample)
    index = int(predictions.argmax())
    row = sample.iloc[index:index + 1]
    return row, request_tensors(row), float(predictions[index])


def fixed_requests(model, frame, seed: int) -> Requests:
    _, tensors, expected = one_row_request(model, frame, seed)
    return Requests("fixed: the same row in every request",
                    [json_body(tensors)], [grpc_payload(tensors)], [(0, expected)])


def distinct_requests(model, count: int, seed: int) -> Requests:
    """``count`` transactions from a generator seed the model was not trained on, one per request.

    Shuffled: the generator sorts its rows by cardholder and time, and live traffic interleaves cardholders.
    """
    import numpy as np

    from triton_nb.fraud import generate_transactions, request_tensors

    frame = generate_transactions(count, seed=seed)
    frame = frame.iloc[np.random.default_rng(seed).permutation(len(frame))].reset_index(drop=True)
    predictions = model.predict(frame)
    columns = request_tensors(frame)
    rows = [{name: array[i:i + 1] for name, array in columns.items()} for i in range(len(frame))]
    # every row XGBoost flags as fraud, up to half the sample, so that two servers agreeing is not just both
    # giving the common answer; the rest spread over the whole cycle
    flagged = [int(i) for i in np.flatnonzero(predictions)][:CHECKED_ROWS // 2]
    spread = np.linspace(0, len(frame) - 1, CHECKED_ROWS - len(flagged)).astype(int).tolist()
    checks = [(i, float(predictions[i])) for i in sorted(set(flagged) | set(spread))]
    label = (f"distinct: {len(frame):,} generated transactions (seed {seed}; the model trained on seed "
             f"{TRAINING_SEED}'s), the next one in each request, cycled, the same sequence for every server")
    return Requests(label, [json_body(row) for row in rows], [grpc_payload(row) for row in rows], checks)


def json_body(tensors) -> bytes:
    """KServe v2 JSON: FP32 as numbers, BYTES as strings, shape [1, 1]."""
    inputs = []
    for name, array in tensors.items():
        if array.dtype.kind == "f":
            inputs.append({"name": name, "shape": list(array.shape), "datatype": "FP32",
                           "data": [float(v) for v in array.reshape(-1)]})
        else:
            inputs.append({"name": name, "shape": list(array.shape), "datatype": "BYTES",
                           "data": [bytes(v).decode("utf-8") for v in array.reshape(-1)]})
    return json.dumps({"inputs": inputs}).encode()


def grpc_payload(tensors) -> bytes:
    """A serialized ``ModelInferRequest`` with raw (binary) contents, the way tritonclient sends them."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=MODEL)
    for name, array in tensors.items():
        tensor = request.inputs.add(name=name, shape=list(array.shape))
        if array.dtype.kind == "f":
            tensor.datatype = "FP32"
            request.raw_input_contents.append(array.astype("<f4").tobytes())
        else:  # BYTES: each element as a 4-byte little-endian length, then the bytes
            tensor.datatype = "BYTES"
            request.raw_input_contents.append(
                b"".join(struct.pack("<I", len(bytes(v))) + bytes(v) for v in array.reshape(-1)))
    request.outputs.add(name=OUTPUT)
    return request.SerializeToString()


def http_prediction(http_url: str, body: bytes) -> float:
    request = urllib.request.Request(f"http://{http_url}/v2/models/{MODEL}/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    output = next(o for o in answer["outputs"] if o["name"] == OUTPUT)
    return float(output["data"][0])


def grpc_prediction(channel, payload: bytes) -> float:
    import numpy as np
    from tritonclient.grpc import service_pb2

    raw = channel.unary_unary(GRPC_METHOD)(payload, timeout=30)
    response = service_pb2.ModelInferResponse.FromString(raw)
    index = next(i for i, o in enumerate(response.outputs) if o.name == OUTPUT)
    output = response.outputs[index]
    if response.raw_output_contents:
        dtype = {"FP32": "<f4", "FP64": "<f8", "INT32": "<i4", "INT64": "<i8"}[output.datatype]
        return float(np.frombuffer(response.raw_output_contents[index], dtype=dtype)[0])
    return float(output.contents.fp32_contents[0])


# ---------------------------------------------------------------------------------- HTTP: wrk

WRK_SCRIPT = """\
-- generated by bench_frontends.py: POST the same KServe v2 JSON body on every request
local file = assert(io.open("{body}", "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"
"""

# Formatting a request costs Lua string work, which the one wrk thread would take from the load it drives:
# every row's request is formatted once, at init (after wrk has set the Host header), and request() only
# hands out the next. wrk calls request() once before the load, to check what it returns, so every run's first
# request carries the second row: the same for every server, which is what matters.
WRK_SCRIPT_CYCLE = """\
-- generated by bench_frontends.py: POST the KServe v2 JSON bodies of {bodies} (one a line) in turn, cycling
local requests = {{}}
local last = 0

function init(args)
   wrk.headers["Content-Type"] = "application/json"
   for body in io.lines("{bodies}") do
      requests[#requests + 1] = wrk.format("POST", nil, nil, body)
   end
   assert(#requests > 0, "no bodies in {bodies}")
end

function request()
   last = last % #requests + 1
   return requests[last]
end
"""


def write_wrk_script(work: Path, bodies: list[bytes]) -> Path:
    script = work / "post.lua"
    if len(bodies) == 1:
        (work / "body.json").write_bytes(bodies[0])
        script.write_text(WRK_SCRIPT.format(body=work / "body.json"))
        return script
    # json.dumps escapes every control character, so no body holds a newline: one body a line
    if any(b"\n" in body for body in bodies):
        raise ValueError("a JSON body holds a newline")
    (work / "bodies.jsonl").write_bytes(b"\n".join(bodies) + b"\n")
    script.write_text(WRK_SCRIPT_CYCLE.format(bodies=work / "bodies.jsonl"))
    return script

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)([a-z]+)", text).groups()
    return float(number) * _UNITS[unit]


def parse_wrk(output: str) -> Point:
    """Requests/sec and the 50%/99% lines of ``--latency``; non-2xx answers and socket errors count as errors."""
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    percentiles = {int(p): _seconds(v) for p, v in re.findall(r"^\s+(\d+)%\s+(\S+)\s*$", output, re.MULTILINE)}
    errors = 0
    if match := re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output):
        errors += int(match.group(1))
    if match := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output):
        errors += sum(int(g) for g in match.groups())
    return Point(rate, percentiles[50], percentiles[99], errors)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_wrk(wrk: str, url: str, script: Path, connections: int, seconds: int) -> Point:
    # one thread: on a small machine every extra load thread is taken from the server under test
    args = [wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url]
    cpu = _children_cpu()
    result = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 60, check=False)
    cpu = _children_cpu() - cpu
    if result.returncode != 0 or "Requests/sec" not in result.stdout:
        raise RuntimeError(f"wrk failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    point = parse_wrk(result.stdout)
    point.client_cpu = cpu / seconds
    return point


def bench_http(wrk: str, http_url: str, script: Path, concurrency: int, warmup_s: int, duration_s: int,
               server_pid: int | None = None) -> Point:
    url = f"http://{http_url}/v2/models/{MODEL}/infer"
    run_wrk(wrk, url, script, concurrency, warmup_s)  # warm-up: connections, batcher, caches
    with ServerCpu(server_pid) as cpu:
        start = time.perf_counter()
        point = run_wrk(wrk, url, script, concurrency, duration_s)
        point.server_cpu = cpu.shares(start + 0.5, start + duration_s - 0.25)
    return point


# ---------------------------------------------------------------------------------- gRPC: grpc.aio


def grpc_load_process(grpc_url: str, payloads: list[bytes], start: int, in_flight: int, warmup_s: float,
                      duration_s: float, barrier, results) -> None:
    """One load-generator process: ``in_flight`` coroutines on one channel, each sending back to back the
    next of ``payloads`` (cycled, from index ``start``).

    Only requests that complete inside the measuring window count, and only their latencies are kept.
    """
    import grpc

    async def main() -> tuple[list[float], int, float]:
        latencies: list[float] = []
        errors = 0
        cpu = 0.0
        sent = start  # shared by the coroutines: one event loop, so no two take the same turn
        async with grpc.aio.insecure_channel(grpc_url) as channel:
            # no serializers: the pre-serialized bytes go out as they are, answers come back as bytes
            call = channel.unary_unary(GRPC_METHOD)
            await call(payloads[start], timeout=30)  # connected before the clock starts
            await asyncio.get_running_loop().run_in_executor(None, barrier.wait, 120)
            begin = time.perf_counter() + warmup_s
            end = begin + duration_s

            async def worker() -> None:
                nonlocal errors, sent
                while True:
                    payload = payloads[sent % len(payloads)]
                    sent += 1
                    started = time.perf_counter()
                    try:
                        await call(payload, timeout=30)
                    except grpc.RpcError:
                        errors += 1
                    finished = time.perf_counter()
                    if finished >= end:
                        return
                    if finished >= begin:
                        latencies.append(finished - started)

            async def cpu_meter() -> None:  # CPU this process spends inside the measuring window
                nonlocal cpu
                await asyncio.sleep(begin - time.perf_counter())
                cpu = -time.process_time()
                await asyncio.sleep(end - time.perf_counter())
                cpu += time.process_time()

            await asyncio.gather(cpu_meter(), *(worker() for _ in range(in_flight)))
        return latencies, errors, cpu

    try:
        results.put(asyncio.run(main()))
    except BaseException as exc:  # the parent waits on the queue: always answer
        results.put(exc)


def bench_grpc(grpc_url: str, payloads: list[bytes], concurrency: int, processes: int, warmup_s: float,
               duration_s: float, server_pid: int | None = None) -> Point:
    import multiprocessing

    # spawn: a fresh interpreter, with no server, grpc or numpy state inherited from this one
    context = multiprocessing.get_context("spawn")
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    barrier = context.Barrier(processes)
    results = context.Queue()
    # each process starts at its own place in the cycle, so that they do not send the same rows together
    starts = [i * len(payloads) // processes for i in range(processes)]
    workers = [context.Process(target=grpc_load_process,
                               args=(grpc_url, payloads, start, share, warmup_s, duration_s, barrier, results),
                               daemon=True)
               for start, share in zip(starts, shares, strict=True)]
    for worker in workers:
        worker.start()
    with ServerCpu(server_pid) as cpu:
        # the window: the load processes' clocks start after they connect and meet at the barrier,
        # a moment after this one, so its first and last half second are left out
        started = time.perf_counter()
        answers = [results.get(timeout=warmup_s + duration_s + 120) for _ in workers]
        server_cpu = cpu.shares(started + warmup_s + 0.5, started + warmup_s + duration_s - 0.5)
    for worker in workers:
        worker.join(timeout=30)
    failed = [a for a in answers if isinstance(a, BaseException)]
    if failed:
        raise RuntimeError(f"gRPC load process failed: {failed[0]!r}")
    latencies = sorted(x for lat, _, _ in answers for x in lat)
    errors = sum(e for _, e, _ in answers)
    cpu = sum(c for _, _, c in answers)
    if not latencies:
        raise RuntimeError("no gRPC request completed in the measuring window")
    return Point(len(latencies) / duration_s, percentile(latencies, 50), percentile(latencies, 99), errors,
                 cpu / duration_s, server_cpu)


def percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of sorted values (what wrk's histogram reports too)."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))]


# ---------------------------------------------------------------------------------- server CPU

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# what a child process of a server is, from its command line
_PROCESS_KINDS = (("http/relay.py", "HTTP relay"), ("grpc/relay.py", "gRPC relay"),
                  ("_python_stub", "model processes"), ("triton_python_backend_stub", "model processes"))


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds so far), from /proc (empty where there is none)."""
    table = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS_PER_S)
    return table


def _kind(pid: int, root: int) -> str:
    if pid == root:
        return "server"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    return next((kind for marker, kind in _PROCESS_KINDS if marker in command), "other")


class ServerCpu:
    """CPU use of a server's processes (the server and its descendants: relays, model processes),
    sampled every 0.25 s in a thread while a point runs; :meth:`shares` gives each kind of process's
    CPU seconds per second over a window of it."""

    def __init__(self, pid: int | None) -> None:
        self._pid = pid
        self._samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._kinds: dict[int, str] = {}

    def _sample(self) -> dict[str, float]:
        table = _process_table()
        members = {self._pid}
        grew = True
        while grew:  # descendants, however deep (real Triton's stubs are its children)
            grew = False
            for pid, (parent, _) in table.items():
                if parent in members and pid not in members:
                    members.add(pid)
                    grew = True
        used: dict[str, float] = {}
        for pid in members & table.keys():
            kind = self._kinds.setdefault(pid, _kind(pid, self._pid))
            used[kind] = used.get(kind, 0.0) + table[pid][1]
        return used

    def _run(self) -> None:
        while not self._stop.is_set():
            self._samples.append((time.perf_counter(), self._sample()))
            self._stop.wait(0.25)

    def __enter__(self) -> ServerCpu:
        if self._pid is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pid is not None:
            self._stop.set()
            self._thread.join()

    def shares(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds per second of each kind of process between the samples nearest ``start`` and ``end``."""
        inside = [sample for sample in self._samples if start <= sample[0] <= end]
        if len(inside) < 2:
            return {}
        (t0, first), (t1, last) = inside[0], inside[-1]
        return {kind: (last[kind] - first.get(kind, 0.0)) / (t1 - t0) for kind in last}


def format_cpu(shares: dict[str, float]) -> str:
    if not shares:
        return "-"
    parts = ", ".join(f"{kind} {share:.0%}" for kind, share in sorted(shares.items(), key=lambda kv: -kv[1])
                      if share >= 0.005)  # a relay with nothing to relay (HTTP load) is left out
    return f"{sum(shares.values()):.0%} ({parts})"


# ---------------------------------------------------------------------------------- servers

def _ready(http_url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=2) as r:
        return r.status == 200
    return False


@contextlib.contextmanager
def triton_nb_server(repo: Path, log_path: Path, flags: tuple[str, ...] = ()):
    """``triton-nb serve`` on ``repo`` in a child process, as a deployment runs it (it also keeps the
    loaded models out of the garbage collector's scans); yields (http_url, grpc_url)."""
    with triton_nb_serve(repo, ("http", "grpc"), log_path, flags=flags) as (process, endpoints):
        while not _ready(endpoints["http"]):
            time.sleep(0.2)
        yield endpoints["http"], endpoints["grpc"], process.pid


@contextlib.contextmanager
def real_triton_server(repo: Path):
    from triton_nb.tritonserver import TritonServerProcess

    with TritonServerProcess(repo) as server:
        yield server.http_url, server.grpc_url, server.pid


# ---------------------------------------------------------------------------------- main


def busy_cpus(seconds: float = 1.0) -> float:
    """How many CPUs' worth of work other processes are doing right now (from /proc/stat; 0 elsewhere)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return 0.0
    return (1 - (idle1 - idle0) / max(1, total1 - total0)) * (os.cpu_count() or 1)


def check_predictions(title: str, urls: tuple[str, str], requests: Requests) -> None:
    """Stop unless the server gives XGBoost's prediction for every checked row, over both protocols."""
    import grpc

    http_url, grpc_url = urls
    wrong = []
    with grpc.insecure_channel(grpc_url) as channel:
        for index, expected in requests.checks:
            got = (http_prediction(http_url, requests.bodies[index]),
                   grpc_prediction(channel, requests.payloads[index]))
            if len(requests.checks) == 1:
                print(f"{title}: prediction over HTTP {got[0]}, gRPC {got[1]} (XGBoost: {expected})", flush=True)
            if any(value != expected for value in got):
                wrong.append(f"row {index}: HTTP {got[0]}, gRPC {got[1]}, XGBoost {expected}")
    if wrong:
        raise SystemExit(f"{title} does not predict what XGBoost does: " + "; ".join(wrong[:10]))
    if len(requests.checks) > 1:
        flagged = sum(expected != 0 for _, expected in requests.checks)
        print(f"{title}: predictions over HTTP and gRPC equal XGBoost's on {len(requests.checks)} of the "
              f"{len(requests.bodies):,} rows ({flagged} of them flagged as fraud)", flush=True)


def measure_server(name: str, urls: tuple[str, str, int | None], args, requests: Requests,
                   script: Path) -> dict[tuple[str, int], Point]:
    http_url, grpc_url, pid = urls
    check_predictions(SERVERS[name][0], (http_url, grpc_url), requests)
    points = {}
    for protocol in args.protocols:
        for concurrency in args.concurrency:
            if protocol == "http":
                point = bench_http(args.wrk, http_url, script, concurrency, args.warmup_s, args.duration_s, pid)
            else:
                point = bench_grpc(grpc_url, requests.payloads, concurrency, args.grpc_processes, args.warmup_s,
                                   args.duration_s, pid)
            points[protocol, concurrency] = point
            print(f"  {protocol:4} c={concurrency:<3} {point.rate:9,.0f} infer/s   p50 {point.p50 * 1e3:7.2f} ms   "
                  f"p99 {point.p99 * 1e3:7.2f} ms   load generator {point.client_cpu:4.0%} CPU   "
                  f"server CPU {format_cpu(point.server_cpu)}"
                  + (f"   ERRORS {point.errors}" if point.errors else ""), flush=True)
    return points


def median_points(rounds: list[dict[tuple[str, int], Point]]) -> dict[tuple[str, int], Point]:
    """Per point, the round with the median throughput (its latencies with it, so they stay one measurement)."""
    return {key: sorted((r[key] for r in rounds), key=lambda p: p.rate)[(len(rounds) - 1) // 2] for key in rounds[0]}


def judge(ours: Point | None, real: Point | None, concurrency: int) -> tuple[tuple[str, str, str], str]:
    """The three ratios (ours/real) as printed, and the target's verdict for this point."""
    if not (ours and real):
        return ("     -",) * 3, "-"
    ratios = (f"{ours.rate / real.rate:6.2f}", f"{ours.p50 / real.p50:6.2f}", f"{ours.p99 / real.p99:6.2f}")
    if ours.errors or real.errors:
        return ratios, "not judged: requests failed"
    if concurrency == 1:
        return ratios, f"p50 <= real: {'ok' if ours.p50 <= real.p50 else 'MISSED'}"
    met = ours.rate >= real.rate and ours.p99 <= real.p99
    return ratios, f"rate >= real, p99 <= real: {'ok' if met else 'MISSED'}"


def print_table(results: dict[str, dict[tuple[str, int], Point]], args, inputs: str) -> None:
    """One block of rows per triton_nb export, the like-for-like one first; every row holds the same
    real Triton medians, so each ratio compares measurements of this run's alternation."""
    real = results.get("real")
    variants = [name for name in TREE_MODEL_LABELS if name in results] or [None]  # None: real Triton alone
    width = max(len(label) for label in TREE_MODEL_LABELS.values())

    def cell(point, attr, scale=1.0, fmt="8,.0f"):
        return format(getattr(point, attr) * scale, fmt) if point else "-".rjust(len(format(0, fmt)))

    print(f"\ninputs: {inputs}")
    header = (f"{'tree model':{width}} | {'proto':5} {'c':>3} | {'ours/s':>8} {'real/s':>8} {'ratio':>6} | "
              f"{'p50 ms':>13} {'ratio':>6} | {'p99 ms':>13} {'ratio':>6} | target")
    print(header)
    for variant in variants:
        print("-" * len(header))
        ours = results[variant] if variant else None
        label = TREE_MODEL_LABELS.get(variant, "-")
        for protocol in args.protocols:
            for concurrency in args.concurrency:
                a = ours[protocol, concurrency] if ours else None
                b = real[protocol, concurrency] if real else None
                ratios, target = judge(a, b, concurrency)
                p50 = f"{cell(a, 'p50', 1e3, '6.2f')}/{cell(b, 'p50', 1e3, '6.2f')}"
                p99 = f"{cell(a, 'p99', 1e3, '6.2f')}/{cell(b, 'p99', 1e3, '6.2f')}"
                print(f"{label:{width}} | {protocol:5} {concurrency:3} | {cell(a, 'rate')} {cell(b, 'rate')} "
                      f"{ratios[0]} | {p50} {ratios[1]} | {p99} {ratios[2]} | {target}")
    print(f"ratios are ours/real Triton's; p50 and p99 columns are ours/real Triton's in ms; each point is the "
          f"median of {args.rounds} round(s)\n"
          "python twin (same dir): both servers serve one directory, the tree model on the Python backend\n"
          "FIL (ours only): triton_nb on its default export, the tree model on the FIL backend (real Triton's build "
          "has none); its real/s column is the same real Triton measurement")
    print("\nCPU seconds per second while measured (the point's median round): the server's processes by kind, "
          "and the load generator")
    for name, points in results.items():
        for (protocol, concurrency), point in points.items():
            print(f"  {SERVERS[name][0]:58} {protocol:5} c={concurrency:<3} server {format_cpu(point.server_cpu)}; "
                  f"load generator {point.client_cpu:.0%}")
    if real:
        for variant in variants:
            if variant:
                # geometric: a point at 2x and one at 0.5x average to 1x, not 1.25x
                total = statistics.geometric_mean([results[variant][k].rate / real[k].rate for k in real])
                print(f"geometric mean of the throughput ratios, {TREE_MODEL_LABELS[variant]}: {total:.2f}")


def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=_csv(str), default=list(SERVERS),
                        help="comma-separated, measured in this order (rotated each round): real (real Triton on the "
                             "Python-backend twin), triton_nb (the same directory), triton_nb_fil (triton_nb on the "
                             "default export, tree model on the FIL backend)")
    parser.add_argument("--protocols", type=_csv(str), default=["http", "grpc"])
    parser.add_argument("--concurrency", type=_csv(int), default=[1, 16, 32])
    parser.add_argument("--duration-s", type=int, default=8, help="measured seconds per point (wrk takes whole s)")
    parser.add_argument("--warmup-s", type=int, default=2, help="load before each measured point, not counted")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure each server this many times, alternating; each point reports its median round")
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--max-queue-delay-us", type=int, default=None,
                        help="dynamic batcher delay written into the exported configs (default: the exporter's)")
    parser.add_argument("--grpc-processes", type=int, default=1,
                        help="gRPC load processes; the concurrency is split among them")
    parser.add_argument("--wrk", default=shutil.which("wrk") or "/usr/bin/wrk")
    parser.add_argument("--inputs", choices=("fixed", "distinct"), default="distinct",
                        help="fixed: one row in every request; distinct: --rows generated transactions the model "
                             "never saw, a different one in each request, cycled")
    parser.add_argument("--rows", type=int, default=4096, help="distinct rows to cycle through (--inputs distinct)")
    parser.add_argument("--seed", type=int, default=1,
                        help=f"fixed: picks the row from the training frame; distinct: the rows' generator seed "
                             f"(not {TRAINING_SEED}, the training frame's)")
    args = parser.parse_args()
    unknown = set(args.servers) - set(SERVERS) or set(args.protocols) - {"http", "grpc"}
    if unknown:
        parser.error(f"unknown: {', '.join(sorted(unknown))}")
    if len(set(args.servers)) != len(args.servers):
        parser.error("--servers names a server twice")
    if args.rounds < 1 or args.duration_s < 1 or args.warmup_s < 1:
        parser.error("--rounds, --duration-s and --warmup-s must be >= 1")
    if args.inputs == "distinct" and (args.rows < 2 or args.seed == TRAINING_SEED):
        parser.error(f"--inputs distinct needs --rows >= 2 and a --seed other than {TRAINING_SEED}, the training "
                     "frame's")
    if "http" in args.protocols and not os.access(args.wrk, os.X_OK):
        parser.error(f"wrk not found at {args.wrk}")

    from triton_nb import fraud
    from triton_nb.repository import export_fraud_repository
    from triton_nb.repository.export import BatchingOptions

    started = time.perf_counter()
    frame = fraud.generate_transactions(50_000, seed=TRAINING_SEED)
    model = fraud.train_fraud_model(frame, num_boost_round=args.trees, early_stopping_rounds=None, progress=False)
    batching = BatchingOptions() if args.max_queue_delay_us is None else BatchingOptions(
        max_queue_delay_microseconds=args.max_queue_delay_us)
    work = Path(tempfile.mkdtemp(prefix="bench-frontends-"))
    # one directory per tree backend: real Triton and triton_nb's like-for-like run share the python one
    repos = {backend: export_fraud_repository(model, work / f"repo-{backend}", model_backend=backend,
                                              batching=batching)
             for backend in sorted({SERVERS[name][1] for name in args.servers})}
    if args.inputs == "fixed":
        requests = fixed_requests(model, frame, args.seed)
    else:
        requests = distinct_requests(model, args.rows, args.seed)
    script = write_wrk_script(work, requests.bodies)
    print(f"model: {model.best_iteration + 1} trees, depth 8; dynamic batching, max_queue_delay_microseconds "
          f"{batching.max_queue_delay_microseconds}; servers: {'; '.join(SERVERS[name][0] for name in args.servers)}; "
          f"{os.cpu_count()} CPUs; inputs {args.inputs}; prepared in {time.perf_counter() - started:.0f} s", flush=True)

    rounds: dict[str, list[dict[tuple[str, int], Point]]] = {name: [] for name in args.servers}
    try:
        for round_index in range(args.rounds):
            # the servers alternate, so a slow spell of the machine hits each of them; each round starts with
            # the next one, so no server always follows the same other one (or always runs first)
            shift = round_index % len(args.servers)
            for name in args.servers[shift:] + args.servers[:shift]:
                title, backend = SERVERS[name]
                busy = busy_cpus()
                if busy > 0.3:  # the servers and load generators share the CPUs with whatever else runs
                    print(f"warning: {busy:.1f} CPUs busy before {title} starts: other processes "
                          "compete for the CPUs, expect noisy numbers", flush=True)
                if name == "real":
                    server = real_triton_server(repos[backend])
                else:
                    server = triton_nb_server(repos[backend], work / f"{name}.log", SERVE_FLAGS.get(name, ()))
                if args.rounds > 1:
                    print(f"round {round_index + 1}/{args.rounds}", end=": ", flush=True)
                with server as urls:
                    rounds[name].append(measure_server(name, urls, args, requests, script))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {name: median_points(measured) for name, measured in rounds.items()}
    print_table(results, args, requests.label)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
