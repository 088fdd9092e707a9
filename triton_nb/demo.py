"""``triton-nb demo``: the whole worked example, headless, in one command.

Generate TabFormer-style transactions, train the fraud model, export the Triton model repository,
serve it in this process with HTTP and gRPC on free loopback ports, check that in-process calls,
``tritonclient.http`` and ``tritonclient.grpc`` all answer as XGBoost does, sweep the dynamic batching
knobs of the ensemble's models against the same models with dynamic batching off, and write a
report folder: CSV tables, PNG plots and a markdown summary, with the line
``dynamic batching gain: N.Nx`` (the recommended config's throughput within the latency budget over
the no-batching config's, measured in the same run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DemoSettings", "run_demo"]


@dataclass
class DemoSettings:
    """What the demo does; the defaults finish in about three minutes on two cores."""

    out: Path = Path("triton-nb-demo")
    rows: int = 200_000
    rounds: int | None = None
    fraud_rate: float = 0.02
    seed: int = 0
    device: str = "auto"
    csv: Path | None = None
    check_rows: int = 2_000
    network_rows: int = 256
    sweep_delays_us: tuple[int, ...] = (0, 100, 1000)
    sweep_instances: tuple[int, ...] = (1, 2)
    sweep_concurrency: tuple[int, ...] = (1, 16, 64)
    # the ensemble's composing models, tuned together (each candidate's knobs apply to both)
    sweep_models: tuple[str, ...] = ("preprocessing", "fil")
    latency_budget_ms: float = 10.0
    measurement_interval_ms: int = 600
    notes: list[str] = field(default_factory=list)


def _step(message: str) -> float:
    print(f"\n== {message}", flush=True)
    return time.perf_counter()


def _agreement(predictions: np.ndarray, expected: np.ndarray) -> float:
    return float(np.mean(np.asarray(predictions).ravel() == np.asarray(expected).ravel()))


def _network_predictions(server: Any, frame: Any) -> dict[str, np.ndarray]:
    """The ensemble's predictions for ``frame`` through tritonclient over HTTP and over gRPC."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from triton_nb.fraud import request_tensors

    tensors = request_tensors(frame)
    answers = {}
    for name, module, url in (("http", httpclient, server.endpoints["http"]),
                              ("grpc", grpcclient, server.endpoints["grpc"])):
        client = module.InferenceServerClient(url)
        inputs = []
        for tensor, array in tensors.items():
            item = module.InferInput(tensor, list(array.shape), "FP32" if array.dtype == np.float32 else "BYTES")
            item.set_data_from_numpy(array)
            inputs.append(item)
        answers[name] = client.infer("ensemble", inputs).as_numpy("predictions").ravel()
        client.close()
    return answers


def run_demo(settings: DemoSettings) -> dict[str, Any]:
    """Run the demo; returns the summary it printed and wrote (report paths included)."""
    from triton_nb import fraud, perf, serve
    from triton_nb.repository import export_fraud_repository, validate_repository

    out = Path(settings.out)
    report = out / "report"
    report.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    started = time.perf_counter()

    step = _step("data and training")
    if settings.csv is not None:
        frame = fraud.load_tabformer_csv(settings.csv, nrows=settings.rows)
    else:
        frame = fraud.generate_transactions(settings.rows, seed=settings.seed, fraud_rate=settings.fraud_rate)
    options = {} if settings.rounds is None else {"num_boost_round": settings.rounds}
    model = fraud.train_fraud_model(frame, device=settings.device, seed=settings.seed, **options)
    paths = model.save(out / "model")
    metrics = model.evaluation["value"]
    summary["training"] = {"rows": len(frame), "trees": model.best_iteration + 1, "aucpr": float(metrics["aucpr"]),
                           "roc_auc": float(metrics["roc_auc"]), "seconds": time.perf_counter() - step}
    print(f"trained {model.best_iteration + 1} trees on {len(frame):,} rows: AUC-PR {metrics['aucpr']:.3f}, "
          f"ROC-AUC {metrics['roc_auc']:.3f}; wrote {paths['xgboost_json']}")

    _step("Triton model repository")
    repository = export_fraud_repository(fraud.TrainedFraudModel.load(out / "model"), out / "model_repository",
                                         overwrite=True)
    problems = validate_repository(repository)
    print(f"exported {repository}/ (preprocessing, fil, ensemble): {len(problems)} validation problem(s)")

    step = _step("serving: in-process, HTTP and gRPC")
    holdout = fraud.generate_transactions(settings.check_rows, seed=settings.seed + 1)
    expected = model.predict(holdout)
    with serve(repository, http_port=0, grpc_port=0) as server:
        in_process = server.client().infer("ensemble", holdout).as_numpy("predictions")
        network = _network_predictions(server, holdout.iloc[:settings.network_rows])
        agreement = {"in-process": _agreement(in_process, expected)}
        agreement.update({name: _agreement(values, expected[:settings.network_rows])
                          for name, values in network.items()})
        summary["serving"] = {"endpoints": dict(server.endpoints), "agreement": agreement}
        print(f"endpoints {server.endpoints}")
        for name, share in agreement.items():
            rows = settings.check_rows if name == "in-process" else settings.network_rows
            print(f"  {name:>10}: {rows:,} transactions, {share:.1%} agree with XGBoost")

        _step("dynamic batching sweep of the ensemble's models (in-process load)")
        # Measure what a warm server serves: the tree model's compiled engine ready (it builds in
        # the background after the load), then a first load that absorbs one-time costs.
        for name in settings.sweep_models:
            if not server.wait_warm(name, timeout_s=600):
                print(f"note: {name} is still warming up; the sweep measures it as it is")
        perf.measure(server, "ensemble", concurrency_range=[16], input_data="fraud",
                     measurement_interval_ms=settings.measurement_interval_ms, max_trials=2)
        tuned = perf.tune(
            server, "ensemble",
            {"max_queue_delay_microseconds": list(settings.sweep_delays_us),
             "instance_count": list(settings.sweep_instances)},
            tuned_model=list(settings.sweep_models), concurrency_range=list(settings.sweep_concurrency),
            input_data="fraud", latency_budget_ms=settings.latency_budget_ms,
            measurement_interval_ms=settings.measurement_interval_ms, max_trials=4, progress=True,
            no_batching_baseline=True)
        print(f"config restored: {server.model_config('fil').dynamic_batching.max_queue_delay_microseconds} us delay")
    summary["sweep"] = {"recommended": tuned.recommended, "configs": len(tuned.ranking),
                        "points": len(tuned.measurements), "batching_gain": tuned.batching_gain}
    summary["report"] = _write_report(report, tuned, summary, settings)
    summary["seconds"] = time.perf_counter() - started
    _print_table(tuned, settings)
    print(_gain_line(tuned))
    print(f"\nreport: {report}/ ({', '.join(sorted(p.name for p in report.iterdir()))})")
    print(f"demo finished in {summary['seconds']:.0f} s")
    return summary


