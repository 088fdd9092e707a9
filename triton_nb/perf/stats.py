"""The arithmetic of a measurement, as perf_analyzer does it: windows, percentiles, stability,
throughput, and the server-side latency breakdown from statistics.

Everything here is pure: completions in, numbers out. Times are nanoseconds on the machine's
monotonic clock (shared by processes on one host, so load generators in other processes can
report completions the controller windows); results are microseconds, perf_analyzer's unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triton_nb.errors import InvalidArgumentError

__all__ = [
    "PERCENTILES",
    "Completions",
    "ServerBreakdown",
    "Window",
    "is_stable",
    "parse_range",
    "percentile",
    "server_breakdown",
    "summarize",
]

PERCENTILES = (50, 90, 95, 99)


def percentile(ordered: Sequence[float] | np.ndarray, pct: float) -> float:
    """perf_analyzer's percentile of sorted values: the element at ``pct/100 * (n - 1)``, rounded
    to the nearest index."""
    n = len(ordered)
    if n == 0:
        raise ValueError("percentile of no values")
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile must be within 0..100, got {pct}")
    return float(ordered[int(pct / 100.0 * (n - 1) + 0.5)])


def parse_range(text: str | Sequence[float] | float, what: str) -> list[float]:
    """perf_analyzer's ``start:end:step`` (``end`` and ``step`` optional; step 1): the values from
    start up to end inclusive. A list or a single number is taken as it is."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        values = [float(text)]
    elif isinstance(text, str):
        parts = text.split(":")
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            raise InvalidArgumentError(f"{what} must be start[:end[:step]], got {text!r}") from None
        if len(numbers) > 3 or not numbers:
            raise InvalidArgumentError(f"{what} must be start[:end[:step]], got {text!r}")
        start = numbers[0]
        end = numbers[1] if len(numbers) > 1 else start
        step = numbers[2] if len(numbers) > 2 else 1.0
        if step <= 0 or end < start:
            raise InvalidArgumentError(f"{what} {text!r} needs end >= start and a step > 0")
        count = int((end - start) / step + 1e-9) + 1
        values = [start + i * step for i in range(count)]
    else:
        values = [float(v) for v in text]
    if not values or any(v <= 0 for v in values):
        raise InvalidArgumentError(f"{what} values must be > 0, got {values}")
    return values


def _no_bytes(count: int) -> np.ndarray:
    return np.full(count, -1, np.int64)


@dataclass
class Completions:
    """Requests that finished: when each was sent and answered (ns), whether it succeeded, and the
    bytes its request and response took on the wire (-1: not known, as for in-process calls)."""

    start_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    end_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    ok: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    request_bytes: np.ndarray | None = None
    response_bytes: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.request_bytes is None:
            self.request_bytes = _no_bytes(len(self.end_ns))
        if self.response_bytes is None:
            self.response_bytes = _no_bytes(len(self.end_ns))

    @classmethod
    def joined(cls, parts: Sequence[Completions]) -> Completions:
        """All of ``parts`` in one, in their order: one copy for many parts, where extending part by
        part would copy everything gathered so far each time (a measurement polls many times a second)."""
        if not parts:
            return cls()
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(part, name) for part in parts])
                     for name in ("start_ns", "end_ns", "ok", "request_bytes", "response_bytes")))

    def extend(self, start_ns: Any, end_ns: Any, ok: Any, request_bytes: Any = None,
               response_bytes: Any = None) -> None:
        fresh = Completions(np.asarray(start_ns, np.int64), np.asarray(end_ns, np.int64), np.asarray(ok, bool),
                            None if request_bytes is None else np.asarray(request_bytes, np.int64),
                            None if response_bytes is None else np.asarray(response_bytes, np.int64))
        whole = Completions.joined([self, fresh])
        self.start_ns, self.end_ns, self.ok = whole.start_ns, whole.end_ns, whole.ok
        self.request_bytes, self.response_bytes = whole.request_bytes, whole.response_bytes

    def between(self, begin_ns: int, end_ns: int) -> Completions:
        """The requests answered within ``[begin_ns, end_ns)``."""
        mask = (self.end_ns >= begin_ns) & (self.end_ns < end_ns)
        return Completions(self.start_ns[mask], self.end_ns[mask], self.ok[mask], self.request_bytes[mask],
                           self.response_bytes[mask])

    def __len__(self) -> int:
        return len(self.end_ns)


@dataclass(frozen=True)
class Window:
    """One measurement window's client-side figures."""

    begin_ns: int
    end_ns: int
    completed: int
    errors: int
    throughput_infer_per_sec: float
    latency_avg_us: float
    latency_percentiles_us: dict[int, float]
    #: the mean bytes on the wire of the successful requests and of their responses (NaN: not known)
    request_bytes: float = float("nan")
    response_bytes: float = float("nan")

    def latency_us(self, pct: int | None) -> float:
        return self.latency_avg_us if pct is None else self.latency_percentiles_us[pct]


def _mean_bytes(values: np.ndarray) -> float:
    known = values[values >= 0]
    return float(known.mean()) if len(known) else float("nan")


