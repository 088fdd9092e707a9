"""``triton-nb perf`` and ``triton-nb tune`` once their arguments are parsed: the command line
(:mod:`triton_nb.cli`, which defines the flags without loading these modules) hands over here to
measure, print the tables and write the reports."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from triton_nb.errors import InvalidArgumentError

__all__ = ["REPLAY_START", "payload_options", "run_perf", "run_tune", "wire_of_args"]

#: ``tune --replay-url start``: start the nvidia-pytriton wheel's tritonserver for the replay
REPLAY_START = "start"

_WIRE_FLAGS = ("input_tensor_format", "output_tensor_format", "request_compression", "response_compression",
               "grpc_compression_algorithm")


def wire_of_args(args: argparse.Namespace) -> Any:
    """The parsed wire flags (the fields of :class:`~triton_nb.perf.options.Wire`, flag for field)."""
    from triton_nb.perf.options import Wire

    return Wire(**{name: getattr(args, name) for name in _WIRE_FLAGS})


def payload_options(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed payload flags as :func:`~triton_nb.perf.measure`'s keywords."""
    return {"rows_per_request": args.rows_per_request, "rows_per_request_weights": args.batch_size_weights,
            "wire": wire_of_args(args)}


def _rows_text(args: argparse.Namespace) -> str:
    if not isinstance(args.rows_per_request, list):
        return str(args.rows_per_request)
    weights = args.batch_size_weights or [1.0] * len(args.rows_per_request)
    return "{" + ", ".join(f"{s}: {w:g}" for s, w in zip(args.rows_per_request, weights, strict=True)) + "}"


def _wire_text(args: argparse.Namespace) -> str:
    changed = [f"{name.replace('_', ' ')} {getattr(args, name)}" for name in _WIRE_FLAGS
               if getattr(args, name) not in ("binary", "none")]
    return "; " + ", ".join(changed) if changed else ""


def _cell(value: Any, digits: int = 0) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:.{digits}f}" if math.isfinite(number) else "-"


# (header, column, digits) of perf's summary table; the server's compute is input + infer + output;
# bytes are the mean per request and response on the wire ("-" in-process).
_PERF_TABLE = (("Infer/s", "throughput_infer_per_sec", 1), ("p50 usec", "latency_p50_us", 0),
               ("p90 usec", "latency_p90_us", 0), ("p95 usec", "latency_p95_us", 0),
               ("p99 usec", "latency_p99_us", 0), ("Avg usec", "latency_avg_us", 0),
               ("Queue usec", "server_queue_us", 0), ("Compute usec", "server_compute_us", 0),
               ("Req bytes", "request_bytes", 0), ("Resp bytes", "response_bytes", 0))


def _perf_line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True))


