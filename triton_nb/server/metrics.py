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
  ``pb_utils.MetricFamily`` (see :mod:`triton_nb.backends.pb_utils`).

Custom metrics: scopes and lifetime
-----------------------------------
Triton has one metrics registry per process, so a family name means one family (one kind) in the
whole process: registering it again with the same kind returns the same family (the first
description is kept, as prometheus-cpp's registry does), with another kind it is Triton's error
``Family name already exists with different type``. triton_nb may run several servers in one
process, so each *series* belongs to a scope: the server whose model created it (the
``_CallContext`` of pb_utils), exported by that server only, or the process scope (a metric created
outside any model, e.g. at a notebook cell or at module import time), exported by every server.
A process-scope series lives while a ``Metric`` object refers to it (Triton deletes a series with
its last ``Metric``). A model's series stay until its server stops, through unloads and reloads:
Triton 2.51 keeps them too (its stub is torn down without deleting them; a reloaded model's
``Metric`` with the same labels continues the same series, a counter from where it was). The one
difference: a ``Metric`` (or ``MetricFamily``) a model deletes while it runs keeps its series
here, where Triton deletes it. A ``MetricFamily`` deleted before its ``Metric`` objects clears them
(Triton's stub does that; they raise from then on), so a model keeps its families, as Triton's
docs ask.
"""

from __future__ import annotations

import math
import random
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from triton_nb.errors import InvalidArgumentError

__all__ = [
    "CPU_INTERVAL_S",
    "CUSTOM_METRICS",
    "DEFAULT_FIRST_RESPONSE_BUCKETS_MS",
    "DEFAULT_SUMMARY_QUANTILES",
    "FIRST_RESPONSE_HISTOGRAM",
    "METRICS_CONFIG_KEYS",
    "CpuMetricsCollector",
    "CustomMetricError",
    "CustomMetricsCollector",
    "CustomMetricsRegistry",
    "Histogram",
    "MetricsConfig",
    "SlidingQuantiles",
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


class Histogram:
    """One histogram series: cumulative bucket counts (upper bounds ascending, +Inf implied), count
    and sum. Not thread-safe: its owner locks."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        if any(b >= c for b, c in zip(self.bounds, self.bounds[1:], strict=False)):
            raise InvalidArgumentError(f"histogram buckets must be strictly increasing, got {list(self.bounds)}")
        self.counts = [0] * len(self.bounds)  # per bucket, not cumulative (the exposition sums them)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break

    def copy(self) -> Histogram:
        """A snapshot (for a scrape outside the owner's lock)."""
        copy = Histogram.__new__(Histogram)
        copy.bounds, copy.counts, copy.count, copy.sum = self.bounds, list(self.counts), self.count, self.sum
        return copy

    def samples(self, name: str, labels: dict[str, str]) -> list[tuple[str, dict[str, str], float]]:
        """The series' samples in prometheus-cpp's order: ``_count``, ``_sum``, then ``_bucket`` by
        ``le`` (cumulative), ``+Inf`` last."""
        samples = [(f"{name}_count", labels, self.count), (f"{name}_sum", labels, self.sum)]
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            running += count
            samples.append((f"{name}_bucket", {**labels, "le": _format_bound(bound)}, running))
        if not self.bounds or self.bounds[-1] != math.inf:
            samples.append((f"{name}_bucket", {**labels, "le": "+Inf"}, self.count))
        return samples


def _format_bound(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def summary_samples(name: str, labels: dict[str, str], summary: SlidingQuantiles,
                    quantiles: Iterable[float], now_s: float) -> list[tuple[str, dict[str, str], float]]:
    """A summary series' samples in prometheus-cpp's order: ``_count``, ``_sum``, the quantiles."""
    samples = [(f"{name}_count", labels, summary.count), (f"{name}_sum", labels, summary.sum)]
    for q, value in summary.quantiles(quantiles, now_s):
        samples.append((name, {**labels, "quantile": _format_bound(q)}, value))
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
class CustomMetricError(Exception):
    """A custom metric operation Triton refuses; the message is Triton's (pb_utils raises it as
    ``TritonModelException``)."""


COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
_KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
_TRITON_KIND = {COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER", GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
                HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM"}


def _valid_name(name: str, label: bool) -> bool:
    # prometheus-cpp's CheckMetricName / CheckLabelName: [a-zA-Z_:][a-zA-Z0-9_:]* (no ':' in
    # label names), not starting with "__"
    if not name or name[0].isdigit() or name.startswith("__"):
        return False
    allowed = "_" if label else "_:"
    return all((c.isascii() and c.isalnum()) or c in allowed for c in name)


@dataclass
class _Series:
    family: _CustomFamily
    scope: object | None
    labels: dict[str, str]
    histogram: Histogram | None
    value: float = 0.0
    refs: int = 0


@dataclass
class _CustomFamily:
    name: str
    description: str
    kind: int
    series: dict[tuple[object | None, tuple[tuple[str, str], ...]], _Series] = field(default_factory=dict)


class CustomMetricHandle:
    """What one ``pb_utils`` ``Metric`` object holds: its series, until released or invalidated."""

    __slots__ = ("__weakref__", "_finalizer", "_invalid", "_registry", "_series", "kind")

    def __init__(self, registry: CustomMetricsRegistry, series: _Series, pinned: bool) -> None:
        self._registry = registry
        self._series: _Series | None = series
        self._invalid: str | None = None  # why operations fail once the series is dropped
        self.kind = series.family.kind
        # Triton deletes a series with its last Metric object: release it when this handle goes.
        # A model's series are pinned instead: they outlive its unload, as Triton 2.51's do.
        self._finalizer = None if pinned else weakref.finalize(self, registry._release, series)

    def _live(self, what: str) -> _Series:
        series = self._series
        if series is None:
            raise CustomMetricError(self._invalid or f"Could not {what} metric value. Metric has been invalidated.")
        return series

    def increment(self, value: float) -> None:
        value = float(value)
        with self._registry._lock:
            series = self._live("increment")
            if self.kind == HISTOGRAM:
                raise CustomMetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")
            if self.kind == COUNTER and value < 0.0:
                raise CustomMetricError("TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
                                        "monotonically by non-negative values.")
            series.value += value

    def set(self, value: float) -> None:
        value = float(value)
        with self._registry._lock:
            series = self._live("set")
            if self.kind != GAUGE:
                raise CustomMetricError(f"{_TRITON_KIND[self.kind]} does not support Set")
            series.value = value

    def observe(self, value: float) -> None:
        value = float(value)
        with self._registry._lock:
            series = self._live("set")  # sic: Triton's Observe says "set" too
            if series.histogram is None:
                raise CustomMetricError(f"{_TRITON_KIND[self.kind]} does not support Observe")
            series.histogram.observe(value)

    def value(self) -> float:
        with self._registry._lock:
            series = self._live("get")
            if self.kind == HISTOGRAM:
                raise CustomMetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")
            return series.value

    def invalidate(self, reason: str | None = None) -> None:
        """Drop the series reference now (unload, or its family deleted: ``reason`` is then the
        error its operations raise from here on)."""
        self._series = None
        if self._finalizer is not None:  # a pinned series (a model's) stays: see the module's docs
            self._finalizer()
        if self._invalid is None:
            self._invalid = reason


class CustomMetricsRegistry:
    """The process's custom metric families (one name, one kind) and their series by scope."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _CustomFamily] = {}
        #: names a custom family may not take: the server's own families (set by the stats module)
        self.reserved: frozenset[str] = frozenset()

    def family(self, name: str, description: str, kind: int) -> _CustomFamily:
        """Register (or find) a family, as ``TRITONSERVER_MetricFamilyNew``: the same name and kind
        is the same family; another kind is Triton's error."""
        if kind not in _KIND_NAMES:
            raise CustomMetricError("Unsupported kind passed to MetricFamily constructor.")
        if not _valid_name(name, label=False):
            raise CustomMetricError(f"Invalid metric name: {name!r} (Prometheus names match [a-zA-Z_:][a-zA-Z0-9_:]*)")
        if name in self.reserved:
            raise CustomMetricError(f"Family name already exists: {name!r} is one of the server's own metric families")
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = _CustomFamily(name, description, kind)
            elif family.kind != kind:
                raise CustomMetricError("Family name already exists with different type")
            return family

    def family_named(self, name: str) -> _CustomFamily:
        """The family registered under ``name`` (KeyError if none)."""
        with self._lock:
            return self._families[name]

    def metric(self, family: _CustomFamily, labels: Mapping[str, str] | None, buckets: Iterable[float] | None,
               owner: tuple[object, str, int] | None) -> CustomMetricHandle:
        """A handle on the series of ``labels`` in ``owner``'s scope (its server; None: the
        process scope), created at zero on first use, as ``TRITONSERVER_MetricNew``."""
        label_map = {str(k): str(v) for k, v in (labels or {}).items()}
        for key in label_map:
            if not _valid_name(key, label=True) or (family.kind == HISTOGRAM and key == "le"):
                raise CustomMetricError(f"Invalid label name: {key!r}")
        histogram = None
        if family.kind == HISTOGRAM:
            if buckets is None:
                raise CustomMetricError("Bucket boundaries not found in Metric args.")
            try:
                histogram = Histogram(buckets)
            except InvalidArgumentError:
                raise CustomMetricError("Bucket Boundaries must be strictly sorted") from None
        elif buckets is not None:
            raise CustomMetricError(f"Unexpected args found in {_KIND_NAMES[family.kind]} Metric constructor.")
        scope = None if owner is None else owner[0]
        key = (scope, tuple(sorted(label_map.items())))
        with self._lock:
            series = family.series.get(key)
            if series is None:  # an existing series keeps its buckets, as prometheus-cpp's Family::Add
                series = family.series[key] = _Series(family, scope, label_map, histogram)
            series.refs += 1
        return CustomMetricHandle(self, series, pinned=owner is not None)

    def _release(self, series: _Series) -> None:
        with self._lock:
            series.refs -= 1
            if series.refs <= 0:
                key = (series.scope, tuple(sorted(series.labels.items())))
                if series.family.series.get(key) is series:
                    del series.family.series[key]

    def release_scope(self, scope: object) -> None:
        """Forget every series of ``scope`` (its server stopped). Handles still held keep working
        on series nobody exports."""
        with self._lock:
            for family in self._families.values():
                for key in [k for k, s in family.series.items() if s.scope is scope]:
                    del family.series[key]

    def collect(self, scope: object | None) -> Iterator[Metric]:
        """The families with series in ``scope`` or the process scope, prometheus_client style."""
        with self._lock:
            families = [(f.name, f.description, f.kind,
                         [(s.labels, s.value, None if s.histogram is None else s.histogram.copy())
                          for s in f.series.values() if s.scope is None or s.scope is scope])
                        for f in self._families.values()]
        for name, description, kind, series in families:
            if not series:  # prometheus-cpp leaves a family without series out
                continue
            metric = Metric(name, description, _KIND_NAMES[kind])
            for labels, value, histogram in series:
                if histogram is None:
                    metric.add_sample(name, labels, value)
                else:
                    for sample_name, sample_labels, sample_value in histogram.samples(name, labels):
                        metric.add_sample(sample_name, sample_labels, sample_value)
            yield metric


#: The process's custom metrics (one registry per process, as Triton's).
CUSTOM_METRICS = CustomMetricsRegistry()


class CustomMetricsCollector(Collector):
    """One server's view of :data:`CUSTOM_METRICS`: its own scope's series and the process scope's."""

    def __init__(self, scope: object, registry: CustomMetricsRegistry = CUSTOM_METRICS) -> None:
        self._scope = scope
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        return self._registry.collect(self._scope)