def summarize(completions: Completions, begin_ns: int, end_ns: int, rows_per_request: float = 1) -> Window:
    """The window ``[begin_ns, end_ns)``: throughput counts successful requests answered within
    it, times the rows each carried (a mix's mean), over the window's length; latencies and bytes
    on the wire are theirs."""
    if end_ns <= begin_ns:
        raise ValueError("a window must end after it begins")
    inside = completions.between(begin_ns, end_ns)
    good = inside.ok
    latencies_us = np.sort((inside.end_ns[good] - inside.start_ns[good]) / 1e3)
    seconds = (end_ns - begin_ns) / 1e9
    count = int(good.sum())
    if count:
        avg = float(latencies_us.mean())
        pcts = {p: percentile(latencies_us, p) for p in PERCENTILES}
    else:
        avg = float("nan")
        pcts = dict.fromkeys(PERCENTILES, float("nan"))
    return Window(begin_ns, end_ns, count, int((~good).sum()), count * rows_per_request / seconds, avg, pcts,
                  _mean_bytes(inside.request_bytes[good]), _mean_bytes(inside.response_bytes[good]))


def is_stable(windows: Sequence[Window], stability_percentage: float = 10.0, latency_percentile: int | None = None,
              count: int = 3) -> bool:
    """perf_analyzer's rule: the last ``count`` windows are each within ``stability_percentage``
    of their mean, on throughput and on latency (the average, or ``latency_percentile``)."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    tolerance = stability_percentage / 100.0
    for values in ([w.throughput_infer_per_sec for w in last], [w.latency_us(latency_percentile) for w in last]):
        mean = float(np.mean(values))
        if not np.isfinite(mean) or mean <= 0:
            return False
        if any(abs(v / mean - 1.0) > tolerance for v in values):
            return False
    return True


@dataclass(frozen=True)
class ServerBreakdown:
    """Server-side time per request over a span (µs), and the batch sizes it executed."""

    requests: int
    request_us: float
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float
    batch_sizes: dict[int, int]
    #: the response cache: the requests answered from it, and hit and miss time per request (µs),
    #: part of the server's time as perf_analyzer counts it ("queue + cache hit/miss + compute")
    cache_hits: int = 0
    cache_hit_us: float = 0.0
    cache_miss_us: float = 0.0

    @property
    def server_us(self) -> float:
        return (self.queue_us + self.cache_hit_us + self.cache_miss_us + self.compute_input_us
                + self.compute_infer_us + self.compute_output_us)

    @property
    def cache_hit_ratio(self) -> float:
        """The share of the model's successful requests answered from the cache (0 without one)."""
        return self.cache_hits / self.requests if self.requests else 0.0


def _model_entries(statistics: dict[str, Any], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {}
    for entry in statistics.get("model_stats", []):
        if entry.get("name") in names:
            entries.setdefault(entry["name"], entry)  # the first (latest) version listed
    return entries


def _duration(entry: dict[str, Any] | None, key: str) -> tuple[int, int]:
    if entry is None:
        return 0, 0
    stat = entry.get("inference_stats", {}).get(key, {})
    return int(stat.get("count", 0)), int(stat.get("ns", 0))


def server_breakdown(before: dict[str, Any], after: dict[str, Any], model: str,
                     composing: Sequence[str] = ()) -> ServerBreakdown:
    """The difference of two statistics snapshots (Triton's statistics JSON), per request of
    ``model``. For an ensemble give its ``composing`` models: its queue and compute times are
    theirs, summed, as perf_analyzer reports an ensemble."""
    names = [model, *composing]
    first, last = _model_entries(before, names), _model_entries(after, names)
    if model not in last:
        raise ValueError(f"the statistics have no model '{model}'")

    def delta(name: str, key: str) -> tuple[int, int]:
        c0, n0 = _duration(first.get(name), key)
        c1, n1 = _duration(last.get(name), key)
        return c1 - c0, n1 - n0

    requests, request_ns = delta(model, "success")
    parts = {}
    sources = list(composing) or [model]
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        total = 0
        for name in sources:
            _, ns = delta(name, key)
            total += ns
        parts[key] = total / requests / 1e3 if requests else 0.0
    batch_sizes: dict[int, int] = {}
    for name in sources:
        earlier = {b["batch_size"]: int(b["compute_infer"]["count"])
                   for b in (first.get(name) or {}).get("batch_stats", [])}
        for entry in (last.get(name) or {}).get("batch_stats", []):
            grown = int(entry["compute_infer"]["count"]) - earlier.get(entry["batch_size"], 0)
            if grown > 0 and name == sources[-1]:  # the batch sizes of the last step (or the model)
                batch_sizes[int(entry["batch_size"])] = grown
    hits, hit_ns = delta(model, "cache_hit")
    _, miss_ns = delta(model, "cache_miss")
    return ServerBreakdown(
        cache_hits=hits,
        cache_hit_us=hit_ns / requests / 1e3 if requests else 0.0,
        cache_miss_us=miss_ns / requests / 1e3 if requests else 0.0,
        requests=requests,
        request_us=request_ns / requests / 1e3 if requests else 0.0,
        queue_us=parts["queue"],
        compute_input_us=parts["compute_input"],
        compute_infer_us=parts["compute_infer"],
        compute_output_us=parts["compute_output"],
        batch_sizes=dict(sorted(batch_sizes.items())),
    )