def run_perf(args: argparse.Namespace, perf_target: Callable[[argparse.Namespace], Any]) -> int:
    """``triton-nb perf`` once its arguments are parsed: ``perf_target(args)`` is a context manager
    giving the transport to measure through. Returns the exit status."""
    from triton_nb.perf import Sequences, SharedMemory, measure, write_perf_analyzer_csv

    by_rate = args.request_rate_range is not None
    levels = args.request_rate_range if by_rate else args.concurrency_range
    level_header = "Request Rate" if by_rate else "Concurrency"
    headers = [level_header, *(header for header, _, _ in _PERF_TABLE)]
    widths = [max(len(header), 9) for header in headers]
    options = {"input_data": args.input_data, "rows_per_request": args.rows_per_request,
               "measurement_interval_ms": args.measurement_interval,
               "measurement_request_count": args.measurement_request_count,
               "stability_percentage": args.stability_percentage, "max_trials": args.max_trials,
               "latency_percentile": args.percentile,
               "sequences": Sequences(sequence_length=args.sequence_length,
                                      sequence_length_variation=args.sequence_length_variation,
                                      sequence_id_range=args.sequence_id_range,
                                      num_of_sequences=args.num_of_sequences),
               "shared_memory": SharedMemory(kind=args.shared_memory,
                                             output_size_bytes=args.output_shared_memory_size),
               **payload_options(args)}
    if by_rate:
        options["request_distribution"] = args.request_distribution or "constant"
    frames = []
    interrupted = False
    with perf_target(args) as target:
        where = args.url or f"an in-kernel server on {args.model_repository}"
        window = (f"{args.measurement_request_count} requests" if args.measurement_request_count
                  else f"{args.measurement_interval} ms")
        print(f"*** Measuring '{args.model}' over {args.protocol} ({where}) ***")
        print(f"  {level_header.lower()}: {', '.join(f'{v:g}' for v in levels)}"
              f"{' /s (' + options['request_distribution'] + ')' if by_rate else ''}; windows of {window}, "
              f"stable within {args.stability_percentage:g}% on "
              f"{'p' + str(args.percentile) if args.percentile else 'average'} latency, at most "
              f"{args.max_trials} trials; {_rows_text(args)} row(s) per request"
              f"{'; tensors in system shared memory' if args.shared_memory == 'system' else ''}{_wire_text(args)}")
        print(_perf_line(headers, widths), flush=True)
        try:
            for level in levels:
                load = {"request_rate_range": [level]} if by_rate else {"concurrency_range": [level]}
                frame = measure(target, args.model, protocol=args.protocol, **load, **options)
                frames.append(frame)
                row = frame.iloc[0]
                compute = sum(float(row[c]) for c in ("server_compute_input_us", "server_compute_infer_us",
                                                      "server_compute_output_us"))
                values = {**row.to_dict(), "server_compute_us": compute}
                cells = [f"{level:g}",
                         *(_cell(values[column], digits) for _, column, digits in _PERF_TABLE)]
                notes = [] if row["stable"] else ["unstable"]
                if row["errors"]:
                    notes.append(f"{int(row['errors'])} error(s)")
                print(_perf_line(cells, widths) + ("  " + ", ".join(notes) if notes else ""), flush=True)
                if row["errors"]:
                    print(f"  first error: {row['first_error']}", flush=True)
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: keeping the levels measured so far", flush=True)
    if not frames:
        return 130 if interrupted else 0
    import pandas as pd

    results = pd.concat(frames, ignore_index=True)
    if args.latency_report_file is not None:
        print(f"wrote {write_perf_analyzer_csv(results, args.latency_report_file)}")
    if args.plots is not None:
        from triton_nb.perf import plot_latency_breakdown, plot_throughput_vs_latency

        _save_figures(args.plots, {"throughput_vs_latency": plot_throughput_vs_latency(results),
                                   "latency_breakdown": plot_latency_breakdown(results)})
    return 130 if interrupted else 0


