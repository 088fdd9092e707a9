"""``replay``: a sweep's best configs measured again on a real Triton server.

A :func:`~triton_nb.perf.tune` sweep ranks configs on the in-kernel server. :func:`replay` takes its
result and a tritonserver by URL (explicit model control, so that the repository load API takes a
config override), applies the sweep's top configs and its recommended one to the same model there
(tune's own applier: a load with the config override, the original config loaded back at the end,
also on error or interrupt), and measures each as the sweep did: the same load levels and their
early stops, the same request data, windows and client options. It measures in rounds, the order of
the configs reversed every other round, so that drift on a shared machine falls on every config
alike; a config's later rounds repeat the load levels of its first, and its figures per level are
the mean over the rounds. The replayed configs are ranked by the sweep's objective and constraints.

The figure :attr:`ReplayResult.pick_vs_best` is the throughput real Triton gives the sweep's
recommended config over the best throughput it gives any config of the replay: 1.0 when the
in-kernel sweep picked what real Triton would have picked.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from triton_nb.errors import InvalidArgumentError, NotFoundError, TritonNBError
from triton_nb.perf.tune import (
    KnobApplier,
    TuneResult,
    config_label,
    knob_missing,
    plain_value,
    sweep_config,
    tune_result_of,
)
from triton_nb.transport import Transport, connect

__all__ = ["ReplayResult", "replay"]

# where the figures of each side come from in the ranking of tune's result
_SIDES = ("sweep", "triton")


@dataclass
class ReplayResult:
    """Both rankings of the replayed configs side by side, and how our pick fared on real Triton."""

    #: one row per replayed config, in the sweep's order: ``config``, ``recommended`` (the sweep's
    #: pick), then ``sweep_rank``, ``sweep_concurrency``, ``sweep_throughput_infer_per_sec``,
    #: ``sweep_latency_p<N>_us`` and the same ``triton_*`` columns (``triton_feasible``: the config
    #: met the constraints on real Triton)
    comparison: pd.DataFrame
    #: real Triton's throughput of our recommended config over the best real Triton throughput of
    #: the replay, in (0, 1]; None when the recommended config was not measured (an interrupt)
    pick_vs_best: float | None
    #: the label of the sweep's recommended config
    recommended: str
    #: the label of the config real Triton ranks first
    triton_best: str | None
    #: every replayed point (one row per config, load level and round, ``round`` from 1)
    measurements: pd.DataFrame
    #: the server replayed on ("the tritonserver started for the replay" when it was) and the models
    #: whose config changed there
    url: str
    tuned_models: tuple[str, ...]
    rounds: int
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: the figure, our pick and real Triton's best."""
        if self.pick_vs_best is None:
            return f"real Triton at {self.url}: our pick '{self.recommended}' was not measured"
        best = "it too" if self.triton_best == self.recommended else f"'{self.triton_best}'"
        return (f"real Triton at {self.url} gives our pick '{self.recommended}' {self.pick_vs_best:.2f} of the "
                f"best throughput it found among {len(self.comparison)} config(s) (best: {best})")

    def __repr__(self) -> str:
        return f"<ReplayResult: {self.summary()}>"


