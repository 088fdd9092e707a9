"""``triton-nb demo``: the whole worked example, headless, in one command.

Generate TabFormer-style transactions, train the fraud model, export the Triton model repository,
serve it in this process with HTTP and gRPC on free loopback ports, check that in-process calls,
``tritonclient.http`` and ``tritonclient.grpc`` all answer as XGBoost does, sweep the dynamic batching
knobs of the ensemble's models against the same models with dynamic batching off, measure the
payload's trade-off over HTTP (binary tensors, JSON tensors, binary with gzip, at 1 and 16 in
flight: throughput, p50/p99 and bytes per request), and write a report folder: CSV tables, PNG
plots and a markdown summary, with the line ``dynamic batching gain: N.Nx`` (the recommended
config's throughput within the latency budget over the no-batching config's, measured in the same
run) and a payload section.
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
    """What the demo does; the defaults finish in about a minute and a quarter on two cores (68 s measured)."""

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
    # the payload section: each payload at each level over HTTP, in short windows (about 10 s in all)
    payload_concurrency: tuple[int, ...] = (1, 16)
    payload_interval_ms: int = 300
    notes: list[str] = field(default_factory=list)


def _step(message: str) -> float:
    print(f"\n== {message}", flush=True)
    return time.perf_counter()


def _agreement(predictions: np.ndarray, expected: np.ndarray) -> float:
    return float(np.mean(np.asarray(predictions).ravel() == np.asarray(expected).ravel()))


def _network_predictions(server: Any, frame: Any) -> dict[str, np.ndarray]:
    """The ensemble's predictions for ``frame`` through the server's HTTP and gRPC endpoints
    (tritonclient's clients, behind the transports)."""
    from triton_nb.fraud import request_tensors
    from triton_nb.transport import connect

    tensors = request_tensors(frame)
    answers = {}
    for protocol in ("http", "grpc"):
        with connect(server, protocol) as transport:
            answers[protocol] = transport.infer("ensemble", tensors, outputs=["predictions"])["predictions"].ravel()
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

        step = _step("payload: binary and JSON tensors, gzip (HTTP)")
        payloads = _measure_payloads(server, settings)
        print(_payload_table(payloads))
        print(f"measured in {time.perf_counter() - step:.1f} s")
    summary["payload"] = payloads.drop(columns=["batch_sizes"]).to_dict("records")
    summary["sweep"] = {"recommended": tuned.recommended, "configs": len(tuned.ranking),
                        "points": len(tuned.measurements), "batching_gain": tuned.batching_gain}
    summary["report"] = _write_report(report, tuned, summary, settings, payloads)
    summary["seconds"] = time.perf_counter() - started
    _print_table(tuned, settings)
    print(_gain_line(tuned))
    print(f"\nreport: {report}/ ({', '.join(sorted(p.name for p in report.iterdir()))})")
    print(f"demo finished in {summary['seconds']:.0f} s")
    return summary


#: The payloads the demo compares: the fields of measure()'s ``wire`` group for each.
PAYLOADS: dict[str, dict[str, str]] = {
    "binary": {},
    "json": {"input_tensor_format": "json", "output_tensor_format": "json"},
    "binary + gzip": {"request_compression": "gzip", "response_compression": "gzip"},
}


def _measure_payloads(server: Any, settings: DemoSettings) -> Any:
    """The fraud ensemble over HTTP with each of :data:`PAYLOADS`, at each payload level."""
    import pandas as pd

    from triton_nb import perf

    interval = min(settings.payload_interval_ms, settings.measurement_interval_ms)
    frames = []
    for name, options in PAYLOADS.items():
        frame = perf.measure(server, "ensemble", concurrency_range=list(settings.payload_concurrency),
                             protocol="http", input_data="fraud", measurement_interval_ms=interval,
                             warmup_ms=interval, max_trials=3, wire=perf.Wire(**options))
        frames.append(frame.assign(payload=name))
    return pd.concat(frames, ignore_index=True)


def _payload_table(payloads: Any) -> str:
    """The payload measurements as a markdown table (also what the demo prints)."""
    table = payloads[["payload", "concurrency", "throughput_infer_per_sec", "latency_p50_us", "latency_p99_us",
                      "request_bytes", "response_bytes", "server_compute_input_us", "server_compute_output_us"]]
    table = table.assign(latency_p50_us=table["latency_p50_us"] / 1e3, latency_p99_us=table["latency_p99_us"] / 1e3)
    table.columns = ["payload", "in flight", "infer/s", "p50 ms", "p99 ms", "request bytes", "response bytes",
                     "server compute input µs", "server compute output µs"]
    return _markdown_table(table.round({"infer/s": 0, "p50 ms": 3, "p99 ms": 3, "request bytes": 0,
                                        "response bytes": 0, "server compute input µs": 1,
                                        "server compute output µs": 1}))


def _write_report(report: Path, tuned: Any, summary: dict[str, Any], settings: DemoSettings,
                  payloads: Any) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from triton_nb import perf

    budget_ms = settings.latency_budget_ms
    files = {}
    tuned.measurements.drop(columns=["batch_sizes"]).to_csv(report / "sweep_measurements.csv", index=False)
    tuned.ranking.to_csv(report / "sweep_ranking.csv", index=False)
    files["measurements"] = "sweep_measurements.csv"
    figures = {
        "throughput_vs_latency.png": perf.plot_throughput_vs_latency(tuned.measurements, latency_budget_ms=budget_ms),
        "knob_heatmap.png": perf.plot_knob_heatmap(tuned.measurements, latency_budget_ms=budget_ms),
    }
    best = tuned.ranking.iloc[0]["config"]
    best_points = tuned.measurements[tuned.measurements["config"] == best]
    figures["latency_breakdown.png"] = perf.plot_latency_breakdown(best_points)
    figures["batch_sizes.png"] = perf.plot_batch_size_histogram(best_points)
    figures["payload.png"] = perf.plot_payload_comparison(payloads)
    payloads.drop(columns=["batch_sizes"]).to_csv(report / "payload_measurements.csv", index=False)
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
        "## Payload: binary and JSON tensors, gzip", "",
        f"The ensemble over HTTP with fraud transactions, one row per request, at "
        f"{' and '.join(map(str, settings.payload_concurrency))} in flight, after the sweep (the original config): "
        "binary tensors (the binary tensor data extension), JSON tensors both ways, and binary with gzip both "
        "ways (each request body compressed once before the load; answers decompressed by the client). Bytes "
        "are the mean per request and per response on the wire, headers included; server compute input/output "
        "are the server's statistics.", "",
        _payload_table(payloads), "",
        "![payload](payload.png)", "",
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
