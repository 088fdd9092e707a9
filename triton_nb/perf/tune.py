"""``tune``: Model Analyzer's config search, in the notebook.

Each candidate config (a combination of knob values) is applied to the serving model — live on the
in-kernel server (batching knobs and instance counts change from the next batch, no reload; other
config fields by an in-kernel reload), or through the repository load API with a config override on
a remote server in explicit mode — and measured over the concurrency range. A config's sweep stops
early when throughput stops rising (under 5% over 4 steps, Model Analyzer's rule) or when the latency
budget is already exceeded. Configs are ranked by the objective over their points that meet the
constraints. The original config is restored at the end, also on error or interrupt, and what was
measured is kept.

Knobs: ``max_batch_size``, ``max_queue_delay_microseconds``, ``preferred_batch_size`` (a tuple per
value), ``instance_count``, ``dynamic_batching`` (True/False: the dynamic batcher on, or Triton's
default scheduler, one request per execution), ``response_cache`` (True/False: the model's
``response_cache { enable }``, live on the in-kernel server, which needs ``cache_size_bytes``; measure
it with ``repeat_ratio`` so that requests repeat), and any ``parameters.<key>`` (FIL engine
parameters, for instance). Client-side knobs change how the requests travel, not the server:
``input_tensor_format``, ``output_tensor_format`` ("binary"/"json"), ``request_compression``,
``response_compression`` ("none"/"gzip"/"deflate", HTTP) and ``grpc_compression_algorithm`` (gRPC),
as :func:`~triton_nb.perf.measure` takes them; they are passed to each measurement, never applied to
a config, so one sweep crosses the payload format with the server's knobs (format x delay x
instances) and a recommended config carries the server's knobs only.

An ensemble's composing models can be tuned together (``tuned_model=["preprocessing", "fil"]``: each
candidate's knob values apply to every one of them), as Model Analyzer searches an ensemble's
composing models. ``no_batching_baseline=True`` also measures the tuned models with dynamic batching
off (config "dynamic batching off"), ranked with the others, and :attr:`TuneResult.batching_gain`
says what batching bought: the recommended config's throughput within the constraints over the
baseline's, from the same run.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from triton_nb.errors import InvalidArgumentError
from triton_nb.perf.measure import WIRE_OPTIONS, measure
from triton_nb.perf.options import Sequences, SharedMemory, Wire, wire_of
from triton_nb.perf.stats import parse_range
from triton_nb.transport import Transport, connect

__all__ = ["BATCHING_KNOBS", "CLIENT_KNOBS", "LIVE_KNOBS", "NO_BATCHING", "SweepSettings", "TuneResult",
           "config_label", "config_with_knobs", "server_knobs", "tune"]

BATCHING_KNOBS = ("max_batch_size", "max_queue_delay_microseconds", "preferred_batch_size", "instance_count")
# Knobs the in-kernel server changes live, without a reload (response_cache through
# update_response_cache, the others through update_batching).
LIVE_KNOBS = (*BATCHING_KNOBS, "dynamic_batching", "response_cache")
#: Knobs of the client (how requests travel), passed to each measurement and never to the server.
CLIENT_KNOBS = tuple(WIRE_OPTIONS)
_SHORT = {"max_batch_size": "mbs", "max_queue_delay_microseconds": "delay_us", "preferred_batch_size": "preferred",
          "instance_count": "instances", "dynamic_batching": "batching", "response_cache": "cache",
          "input_tensor_format": "in", "output_tensor_format": "out", "request_compression": "req_zip",
          "response_compression": "resp_zip", "grpc_compression_algorithm": "grpc_zip"}
#: The label of the baseline config that ``no_batching_baseline`` adds.
NO_BATCHING = "dynamic batching off"
EARLY_STOP_STEPS = 4
EARLY_STOP_GAIN = 0.05


def _check_knob(name: str) -> None:
    if name not in LIVE_KNOBS and name not in CLIENT_KNOBS and not name.startswith("parameters."):
        raise InvalidArgumentError(f"unknown knob '{name}': use {', '.join(LIVE_KNOBS + CLIENT_KNOBS)} or "
                                   f"parameters.<key>")


def server_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs a config takes: ``knobs`` without the client's (:data:`CLIENT_KNOBS`)."""
    return {name: value for name, value in knobs.items() if name not in CLIENT_KNOBS}


