"""Triton's statistics extension and its per-model Prometheus metrics.

:class:`ModelStats` accumulates what one model version did, exactly as Triton's core does
(``src/infer_stats.cc`` in triton-inference-server/core); :class:`ServerStats` holds them for one
server and answers both views:

* :meth:`ServerStats.statistics` — the statistics extension's JSON (``GET v2/models[/<name>[/versions/
  <v>]]/stats``, gRPC ``ModelStatistics``), field for field as ``TRITONSERVER_ServerModelStatistics``
  writes it: ``name``, ``version`` (a string), ``last_inference`` (ms since the epoch),
  ``inference_count``, ``execution_count``, ``inference_stats`` (``success``, ``fail``, ``queue``,
  ``compute_input``, ``compute_infer``, ``compute_output``, ``cache_hit``, ``cache_miss``: each
  ``{"count", "ns"}``), ``response_stats`` (``{}``: only backends that report per-response
  statistics fill it), ``batch_stats`` (one entry per executed batch size, ascending) and
  ``memory_usage`` (``[]``);
* :meth:`ServerStats.prometheus_text` — the ``/metrics`` text, with Triton's family names, help
  strings, types and labels (``model``, ``version``; ``reason`` on failures).

How Triton counts, and so how the server should call these:

* one :meth:`ModelStats.record_request` per finished request (the batcher records a batch's
  successes in one :meth:`ModelStats.record_successes` call, with the same sums). A success adds 1 to ``success``
  (with the request's end-to-end time), its ``batch_size`` to ``inference_count``, and its queue
  and compute durations to ``queue``/``compute_*``. Triton attributes a batch's compute time to
  every request in it: pass each request of a batch the batch's ``compute_*`` durations. A
  failure only adds to ``fail`` (count and time) and to ``nv_inference_request_failure`` under its
  reason: ``REJECTED`` (timed out in the scheduler queue), ``CANCELED``, ``BACKEND`` (the model or
  backend failed it) or ``OTHER``;
* one :meth:`ModelStats.record_execution` per executed batch: ``execution_count``, the batch size's
  ``batch_stats`` entry and ``last_inference``. (It does not touch ``inference_count``: Triton adds
  each *successful request's* batch size there, so rows of a failed request are not counted.)
* :meth:`ModelStats.pending_add`: +1 when a request is queued for the model, -1 when a backend
  starts executing it (Triton's ``nv_inference_pending_request_count``; a request that leaves the
  queue without executing, such as a timed-out one, is -1 too).
* the response cache (:mod:`triton_nb.server.cache`): a request answered from the cache is one
  :meth:`ModelStats.record_cache_hit` instead (a success and a ``cache_hit``; no inference count,
  execution or compute time, so ``compute_*`` counts are successes less hits); a request that
  missed, ran and was inserted adds :meth:`ModelStats.record_cache_miss` to its success. The
  ``nv_cache_*_per_model`` counters exist only for versions that enable the cache.

Prometheus counters: prometheus_client's own exposition (``generate_latest``) appends ``_total``
to every counter name, which Triton's does not (``nv_inference_count{model="m",version="1"} 9``).
:meth:`ServerStats.prometheus_text` therefore writes the text format itself from
``registry.collect()``: Triton's exact names, integral values without ``.0`` and labels sorted by
name, as prometheus-cpp writes them. The registry is still a ``prometheus_client``
``CollectorRegistry`` (one per server, so several servers in a process never share series).

Unloading: Triton drops a model version's statistics and its metric series when the version
unloads (the series disappear from ``/metrics``; a reload starts again from zero). The server
calls :meth:`ServerStats.remove` at unload to do the same.

Beyond the counters (see :mod:`triton_nb.server.observability.metrics`): ``--metrics-config`` (the
``metrics_config`` argument) turns Triton's latency counters off (``counter_latencies=false``) and
its summaries (``summary_latencies=true``: ``nv_inference_{request,queue,compute_input,
compute_infer,compute_output}_summary_us``, and ``nv_cache_{hit,miss}_summary_per_model`` for
versions with the cache, which show no request summary, as in Triton) or the first-response
histogram (``histogram_latencies=true``) on. Their observations are taken where the counters are
added, under the same lock; nothing is recorded per request when both are off. ``cpu_metrics``
adds Triton's ``nv_cpu_*`` gauges and ``custom_metrics`` the Python models' ``pb_utils`` metrics.

Beyond Triton — why each batch left: :meth:`ModelStats.count_batch` counts each batch the dynamic
batcher forms with its rows and :class:`~triton_nb.server.observability.batch_reasons.BatchReason` (statistics key
``triton_nb_batch_reasons``, ``/metrics`` families ``triton_nb_batch_count`` and
``triton_nb_batch_size``): see :mod:`triton_nb.server.observability.batch_reasons`. The Prometheus text itself is
written by :func:`triton_nb.server.observability.metrics.exposition`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CollectorRegistry, Metric
from prometheus_client.registry import Collector

from triton_nb.errors import InvalidArgumentError, TritonNBError
from triton_nb.server.observability.batch_reasons import (
    BATCH_COUNT_FAMILY,
    BATCH_FAMILIES,
    BATCH_REASONS,
    BATCH_REASONS_KEY,
    BATCH_SIZE_BUCKETS,
    BATCH_SIZE_FAMILY,
    BatchCollector,
    BatchReason,
)
from triton_nb.server.observability.metrics import (
    CUSTOM_METRICS,
    DEFAULT_FIRST_RESPONSE_BUCKETS_MS,
    FIRST_RESPONSE_HISTOGRAM,
    PROMETHEUS_CONTENT_TYPE,
    CpuMetricsCollector,
    CustomMetricsCollector,
    Histogram,
    MetricsConfig,
    SlidingQuantiles,
    exposition,
    parse_metrics_config,
    summary_samples,
)

__all__ = [
    "BATCH_COUNT_FAMILY",
    "BATCH_REASONS",
    "BATCH_REASONS_KEY",
    "BATCH_SIZE_BUCKETS",
    "BATCH_SIZE_FAMILY",
    "FAILURE_REASONS",
    "PROMETHEUS_CONTENT_TYPE",
    "BatchReason",
    "ModelStats",
    "ServerStats",
]

#: The ``reason`` label values of ``nv_inference_request_failure`` (Triton core, FailureReason).
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


# Triton core src/metrics.cc: family name, type and help, in Triton's registration order.
_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "counter",
     "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    # Only for versions that enable the response cache (Triton's MetricModelReporter); a family
    # without series is left out, as prometheus-cpp leaves it out.
    ("nv_cache_num_hits_per_model", "counter", "Number of cache hits per model"),
    ("nv_cache_hit_duration_per_model", "counter", "Total cache hit duration per model, in microseconds"),
    ("nv_cache_num_misses_per_model", "counter", "Number of cache misses per model"),
    ("nv_cache_miss_duration_per_model", "counter",
     "Total cache miss (insert+lookup) duration per model, in microseconds"),
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model."),
    ("nv_model_load_duration_secs", "gauge", "Model load time in seconds"),
)
_CACHE_FAMILIES = frozenset(("nv_cache_num_hits_per_model", "nv_cache_hit_duration_per_model",
                             "nv_cache_num_misses_per_model", "nv_cache_miss_duration_per_model"))
# What --metrics-config counter_latencies=false leaves out (Triton creates these counters only with
# latency counters on: the cache ones are inside the same block of MetricModelReporter).
_LATENCY_COUNTERS = frozenset(("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                               "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                               "nv_inference_compute_output_duration_us")) | _CACHE_FAMILIES

# --metrics-config summary_latencies=true (Triton core src/metrics.cc): key, family name and help.
# "request" is left out for versions that use the response cache and the cache ones are only for
# them, as Triton does (its FIXME DLIS-4762).
_SUMMARIES: tuple[tuple[str, str, str], ...] = (
    ("request", "nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)"),
    ("queue", "nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)"),
    ("compute_input", "nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("compute_infer", "nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("compute_output", "nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    ("cache_hit", "nv_cache_hit_summary_per_model",
     "Summary of cache hit counts/durations per model, in microseconds."),
    ("cache_miss", "nv_cache_miss_summary_per_model",
     "Summary of cache miss counts/durations per model, in microseconds."),
)
_FIRST_RESPONSE_HELP = "Duration from request to first response in milliseconds"

#: Every family name the server exports itself (a custom metric may not take one).
BUILTIN_FAMILIES = frozenset(
    [name for name, _, _ in _FAMILIES] + [name for _, name, _ in _SUMMARIES] + [name for name, _, _ in BATCH_FAMILIES]
    + [FIRST_RESPONSE_HISTOGRAM, "nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes",
       "nv_cache_num_entries", "nv_cache_num_lookups", "nv_cache_num_hits", "nv_cache_num_misses",
       "nv_cache_num_evictions", "nv_cache_util", "nv_cache_lookup_duration", "nv_cache_insertion_duration"])
CUSTOM_METRICS.reserved = BUILTIN_FAMILIES


class _Latencies:
    """Per-request latencies of one version, for --metrics-config summary_latencies and
    histogram_latencies: touched only under its :class:`ModelStats`' lock, so recording costs no
    lock of its own. Values are microseconds (summaries) and milliseconds (the histogram), truncated
    as Triton truncates them (``ns / 1000``)."""

    __slots__ = ("buckets", "first_response", "summaries")

    def __init__(self, config: MetricsConfig, buckets: Callable[[], tuple[float, ...]]) -> None:
        self.summaries = {key: SlidingQuantiles() for key, _, _ in _SUMMARIES} if config.summary_latencies else None
        #: the first-response histogram, created at the first observation (or scrape) with the
        #: buckets ``buckets()`` reads from the version's model_metrics; None without histograms
        self.buckets = buckets if config.histogram_latencies else None
        self.first_response: Histogram | None = None

    def new_histogram(self) -> Histogram:
        assert self.buckets is not None
        try:
            return Histogram(self.buckets())
        except InvalidArgumentError:  # unsorted buckets are refused at load (fields.py); never fail a request
            return Histogram(DEFAULT_FIRST_RESPONSE_BUCKETS_MS)

    def observe(self, now_s: float, request_ns: int, queue_ns: int, compute_input_ns: int, compute_infer_ns: int,
                compute_output_ns: int, first_response: bool = True) -> None:
        summaries = self.summaries
        if summaries is not None:
            summaries["request"].observe(request_ns // 1000, now_s)
            summaries["queue"].observe(queue_ns // 1000, now_s)
            summaries["compute_input"].observe(compute_input_ns // 1000, now_s)
            summaries["compute_infer"].observe(compute_infer_ns // 1000, now_s)
            summaries["compute_output"].observe(compute_output_ns // 1000, now_s)
        if first_response and self.first_response is not None:
            # the whole response for a model that answers once: Triton's first response (2.65
            # observes it for every model; a decoupled model's is observed as it sends it)
            self.first_response.observe(request_ns // 1_000_000)


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class _BatchStats:
    count: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


def _ns(value: int, what: str) -> int:
    value = int(value)
    if value < 0:
        raise InvalidArgumentError(f"{what} must be >= 0 nanoseconds, got {value}")
    return value


class ModelStats:
    """Cumulative statistics of one model version; thread-safe. Durations are nanoseconds."""

    def __init__(self, name: str, version: int, metrics: MetricsConfig | None = None,
                 first_response_buckets: Callable[[], tuple[float, ...]] | None = None) -> None:
        """``metrics``: the server's --metrics-config (summaries and histograms need per-request
        observations); ``first_response_buckets``: the first-response histogram's buckets in ms
        (the version's model_metrics; Triton's defaults when None)."""
        self.name = name
        self.version = int(version)
        self._lock = threading.Lock()
        self.metrics = metrics if metrics is not None else MetricsConfig()
        self._latency: _Latencies | None = None
        if self.metrics.records_latencies:
            self._latency = _Latencies(self.metrics,
                                       first_response_buckets or (lambda: DEFAULT_FIRST_RESPONSE_BUCKETS_MS))
        self._last_inference_ms = 0
        self._inference_count = 0
        self._execution_count = 0
        self._success = _Duration()
        self._fail = _Duration()
        self._queue_ns = 0
        self._compute_input_ns = 0
        self._compute_infer_ns = 0
        self._compute_output_ns = 0
        self._batches: dict[int, _BatchStats] = {}
        self._failures = dict.fromkeys(FAILURE_REASONS, 0)
        # The Prometheus counters add ns // 1000 per request, as Triton does (so they can differ
        # from the JSON's ns / 1000 by the truncated remainders).
        self._request_us = 0
        self._queue_us = 0
        self._compute_input_us = 0
        self._compute_infer_us = 0
        self._compute_output_us = 0
        self._pending = 0
        self._load_seconds = 0.0
        # The response cache (triton_nb.server.cache): hits and misses, and their microseconds.
        self._cache_hit = _Duration()
        self._cache_miss = _Duration()
        self._cache_hit_us = 0
        self._cache_miss_us = 0
        # reason -> {rows: batches}: written by count_batch, read by copying (see there)
        self._batch_sizes: dict[str, dict[int, int]] = {reason: {} for reason in BATCH_REASONS}

    def record_request(
        self,
        *,
        success: bool,
        request_ns: int,
        queue_ns: int = 0,
        compute_input_ns: int = 0,
        compute_infer_ns: int = 0,
        compute_output_ns: int = 0,
        batch_size: int = 1,
        reason: str = "OTHER",
        first_response: bool = True,
    ) -> None:
        """One finished request. ``request_ns`` is its end-to-end time in the server.

        With ``histogram_latencies``, ``request_ns`` is also the request's first response time
        (``nv_inference_first_response_histogram_ms``), success or failure, as Triton 2.65
        observes every model's first response; ``first_response=False`` when no response was
        sent for it here (refused before it was scheduled) or the response sender observed it
        (a decoupled model's, :meth:`observe_first_response`).

        Success: ``success``, ``queue`` and ``compute_*`` get the durations (for a batched request,
        the whole batch's compute durations, as Triton attributes them) and ``inference_count``
        grows by ``batch_size`` (the request's rows; 1 for a model without batching). Failure: only
        ``fail`` and the failure counter of ``reason`` (one of :data:`FAILURE_REASONS`).
        """
        request_ns = _ns(request_ns, "request_ns")
        if success:
            queue_ns = _ns(queue_ns, "queue_ns")
            compute_input_ns = _ns(compute_input_ns, "compute_input_ns")
            compute_infer_ns = _ns(compute_infer_ns, "compute_infer_ns")
            compute_output_ns = _ns(compute_output_ns, "compute_output_ns")
            if int(batch_size) < 0:
                raise InvalidArgumentError(f"batch_size must be >= 0, got {batch_size}")
            latency = self._latency
            histogram = None if latency is None else self._pending_histogram(latency)
            with self._lock:
                if latency is not None:
                    if histogram is not None and latency.first_response is None:
                        latency.first_response = histogram
                    latency.observe(time.monotonic(), request_ns, queue_ns, compute_input_ns, compute_infer_ns,
                                    compute_output_ns, first_response)
                self._inference_count += int(batch_size)
                self._success.add(request_ns)
                self._queue_ns += queue_ns
                self._compute_input_ns += compute_input_ns
                self._compute_infer_ns += compute_infer_ns
                self._compute_output_ns += compute_output_ns
                self._request_us += request_ns // 1000
                self._queue_us += queue_ns // 1000
                self._compute_input_us += compute_input_ns // 1000
                self._compute_infer_us += compute_infer_ns // 1000
                self._compute_output_us += compute_output_ns // 1000
            return
        if reason not in self._failures:
            raise InvalidArgumentError(f"failure reason must be one of {', '.join(FAILURE_REASONS)}, got {reason!r}")
        if first_response:  # an error response is a first response too (summaries take successes only)
            self.observe_first_response(request_ns)
        with self._lock:
            self._fail.add(request_ns)
            self._failures[reason] += 1

    @property
    def observes_first_responses(self) -> bool:
        """Whether the first-response histogram is on (``histogram_latencies=true``)."""
        return self._latency is not None and self._latency.buckets is not None

    def observe_first_response(self, first_response_ns: int) -> None:
        """One request's first response, ``first_response_ns`` after it arrived, in the
        first-response histogram (when it is on): for a decoupled model, as it sends it."""
        latency = self._latency
        if latency is None or latency.buckets is None:
            return
        histogram = self._pending_histogram(latency)
        with self._lock:
            if histogram is not None and latency.first_response is None:
                latency.first_response = histogram
            if latency.first_response is not None:
                latency.first_response.observe(max(0, first_response_ns) // 1_000_000)

    def record_successes(self, requests: list[tuple[int, int, int]], *, compute_input_ns: int,
                         compute_infer_ns: int, compute_output_ns: int, first_response: bool = True) -> None:
        """The successful requests of one executed batch, under one lock: each a tuple of its
        end-to-end ``request_ns``, its ``queue_ns`` and its ``batch_size``, each given the batch's
        ``compute_*`` durations, as Triton attributes them. The same sums as
        :meth:`record_request` once per request; the batcher calls this once per batch
        (``first_response`` False for a decoupled model's, whose senders observe them)."""
        if not requests:
            return
        compute_input_ns = _ns(compute_input_ns, "compute_input_ns")
        compute_infer_ns = _ns(compute_infer_ns, "compute_infer_ns")
        compute_output_ns = _ns(compute_output_ns, "compute_output_ns")
        count = len(requests)
        request_total = queue_total = rows = request_us = queue_us = 0
        for request_ns, queue_ns, batch_size in requests:
            if request_ns < 0 or queue_ns < 0 or batch_size < 0:
                raise InvalidArgumentError(f"request_ns, queue_ns and batch_size must be >= 0, got "
                                           f"{request_ns}, {queue_ns}, {batch_size}")
            request_total += request_ns
            queue_total += queue_ns
            rows += batch_size
            request_us += request_ns // 1000  # truncated per request, as record_request does
            queue_us += queue_ns // 1000
        latency = self._latency
        histogram = None if latency is None else self._pending_histogram(latency)
        with self._lock:
            if latency is not None:
                if histogram is not None and latency.first_response is None:
                    latency.first_response = histogram
                now_s = time.monotonic()
                for request_ns, queue_ns, _ in requests:
                    latency.observe(now_s, request_ns, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns,
                                    first_response)
            self._inference_count += rows
            self._success.count += count
            self._success.ns += request_total
            self._queue_ns += queue_total
            self._compute_input_ns += compute_input_ns * count
            self._compute_infer_ns += compute_infer_ns * count
            self._compute_output_ns += compute_output_ns * count
            self._request_us += request_us
            self._queue_us += queue_us
            self._compute_input_us += compute_input_ns // 1000 * count
            self._compute_infer_us += compute_infer_ns // 1000 * count
            self._compute_output_us += compute_output_ns // 1000 * count

    def record_cache_hit(self, *, request_ns: int, queue_ns: int, hit_ns: int) -> None:
        """A request answered from the response cache, as Triton's ``UpdateSuccessCacheHit``: a
        success with its end-to-end and queue time (arrival to the lookup) and a cache hit with the
        lookup's time. No ``inference_count``, no execution, no compute time: the model did not run."""
        request_ns = _ns(request_ns, "request_ns")
        queue_ns = _ns(queue_ns, "queue_ns")
        hit_ns = _ns(hit_ns, "hit_ns")
        latency = self._latency
        histogram = None if latency is None else self._pending_histogram(latency)
        with self._lock:
            if latency is not None:  # Triton's UpdateSuccessCacheHit: queue and cache hit summaries
                if histogram is not None and latency.first_response is None:
                    latency.first_response = histogram
                now_s = time.monotonic()
                if latency.summaries is not None:
                    latency.summaries["queue"].observe(queue_ns // 1000, now_s)
                    latency.summaries["cache_hit"].observe(hit_ns // 1000, now_s)
                if latency.first_response is not None:
                    latency.first_response.observe(request_ns // 1_000_000)
            self._success.add(request_ns)
            self._queue_ns += queue_ns
            self._cache_hit.add(hit_ns)
            self._request_us += request_ns // 1000
            self._queue_us += queue_ns // 1000
            self._cache_hit_us += hit_ns // 1000

    def record_cache_miss(self, miss_ns: int) -> None:
        """A request that missed the cache, ran and was inserted, as Triton's
        ``UpdateSuccessCacheMiss``: a cache miss with the lookup and insert time, which is added to
        the request's time too (its success was counted by whoever ran it)."""
        miss_ns = _ns(miss_ns, "miss_ns")
        with self._lock:
            if self._latency is not None and self._latency.summaries is not None:
                self._latency.summaries["cache_miss"].observe(miss_ns // 1000, time.monotonic())
            self._success.ns += miss_ns
            self._cache_miss.add(miss_ns)
            self._request_us += miss_ns // 1000
            self._cache_miss_us += miss_ns // 1000

    @staticmethod
    def _pending_histogram(latency: _Latencies | None) -> Histogram | None:
        """The first-response histogram to install, made before taking the lock: its buckets come
        from the server's view of the model's config, which must not be read under this lock."""
        if latency is None or latency.buckets is None or latency.first_response is not None:
            return None
        return latency.new_histogram()

    def _latency_samples(self, cache: bool, now_s: float) -> dict[str, list[tuple[str, dict[str, str], float]]]:
        """Each summary and histogram family's samples for this version (full sample names and
        labels), empty without --metrics-config summary_latencies / histogram_latencies."""
        latency = self._latency
        if latency is None:
            return {}
        labels = {"model": self.name, "version": str(self.version)}
        histogram = self._pending_histogram(latency)  # Triton shows the series at zero from the load on
        values: dict[str, list[tuple[str, dict[str, str], float]]] = {}
        with self._lock:
            if histogram is not None and latency.first_response is None:
                latency.first_response = histogram
            if latency.first_response is not None:
                values[FIRST_RESPONSE_HISTOGRAM] = latency.first_response.samples(FIRST_RESPONSE_HISTOGRAM, labels)
            if latency.summaries is not None:
                quantiles = [q for q, _ in self.metrics.summary_quantiles]
                for key, name, _ in _SUMMARIES:
                    if (key == "request" and cache) or (key.startswith("cache_") and not cache):
                        continue
                    values[name] = summary_samples(name, labels, latency.summaries[key], quantiles, now_s)
        return values

    @property
    def cache_counted(self) -> bool:
        """Whether any cache hit or miss was recorded."""
        with self._lock:
            return bool(self._cache_hit.count or self._cache_miss.count)

    def record_execution(
        self, *, batch_rows: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        """One executed batch of ``batch_rows`` rows (the sum of its requests' batch sizes)."""
        rows = int(batch_rows)
        if rows < 0:
            raise InvalidArgumentError(f"batch_rows must be >= 0, got {batch_rows}")
        compute_input_ns = _ns(compute_input_ns, "compute_input_ns")
        compute_infer_ns = _ns(compute_infer_ns, "compute_infer_ns")
        compute_output_ns = _ns(compute_output_ns, "compute_output_ns")
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self._last_inference_ms = max(self._last_inference_ms, now_ms)
            self._execution_count += 1
            batch = self._batches.get(rows)
            if batch is None:
                batch = self._batches[rows] = _BatchStats()
            batch.count += 1
            batch.compute_input_ns += compute_input_ns
            batch.compute_infer_ns += compute_infer_ns
            batch.compute_output_ns += compute_output_ns

    def count_batch(self, reason: str, rows: int) -> None:
        """One batch the dynamic batcher formed, of ``rows`` rows, and why it left (a
        :class:`BatchReason`). Called with the batcher's lock held, by the worker forming the
        batch, so the writers take turns; no lock of this object's is taken, so counting costs the
        hot path a dict increment (0.2 µs a batch, measured with timeit). Readers copy the counts
        (:meth:`batch_reasons`), a copy made whole under the GIL."""
        sizes = self._batch_sizes[reason]
        sizes[rows] = sizes.get(rows, 0) + 1

    def batch_reasons(self) -> dict[str, dict[int, int]]:
        """Every :class:`BatchReason` -> {rows: batches of that many rows}, a copy."""
        return {reason: dict(sizes) for reason, sizes in self._batch_sizes.items()}

    def pending_add(self, n: int) -> None:
        """Move the pending-request gauge: +1 when queued, -1 when execution starts (or it leaves the queue)."""
        with self._lock:
            self._pending += int(n)

    def set_load_duration(self, seconds: float) -> None:
        """How long the version took to load (``nv_model_load_duration_secs``)."""
        with self._lock:
            self._load_seconds = float(seconds)

    @property
    def inference_count(self) -> int:
        with self._lock:
            return self._inference_count

    @property
    def execution_count(self) -> int:
        with self._lock:
            return self._execution_count

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def to_json(self) -> dict[str, Any]:
        """This version's ``$model_stat`` object, as Triton writes it."""
        with self._lock:
            successes = self._success.count
            compute_count = successes - self._cache_hit.count  # hits computed nothing (Triton's rule)
            batches = sorted(self._batches.items())
            return {
                "name": self.name,
                "version": str(self.version),
                "last_inference": self._last_inference_ms,
                "inference_count": self._inference_count,
                "execution_count": self._execution_count,
                "inference_stats": {
                    "success": self._success.to_json(),
                    "fail": self._fail.to_json(),
                    "queue": {"count": successes, "ns": self._queue_ns},
                    "compute_input": {"count": compute_count, "ns": self._compute_input_ns},
                    "compute_infer": {"count": compute_count, "ns": self._compute_infer_ns},
                    "compute_output": {"count": compute_count, "ns": self._compute_output_ns},
                    "cache_hit": self._cache_hit.to_json(),
                    "cache_miss": self._cache_miss.to_json(),
                },
                "response_stats": {},
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": {"count": batch.count, "ns": batch.compute_input_ns},
                        "compute_infer": {"count": batch.count, "ns": batch.compute_infer_ns},
                        "compute_output": {"count": batch.count, "ns": batch.compute_output_ns},
                    }
                    for size, batch in batches
                ],
                "memory_usage": [],
                BATCH_REASONS_KEY: {reason: {"count": sum(sizes.values()),
                                             "rows": sum(rows * n for rows, n in sizes.items())}
                                    for reason, sizes in self.batch_reasons().items()},
            }

    def _metric_values(self, cache: bool = False) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Each family's samples for this version: (extra labels, value); the ``nv_cache_*``
        families only with ``cache`` (the version uses the response cache)."""
        with self._lock:
            values = {
                "nv_inference_request_success": [({}, self._success.count)],
                "nv_inference_request_failure": [({"reason": r}, self._failures[r]) for r in FAILURE_REASONS],
                "nv_inference_count": [({}, self._inference_count)],
                "nv_inference_exec_count": [({}, self._execution_count)],
                "nv_inference_request_duration_us": [({}, self._request_us)],
                "nv_inference_queue_duration_us": [({}, self._queue_us)],
                "nv_inference_compute_input_duration_us": [({}, self._compute_input_us)],
                "nv_inference_compute_infer_duration_us": [({}, self._compute_infer_us)],
                "nv_inference_compute_output_duration_us": [({}, self._compute_output_us)],
                "nv_inference_pending_request_count": [({}, self._pending)],
                "nv_model_load_duration_secs": [({}, self._load_seconds)],
            }
            if cache:
                values["nv_cache_num_hits_per_model"] = [({}, self._cache_hit.count)]
                values["nv_cache_hit_duration_per_model"] = [({}, self._cache_hit_us)]
                values["nv_cache_num_misses_per_model"] = [({}, self._cache_miss.count)]
                values["nv_cache_miss_duration_per_model"] = [({}, self._cache_miss_us)]
            return values


class _TritonCollector(Collector):
    """Yields Triton's per-model families from a :class:`ServerStats`' models."""

    def __init__(self, stats: ServerStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        models = self._stats.snapshot()
        series = self._stats.cache_series
        caches = [model.cache_counted or (series is not None and series(model.name, model.version)) for model in models]
        values = [(model, model._metric_values(cache=cache)) for model, cache in zip(models, caches, strict=True)]
        config = self._stats.metrics_config
        for name, kind, documentation in _FAMILIES:
            if not config.counter_latencies and name in _LATENCY_COUNTERS:
                continue
            metric = Metric(name, documentation, kind)
            for model, samples in values:
                for extra, value in samples.get(name, ()):
                    labels = {"model": model.name, "version": str(model.version), **extra}
                    metric.add_sample(name, labels, value)
            if metric.samples or name not in _CACHE_FAMILIES:
                yield metric
        if not config.records_latencies:
            return
        now_s = time.monotonic()
        latency = [model._latency_samples(cache, now_s) for model, cache in zip(models, caches, strict=True)]
        families = [(FIRST_RESPONSE_HISTOGRAM, "histogram", _FIRST_RESPONSE_HELP)] if config.histogram_latencies else []
        if config.summary_latencies:
            families += [(name, "summary", documentation) for _, name, documentation in _SUMMARIES]
        for name, kind, documentation in families:
            metric = Metric(name, documentation, kind)
            for samples in latency:
                for sample_name, labels, value in samples.get(name, ()):
                    metric.add_sample(sample_name, labels, value)
            if metric.samples:  # a family without series is left out, as prometheus-cpp leaves it out
                yield metric


class ServerStats:
    """Statistics and metrics of every loaded model version of one server."""

    def __init__(self, metrics_config: MetricsConfig | Iterable[str] | None = None, *, cpu_metrics: bool = False,
                 custom_metrics: bool = False) -> None:
        """``metrics_config``: Triton's ``--metrics-config`` settings (see
        :func:`~triton_nb.server.observability.metrics.parse_metrics_config`); ``cpu_metrics``: export Triton's
        ``nv_cpu_*`` gauges; ``custom_metrics``: export the custom metrics (``pb_utils.MetricFamily``)
        of this server's models and of the process scope (a server turns it on; a bare
        ServerStats shows only its models' families)."""
        self._lock = threading.Lock()
        self._models: dict[tuple[str, int], ModelStats] = {}
        self.metrics_config = parse_metrics_config(metrics_config)
        #: The version's ``model_metrics`` (a ModelMetrics message) for the first-response
        #: histogram's buckets: set by the server; None uses Triton's default buckets.
        self.model_metrics: Callable[[str, int], Any] | None = None
        #: The scope of this server's custom metrics (see triton_nb.server.observability.metrics).
        self.custom_scope = object()
        #: Whether a version (name, version) shows the ``nv_cache_*_per_model`` series: set by the
        #: server (its response cache switches); None shows them only for versions with counts.
        self.cache_series: Callable[[str, int], bool] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_TritonCollector(self))
        self.registry.register(BatchCollector(self.snapshot))
        if cpu_metrics:
            self.registry.register(CpuMetricsCollector())
        if custom_metrics:
            self.registry.register(CustomMetricsCollector(self.custom_scope))

    def _first_response_buckets(self, name: str, version: int) -> tuple[float, ...]:
        """The first-response histogram's buckets (ms) of a version: its config's model_metrics
        histogram_options for that family, else Triton's defaults (Triton reads them at load)."""
        source = self.model_metrics
        if source is not None:
            try:
                metrics = source(name, version)
            except TritonNBError:  # not serving (yet): the defaults
                metrics = None
            for control in getattr(metrics, "metric_control", ()):
                if control.metric_identifier.family == FIRST_RESPONSE_HISTOGRAM and control.HasField(
                        "histogram_options"):
                    return tuple(control.histogram_options.buckets)
        return DEFAULT_FIRST_RESPONSE_BUCKETS_MS

    def _new_model(self, name: str, version: int) -> ModelStats:
        version = int(version)
        return ModelStats(name, version, self.metrics_config,
                          lambda: self._first_response_buckets(name, version))

    def model(self, name: str, version: int) -> ModelStats:
        """The stats of ``name`` version ``version``, created (at zero) on first use."""
        key = (name, int(version))
        with self._lock:
            stats = self._models.get(key)
            if stats is None:
                stats = self._models[key] = self._new_model(name, int(version))
            return stats

    def fresh(self, name: str, version: int) -> ModelStats:
        """Stats at zero for a version being reloaded, not yet shown: the serving version's
        stay visible until :meth:`install` swaps these in, as Triton's reload starts from zero."""
        return self._new_model(name, int(version))

    def install(self, stats: ModelStats) -> None:
        """Show ``stats`` for its version from now on (in place of any before them)."""
        with self._lock:
            self._models[(stats.name, stats.version)] = stats

    def remove(self, name: str, version: int) -> None:
        """Forget a version at unload: its statistics and its metric series go, as in Triton
        (a reload starts from zero). Unknown versions are ignored."""
        with self._lock:
            self._models.pop((name, int(version)), None)
        # (the version's custom metrics stay, as Triton 2.51 keeps them: see triton_nb.server.observability.metrics)

    def close(self) -> None:
        """The server stopped: its models' custom metric series leave the process registry."""
        CUSTOM_METRICS.release_scope(self.custom_scope)

    def snapshot(self) -> list[ModelStats]:
        """Every version's stats, by name and version."""
        with self._lock:
            return [self._models[key] for key in sorted(self._models)]

    def statistics(self, name: str | None = None, version: int | None = None) -> dict[str, Any]:
        """``{"model_stats": [...]}`` for every version (no ``name``), every version of ``name``
        (``version`` None or -1), or one version. Unknown models and versions raise
        :class:`~triton_nb.errors.InvalidArgumentError` with Triton's messages."""
        models = self.snapshot()
        if name:
            models = [m for m in models if m.name == name]
            if not models:
                raise InvalidArgumentError(f"requested model '{name}' is not available")
            if version is not None and int(version) != -1:
                models = [m for m in models if m.version == int(version)]
                if not models:
                    raise InvalidArgumentError(f"requested model version is not available for model '{name}'")
        return {"model_stats": [m.to_json() for m in models]}

    def prometheus_text(self) -> bytes:
        """The ``/metrics`` text of this server's models, with Triton's exact names."""
        return exposition(self.registry)