def replay(
    result: TuneResult,
    url: str | Transport | None = None,
    *,
    top: int = 3,
    rounds: int = 2,
    protocol: str | None = None,
    progress: bool = True,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    model_repository: str | os.PathLike[str] | None = None,
) -> ReplayResult:
    """Replay the ``top`` configs of a :func:`~triton_nb.perf.tune` result, and its recommended
    config, on the tritonserver at ``url`` (``host:port``; a :class:`~triton_nb.transport.Transport`
    also does), or on one started for the replay; see the module.

    Parameters
    ----------
    result
        The in-kernel sweep's result; its recommended config is always replayed.
    url
        A running tritonserver in explicit model control mode (``--model-control-mode=explicit``)
        serving the sweep's models. None: start the nvidia-pytriton wheel's tritonserver
        (:mod:`triton_nb.tritonserver`) over ``model_repository``, its FIL models served by their
        Python twins (:func:`~triton_nb.repository.python_twin_repository`, since that build has no
        FIL backend), and stop it at the end.
    model_repository
        With ``url=None``: the repository the sweep's server serves (what real Triton will load).
    top
        How many of the sweep's best configs that met the constraints to replay.
    rounds
        How many times each config is measured, the order reversed every other round.
    protocol
        "http" or "grpc"; default the sweep's, or "http" when the sweep ran in-process.
    progress
        Show a progress bar of the configs measured.
    on_point
        Called with each measured point (a dict with ``config``, ``round`` and the figures).

    Returns
    -------
    ReplayResult
        Both rankings side by side and :attr:`ReplayResult.pick_vs_best`.
    """
    if url is None:
        return _replay_on_started_server(result, model_repository, top=top, rounds=rounds, protocol=protocol,
                                         progress=progress, on_point=on_point)
    if model_repository is not None:
        raise InvalidArgumentError("replay: model_repository is for a tritonserver started here (url=None); "
                                   f"the server at {url} serves its own")
    settings = result.settings
    if settings is None:
        raise InvalidArgumentError("replay: this result has no sweep settings; replay what tune() returned")
    if result.recommended is None:
        raise InvalidArgumentError("replay: the sweep recommended no config (none met the constraints): "
                                   "nothing to compare")
    if top < 1:
        raise InvalidArgumentError(f"replay: top must be >= 1, got {top}")
    if rounds < 1:
        raise InvalidArgumentError(f"replay: rounds must be >= 1, got {rounds}")
    configs = replayed_configs(result.ranking, settings.knob_names, result.recommended, top)
    if protocol is None:
        protocol = _default_protocol(result)
    transport = connect_checked(url, protocol, (settings.model, *settings.tuned_models))
    where = transport.url or str(url)
    points: list[dict[str, Any]] = []
    interrupted = False
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=rounds * len(configs), desc=f"replaying on {where}", unit="config")
    try:
        appliers = [KnobApplier(transport, name) for name in settings.tuned_models]
        try:
            levels: dict[str, list[int]] = {}
            for round_number in range(1, rounds + 1):
                # reversed every other round: a drift over the replay weighs on first and last alike
                for label, values in configs if round_number % 2 else configs[::-1]:
                    for applier in appliers:
                        applier.apply(values)

                    def mark(row: dict[str, Any], round_number: int = round_number) -> None:
                        row["round"] = round_number
                        if on_point is not None:
                            on_point(row)

                    rows = sweep_config(transport, settings, values, points, levels.get(label), on_point=mark)
                    levels.setdefault(label, [int(row["concurrency"]) for row in rows])
                    if bar is not None:
                        bar.update(1)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            _restore(appliers)
    finally:
        if bar is not None:
            bar.close()
        if transport is not url:  # made here, so closed here
            transport.close()
    # every knob a column, as the sweep's ranking has them (a baseline replayed alone sets one knob)
    measurements = pd.DataFrame(points)
    for name in settings.knob_names:
        if name not in measurements:
            measurements[name] = None
    triton = tune_result_of(mean_over_rounds(measurements), settings, appliers[0].original, interrupted)
    comparison = compare_rankings(result.ranking, triton.ranking, [label for label, _ in configs],
                                  settings.latency_column, config_label(result.recommended))
    notes = [f"on real Triton: {note}" for note in triton.notes]
    if interrupted:
        notes.append("interrupted: ranking the configs measured so far")
    return ReplayResult(
        comparison=comparison, pick_vs_best=pick_vs_best(comparison), recommended=config_label(result.recommended),
        triton_best=None if triton.ranking.empty else str(triton.ranking.iloc[0]["config"]),
        measurements=measurements, url=where, tuned_models=settings.tuned_models, rounds=rounds,
        interrupted=interrupted, notes=notes)


def _replay_on_started_server(result: TuneResult, model_repository: str | os.PathLike[str] | None,
                              **options: Any) -> ReplayResult:
    """:func:`replay` on the wheel's tritonserver, started over the Python twin of ``model_repository``."""
    from triton_nb.repository import python_twin_repository
    from triton_nb.tritonserver import TritonServerProcess

    if model_repository is None:
        raise InvalidArgumentError("replay: give url= (a running tritonserver) or model_repository= (the "
                                   "repository to start one over)")
    if not Path(model_repository).is_dir():
        raise InvalidArgumentError(f"replay: model_repository {model_repository} is not a folder")
    with tempfile.TemporaryDirectory(prefix="triton-nb-replay-") as scratch:
        twin = python_twin_repository(model_repository, Path(scratch) / "model_repository")
        # explicit control, every model loaded: the replay loads each config through the repository API
        server = TritonServerProcess(twin, extra_args=["--model-control-mode=explicit", "--load-model=*"])
        with server:
            protocol = options.get("protocol") or _default_protocol(result)
            outcome = replay(result, server.grpc_url if protocol == "grpc" else server.http_url, **options)
        outcome.notes.append(f"on a tritonserver started for the replay over the Python twin of {model_repository}")
        outcome.url = "the tritonserver started for the replay"  # its address is gone with it
        return outcome


