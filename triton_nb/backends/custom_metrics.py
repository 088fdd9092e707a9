"""The process's registry of custom metrics: the families and series Python models create with
``pb_utils.MetricFamily`` / ``Metric`` (:mod:`triton_nb.backends.pb_utils`), which
:mod:`triton_nb.server.observability.metrics` exports on ``/metrics``.

Standard library only: a Python model's own process (:mod:`triton_nb.backends._python_stub`),
which may run an interpreter with numpy and nothing else, keeps a registry of its own too.

Scopes and lifetime
-------------------
Triton has one metrics registry per process, so a family name means one family (one kind) in the
whole process: registering it again with the same kind returns the same family (the first
description is kept, as prometheus-cpp's registry does), with another kind it is Triton's error
``Family name already exists with different type``. triton_nb may run several servers in one
process, so each *series* belongs to a scope: the server whose model created it (the calling
instance of :mod:`triton_nb.backends._pb_context`), exported by that server only, or the process
scope (a metric created outside any model, e.g. at a notebook cell or at module import time),
exported by every server. A process-scope series lives while a ``Metric`` object refers to it
(Triton deletes a series with its last ``Metric``). A model's series stay until its server stops,
through unloads and reloads: Triton 2.51 keeps them too (its stub is torn down without deleting
them; a reloaded model's ``Metric`` with the same labels continues the same series, a counter from
where it was). The one difference: a ``Metric`` (or ``MetricFamily``) a model deletes while it runs
keeps its series here, where Triton deletes it. A ``MetricFamily`` deleted before its ``Metric``
objects clears them (Triton's stub does that; they raise from then on), so a model keeps its
families, as Triton's docs ask.

A model's process mirrors what its model does to the server: it gives its registry a
:class:`MetricsObserver` (:meth:`CustomMetricsRegistry.observe_with`), told of every family and
series created and of every change to a series, after the checks here passed.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from triton_nb.errors import InvalidArgumentError

__all__ = [
    "COUNTER",
    "CUSTOM_METRICS",
    "GAUGE",
    "HISTOGRAM",
    "KIND_NAMES",
    "CustomMetricError",
    "CustomMetricHandle",
    "CustomMetricsRegistry",
    "FamilySnapshot",
    "Histogram",
    "MetricsObserver",
    "format_bound",
]

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
#: Prometheus' type name of each kind.
KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
_TRITON_KIND = {COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER", GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
                HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM"}


class CustomMetricError(Exception):
    """A custom metric operation Triton refuses; the message is Triton's (pb_utils raises it as
    ``TritonModelException``)."""


# ---------------------------------------------------------------------- histograms
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

    def observe(self, value: float, times: int = 1) -> None:
        """``value`` observed ``times`` times (a histogram rebuilt from counts at scrape time)."""
        self.count += times
        self.sum += value * times
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += times
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
            samples.append((f"{name}_bucket", {**labels, "le": format_bound(bound)}, running))
        if not self.bounds or self.bounds[-1] != math.inf:
            samples.append((f"{name}_bucket", {**labels, "le": "+Inf"}, self.count))
        return samples


def format_bound(value: float) -> str:
    """A bucket bound or quantile as prometheus-cpp writes it (``100``, ``0.5``, ``+Inf``)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# ---------------------------------------------------------------------- the registry
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


@dataclass(frozen=True)
class FamilySnapshot:
    """One family as a scrape sees it: ``series`` holds (labels, value, histogram copy or None)."""

    name: str
    description: str
    kind: int
    series: list[tuple[dict[str, str], float, Histogram | None]]


class MetricsObserver(Protocol):
    """Told of what models do to a registry (see :meth:`CustomMetricsRegistry.observe_with`)."""

    def family_registered(self, name: str, description: str, kind: int) -> None:
        """A family was registered (or found again under the same kind)."""

    def metric_created(self, family: str, labels: dict[str, str],
                       buckets: list[float] | None) -> Callable[[str, float], None] | None:
        """A ``Metric`` was created; the callable returned (if any) gets each change of its
        series as ``(operation, value)``, ``operation`` one of increment, set, observe."""


class CustomMetricHandle:
    """What one ``pb_utils`` ``Metric`` object holds: its series, until released or invalidated."""

    __slots__ = ("__weakref__", "_finalizer", "_invalid", "_on_change", "_registry", "_series", "kind")

    def __init__(self, registry: CustomMetricsRegistry, series: _Series, pinned: bool,
                 on_change: Callable[[str, float], None] | None = None) -> None:
        self._registry = registry
        self._series: _Series | None = series
        self._invalid: str | None = None  # why operations fail once the series is dropped
        self._on_change = on_change
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
        if self._on_change is not None:  # outside the lock: an observer may do I/O
            self._on_change("increment", value)

    def set(self, value: float) -> None:
        value = float(value)
        with self._registry._lock:
            series = self._live("set")
            if self.kind != GAUGE:
                raise CustomMetricError(f"{_TRITON_KIND[self.kind]} does not support Set")
            series.value = value
        if self._on_change is not None:
            self._on_change("set", value)

    def observe(self, value: float) -> None:
        value = float(value)
        with self._registry._lock:
            series = self._live("set")  # sic: Triton's Observe says "set" too
            if series.histogram is None:
                raise CustomMetricError(f"{_TRITON_KIND[self.kind]} does not support Observe")
            series.histogram.observe(value)
        if self._on_change is not None:
            self._on_change("observe", value)

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
        self._observer: MetricsObserver | None = None
        #: names a custom family may not take: the server's own families (set by the stats module)
        self.reserved: frozenset[str] = frozenset()

    def observe_with(self, observer: MetricsObserver | None) -> None:
        """Tell ``observer`` of the families and series created from now on (None: stop)."""
        self._observer = observer

    def family(self, name: str, description: str, kind: int) -> _CustomFamily:
        """Register (or find) a family, as ``TRITONSERVER_MetricFamilyNew``: the same name and kind
        is the same family; another kind is Triton's error."""
        if kind not in KIND_NAMES:
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
        observer = self._observer
        if observer is not None:
            observer.family_registered(name, description, kind)
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
            raise CustomMetricError(f"Unexpected args found in {KIND_NAMES[family.kind]} Metric constructor.")
        scope = None if owner is None else owner[0]
        key = (scope, tuple(sorted(label_map.items())))
        with self._lock:
            series = family.series.get(key)
            if series is None:  # an existing series keeps its buckets, as prometheus-cpp's Family::Add
                series = family.series[key] = _Series(family, scope, label_map, histogram)
            series.refs += 1
        observer = self._observer
        on_change = None
        if observer is not None:
            on_change = observer.metric_created(family.name, dict(label_map),
                                                None if histogram is None else list(histogram.bounds))
        return CustomMetricHandle(self, series, pinned=owner is not None, on_change=on_change)

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

    def snapshot(self, scope: object | None) -> list[FamilySnapshot]:
        """The families with their series in ``scope`` or the process scope, copied under the
        lock (a family with no such series is left out, as prometheus-cpp leaves it out)."""
        with self._lock:
            families = [FamilySnapshot(f.name, f.description, f.kind,
                                       [(s.labels, s.value, None if s.histogram is None else s.histogram.copy())
                                        for s in f.series.values() if s.scope is None or s.scope is scope])
                        for f in self._families.values()]
        return [family for family in families if family.series]


#: The process's custom metrics (one registry per process, as Triton's).
CUSTOM_METRICS = CustomMetricsRegistry()