def _save_figures(folder: Path, figures: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, figure in figures.items():
        path = folder / f"{name}.png"
        figure.savefig(path, dpi=100)
        print(f"wrote {path}")


def run_tune(args: argparse.Namespace, perf_target: Callable[[argparse.Namespace], Any],
             knobs: dict[str, list[Any]]) -> int:
    """``triton-nb tune`` once its arguments are parsed (see :func:`run_perf`), over ``knobs``."""
    from triton_nb.perf import tune

    tuned = args.tuned_model or args.model
    latency = f"latency_p{args.percentile}_us"

    def on_point(row: dict[str, Any]) -> None:
        round_text = f"round {row['round']}: " if "round" in row else ""
        print(f"  {round_text}{row['config']}  concurrency {int(row['concurrency'])}: "
              f"{_cell(row['throughput_infer_per_sec'], 1)} infer/s, p{args.percentile} "
              f"{_cell(row[latency])} usec", flush=True)

    replay_protocol = args.protocol if args.protocol in ("http", "grpc") else "http"
    if args.replay_url == REPLAY_START:
        from triton_nb.tritonserver import tritonserver_unavailable_reason

        # a replay that cannot start fails now, not after a sweep of minutes
        if args.model_repository is None:
            raise InvalidArgumentError(f"--replay-url {REPLAY_START} starts tritonserver over --model-repository, "
                                       "which is not given")
        reason = tritonserver_unavailable_reason()
        if reason is not None:
            raise InvalidArgumentError(f"--replay-url {REPLAY_START}: {reason}")
    elif args.replay_url is not None:
        from triton_nb.perf.replay import connect_checked

        # a server that cannot take the replay fails now, not after a sweep of minutes
        connect_checked(args.replay_url, replay_protocol, list(dict.fromkeys((args.model, tuned)))).close()
    with perf_target(args) as target:
        where = args.url or f"an in-kernel server on {args.model_repository}"
        print(f"*** Tuning '{tuned}' (requests to '{args.model}' over {args.protocol}, {where}); "
              f"budget p{args.percentile} <= {args.latency_budget_ms:g} ms, objective {args.objective}, "
              f"{args.search} search ***", flush=True)
        result = tune(target, args.model, knobs, concurrency_range=args.concurrency_range,
                      tuned_model=args.tuned_model, search=args.search, latency_budget_ms=args.latency_budget_ms,
                      min_throughput=args.min_throughput, objective=args.objective,
                      latency_percentile=args.percentile, protocol=args.protocol, input_data=args.input_data,
                      measurement_interval_ms=args.measurement_interval, rows_per_request=args.rows_per_request,
                      rows_per_request_weights=args.batch_size_weights,
                      wire=wire_of_args(args),
                      max_trials=args.max_trials, progress=False, on_point=on_point)
    if result.interrupted:
        print("interrupted: ranking the configs measured so far")
    if not result.ranking.empty:
        _print_ranking(result.ranking, latency, args.percentile)
    for note in result.notes:
        print(note)
    if result.recommended is not None:
        shown = ", ".join(f"{name}={list(value) if isinstance(value, tuple) else value}"
                          for name, value in result.recommended.items())
        print(f"recommended for '{tuned}': {shown}")
        if args.write_config:
            print(f"wrote {result.write_config(args.model_repository / tuned / 'config.pbtxt')}")
        elif args.url is not None:
            from triton_nb.repository.config import config_from_json, format_config

            print("recommended config.pbtxt:")
            print(format_config(config_from_json(result.recommended_config, source="recommended config")))
    if args.plots is not None and not result.measurements.empty:
        from triton_nb.perf import plot_knob_heatmap, plot_throughput_vs_latency

        budget_ms = args.latency_budget_ms
        figures = {"throughput_vs_latency": plot_throughput_vs_latency(
            result.measurements, latency=latency, by="config", latency_budget_ms=budget_ms)}
        varying = [name for name, values in knobs.items() if len(values) > 1]
        if len(varying) == 2:
            figures["knob_heatmap"] = plot_knob_heatmap(result.measurements, x=varying[0], y=varying[1],
                                                        latency=latency, latency_budget_ms=budget_ms)
        _save_figures(args.plots, figures)
    if result.interrupted:
        return 130
    if result.recommended is None:
        return 1
    if args.replay_url is not None:
        return _replay(args, result, replay_protocol, on_point)
    return 0


def _replay(args: argparse.Namespace, result: Any, protocol: str, on_point: Callable[[dict[str, Any]], None]) -> int:
    """``tune --replay-url``: the sweep's best configs on real Triton, both rankings side by side."""
    from triton_nb.perf import replay

    started = args.replay_url == REPLAY_START
    where = "a tritonserver started over the Python twin of the repository" if started else args.replay_url
    print(f"*** Replaying the top {args.replay_top} config(s) on {where} over {protocol}, "
          f"{args.replay_rounds} round(s), as the sweep measured them ***", flush=True)
    outcome = replay(result, None if started else args.replay_url, top=args.replay_top, rounds=args.replay_rounds,
                     protocol=protocol, progress=False, on_point=on_point,
                     model_repository=args.model_repository if started else None)
    _print_comparison(outcome.comparison, args.percentile)
    for note in outcome.notes:
        print(note)
    print(outcome.summary())
    return 130 if outcome.interrupted else 0


def _print_comparison(comparison: Any, percentile: int) -> None:
    headers = ("Config", "Sweep rank", "Sweep infer/s", f"Sweep p{percentile} usec", "Triton rank",
               "Triton infer/s", f"Triton p{percentile} usec", "Meets")
    latency = f"latency_p{percentile}_us"
    rows = [(str(row["config"]) + (" (our pick)" if row["recommended"] else ""), _cell(row["sweep_rank"]),
             _cell(row["sweep_throughput_infer_per_sec"], 1), _cell(row[f"sweep_{latency}"]),
             _cell(row["triton_rank"]), _cell(row["triton_throughput_infer_per_sec"], 1),
             _cell(row[f"triton_{latency}"]), "yes" if row["triton_feasible"] else "no")
            for _, row in comparison.iterrows()]
    _print_table(headers, rows)


def _print_ranking(ranking: Any, latency: str, percentile: int) -> None:
    headers = ("Rank", "Config", "Meets", "Concurrency", "Infer/s", f"p{percentile} usec", "p50 usec")
    rows = [(str(row["rank"]), str(row["config"]), "yes" if row["feasible"] else "no", str(int(row["concurrency"])),
             _cell(row["throughput_infer_per_sec"], 1), _cell(row[latency]), _cell(row["latency_p50_us"]))
            for _, row in ranking.iterrows()]
    _print_table(headers, rows, left=1)


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 0) -> None:
    """Columns as wide as their widest cell, the config (column ``left``) left-aligned."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        print("  ".join(cell.ljust(width) if i == left else cell.rjust(width)
                        for i, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip())