def config_with_knobs(config: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config (Triton's JSON form) with knob values set (client knobs are not the
    config's: they are left out)."""
    out = copy.deepcopy(config)
    for name, value in knobs.items():
        _check_knob(name)
        if name in CLIENT_KNOBS:
            continue
        if name == "max_batch_size":
            out["max_batch_size"] = int(value)
        elif name == "dynamic_batching":
            if not value:
                out.pop("dynamic_batching", None)
            else:
                out.setdefault("dynamic_batching", {})
        elif name == "response_cache":
            out["response_cache"] = {"enable": bool(value)}
        elif name == "max_queue_delay_microseconds":
            out.setdefault("dynamic_batching", {})["max_queue_delay_microseconds"] = int(value)
        elif name == "preferred_batch_size":
            out.setdefault("dynamic_batching", {})["preferred_batch_size"] = [int(v) for v in value]
        elif name == "instance_count":
            groups = out.setdefault("instance_group", [{"kind": "KIND_CPU"}])
            groups[0]["count"] = int(value)
            del groups[1:]
        else:
            out.setdefault("parameters", {})[name.removeprefix("parameters.")] = {"string_value": str(value)}
    return out


def knobs_of(config: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """The values a config gives the named knobs."""
    batching = config.get("dynamic_batching", {})
    groups = config.get("instance_group", [])
    values: dict[str, Any] = {}
    for name in names:
        if name == "max_batch_size":
            values[name] = int(config.get("max_batch_size", 0))
        elif name == "dynamic_batching":
            values[name] = "dynamic_batching" in config
        elif name == "response_cache":
            values[name] = bool(config.get("response_cache", {}).get("enable", False))
        elif name == "max_queue_delay_microseconds":
            values[name] = int(batching.get("max_queue_delay_microseconds", 0))
        elif name == "preferred_batch_size":
            values[name] = tuple(int(v) for v in batching.get("preferred_batch_size", []))
        elif name == "instance_count":
            values[name] = int(groups[0].get("count", 1)) if groups else 1
        else:
            values[name] = config.get("parameters", {}).get(name.removeprefix("parameters."), {}).get("string_value")
    return values


def config_label(knobs: dict[str, Any]) -> str:
    """A short label of knob values: ``delay_us=100 instances=2``."""
    if knobs.get("dynamic_batching") is False:
        rest = {k: v for k, v in knobs.items() if k != "dynamic_batching"}
        return " ".join([NO_BATCHING, *([config_label(rest)] if rest else [])])
    parts = []
    for name, value in knobs.items():
        short = _SHORT.get(name, name.removeprefix("parameters."))
        shown = "[" + ",".join(map(str, value)) + "]" if isinstance(value, (tuple, list)) else value
        parts.append(f"{short}={shown}")
    return " ".join(parts)


@dataclass(frozen=True)
class SweepSettings:
    """How a sweep measured and ranked its configs, kept with its result so that
    :func:`~triton_nb.perf.replay` measures another server the same way."""

    model: str
    tuned_models: tuple[str, ...]
    knob_names: tuple[str, ...]
    concurrency_levels: tuple[int, ...]
    protocol: str
    objective: str | dict[str, float] = "throughput"
    latency_budget_ms: float | None = None
    min_throughput: float | None = None
    latency_percentile: int = 99
    input_data: Any = "random"
    rows_per_request: int | Sequence[int] = 1
    rows_per_request_weights: Sequence[float] | None = None
    wire: Wire = field(default_factory=Wire)
    repeat_ratio: float = 0.0
    request_count: int | None = None
    shared_memory: SharedMemory = field(default_factory=SharedMemory)
    sequences: Sequences = field(default_factory=Sequences)
    measurement_interval_ms: int = 2000
    max_trials: int = 5
    early_stop: bool = True

    @property
    def latency_column(self) -> str:
        return f"latency_p{self.latency_percentile}_us"

    @property
    def latency_budget_us(self) -> float | None:
        return None if self.latency_budget_ms is None else self.latency_budget_ms * 1e3


def sweep_config(transport: Transport, settings: SweepSettings, values: dict[str, Any],
                 points: list[dict[str, Any]], levels: Sequence[int] | None = None,
                 on_point: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Measure the config already applied (knob ``values``) at each load level, as a sweep does:
    every level of ``settings`` with its early stops, or exactly ``levels`` when given (a replay's
    later rounds repeat the levels of its first). One row per level, labelled with the config, and
    each also appended to ``points`` as soon as it is measured, so an interrupt keeps it."""
    budget_us = settings.latency_budget_us
    rows: list[dict[str, Any]] = []
    # the client's knobs of this config over the sweep's fixed wire
    wire = dataclasses.replace(settings.wire, **{k: v for k, v in values.items() if k in CLIENT_KNOBS})
    for level in settings.concurrency_levels if levels is None else levels:
        frame = measure(transport, settings.model, concurrency_range=[level], input_data=settings.input_data,
                        rows_per_request=settings.rows_per_request,
                        rows_per_request_weights=settings.rows_per_request_weights,
                        repeat_ratio=settings.repeat_ratio, wire=wire, request_count=settings.request_count,
                        shared_memory=settings.shared_memory, sequences=settings.sequences,
                        measurement_interval_ms=settings.measurement_interval_ms,
                        max_trials=settings.max_trials, warmup_ms=min(settings.measurement_interval_ms, 1000))
        row = {**frame.iloc[0].to_dict(), **values, "config": config_label(values)}
        rows.append(row)
        points.append(row)
        if on_point is not None:
            on_point(row)
        if levels is not None:
            continue
        if budget_us is not None and row[settings.latency_column] > budget_us:
            break  # more load only adds latency
        throughputs = [p["throughput_infer_per_sec"] for p in rows]
        if settings.early_stop and len(throughputs) > EARLY_STOP_STEPS and max(throughputs[-EARLY_STOP_STEPS:]) < (
                1 + EARLY_STOP_GAIN) * throughputs[-EARLY_STOP_STEPS - 1]:
            break
    return rows


@dataclass
class TuneResult:
    """What a sweep measured and what it recommends."""

    measurements: pd.DataFrame
    ranking: pd.DataFrame
    recommended: dict[str, Any] | None
    recommended_config: dict[str, Any] | None
    original_config: dict[str, Any]
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    #: the recommended config's throughput over the "dynamic batching off" baseline's (both the
    #: best point within the constraints); None without a baseline or when either has no such point
    batching_gain: float | None = None
    #: how the sweep measured (what :func:`~triton_nb.perf.replay` repeats); None for a result made by hand
    settings: SweepSettings | None = None

    def write_config(self, path: str | Path) -> Path:
        """Write the recommended config as ``config.pbtxt`` (a folder means ``<folder>/config.pbtxt``)."""
        from triton_nb.repository.config import (
            CONFIG_FILENAME,
            config_from_json,
            config_to_json,
            load_config,
            save_config,
        )

        if self.recommended_config is None or self.recommended is None:
            raise InvalidArgumentError("no config met the constraints: nothing to write")
        target = Path(path)
        if target.is_dir():
            target = target / CONFIG_FILENAME
        # Over an existing file, change only the knobs: the server's effective config would add every
        # default Triton fills in (version policy, instance-group names) to a file a person reads.
        base = config_to_json(load_config(target)) if target.is_file() else self.recommended_config
        config = config_with_knobs(base, self.recommended)
        return save_config(config_from_json(config, source="recommended config"), target)


class KnobApplier:
    """Applies knob values to the tuned model and puts the original back.

    On an in-kernel server (``transport.service``, whichever protocol the measurements use) the
    batching knobs change live (``update_batching``) and the others by a reload with a config
    override; on a remote server every change is a reload through the transport (Triton's load
    API with a config; explicit model control)."""

    def __init__(self, transport: Transport, model: str) -> None:
        self.transport = transport
        self.server = transport.service
        self.model = model
        self.original = transport.model_config_json(model)
        self._reloaded = False
        self._cache_set = False  # response_cache changed live (restored at the end)

    def apply(self, knobs: dict[str, Any]) -> None:
        knobs = server_knobs(knobs)
        server = self.server
        if server is None:
            self.transport.load_model(self.model, config_with_knobs(self.original, knobs))
            self._reloaded = True
            return
        others = {k: v for k, v in knobs.items() if k not in LIVE_KNOBS}
        if others:
            current = knobs_of(self.transport.model_config_json(self.model), list(others))
            if current != others:
                server.load_model(self.model, config=config_with_knobs(self.original, knobs))
                self._reloaded = True
        if "response_cache" in knobs:
            # each config starts cold: entries of an earlier config would make its first pass hit
            server.update_response_cache(self.model, enable=bool(knobs["response_cache"]), drop_entries=True)
            self._cache_set = True
        batching = {k: (list(v) if k == "preferred_batch_size" else v)
                    for k, v in knobs.items() if k in LIVE_KNOBS and k != "response_cache"}
        if "dynamic_batching" not in batching and "dynamic_batching" in self.original:
            batching["dynamic_batching"] = True  # a baseline measured before may have turned it off
        if batching.get("dynamic_batching") is False:
            batching = {k: v for k, v in batching.items() if k in ("dynamic_batching", "instance_count")}
        if batching:
            server.update_batching(self.model, **batching)

    def restore(self) -> None:
        server = self.server
        if server is None:
            self.transport.load_model(self.model, self.original)
            return
        if self._reloaded:
            server.load_model(self.model, config=self.original)
        if self._cache_set:
            enable = knobs_of(self.original, ["response_cache"])["response_cache"]
            server.update_response_cache(self.model, enable=enable)
        values = knobs_of(self.original, BATCHING_KNOBS)
        if self.original.get("max_batch_size", 0) > 0 and "dynamic_batching" in self.original:
            server.update_batching(
                self.model, dynamic_batching=True, max_batch_size=values["max_batch_size"],
                max_queue_delay_microseconds=values["max_queue_delay_microseconds"],
                preferred_batch_size=list(values["preferred_batch_size"]), instance_count=values["instance_count"])
        elif self.original.get("max_batch_size", 0) > 0:
            server.update_batching(self.model, dynamic_batching=False, instance_count=values["instance_count"])
        else:
            server.update_batching(self.model, instance_count=values["instance_count"])


def _score(points: pd.DataFrame, objective: Any, latency_column: str) -> pd.Series:
    if objective == "throughput":
        return points["throughput_infer_per_sec"]
    if objective == "latency":
        return -points[latency_column]
    if isinstance(objective, dict) and set(objective) <= {"throughput", "latency"}:
        top = points["throughput_infer_per_sec"].max() or 1.0
        low = points[latency_column].min() or 1.0
        return (objective.get("throughput", 0.0) * points["throughput_infer_per_sec"] / top
                - objective.get("latency", 0.0) * points[latency_column] / low)
    raise InvalidArgumentError(
        f"objective must be 'throughput', 'latency' or a dict of their weights, got {objective!r}")


def tune(
    target: Any,
    model: str,
    knobs: dict[str, Sequence[Any]],
    *,
    concurrency_range: str | Sequence[int] = "1:32:1",
    tuned_model: str | Sequence[str] | None = None,
    search: str = "brute",
    latency_budget_ms: float | None = None,
    min_throughput: float | None = None,
    objective: str | dict[str, float] = "throughput",
    latency_percentile: int = 99,
    protocol: str | None = None,
    input_data: Any = "random",
    rows_per_request: int | Sequence[int] = 1,
    rows_per_request_weights: Sequence[float] | None = None,
    wire: Wire | Mapping[str, str] | None = None,
    repeat_ratio: float = 0.0,
    request_count: int | None = None,
    shared_memory: SharedMemory | str = "none",
    sequences: Sequences | None = None,
    measurement_interval_ms: int = 2000,
    max_trials: int = 5,
    early_stop: bool = True,
    progress: bool = True,
    write_config: str | Path | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    no_batching_baseline: bool = False,
) -> TuneResult:
    """Search ``knobs`` (name -> candidate values) for the config of ``tuned_model`` (default
    ``model``; for an ensemble, name one composing model or a list of them, which then take the same
    values) that serves ``model`` best; see the module.

    ``search``: "brute" (every combination) or "quick" (hill climbing from the first values: move
    to the best neighbouring config while it improves). Constraints: ``latency_budget_ms`` on the
    ``latency_percentile`` latency, and ``min_throughput`` (infer/s). ``on_point`` is called with
    each measured point (the tuning panel's live plot). ``no_batching_baseline``: measure the tuned
    models with dynamic batching off too, first (see :attr:`TuneResult.batching_gain`).
    ``repeat_ratio`` and ``request_count``: the requests' repetition, as :func:`~triton_nb.perf.measure`
    takes them (for the ``response_cache`` knob). The option groups of
    :mod:`triton_nb.perf.options`, as :func:`~triton_nb.perf.measure` takes them:
    ``shared_memory`` (a :class:`~triton_nb.perf.options.SharedMemory` or its kind alone, "system":
    tensors in shared-memory regions, over HTTP or gRPC), ``sequences`` (a
    :class:`~triton_nb.perf.options.Sequences`, for a stateful model) and ``wire`` (a
    :class:`~triton_nb.perf.options.Wire`, or a dict of some of its fields): fixed values of the
    client knobs for every config (``wire=Wire(request_compression="gzip")``); to sweep one, give it
    in ``knobs`` instead (``{"input_tensor_format": ["binary", "json"], ...}``). ``rows_per_request``
    and ``rows_per_request_weights``: one size or a mix, as :func:`~triton_nb.perf.measure` takes them.

    Not to be confused with :meth:`triton_nb.InferenceServer.tune`, which opens the tuning panel
    (a notebook widget) whose **Sweep** button runs this search.
    """
    if not knobs:
        raise InvalidArgumentError("give at least one knob to vary")
    for name, values in knobs.items():
        _check_knob(name)
        if not list(values):
            raise InvalidArgumentError(f"knob '{name}' has no values")
    if search not in ("brute", "quick"):
        raise InvalidArgumentError(f"search must be 'brute' or 'quick', got {search!r}")
    wire = wire_of(wire)
    shared_memory = SharedMemory.of(shared_memory)
    sequences = sequences or Sequences()
    names = list(knobs)
    grids = [[tuple(v) if isinstance(v, list) else v for v in knobs[name]] for name in names]
    levels = [int(c) for c in parse_range(concurrency_range, "concurrency_range")]
    resolved = connect(target, protocol)
    tuned = [tuned_model or model] if tuned_model is None or isinstance(tuned_model, str) else list(tuned_model)
    if not tuned:
        raise InvalidArgumentError("tuned_model: name at least one model")
    appliers = [KnobApplier(resolved, name) for name in tuned]
    if no_batching_baseline:
        unbatched = [a.model for a in appliers if a.original.get("max_batch_size", 0) <= 0]
        if unbatched:
            raise InvalidArgumentError(f"no_batching_baseline: model(s) {', '.join(unbatched)} do not batch "
                                       "(max_batch_size 0): there is no dynamic batching to turn off")
    ranked_names = [*names, "dynamic_batching"] if no_batching_baseline and "dynamic_batching" not in names else names
    settings = SweepSettings(
        model=model, tuned_models=tuple(tuned), knob_names=tuple(ranked_names), concurrency_levels=tuple(levels),
        protocol=resolved.protocol, objective=objective, latency_budget_ms=latency_budget_ms,
        min_throughput=min_throughput, latency_percentile=latency_percentile, input_data=input_data,
        rows_per_request=rows_per_request, rows_per_request_weights=rows_per_request_weights, wire=wire,
        repeat_ratio=repeat_ratio, request_count=request_count, shared_memory=shared_memory, sequences=sequences,
        measurement_interval_ms=measurement_interval_ms, max_trials=max_trials, early_stop=early_stop)
    points: list[dict[str, Any]] = []
    measured: dict[tuple, float] = {}
    interrupted = False
    bar = None
    if progress:
        from tqdm.auto import tqdm

        total = math.prod(len(g) for g in grids) if search == "brute" else None
        if total is not None:
            total += no_batching_baseline
        bar = tqdm(total=total, desc=f"tuning {', '.join(tuned)}", unit="config")

    def evaluate(index: tuple[int, ...] | None) -> float:
        if index in measured:
            return measured[index]
        values = ({"dynamic_batching": False} if index is None else
                  {name: grids[i][k] for i, (name, k) in enumerate(zip(names, index, strict=True))})
        for applier in appliers:
            applier.apply(values)
        config_points = sweep_config(resolved, settings, values, points, on_point=on_point)
        frame = pd.DataFrame(config_points)
        feasible = _feasible(frame, settings)
        scores = _score(frame, objective, settings.latency_column)[feasible]
        score = float(scores.max()) if feasible.any() else -math.inf
        measured[index] = score
        if bar is not None:
            bar.update(1)
        return score

    try:
        if no_batching_baseline:
            evaluate(None)
        if search == "brute":
            for index in itertools.product(*(range(len(g)) for g in grids)):
                evaluate(index)
        else:
            current = tuple(0 for _ in grids)
            best = evaluate(current)
            while True:
                neighbours = []
                for i in range(len(grids)):
                    for step in (-1, 1):
                        k = current[i] + step
                        if 0 <= k < len(grids[i]):
                            neighbours.append((*current[:i], k, *current[i + 1:]))
                scored = [(evaluate(n), n) for n in neighbours]
                top, where = max(scored, key=lambda item: item[0])
                if top <= best:
                    break
                best, current = top, where
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
        for applier in reversed(appliers):
            applier.restore()
        if resolved is not target:  # made here, so closed here
            resolved.close()
    result = tune_result_of(points, settings, appliers[0].original, interrupted)
    if write_config is not None and result.recommended_config is not None:
        result.write_config(write_config)
    return result


def plain_value(value: Any) -> Any:
    """numpy scalars as Python values (they go into JSON configs and user-facing dicts)."""
    return value.item() if hasattr(value, "item") else value


def knob_missing(value: Any) -> bool:
    """A knob a config did not set: the baseline sets only ``dynamic_batching``, the others not it."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _feasible(frame: pd.DataFrame, settings: SweepSettings) -> pd.Series:
    ok = frame["errors"].fillna(0) == 0
    if settings.latency_budget_us is not None:
        ok &= frame[settings.latency_column] <= settings.latency_budget_us
    if settings.min_throughput is not None:
        ok &= frame["throughput_infer_per_sec"] >= settings.min_throughput
    return ok


def tune_result_of(points: list[dict[str, Any]] | pd.DataFrame, settings: SweepSettings, original: dict[str, Any],
            interrupted: bool) -> TuneResult:
    """Rank the configs of measured ``points`` (one row per config and load level) by the best of
    their points that meet the constraints, and recommend the first."""
    names = list(settings.knob_names)
    latency_column = settings.latency_column
    measurements = pd.DataFrame(points)
    if measurements.empty:
        return TuneResult(measurements, pd.DataFrame(), None, None, original, interrupted,
                          ["nothing was measured"], settings=settings)
    measurements["feasible"] = _feasible(measurements, settings)
    measurements["score"] = _score(measurements, settings.objective, latency_column)
    rows = []
    for label, group in measurements.groupby("config", sort=False):
        feasible = group[group["feasible"]]
        best = feasible.loc[feasible["score"].idxmax()] if not feasible.empty else None
        row = {"config": label, **{n: group.iloc[0][n] for n in names}, "feasible": best is not None,
               "score": best["score"] if best is not None else -math.inf}
        source = best if best is not None else group.loc[group["throughput_infer_per_sec"].idxmax()]
        row.update({"concurrency": int(source["concurrency"]),
                    "throughput_infer_per_sec": source["throughput_infer_per_sec"],
                    latency_column: source[latency_column], "latency_p50_us": source["latency_p50_us"]})
        rows.append(row)
    ranking = pd.DataFrame(rows).sort_values("score", ascending=False, kind="stable").reset_index(drop=True)
    ranking.insert(0, "rank", range(1, len(ranking) + 1))
    recommended = None
    recommended_config = None
    notes = []
    if ranking.iloc[0]["feasible"]:
        recommended = {n: plain_value(ranking.iloc[0][n]) for n in names if not knob_missing(ranking.iloc[0][n])}
        recommended_config = config_with_knobs(original, recommended)
    else:
        notes.append("no config met the constraints")
    gain = None
    baseline = ranking[ranking["config"] == NO_BATCHING]
    if not baseline.empty and recommended is not None:
        if baseline.iloc[0]["feasible"] and baseline.iloc[0]["throughput_infer_per_sec"] > 0:
            gain = float(ranking.iloc[0]["throughput_infer_per_sec"] / baseline.iloc[0]["throughput_infer_per_sec"])
        else:
            notes.append(f"'{NO_BATCHING}' met no constraint: no batching gain to state")
    return TuneResult(measurements, ranking, recommended, recommended_config, original, interrupted, notes,
                      batching_gain=gain, settings=settings)
