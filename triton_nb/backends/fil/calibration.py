"""Which engine serves a batch: measured at load, then kept up to date while serving.

At load, and again once the compiled library is ready, :func:`time_candidates` times every
candidate at 1, 8, 64, 512 and 4096 rows of :func:`calibration_data` (values drawn between the
model's own split thresholds, 2% missing). :class:`Selector` turns those timings into a choice
per size band (a band runs from the geometric mean of its size and the next smaller one to that
with the next larger one) and, while serving, keeps timing the batches and now and then
re-measures the other candidates on a live batch, so the choice follows a machine that gets
busier or quieter.

Imports from this package: :mod:`.common` and :mod:`.engines` (the candidates it chooses among).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from triton_nb.backends.fil.common import Cancelled, log
from triton_nb.backends.fil.engines import Candidate

#: Batch sizes timed at calibration; a batch uses the engine that won the nearest size (in log scale).
CALIBRATION_SIZES = (1, 8, 64, 512, 4096)
BAND_EDGES = tuple(math.ceil(math.sqrt(a * b)) for a, b in itertools.pairwise(CALIBRATION_SIZES))
_CALIBRATION_REPS = 7  # at most, per engine and size ...
_CALIBRATION_BUDGET_S = 0.025  # ... stopping once an engine has spent this long at one size (after 2 reps)


def calibration_data(tl_model: Any, num_feature: int, rows: int = max(CALIBRATION_SIZES)) -> np.ndarray:
    """Rows whose values fall between the model's own split thresholds (so they walk realistic
    paths), with 2% missing values."""
    rng = np.random.default_rng(20240601)
    data = rng.standard_normal((rows, num_feature)).astype(np.float32)
    try:
        features, thresholds = [], []
        for tree in range(min(int(tl_model.num_tree), 64)):
            accessor = tl_model.get_tree_accessor(tree)
            internal = np.asarray(accessor.get_field("cleft")) >= 0
            features.append(np.asarray(accessor.get_field("split_index"))[internal])
            thresholds.append(np.asarray(accessor.get_field("threshold"), dtype=np.float64)[internal])
        split_features = np.concatenate(features) if features else np.zeros(0, dtype=np.int64)
        split_values = np.concatenate(thresholds) if thresholds else np.zeros(0)
        for feature in range(num_feature):
            values = np.unique(split_values[(split_features == feature) & np.isfinite(split_values)])
            if values.size == 0:
                continue
            spread = float(values[-1] - values[0]) or 1.0
            low = np.concatenate(([values[0] - 0.1 * spread], values))
            high = np.concatenate((values, [values[-1] + 0.1 * spread]))
            cell = rng.integers(0, low.size, rows)
            data[:, feature] = rng.uniform(low[cell], high[cell]).astype(np.float32)
    except Exception:  # an exotic model: normal noise still measures speed
        log.debug("calibration data from thresholds failed; using normal noise", exc_info=True)
    data[rng.random(data.shape) < 0.02] = np.nan
    return np.ascontiguousarray(data)


def time_candidates(candidates: Sequence[Candidate], data: np.ndarray,
                     stop: threading.Event | None = None) -> dict[str, dict[int, float]]:
    """Seconds per call of each candidate at each calibration size: the minimum over a few
    consecutive calls, after one warm-up call (consecutive, as a run of equal batches would be
    served, so one engine's threads do not measure another's)."""
    timings: dict[str, dict[int, float]] = {c.label: {} for c in candidates}
    for size in CALIBRATION_SIZES:
        x = data[:size]
        for candidate in candidates:
            if stop is not None and stop.is_set():
                raise Cancelled()
            start = time.perf_counter()
            candidate.predict(x)  # warm-up, timed only to size the budget
            best, spent = math.inf, time.perf_counter() - start
            for rep in range(_CALIBRATION_REPS):
                if rep >= 2 and spent >= _CALIBRATION_BUDGET_S:
                    break
                start = time.perf_counter()
                candidate.predict(x)
                elapsed = time.perf_counter() - start
                spent += elapsed
                best = min(best, elapsed)
            timings[candidate.label][size] = best
    return timings


class Selector:
    """Which candidate serves a batch: the cheapest per row in its size band, kept up to date.

    Each candidate has an estimate of its per-row cost in each band (in log scale), from the
    calibration first and then from the batches it serves: every sample moves the estimate half
    way towards it, a slower sample by at most 13% (so one preempted call hardly counts, while a
    lasting slowdown shows within a few batches). The cheapest estimate serves, switching only for
    a 10% gain; every other candidate is re-measured on a live batch now and then (engines give the
    same outputs, so that is safe), at intervals that keep the cost of all re-measuring to ~2% on
    average: ``(its cost / best cost - 1) * (candidates - 1) / 0.02`` batches, between 8 and 4096,
    brought forward when the best gets 10% slower. So when the machine gets busier — which hurts
    multi-threaded engines most — the choice follows.

    Only the serving thread calls :meth:`pick` and :meth:`record`; a recalibration replaces the
    whole selector.
    """

    _ALPHA = 0.5
    _MAX_RISE = 0.25  # log units per sample, before _ALPHA
    _SWITCH = math.log(0.9)
    _RESCHEDULE = math.log(1.1)  # the best got 10% slower: bring the re-measuring forward
    _OVERHEAD = 0.02  # of all re-measuring together, on average
    _MIN_INTERVAL, _MAX_INTERVAL = 8, 4096

    def __init__(self, candidates: Sequence[Candidate], timings: dict[str, dict[int, float]] | None = None,
                 fixed: Sequence[int] | None = None) -> None:
        self.candidates = tuple(candidates)
        bands = len(CALIBRATION_SIZES)
        count = len(self.candidates)
        self.adaptive = fixed is None and count > 1 and bool(timings)
        self._cost = [[0.0] * count for _ in range(bands)]  # log(seconds per row)
        self._calls = [0] * bands
        self._next_probe = [[0] * count for _ in range(bands)]
        self._soonest: list[float] = [math.inf] * bands  # the earliest re-measuring due in each band
        self._best = list(fixed) if fixed is not None else [0] * bands
        self._anchor = [0.0] * bands  # the best's cost when the re-measuring was last scheduled
        self._others = max(1, count - 1)
        if not self.adaptive:
            return
        assert timings is not None
        for band, size in enumerate(CALIBRATION_SIZES):
            costs = self._cost[band]
            for index, candidate in enumerate(self.candidates):
                costs[index] = math.log(max(timings[candidate.label][size], 1e-9) / size)
            best = self._best[band] = min(range(count), key=costs.__getitem__)
            self._anchor[band] = costs[best]
            for index in range(count):
                if index != best:
                    self._next_probe[band][index] = self._interval(costs[index] - costs[best])
            self._update_soonest(band)

    def _interval(self, log_ratio: float) -> int:
        excess = math.exp(min(log_ratio, 20.0)) - 1.0
        return max(self._MIN_INTERVAL, min(self._MAX_INTERVAL, math.ceil(excess * self._others / self._OVERHEAD)))

    def _update_soonest(self, band: int) -> None:
        best = self._best[band]
        self._soonest[band] = min((due for i, due in enumerate(self._next_probe[band]) if i != best),
                                  default=math.inf)

    def best(self, band: int) -> Candidate:
        return self.candidates[self._best[band]]

    def pick(self, band: int) -> int:
        """The candidate for the next batch in ``band``: the best, or one due for re-measuring."""
        best = self._best[band]
        if not self.adaptive:
            return best
        calls = self._calls[band] = self._calls[band] + 1
        if calls < self._soonest[band]:
            return best
        for index, due in enumerate(self._next_probe[band]):
            if index != best and calls >= due:
                return index
        return best

    def record(self, band: int, index: int, rows: int, seconds: float) -> None:
        """What serving a batch of ``rows`` rows with candidate ``index`` cost."""
        costs = self._cost[band]
        step = math.log(max(seconds, 1e-9) / rows) - costs[index]
        cost = costs[index] = costs[index] + self._ALPHA * min(step, self._MAX_RISE)
        best = self._best[band]
        if index == best:  # the usual case: nothing to do unless the best got clearly slower
            anchor = self._anchor[band]
            if cost < anchor:
                self._anchor[band] = cost
                return
            if cost < anchor + self._RESCHEDULE:
                return
        calls = self._calls[band]
        probes = self._next_probe[band]
        if index != best:
            probes[index] = calls + self._interval(costs[index] - costs[best])
        cheapest = min(range(len(costs)), key=costs.__getitem__)
        if cheapest != best and costs[cheapest] - costs[best] < self._SWITCH:
            self._best[band] = best = cheapest
        self._anchor[band] = costs[best]
        # A best that got slower (or a new best) brings the re-measuring of the others forward.
        for other, cost in enumerate(costs):
            if other != best:
                probes[other] = min(probes[other], calls + self._interval(cost - costs[best]))
        self._update_soonest(band)