def _default_protocol(result: TuneResult) -> str:
    protocol = result.settings.protocol if result.settings is not None else "http"
    return protocol if protocol in ("http", "grpc") else "http"


def replayed_configs(ranking: pd.DataFrame, knob_names: Sequence[str], recommended: dict[str, Any],
                     top: int) -> list[tuple[str, dict[str, Any]]]:
    """(label, knob values) of a sweep ranking's ``top`` configs that met the constraints, in its
    order, and the ``recommended`` knob values (the first of them when they rank first)."""
    feasible = ranking[ranking["feasible"].astype(bool)].head(top)
    configs = [(str(row["config"]), {n: plain_value(row[n]) for n in knob_names if not knob_missing(row[n])})
               for _, row in feasible.iterrows()]
    label = config_label(recommended)
    if label not in [known for known, _ in configs]:
        configs.insert(0, (label, dict(recommended)))
    return configs


def connect_checked(url: str | Transport, protocol: str, models: Sequence[str]) -> Transport:
    """A transport to ``url`` that answered for each of ``models``: an unreachable server or a
    model it lacks is a one-line error naming the URL (and the model), before anything changes."""
    transport = connect(url, protocol)
    where = transport.url or str(url)
    model = ""
    try:
        for model in dict.fromkeys(models):
            transport.model_config_json(model)
    except TritonNBError as exc:
        if transport is not url:
            transport.close()
        if isinstance(exc, NotFoundError):
            raise NotFoundError(f"replay on {where}: no model '{model}' there ({exc})") from None
        raise type(exc)(f"replay on {where}: {exc}") from None
    return transport


def _restore(appliers: list[KnobApplier]) -> None:
    """Load each tuned model's original config back, the last changed first; every one is tried
    even when one fails (a model the server then lacks would fail again), and the first failure
    is raised after."""
    failure: TritonNBError | None = None
    for applier in reversed(appliers):
        try:
            applier.restore()
        except TritonNBError as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


def mean_over_rounds(measurements: pd.DataFrame) -> pd.DataFrame:
    """One row per config and load level: the figures' mean over the rounds, the errors' sum."""
    if measurements.empty:
        return measurements
    how = {column: ("sum" if column == "errors" else "mean")
           if pd.api.types.is_numeric_dtype(measurements[column]) and not pd.api.types.is_bool_dtype(
               measurements[column]) else "first"
           for column in measurements.columns if column not in ("config", "concurrency", "round")}
    return measurements.groupby(["config", "concurrency"], sort=False, as_index=False).agg(how)


def compare_rankings(sweep: pd.DataFrame, triton: pd.DataFrame, labels: Sequence[str], latency_column: str,
                     recommended: str) -> pd.DataFrame:
    """The replayed configs (``labels``, in the sweep's order) with each side's rank, load level,
    throughput and latency; real Triton's ranks count the replayed configs only."""
    columns = {"rank": "rank", "concurrency": "concurrency", "throughput_infer_per_sec": "throughput_infer_per_sec",
               latency_column: latency_column}
    rows = []
    for label in labels:
        row: dict[str, Any] = {"config": label, "recommended": label == recommended}
        for side, ranking in zip(_SIDES, (sweep, triton), strict=True):
            found = ranking[ranking["config"] == label] if not ranking.empty else ranking
            for column, name in columns.items():
                row[f"{side}_{name}"] = found.iloc[0][column] if not found.empty else math.nan
            if side == "triton":  # a config interrupted before it was measured there met nothing
                row["triton_feasible"] = bool(found.iloc[0]["feasible"]) if not found.empty else False
        rows.append(row)
    return pd.DataFrame(rows)


def pick_vs_best(comparison: pd.DataFrame) -> float | None:
    """Real Triton's throughput of the recommended config over its best throughput in the replay;
    None when the recommended config has no real figure."""
    throughputs = comparison["triton_throughput_infer_per_sec"]
    ours = throughputs[comparison["recommended"]]
    if ours.empty or not math.isfinite(float(ours.iloc[0])) or not throughputs.max() > 0:
        return None
    return float(ours.iloc[0] / throughputs.max())

