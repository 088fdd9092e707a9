"""``measure``: perf_analyzer's measurement, from Python.

For each load level (a concurrency, or a request rate) a load runs; after a warm-up, measurement
windows follow one another (by time, or by a count of completed requests) until the last three
agree within ``stability_percentage`` on throughput and latency, or ``max_trials`` windows have
passed. The level's figures are those of the last three windows together: throughput, average and
p50/p90/p95/p99 latency as the client saw it, and the server's side of it from the difference of
two statistics snapshots — queue, compute input, compute infer, compute output, and with a response
cache the hit and miss time — with the rest of the client's latency as "network + server
send/receive", as perf_analyzer reports it. ``repeat_ratio`` makes a share of the requests repeat
earlier ones, for measuring a server's response cache. A sequence (stateful) model is measured with
perf_analyzer's sequences: every closed-loop slot runs sequences of about ``sequence_length``
requests one after another, each with a fresh sequence id (see :class:`~triton_nb.perf.load.SequenceSpec`).
``shared_memory="system"`` (perf_analyzer's ``--shared-memory system``) sends every request as
references to system shared-memory regions registered for the measurement (see
:class:`~triton_nb.perf.load.SystemSharedMemory`).

The load generator sends requests encoded once, before the measurement, and does not decode the
answers, so "client send" and "client recv" are zero by construction; what a client library adds
on top is measured separately (``bench/bench_perf_tool.py``). Over HTTP the tensor format (binary
or JSON) and compression are options, and every network row reports the mean bytes its requests
and responses took on the wire (:class:`~triton_nb.perf.options.Wire`); requests can mix row
counts (``rows_per_request=[1, 8, 64]``, ``rows_per_request_weights``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from triton_nb._deprecation import no_unknown, renamed
from triton_nb.errors import InvalidArgumentError
from triton_nb.perf.inputs import (
    InputData,
    RowsPerRequest,
    mix_label,
    request_inputs,
    row_mix,
)
from triton_nb.perf.load import SequenceSpec, SystemSharedMemory, open_load
from triton_nb.perf.options import (
    Sequences,
    SharedMemory,
    Wire,
    flat_options,
    parse_sequence_id_range,
)
from triton_nb.perf.stats import PERCENTILES, Completions, Window, is_stable, parse_range, server_breakdown, summarize
from triton_nb.transport import Transport, connect

__all__ = ["DEFAULT_SEQUENCE_LENGTH", "PERF_ANALYZER_COLUMNS", "WIRE_OPTIONS", "measure", "parse_sequence_id_range",
           "write_perf_analyzer_csv"]

_POLL_S = 0.05

# Our column -> perf_analyzer's CSV header (all in microseconds).
PERF_ANALYZER_COLUMNS = {
    "throughput_infer_per_sec": "Inferences/Second",
    "client_send_us": "Client Send",
    "network_server_send_recv_us": "Network+Server Send/Recv",
    "server_queue_us": "Server Queue",
    "server_compute_input_us": "Server Compute Input",
    "server_compute_infer_us": "Server Compute Infer",
    "server_compute_output_us": "Server Compute Output",
    "client_recv_us": "Client Recv",
    "latency_p50_us": "p50 latency",
    "latency_p90_us": "p90 latency",
    "latency_p95_us": "p95 latency",
    "latency_p99_us": "p99 latency",
    "latency_avg_us": "Avg latency",
}


def _composing(config: dict[str, Any]) -> list[str]:
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    return [step["model_name"] for step in steps]


def _levels(concurrency_range: Any, request_rate_range: Any) -> tuple[str, list[float]]:
    if (concurrency_range is None) == (request_rate_range is None):
        raise InvalidArgumentError("give concurrency_range or request_rate_range (one of them)")
    if concurrency_range is not None:
        values = parse_range(concurrency_range, "concurrency_range")
        if any(v != int(v) for v in values):
            raise InvalidArgumentError(f"concurrency values must be whole numbers, got {values}")
        return "concurrency", values
    return "request_rate", parse_range(request_rate_range, "request_rate_range")


#: perf_analyzer's --sequence-length default, used for a sequence model when none is given.
DEFAULT_SEQUENCE_LENGTH = 20


def _sequence_config(resolved: Transport, config: dict[str, Any]) -> dict[str, Any] | None:
    """The ``sequence_batching`` section of the model, or of the first composing model of an
    ensemble that has one (perf_analyzer treats such an ensemble as a sequence model too)."""
    if config.get("sequence_batching"):
        return config["sequence_batching"]
    for name in _composing(config):
        batching = resolved.model_config_json(name).get("sequence_batching")
        if batching:
            return batching
    return None


def _string_corrid(batching: dict[str, Any] | None) -> bool:
    """Whether the model takes sequence ids as strings: its CORRID control input is TYPE_STRING
    (Triton refuses an integer id for it)."""
    for control_input in (batching or {}).get("control_input", []):
        for control in control_input.get("control", []):
            if control.get("kind") == "CONTROL_SEQUENCE_CORRID":
                return control.get("data_type") == "TYPE_STRING"
    return False


def _sequence_spec(resolved: Transport, config: dict[str, Any], sequences: Sequences,
                   active_sequences: int, rows_per_request: int) -> SequenceSpec | None:
    """The sequences to run, or None for stateless requests: with ``sequence_length`` given, or by
    default for a model with ``sequence_batching`` (the group's values were checked when it was made)."""
    sequence_length, sequence_id_range = sequences.sequence_length, sequences.sequence_id_range
    id_start, id_end = sequences.id_range
    batching = _sequence_config(resolved, config)
    if sequence_length is None and batching is None:
        return None
    if rows_per_request != 1:
        raise InvalidArgumentError(f"a sequence model takes one row per request (the sequence batcher's rule): "
                                   f"rows_per_request must be 1, got {rows_per_request}")
    if id_end is not None and id_end - id_start < active_sequences:
        raise InvalidArgumentError(
            f"sequence_id_range {sequence_id_range!r} holds {id_end - id_start} id(s), fewer than the "
            f"{active_sequences} sequences active at once: two active sequences would share an id")
    return SequenceSpec(length=DEFAULT_SEQUENCE_LENGTH if sequence_length is None else sequence_length,
                        variation_pct=float(sequences.sequence_length_variation), id_start=id_start, id_end=id_end,
                        num_of_sequences=sequences.num_of_sequences, string_ids=_string_corrid(batching))


def _check_shared_memory(shared_memory: SharedMemory) -> None:
    if shared_memory.kind == "cuda":
        raise InvalidArgumentError("shared_memory 'cuda' is not supported: CUDA shared memory needs a GPU and "
                                   "tritonclient's CUDA utilities; use 'system' (or 'none')")


#: The wire options of :func:`measure` (the fields of :class:`~triton_nb.perf.options.Wire`:
#: client-side, set per measurement, the server untouched), their defaults and the protocols each
#: applies to.
WIRE_OPTIONS = {"input_tensor_format": (Wire.input_tensor_format, ("http", "sagemaker")),
                "output_tensor_format": (Wire.output_tensor_format, ("http", "sagemaker")),
                "request_compression": (Wire.request_compression, ("http",)),
                "response_compression": (Wire.response_compression, ("http",)),
                "grpc_compression_algorithm": (Wire.grpc_compression_algorithm, ("grpc",))}


def _check_wire(protocol: str, shared_memory: str, wire: Wire) -> None:
    """The wire options against the protocol they apply to (naming perf_analyzer's flag), and no
    JSON tensors with shared memory (whose requests carry no tensors); the values themselves were
    checked when the group was made."""
    for name, value in wire.as_dict().items():
        default, applies_to = WIRE_OPTIONS[name]
        flag = "--" + name.replace("_", "-")
        if value != default and protocol not in applies_to:
            why = ("in-process calls have no wire format" if protocol == "inprocess"
                   else "SageMaker's contract takes no compression" if protocol == "sagemaker"
                   else "gRPC requests are protobuf (compress them with grpc_compression_algorithm)"
                   if "http" in applies_to else "HTTP bodies take request_compression/response_compression")
            raise InvalidArgumentError(f"{name} ({flag}) {value!r} applies to protocol "
                                       f"{' or '.join(repr(p) for p in applies_to)}, not {protocol!r}: {why}")
        if name.endswith("tensor_format") and value == "json" and shared_memory != "none":
            raise InvalidArgumentError(f"{name} ({flag}) 'json' does not go with shared_memory {shared_memory!r}: "
                                       "tensors in shared memory are not in the requests")


def measure(
    target: Any,
    model: str,
    *,
    concurrency_range: str | Sequence[int] | int | None = None,
    request_rate_range: str | Sequence[float] | float | None = None,
    protocol: str | None = None,
    input_data: InputData = "random",
    rows_per_request: RowsPerRequest = 1,
    rows_per_request_weights: Sequence[float] | None = None,
    request_distribution: str = "constant",
    measurement_interval_ms: int = 5000,
    measurement_request_count: int | None = None,
    stability_percentage: float = 10.0,
    max_trials: int = 10,
    latency_percentile: int | None = None,
    warmup_ms: int | None = None,
    progress: bool = False,
    repeat_ratio: float = 0.0,
    request_count: int | None = None,
    wire: Wire | Mapping[str, str] | None = None,
    sequences: Sequences | None = None,
    shared_memory: SharedMemory | str = "none",
    **deprecated: Any,
) -> pd.DataFrame:
    """Measure ``model`` at each load level; one row per level (see the module's docstring).

    ``target``: an in-kernel ``InferenceServer`` (``protocol`` "inprocess", "http" or "grpc" — its
    own endpoints), a ``host:port`` URL of any KServe v2 server ("http" or "grpc"), or a
    :class:`~triton_nb.transport.Transport` (see :func:`triton_nb.transport.connect`).
    ``concurrency_range``/``request_rate_range``: perf_analyzer's ``start:end:step``, a list, or one
    number. ``latency_percentile``: judge stability on that latency percentile instead of the
    average (perf_analyzer's ``--percentile``; the same name :func:`~triton_nb.perf.tune` ranks by).
    ``measurement_request_count``: windows end after that many completions instead of after
    ``measurement_interval_ms``.

    ``request_count``: how many requests the load cycles through (default 16, or 100 with
    ``repeat_ratio``). ``repeat_ratio``: the share of them that repeat an earlier one of the
    sequence, for measuring a server's response cache: on the first pass through the sequence that
    share of requests can hit the cache; later passes repeat every request, so for a sustained ratio
    make ``request_count`` larger than the requests a measurement sends. Each row reports what the
    server saw: ``cache_hit_ratio`` (the model's requests answered from its cache) and the hit and
    miss time per request (``server_cache_hit_us``, ``server_cache_miss_us``).

    The option groups (:mod:`triton_nb.perf.options`) — ``sequences``, ``shared_memory`` and
    ``wire`` — replace the flat keywords of their fields (``request_compression="gzip"`` is now
    ``wire=Wire(request_compression="gzip")``); the flat keywords still work for a release, with a
    ``DeprecationWarning`` naming the group, as does ``percentile`` for ``latency_percentile``.

    ``sequences`` (a :class:`~triton_nb.perf.options.Sequences`): stateful models, as
    perf_analyzer's sequence options: ``sequence_length`` (``--sequence-length``): each closed-loop
    slot sends sequences of about that many requests back to back, the first with
    ``sequence_start``, the last with ``sequence_end``, each request after the previous one of its
    sequence was answered. Each sequence's length is drawn (seeded, so repeatable) within
    ``sequence_length_variation`` percent of it (``--sequence-length-variation``, default 20), at
    least 1. A model with ``sequence_batching`` (or an ensemble with such a step) gets
    perf_analyzer's default length 20 when none is given; given for another model, the sequence
    parameters are sent to it all the same. ``sequence_id_range`` (``--sequence-id-range``):
    ``"start[:end]"`` or ``(start, end)``, the ids each new sequence takes in turn, ``end`` excluded
    and the ids wrapping within the range (default from 1, unbounded); two sequences active at once
    never share an id, so the range must hold at least as many ids as the highest concurrency (or
    ``num_of_sequences``). At a request rate, ``num_of_sequences`` (``--num-of-sequences``, default
    4) sequences are active and the arrivals go to them in turn; an arrival for a sequence whose
    previous request is unanswered is sent once it is answered (so a slow server gets less than the
    rate). A sequence takes one row per request. Stopping a level ends the sequences it cut short
    with one unrecorded request each. Each row's ``sequence_length`` is the length used (NaN without
    sequences).

    ``shared_memory`` (a :class:`~triton_nb.perf.options.SharedMemory`, or its ``kind`` alone:
    ``shared_memory="system"``; ``--shared-memory``): "none" (tensors in the requests), or "system" over
    HTTP or gRPC: before the load, one region holding the inputs of every distinct request (written
    once) and one for their outputs are created and registered with the server (for an in-kernel
    server through its own endpoint), every request refers to them instead of carrying tensors, and
    they are unregistered and destroyed when the measurement ends, also on an error. The server must
    run on this host. ``output_size_bytes`` (``--output-shared-memory-size``, default 102400):
    the bytes per row of an output whose size the config does not give (BYTES or a variable
    dimension). "cuda" is refused: CUDA shared memory needs a GPU. Each row's ``shared_memory`` says which.

    Rows per request: ``rows_per_request`` one size, or a list of sizes mixed in the proportions of
    ``rows_per_request_weights`` (equal by default): the ``request_count`` requests (default 100
    with a mix) hold each size in proportion, in a seeded order, and the load cycles through them,
    so the sizes are sent in those proportions. Throughput counts the mix's mean rows per request;
    each row's ``rows_per_request`` is that mean and ``rows_per_request_mix`` the mix sent
    (``"1:90%,8:9%,64:1%"``).

    ``wire`` (a :class:`~triton_nb.perf.options.Wire`, or a dict of some of its fields; HTTP and
    gRPC loads; client-side, the server is not touched), as perf_analyzer and tritonclient send it:
    ``input_tensor_format`` (``--input-tensor-format``) "binary" (the binary tensor data extension,
    the default) or "json" (tensors as JSON ``data`` lists); ``output_tensor_format``
    (``--output-tensor-format``) the same for the answers; ``request_compression``
    (``--request-compression``) "none", "gzip" or "deflate": each distinct body compressed once,
    before the load, and sent with ``Content-Encoding``; ``response_compression``
    (``--response-compression``): answers asked for compressed (``Accept-Encoding``) — the load
    generator decompresses them, as tritonclient does, so that cost is in the client's latency;
    ``grpc_compression_algorithm`` (``--grpc-compression-algorithm``, gRPC only): gRPC compresses
    each request message itself. These options apply to their protocol only: in-process calls pass
    arrays and have no wire, so a non-default value there (or an HTTP option over gRPC) raises
    :class:`~triton_nb.errors.InvalidArgumentError` naming it, as perf_analyzer refuses an option
    its protocol lacks, rather than measuring something else. Each row reports the options and
    ``request_bytes``/``response_bytes``: the mean bytes on the wire per successful request and
    response — over HTTP the whole message (request or status line, headers, body as sent,
    compressed or not); over gRPC the message with its 5-byte prefix (HTTP/2 framing not counted);
    NaN in-process. The server's time to decode the request and encode the answer is in
    ``server_compute_input_us``/``server_compute_output_us``, from its statistics.

    Failed requests are measured, not raised: each row counts them in ``errors`` and keeps the
    first one's message in ``first_error`` (the server's words, over every protocol; empty when
    none failed), which ``triton-nb perf`` prints under the row, as perf_analyzer prints a failed
    request's error.
    """
    latency_percentile = renamed("measure", deprecated, "percentile", "latency_percentile", latency_percentile, None)
    wire, sequences, shared_memory = flat_options("measure", deprecated, wire, sequences, shared_memory)
    no_unknown("measure", deprecated)
    mode, levels = _levels(concurrency_range, request_rate_range)
    if latency_percentile is not None and latency_percentile not in PERCENTILES:
        raise InvalidArgumentError(f"latency_percentile must be one of {PERCENTILES}, got {latency_percentile}")
    if request_distribution not in ("constant", "poisson"):
        raise InvalidArgumentError(f"request_distribution must be constant or poisson, got {request_distribution!r}")
    if measurement_interval_ms <= 0 or max_trials < 1 or stability_percentage <= 0:
        raise InvalidArgumentError("measurement_interval_ms, max_trials and stability_percentage must be > 0")
    _check_shared_memory(shared_memory)
    if not isinstance(rows_per_request, int) and rows_per_request_weights is None and len(
            list(rows_per_request)) == 1:
        rows_per_request = int(next(iter(rows_per_request)))
    mixed = not isinstance(rows_per_request, int) or rows_per_request_weights is not None
    if mixed:
        row_mix(rows_per_request, rows_per_request_weights, 1)  # checked before any connection
    resolved = connect(target, protocol)
    rows = []
    with contextlib.ExitStack() as cleanup:
        if resolved is not target:  # made here, so closed here; a transport passed in stays open
            cleanup.callback(resolved.close)
        if shared_memory.kind == "system" and resolved.protocol not in ("http", "grpc"):
            raise InvalidArgumentError(f"shared_memory 'system' applies to HTTP and gRPC (in-process calls copy "
                                       f"nothing): measure over protocol 'http' or 'grpc', not {resolved.protocol!r}")
        _check_wire(resolved.protocol, shared_memory.kind, wire)
        config = resolved.model_config_json(model)
        if resolved.protocol == "sagemaker":
            # /invocations answers for the endpoint's default model only: one request makes sure it is
            # the model measured (SageMakerTransport refuses another model's answer, naming both)
            resolved.infer(model, request_inputs(config, input_data, 1, count=1)[0])
        if request_count is None:
            request_count = 100 if repeat_ratio or mixed else 16
        requests = request_inputs(config, input_data, rows_per_request, count=request_count,
                                  repeat_ratio=repeat_ratio, rows_per_request_weights=rows_per_request_weights)
        batched = int(config.get("max_batch_size", 0)) > 0
        row_counts = [len(next(iter(r.values()))) if batched and r else 1 for r in requests]
        mean_rows: float = (sum(row_counts) / len(row_counts)) if mixed and row_counts else rows_per_request
        largest = max(row_counts) if row_counts else 1
        composing = _composing(config)
        active = int(max(levels)) if mode == "concurrency" else sequences.num_of_sequences
        spec = _sequence_spec(resolved, config, sequences, active, largest if mixed else rows_per_request)
        warmup_s = (measurement_interval_ms if warmup_ms is None else warmup_ms) / 1e3
        regions = None
        if shared_memory.kind == "system":
            regions = cleanup.enter_context(SystemSharedMemory(resolved, config, requests, largest,
                                                               shared_memory.output_size_bytes))
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = cleanup.enter_context(tqdm(total=len(levels), desc=f"measuring {model}", unit="level"))
        for level in levels:
            load_kwargs = ({"concurrency": int(level)} if mode == "concurrency"
                           else {"request_rate": level, "distribution": request_distribution})
            if spec is not None:
                load_kwargs["sequences"] = spec
            if regions is not None:
                load_kwargs["shared_memory"] = regions
            if resolved.protocol != "inprocess":
                load_kwargs["wire"] = wire
            rows.append(_measure_level(resolved, model, requests, load_kwargs, composing, mean_rows, warmup_s,
                                       measurement_interval_ms / 1e3, measurement_request_count, stability_percentage,
                                       max_trials, latency_percentile))
            rows[-1].update({"model": model, "protocol": resolved.protocol,
                             "concurrency": int(level) if mode == "concurrency" else math.nan,
                             "request_rate": level if mode == "request_rate" else math.nan,
                             "sequence_length": spec.length if spec is not None else math.nan,
                             "shared_memory": shared_memory.kind, "rows_per_request_mix": mix_label(row_counts),
                             **wire.as_dict()})
            if bar is not None:
                bar.update(1)
    columns = ["model", "protocol", "concurrency", "request_rate", *PERF_ANALYZER_COLUMNS]
    frame = pd.DataFrame(rows)
    return frame[columns + [c for c in frame.columns if c not in columns]]


def _measure_level(target: Transport, model: str, requests: list, load_kwargs: dict[str, Any], composing: list[str],
                   rows_per_request: float, warmup_s: float, interval_s: float, request_count: int | None,
                   stability_percentage: float, max_trials: int, percentile: int | None) -> dict[str, Any]:
    load = open_load(target, model, requests, **load_kwargs)
    completions = Completions()
    windows: list[Window] = []
    snapshots: list[dict[str, Any]] = []
    load.start()
    try:
        time.sleep(warmup_s)
        load.take()  # the warm-up's completions are not measured
        begin = time.monotonic_ns()
        snapshots.append(target.statistics())
        for _ in range(max_trials):
            deadline = time.monotonic() + (interval_s * 10 if request_count else interval_s)
            # the window's completions are joined once it closes, not at every poll: the poll runs
            # beside the load, and copying all gathered so far would take the GIL from the server
            parts, answered = [completions], 0
            while time.monotonic() < deadline:
                time.sleep(_POLL_S)
                fresh = load.take()
                parts.append(fresh)
                if request_count:
                    answered += int(np.count_nonzero(fresh.end_ns >= begin))
                    if answered >= request_count:
                        break
            end = time.monotonic_ns()
            parts.append(load.take())  # those answered before the window's end, all of them
            completions = Completions.joined(parts)
            snapshots.append(target.statistics())
            windows.append(summarize(completions, begin, end, rows_per_request))
            begin = end
            if is_stable(windows, stability_percentage, percentile):
                break
    finally:
        load.stop()
    last = windows[-3:]
    span = summarize(completions, last[0].begin_ns, last[-1].end_ns, rows_per_request)
    breakdown = server_breakdown(snapshots[-len(last) - 1], snapshots[-1], model, composing)
    latency = span.latency_avg_us
    remainder = max(0.0, latency - breakdown.server_us) if math.isfinite(latency) else math.nan
    return {
        "throughput_infer_per_sec": span.throughput_infer_per_sec,
        "client_send_us": 0.0,
        "network_server_send_recv_us": remainder,
        "server_queue_us": breakdown.queue_us,
        "server_compute_input_us": breakdown.compute_input_us,
        "server_compute_infer_us": breakdown.compute_infer_us,
        "server_compute_output_us": breakdown.compute_output_us,
        "client_recv_us": 0.0,
        **{f"latency_p{p}_us": span.latency_percentiles_us[p] for p in PERCENTILES},
        "latency_avg_us": latency,
        "completed_requests": span.completed,
        "errors": span.errors,
        "first_error": (load.first_error or "") if span.errors else "",
        "window_s": (last[-1].end_ns - last[0].begin_ns) / 1e9,
        "trials": len(windows),
        "stable": is_stable(windows, stability_percentage, percentile),
        "rows_per_request": rows_per_request,
        "request_bytes": span.request_bytes,
        "response_bytes": span.response_bytes,
        "server_requests": breakdown.requests,
        "server_request_us": breakdown.request_us,
        "server_cache_hit_us": breakdown.cache_hit_us,
        "server_cache_miss_us": breakdown.cache_miss_us,
        "cache_hit_ratio": breakdown.cache_hit_ratio,
        "batch_sizes": breakdown.batch_sizes,
    }


def write_perf_analyzer_csv(results: pd.DataFrame, path: str | Path) -> Path:
    """``results`` as perf_analyzer's ``-f`` CSV: the load column (``Concurrency`` or ``Request
    Rate``), then its columns, in microseconds."""
    if results.empty:
        raise InvalidArgumentError("no results to write")
    missing = [c for c in ("concurrency", "request_rate", *PERF_ANALYZER_COLUMNS) if c not in results.columns]
    if missing:
        raise InvalidArgumentError(f"results lack column(s) {', '.join(missing)}")
    by_rate = results["concurrency"].isna().all()
    out = pd.DataFrame()
    out["Request Rate" if by_rate else "Concurrency"] = results["request_rate" if by_rate else "concurrency"]
    for column, header in PERF_ANALYZER_COLUMNS.items():
        values = results[column].astype(float)
        out[header] = values.round(1) if column == "throughput_infer_per_sec" else values.round().astype("Int64")
    path = Path(path)
    out.to_csv(path, index=False)
    return path