def _write_report(report: Path, tuned: Any, summary: dict[str, Any], settings: DemoSettings) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from triton_nb import perf

    budget_us = settings.latency_budget_ms * 1e3
    files = {}
    tuned.measurements.drop(columns=["batch_sizes"]).to_csv(report / "sweep_measurements.csv", index=False)
    tuned.ranking.to_csv(report / "sweep_ranking.csv", index=False)
    files["measurements"] = "sweep_measurements.csv"
    figures = {
        "throughput_vs_latency.png": perf.plot_throughput_vs_latency(tuned.measurements, latency_budget_us=budget_us),
        "knob_heatmap.png": perf.plot_knob_heatmap(tuned.measurements, latency_budget_us=budget_us),
    }
    best = tuned.ranking.iloc[0]["config"]
    best_points = tuned.measurements[tuned.measurements["config"] == best]
    figures["latency_breakdown.png"] = perf.plot_latency_breakdown(best_points)
    figures["batch_sizes.png"] = perf.plot_batch_size_histogram(best_points)
    for name, figure in figures.items():
        figure.savefig(report / name, dpi=110)
        files[name] = name
    perf.write_perf_analyzer_csv(best_points, report / "perf_analyzer_best_config.csv")
    training, serving = summary["training"], summary["serving"]
    lines = [
        "# triton-nb demo", "",
        f"Trained {training['trees']} trees on {training['rows']:,} transactions: AUC-PR {training['aucpr']:.3f}, "
        f"ROC-AUC {training['roc_auc']:.3f}.", "",
        "## Serving", "",
        "| path | agreement with XGBoost |", "|---|---|",
        *[f"| {name} | {share:.1%} |" for name, share in serving["agreement"].items()], "",
        f"## Dynamic batching sweep ({', '.join(settings.sweep_models)}; ensemble measured in-process)", "",
        f"Latency budget: p99 <= {settings.latency_budget_ms:g} ms. Recommended: `{tuned.recommended}`. "
        f"Concurrency {', '.join(map(str, settings.sweep_concurrency))}, after the tree model's compiled "
        "engine was ready.", "",
        _gain_line(tuned), "",
        _markdown_table(tuned.ranking.drop(columns=["score"]).round(1)), "",
        "![throughput vs latency](throughput_vs_latency.png)", "![knob heatmap](knob_heatmap.png)",
        "![latency breakdown](latency_breakdown.png)", "![batch sizes](batch_sizes.png)", "",
    ]
    (report / "summary.md").write_text("\n".join(lines))
    files["summary"] = "summary.md"
    return files


def _gain_line(tuned: Any) -> str:
    """``dynamic batching gain: N.Nx``, or why there is none."""
    if tuned.batching_gain is None:
        why = "; ".join(tuned.notes) or "no baseline measured"
        return f"dynamic batching gain: not measured ({why})"
    return (f"dynamic batching gain: {tuned.batching_gain:.1f}x (recommended config's throughput within the "
            "latency budget over the 'dynamic batching off' config's)")


def _markdown_table(frame: Any) -> str:
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "---|" * len(frame.columns)
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def _print_table(tuned: Any, settings: DemoSettings) -> None:
    print(f"\nsweep ranking (p99 budget {settings.latency_budget_ms:g} ms):")
    columns = ["rank", "config", "feasible", "concurrency", "throughput_infer_per_sec", "latency_p99_us"]
    print(tuned.ranking[columns].round(1).to_string(index=False))
