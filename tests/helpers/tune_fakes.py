"""A remote server for tune and replay tests whose figures follow its knobs in a known way."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from triton_nb.errors import NotFoundError
from triton_nb.perf.stats import Completions
from triton_nb.perf.tune import config_with_knobs, knobs_of
from triton_nb.transport import Transport

ORIGINAL = {"name": "m", "backend": "python", "max_batch_size": 16,
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
            "dynamic_batching": {"max_queue_delay_microseconds": 100},
            "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}


def capacity(knobs: dict) -> float:
    """Requests/s the fake serves at most: best at delay 500 µs and 2 instances."""
    delay, instances = knobs["max_queue_delay_microseconds"], knobs["instance_count"]
    return max(300.0, 4000.0 - abs(delay - 500) - abs(instances - 2) * 900)


class FakeLoad:
    """Completions at the rate and latency the fake's formulas give (Little's law)."""

    def __init__(self, rate: float, latency_ns: int) -> None:
        self.rate, self.latency_ns = rate, latency_ns
        self.last = 0

    def start(self) -> None:
        self.last = time.monotonic_ns()

    def take(self) -> Completions:
        now = time.monotonic_ns()
        count = int(self.rate * (now - self.last) / 1e9)
        if count == 0:
            return Completions()
        ends = self.last + (np.arange(1, count + 1) * (now - self.last)) // count
        self.last = int(ends[-1])
        return Completions(ends - self.latency_ns, ends, np.ones(count, bool))

    def stop(self) -> None:
        pass


class FakeTarget(Transport):
    """A remote server whose figures follow its knobs: each knob change is a reload with a config
    override (Triton's load API), as tune makes it on a server that is not in this process."""

    protocol = "http"
    url = "fake:8000"

    def __init__(self, plateau: bool = False, capacity: Callable[[dict], float] = capacity,
                 models: tuple[str, ...] = ("m",)) -> None:
        """``capacity``: requests/s served at most under the given knobs; ``models``: the names it serves."""
        self.knobs = knobs_of(ORIGINAL, ["max_queue_delay_microseconds", "instance_count"])
        self.applied: list[dict] = []
        self.restored: list[dict] = []
        self.plateau = plateau
        self.capacity = capacity
        self.models_served = models

    def model_config_json(self, model: str, model_version: int | None = None) -> dict:
        if model not in self.models_served:
            raise NotFoundError(f"Request for unknown model: '{model}' is not found")
        return config_with_knobs(ORIGINAL, self.knobs)

    def statistics(self, model: str = "", model_version: int | None = None) -> dict:
        return {"model_stats": [{"name": "m", "version": "1", "inference_stats": {}, "batch_stats": []}]}

    def make_load(self, concurrency: int) -> FakeLoad:
        rate = min(concurrency * 2000.0, 6000.0 if self.plateau else self.capacity(self.knobs))
        latency_s = concurrency / rate + self.knobs["max_queue_delay_microseconds"] / 1e6
        return FakeLoad(rate, int(latency_s * 1e9))

    def load_model(self, model: str, config=None) -> None:
        knobs = knobs_of(config, ["max_queue_delay_microseconds", "instance_count"])
        if config == config_with_knobs(ORIGINAL, knobs_of(ORIGINAL, list(knobs))):
            self.restored.append(config)  # the original config, put back
        else:
            self.applied.append(knobs)
        self.knobs = knobs


