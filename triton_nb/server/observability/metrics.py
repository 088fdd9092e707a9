"""The metrics beyond the per-model counters: ``--metrics-config``, latency summaries and
histograms, CPU metrics and custom metrics from Python models.

Everything here follows Triton 2.51 (``src/metric_model_reporter.cc``, ``src/metrics.cc`` and
``src/metric_family.cc`` in triton-inference-server/core, prometheus-cpp underneath) where Triton
defines the behaviour:

* :func:`parse_metrics_config` — Triton's ``--metrics-config KEY=VALUE`` settings:
  ``counter_latencies`` (default true: the ``nv_inference_*_duration_us`` counters),
  ``summary_latencies`` (default false: the ``nv_inference_*_summary_us`` summaries),
  ``summary_quantiles`` (``<quantile>:<error>,...``; default
  ``0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001``) and ``histogram_latencies`` (default
  false: ``nv_inference_first_response_histogram_ms``, which Triton 2.51 does not have yet and later
  Triton releases do, with buckets ``100,500,2000,5000`` ms that a model's ``model_metrics``
  overrides). Triton ignores keys it does not know; here an unknown key is an error naming it,
  so that a typo never silently leaves a metric off.
* :class:`SlidingQuantiles` — a summary's quantiles over prometheus-cpp's window (the last 60 s,
  in 5 age buckets of 12 s), bounded in memory; ``_count`` and ``_sum`` are cumulative, as there.
* :class:`CpuMetricsCollector` — ``nv_cpu_utilization`` (0..1, system-wide, between two scrapes
  at least :data:`CPU_INTERVAL_S` apart, from ``/proc/stat``), ``nv_cpu_memory_total_bytes`` and
  ``nv_cpu_memory_used_bytes`` (``MemTotal - MemAvailable`` from ``/proc/meminfo``), as Triton.
* :data:`CUSTOM_METRICS` — the families and series that Python models create with
  ``pb_utils.MetricFamily``, kept in :mod:`triton_nb.backends.custom_metrics` (scopes and
  lifetime are described there); :class:`CustomMetricsCollector` exports one server's view.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CollectorRegistry, Metric
from prometheus_client.registry import Collector

from triton_nb.backends.custom_metrics import (
    CUSTOM_METRICS,
    KIND_NAMES,
    CustomMetricError,
    CustomMetricsRegistry,
    Histogram,
    format_bound,
)
from triton_nb.errors import InvalidArgumentError

__all__ = [
    "CPU_INTERVAL_S",
    "CUSTOM_METRICS",
    "DEFAULT_FIRST_RESPONSE_BUCKETS_MS",
    "DEFAULT_SUMMARY_QUANTILES",
    "FIRST_RESPONSE_HISTOGRAM",
    "METRICS_CONFIG_KEYS",
    "PROMETHEUS_CONTENT_TYPE",
    "CpuMetricsCollector",
    "CustomMetricError",
    "CustomMetricsCollector",
    "CustomMetricsRegistry",
    "Histogram",
    "MetricsConfig",
    "SlidingQuantiles",
    "exposition",
    "parse_metrics_config",
]

#: Triton's default summary quantiles: (quantile, allowed error) pairs (MetricReporterConfig).
DEFAULT_SUMMARY_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
#: prometheus-cpp's Summary window, which Triton does not change: 60 s in 5 age buckets.
SUMMARY_MAX_AGE_S = 60.0
SUMMARY_AGE_BUCKETS = 5
#: Observations kept per age bucket of one summary series; past it a uniform sample of them
#: (reservoir sampling) stands for the bucket, so memory stays bounded at any request rate.
SUMMARY_SAMPLES_PER_BUCKET = 2048

FIRST_RESPONSE_HISTOGRAM = "nv_inference_first_response_histogram_ms"
#: Triton's default buckets of the first-response histogram, in milliseconds.
DEFAULT_FIRST_RESPONSE_BUCKETS_MS: tuple[float, ...] = (100.0, 500.0, 2000.0, 5000.0)

#: The keys ``--metrics-config`` knows (Triton 2.51's, and histogram_latencies of later Triton).
METRICS_CONFIG_KEYS = ("counter_latencies", "summary_latencies", "summary_quantiles", "histogram_latencies")

#: The shortest time between two CPU utilisation samples: closer scrapes show the last value (the
#: kernel's counters move in 10 ms ticks, so shorter spans say little), as Triton's poller does
#: with its 2 s ``--metrics-interval-ms``.
CPU_INTERVAL_S = 1.0


# ---------------------------------------------------------------------- --metrics-config
@dataclass(frozen=True)
class MetricsConfig:
    """The ``--metrics-config`` settings in force (Triton's defaults)."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_SUMMARY_QUANTILES

    @property
    def records_latencies(self) -> bool:
        """Whether requests' latencies are kept per request (for summaries or histograms)."""
        return self.summary_latencies or self.histogram_latencies


def _parse_bool(key: str, value: str) -> bool:
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise InvalidArgumentError(f"--metrics-config {key}: expected true or false, got {value!r}")
    return text == "true"


def _parse_quantiles(value: str) -> tuple[tuple[float, float], ...]:
    pairs = []
    for part in value.replace(" ", ",").split(","):
        if not part:
            continue
        quantile, colon, error = part.partition(":")
        if not colon:
            raise InvalidArgumentError(f"--metrics-config summary_quantiles: invalid option [{part}]: no ':' "
                                       "delimiter found; expected format is <quantile>:<error>")
        try:
            q, e = float(quantile), float(error)
        except ValueError:
            raise InvalidArgumentError(f"--metrics-config summary_quantiles: invalid option [{part}]: "
                                       "<quantile> and <error> must be numbers") from None
        if not (0.0 <= q <= 1.0 and 0.0 <= e <= 1.0):
            raise InvalidArgumentError(f"--metrics-config summary_quantiles: invalid option [{part}]: "
                                       "quantile and error must lie within 0..1")
        pairs.append((q, e))
    if not pairs:
        raise InvalidArgumentError("--metrics-config summary_quantiles: no <quantile>:<error> pairs given")
    return tuple(sorted(pairs))


def parse_metrics_config(settings: MetricsConfig | Iterable[str] | Mapping[str, Any] | None) -> MetricsConfig:
    """``["summary_latencies=true", "summary_quantiles=0.5:0.05,0.9:0.01"]`` (Triton's
    ``--metrics-config`` values, later ones winning) or a mapping of the same keys -> the config.
    An unknown key or a bad value raises :class:`~triton_nb.errors.InvalidArgumentError` naming it."""
    if settings is None:
        return MetricsConfig()
    if isinstance(settings, MetricsConfig):
        return settings
    if isinstance(settings, str):
        settings = [settings]
    if isinstance(settings, Mapping):
        items = [(str(k), v if isinstance(v, str) else str(v).lower()) for k, v in settings.items()]
    else:
        items = []
        for setting in settings:
            key, equals, value = str(setting).partition("=")
            if not equals or not key.strip():
                raise InvalidArgumentError(f"--metrics-config option format is <setting>=<value>. Got {setting}")
            items.append((key.strip(), value.strip().strip('"')))
    values: dict[str, Any] = {}
    for key, value in items:
        if "," in key:  # Triton's "<group>,<setting>=<value>" form: no group is defined in 2.51
            raise InvalidArgumentError(f"--metrics-config {key}={value}: metrics config groups are not supported; "
                                       f"use one of {', '.join(METRICS_CONFIG_KEYS)}")
        if key not in METRICS_CONFIG_KEYS:
            raise InvalidArgumentError(f"--metrics-config: unknown setting {key!r} (known: "
                                       f"{', '.join(METRICS_CONFIG_KEYS)})")
        values[key] = _parse_quantiles(value) if key == "summary_quantiles" else _parse_bool(key, value)
    return MetricsConfig(**values)


# ---------------------------------------------------------------------- summaries and histograms
class SlidingQuantiles:
    """One summary series: cumulative count and sum, and quantiles over the last
    :data:`SUMMARY_MAX_AGE_S`, as prometheus-cpp's ``TimeWindowQuantiles``: observations are kept
    per age bucket of ``max_age / age_buckets`` seconds and the quantiles read the current bucket
    and the ``age_buckets - 1`` before it (the last 48 to 60 s). prometheus-cpp estimates them
    with CKMS within each quantile's allowed error; here they are exact over what is kept (each
    bucket keeps at most :data:`SUMMARY_SAMPLES_PER_BUCKET` observations, a uniform sample past
    that), which is within any allowed error. Not thread-safe: its owner locks."""

    __slots__ = ("_age_buckets", "_buckets", "_capacity", "_interval_s", "count", "sum")

    def __init__(self, max_age_s: float = SUMMARY_MAX_AGE_S, age_buckets: int = SUMMARY_AGE_BUCKETS,
                 capacity: int = SUMMARY_SAMPLES_PER_BUCKET) -> None:
        self._interval_s = max_age_s / age_buckets
        self._age_buckets = age_buckets
        self._capacity = capacity
        # age bucket number (monotonic seconds // interval) -> [observations seen, kept values]
        self._buckets: dict[int, list[Any]] = {}
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, now_s: float) -> None:
        self.count += 1
        self.sum += value
        slot = int(now_s // self._interval_s)
        bucket = self._buckets.get(slot)
        if bucket is None:
            for old in [s for s in self._buckets if s <= slot - self._age_buckets]:
                del self._buckets[old]
            bucket = self._buckets[slot] = [0, []]
        bucket[0] += 1
        kept: list[float] = bucket[1]
        if len(kept) < self._capacity:
            kept.append(value)
        else:  # reservoir sampling (Algorithm R): each of the bucket's observations kept alike
            index = int(random.random() * bucket[0])  # randrange's cost, without its call overhead
            if index < self._capacity:
                kept[index] = value

    def window(self, now_s: float) -> list[float]:
        """The observations of the window, sorted."""
        slot = int(now_s // self._interval_s)
        values: list[float] = []
        for number, (_seen, kept) in self._buckets.items():
            if slot - self._age_buckets < number <= slot:
                values.extend(kept)
        values.sort()
        return values

    def quantiles(self, quantiles: Iterable[float], now_s: float) -> list[tuple[float, float]]:
        """(quantile, value) for each quantile; NaN for all when the window is empty, as
        prometheus-cpp reports it."""
        values = self.window(now_s)
        n = len(values)
        result = []
        for q in quantiles:
            if n == 0:
                result.append((q, math.nan))
            else:  # the value of rank floor(q n), as prometheus-cpp's CKMS picks it when exact
                result.append((q, values[min(n - 1, max(0, int(q * n) - 1))]))
        return result


def summary_samples(name: str, labels: dict[str, str], summary: SlidingQuantiles,
                    quantiles: Iterable[float], now_s: float) -> list[tuple[str, dict[str, str], float]]:
    """A summary series' samples in prometheus-cpp's order: ``_count``, ``_sum``, the quantiles."""
    samples = [(f"{name}_count", labels, summary.count), (f"{name}_sum", labels, summary.sum)]
    for q, value in summary.quantiles(quantiles, now_s):
        samples.append((name, {**labels, "quantile": format_bound(q)}, value))
    return samples


# ---------------------------------------------------------------------- CPU metrics
def read_cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, idle) jiffies of all CPUs from the aggregate ``cpu`` line, as Triton counts them
    (busy: user, nice, system, irq, softirq, steal; idle: idle, iowait); None where unreadable."""
    try:
        with open(path, encoding="ascii") as stat:
            line = stat.readline()
    except OSError:
        return None
    parts = line.split()
    if not parts or parts[0] != "cpu" or len(parts) < 9:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in parts[1:9])
    return user + nice + system + irq + softirq + steal, idle + iowait


def read_memory_bytes(path: str = "/proc/meminfo") -> tuple[int, int] | None:
    """(total, used) bytes of RAM, system-wide: ``MemTotal`` and ``MemTotal - MemAvailable``, as
    Triton defines used memory; None where unreadable."""
    values: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as meminfo:
            for line in meminfo:
                name, _, rest = line.partition(":")
                fields = rest.split()
                if name in ("MemTotal", "MemAvailable") and fields:
                    values[name] = int(fields[0]) * 1024  # the file says kB, meaning KiB
    except (OSError, ValueError):
        return None
    total, available = values.get("MemTotal"), values.get("MemAvailable")
    if total is None or available is None or available > total:
        return None
    return total, total - available


class CpuMetricsCollector(Collector):
    """Triton's CPU metrics (``--allow-cpu-metrics``), read from ``/proc`` at scrape time. The
    utilisation is over the span since the previous sample (at least :data:`CPU_INTERVAL_S`; the
    first scrape measures from the collector's creation), 0 when ``/proc`` cannot be read, as
    Triton reports it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_times = read_cpu_times()
        self._last_s = time.monotonic()
        self._utilization = 0.0

    def utilization(self) -> float:
        """The CPU utilisation in [0, 1], resampled when the last sample is old enough."""
        with self._lock:
            now = time.monotonic()
            if now - self._last_s >= CPU_INTERVAL_S or self._last_times is None:
                times = read_cpu_times()
                if times is not None and self._last_times is not None:
                    busy = max(0, times[0] - self._last_times[0])
                    idle = max(0, times[1] - self._last_times[1])
                    if busy + idle > 0:
                        self._utilization = busy / (busy + idle)
                self._last_times, self._last_s = times, now
            return self._utilization

    def collect(self) -> Iterator[Metric]:
        utilization = Metric("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge")
        utilization.add_sample("nv_cpu_utilization", {}, self.utilization())
        memory = read_memory_bytes() or (0, 0)
        total = Metric("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "gauge")
        total.add_sample("nv_cpu_memory_total_bytes", {}, memory[0])
        used = Metric("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "gauge")
        used.add_sample("nv_cpu_memory_used_bytes", {}, memory[1])
        yield from (utilization, total, used)


# ---------------------------------------------------------------------- custom metrics
class CustomMetricsCollector(Collector):
    """One server's view of :data:`CUSTOM_METRICS`: its own scope's series and the process scope's."""

    def __init__(self, scope: object, registry: CustomMetricsRegistry = CUSTOM_METRICS) -> None:
        self._scope = scope
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.snapshot(self._scope):
            metric = Metric(family.name, family.description, KIND_NAMES[family.kind])
            for labels, value, histogram in family.series:
                if histogram is None:
                    metric.add_sample(family.name, labels, value)
                else:
                    for sample_name, sample_labels, sample_value in histogram.samples(family.name, labels):
                        metric.add_sample(sample_name, sample_labels, sample_value)
            yield metric


#: The content type of the ``/metrics`` text (Prometheus text format 0.0.4).
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format (0.0.4) of ``registry`` without prometheus_client's renaming:
    a counter whose samples carry its own name (as :class:`ServerStats`' do) is exposed under that
    name, with no ``_total``, as Triton exposes its counters. (Counters made with
    ``prometheus_client.Counter`` keep their ``_total`` samples, under a matching ``# TYPE`` line;
    their ``_created`` samples are left out.)"""
    lines: list[str] = []
    for metric in registry.collect():
        kind = {"unknown": "untyped", "info": "gauge", "stateset": "gauge"}.get(metric.type, metric.type)
        name = metric.name
        samples = metric.samples
        if kind == "counter":
            samples = [s for s in samples if s.name != name + "_created"]
            if any(s.name == name + "_total" for s in samples):
                name += "_total"
        lines.append(f"# HELP {name} {_escape_help(metric.documentation)}\n")
        lines.append(f"# TYPE {name} {kind}\n")
        for sample in samples:
            # sorted by name, with a histogram's le and a summary's quantile last, as prometheus-cpp
            labels = ",".join(f'{key}="{_escape_label(str(val))}"' for key, val in sorted(
                sample.labels.items(), key=lambda item: (item[0] in ("le", "quantile"), item[0])))
            label_text = f"{{{labels}}}" if labels else ""
            lines.append(f"{sample.name}{label_text} {_format_value(sample.value)}\n")
    return "".join(lines).encode("utf-8")
