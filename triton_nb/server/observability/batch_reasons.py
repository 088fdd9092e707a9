"""Why each batch left the dynamic batcher (beyond Triton, which does not count this).

The dynamic batcher (:mod:`triton_nb.server.scheduling.batcher`) tells
:meth:`~triton_nb.server.observability.stats.ModelStats.count_batch` the :class:`BatchReason` and the rows of
every batch it forms. The statistics show them under the key ``triton_nb_batch_reasons``
(``{reason: {"count", "rows"}}``, every reason, zeros included: JSON readers such as tritonclient's
HTTP client pass an extra key through; gRPC's ``ModelStatistics`` message has no field for it, so it
is left out there); ``/metrics`` under ``triton_nb_batch_count`` (a counter, labels ``model``,
``version``, ``reason``) and ``triton_nb_batch_size`` (a histogram of the batches' rows, buckets the
powers of two up to 4096), after Triton's families, for versions loaded (no series, no family):
:class:`BatchCollector`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from triton_nb.server.observability.metrics import Histogram

__all__ = [
    "BATCH_COUNT_FAMILY",
    "BATCH_FAMILIES",
    "BATCH_REASONS",
    "BATCH_REASONS_KEY",
    "BATCH_SIZE_BUCKETS",
    "BATCH_SIZE_FAMILY",
    "BatchCollector",
    "BatchReason",
]


class BatchReason:
    """Why the dynamic batcher let a batch leave (beyond Triton, which does not count this): the
    ``reason`` label values of ``triton_nb_batch_count`` and the keys of ``triton_nb_batch_reasons``.
    :mod:`triton_nb.server.scheduling.batcher` decides which one a batch gets."""

    #: it holds max_batch_size rows, or the next queued request's rows would not fit beside it
    MAX_BATCH_SIZE = "max_batch_size"
    #: its rows reached one of the configured preferred_batch_size values
    PREFERRED_BATCH_SIZE = "preferred_batch_size"
    #: it was held for max_queue_delay_microseconds after its oldest request, and the delay ran out
    MAX_QUEUE_DELAY = "max_queue_delay"
    #: an instance took the queue as it was, short of a batch, with nothing to wait for: the delay
    #: is 0, or it had run out before the instance came to form the batch (every instance was busy)
    INSTANCE_FREE = "instance_free"
    #: the next queued request has other non-batch dims (or inputs), so it cannot join
    DIFFERENT_SHAPE = "different_shape"
    #: the model is unloading (or the server stopping): the queue drains without waiting
    DRAINING = "draining"
    #: the model has no dynamic_batching (or max_batch_size 0): each request runs alone
    NO_DYNAMIC_BATCHING = "no_dynamic_batching"


#: Every :class:`BatchReason`, in the order the statistics and /metrics list them.
BATCH_REASONS = (BatchReason.MAX_BATCH_SIZE, BatchReason.PREFERRED_BATCH_SIZE, BatchReason.MAX_QUEUE_DELAY,
                 BatchReason.INSTANCE_FREE, BatchReason.DIFFERENT_SHAPE, BatchReason.DRAINING,
                 BatchReason.NO_DYNAMIC_BATCHING)
#: The statistics key of each model's batch reasons (ours: Triton has none).
BATCH_REASONS_KEY = "triton_nb_batch_reasons"
BATCH_COUNT_FAMILY = "triton_nb_batch_count"
BATCH_SIZE_FAMILY = "triton_nb_batch_size"
#: The batch-size histogram's upper bounds, in rows: batch sizes cluster at powers of two.
BATCH_SIZE_BUCKETS: tuple[float, ...] = tuple(float(2 ** i) for i in range(13))  # 1 .. 4096
BATCH_FAMILIES: tuple[tuple[str, str, str], ...] = (
    (BATCH_COUNT_FAMILY, "counter", "Number of batches the dynamic batcher formed, by why each left (triton_nb)"),
    (BATCH_SIZE_FAMILY, "histogram", "Rows per batch the dynamic batcher formed (triton_nb)"),
)


class BatchCollector(Collector):
    """Yields the batch families (beyond Triton) of the model versions ``snapshot()`` returns
    (each with a ``name``, a ``version`` and ``batch_reasons()``:
    :class:`~triton_nb.server.observability.stats.ModelStats`)."""

    def __init__(self, snapshot: Callable[[], Iterable[Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        models = [(model, model.batch_reasons()) for model in self._snapshot()]
        if not models:  # a family without series is left out, as for Triton's families
            return
        (count_name, count_kind, count_help), (size_name, size_kind, size_help) = BATCH_FAMILIES
        counts = Metric(count_name, count_help, count_kind)
        sizes = Metric(size_name, size_help, size_kind)
        for model, reasons in models:
            labels = {"model": model.name, "version": str(model.version)}
            histogram = Histogram(BATCH_SIZE_BUCKETS)
            for reason, batches in reasons.items():
                counts.add_sample(count_name, {**labels, "reason": reason}, sum(batches.values()))
                for rows, n in batches.items():
                    histogram.observe(rows, n)
            for sample_name, sample_labels, value in histogram.samples(size_name, labels):
                sizes.add_sample(sample_name, sample_labels, value)
        yield counts
        yield sizes
