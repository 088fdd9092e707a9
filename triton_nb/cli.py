"""The ``triton-nb`` command.

Sub-commands:

* ``demo``     — the main job, headless: data, training, export, serving over every protocol, a
  batching sweep, and a report folder;
* ``generate`` — write synthetic TabFormer transactions as CSV;
* ``train``    — train the fraud model on synthetic data or a real TabFormer CSV;
* ``export``   — write the example as a Triton model repository;
* ``validate`` — check a model repository the way Triton does when loading it;
* ``serve``    — serve a model repository over HTTP, gRPC and metrics, as ``tritonserver`` does;
* ``perf``     — measure a served model's latency and throughput, as ``perf_analyzer`` does;
* ``tune``     — search batching knobs under a latency budget, as Model Analyzer does.

User mistakes end with a one-line message on stderr and exit status 2; no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from triton_nb.errors import TritonNBError

__all__ = ["main"]

DEMO_ROWS = 200_000
# model_repository/ is exported from a small deterministic run so it stays small and reproducible.
EXPORT_ROWS = 20_000
EXPORT_ROUNDS = 40


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {value}")
    return value


def _add_training_options(
    parser: argparse.ArgumentParser, default_rows: int, default_rounds: int | None = None
) -> None:
    parser.add_argument("--rows", type=_positive_int, default=default_rows,
                        help=f"rows to generate, or to read from --csv (default {default_rows:,})")
    parser.add_argument("--csv", type=Path, default=None,
                        help="train on a real TabFormer CSV (card_transaction.v1.csv) instead of synthetic data")
    parser.add_argument("--rounds", type=_positive_int, default=default_rounds,
                        help="maximum boosting rounds (early stopping may end sooner)")
    parser.add_argument("--fraud-rate", type=_fraction, default=0.02, help="fraud rate of generated data")
    parser.add_argument("--seed", type=int, default=0, help="random seed for data, split and training")
    parser.add_argument("--device", default="auto", help="auto (GPU when XGBoost sees one), cpu or cuda")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-nb", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="run the whole worked example headless")
    demo.add_argument("--out", type=Path, default=Path("triton-nb-demo"), help="output folder (report in report/)")
    _add_training_options(demo, DEMO_ROWS)
    demo.add_argument("--measurement-interval", type=_positive_int, default=600, metavar="MS",
                      help="measurement window of the batching sweep (default 600 ms)")
    demo.add_argument("--latency-budget-ms", type=float, default=10.0, help="p99 budget of the sweep (default 10)")

    generate = commands.add_parser("generate", help="write synthetic TabFormer transactions as CSV")
    generate.add_argument("--rows", type=_positive_int, required=True)
    generate.add_argument("--out", type=Path, required=True, help="CSV file to write")
    generate.add_argument("--fraud-rate", type=_fraction, default=0.02)
    generate.add_argument("--seed", type=int, default=0)

    train = commands.add_parser("train", help="train the fraud model and save it")
    train.add_argument("--out", type=Path, required=True,
                       help="folder for xgboost.json/.ubj, label_encoders.pkl/.json and metrics.json")
    _add_training_options(train, DEMO_ROWS)

    export = commands.add_parser("export", help="write the fraud example as a Triton model repository")
    export.add_argument("--out", type=Path, required=True, help="repository folder to write")
    export.add_argument("--from-model", type=Path, default=None,
                        help="a folder written by 'triton-nb train' (default: train a small model first)")
    _add_training_options(export, EXPORT_ROWS, default_rounds=EXPORT_ROUNDS)
    export.add_argument("--model-backend", choices=("fil", "python", "onnxruntime"), default="fil",
                        help="what serves the trees: Triton's FIL backend (default), a Python-backend twin "
                             "running XGBoost, or ONNX Runtime")
    export.add_argument("--max-batch-size", type=_positive_int, default=4096)
    export.add_argument("--max-queue-delay-microseconds", type=int, default=100)
    export.add_argument("--preferred-batch-size", type=_positive_int, nargs="*", default=[])
    export.add_argument("--no-dynamic-batching", action="store_true")
    export.add_argument("--instance-count", type=_positive_int, default=1)
    export.add_argument("--instance-kind", choices=("KIND_CPU", "KIND_GPU", "KIND_AUTO"), default="KIND_CPU")
    export.add_argument("--predict-proba", action="store_true", help="predictions = P(fraud) instead of 0/1")
    export.add_argument("--treeshap-output", action="store_true", help="add per-feature SHAP values")
    export.add_argument("--execution-env", default=None,
                        help="conda-pack archive for the preprocessing model's EXECUTION_ENV_PATH, or 'pack'")
    export.add_argument("--overwrite", action="store_true", help="replace an existing repository")
    export.add_argument("--warmup", action="store_true",
                        help="add model_warmup samples (a TabFormer transaction, a row of zeros) that run on every "
                             "instance before the models are READY")

    validate = commands.add_parser("validate", help="check a model repository as Triton would")
    validate.add_argument("repository", type=Path)

    _add_serve_parser(commands)
    _add_perf_parser(commands)
    _add_tune_parser(commands)
    return parser


def _flag(text: str) -> bool:
    """Triton's boolean flag values: ``--allow-grpc=false``."""
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535 (0 picks a free one), got {value}")
    return value


def _add_serve_parser(commands: argparse._SubParsersAction) -> None:
    """``triton-nb serve``, with tritonserver's flag names where it has them."""
    serve = commands.add_parser("serve", help="serve a model repository over HTTP, gRPC and metrics")
    serve.add_argument("--model-repository", "--model-store", type=Path, required=True, dest="model_repository")
    serve.add_argument("--http-port", type=_port, default=8000)
    serve.add_argument("--grpc-port", type=_port, default=8001)
    serve.add_argument("--metrics-port", type=_port, default=8002)
    serve.add_argument("--http-address", default="127.0.0.1",
                       help="interface for HTTP (default 127.0.0.1; 0.0.0.0 serves beyond this machine)")
    serve.add_argument("--grpc-address", default="127.0.0.1")
    serve.add_argument("--metrics-address", default="127.0.0.1")
    serve.add_argument("--allow-http", type=_flag, default=True, metavar="BOOL")
    serve.add_argument("--allow-grpc", type=_flag, default=True, metavar="BOOL")
    serve.add_argument("--allow-metrics", type=_flag, default=True, metavar="BOOL")
    serve.add_argument("--allow-cpu-metrics", type=_flag, default=True, metavar="BOOL",
                       help="export nv_cpu_utilization and nv_cpu_memory_*_bytes (ignored unless --allow-metrics)")
    serve.add_argument("--metrics-config", action="append", default=[], metavar="KEY=VALUE",
                       help="Triton's metrics settings (repeatable): summary_latencies=true, "
                            "summary_quantiles=0.5:0.05,0.9:0.01,..., counter_latencies=false, "
                            "histogram_latencies=true")
    serve.add_argument("--model-control-mode", choices=("none", "poll", "explicit"), default="none")
    serve.add_argument("--load-model", action="append", default=None, metavar="NAME",
                       help="in explicit mode, a model to load at start ('*' for all); repeatable")
    serve.add_argument("--repository-poll-secs", type=float, default=15.0)
    serve.add_argument("--exit-timeout-secs", type=float, default=30.0,
                       help="on SIGINT/SIGTERM, how long requests in flight have to finish")
    serve.add_argument("--http-read-timeout-secs", type=_positive_float, default=60.0,
                       help="an HTTP request must arrive whole within this, from its first byte, or get 408")
    serve.add_argument("--http-timeout-keep-alive-secs", type=_positive_float, default=75.0,
                       help="an HTTP connection idle this long, with no request under way, is closed")
    serve.add_argument("--max-pending-requests", type=_positive_int, default=65536,
                       help="requests waiting or running at once, server-wide; the excess is refused (503)")
    serve.add_argument("--max-string-bytes", type=_positive_int, default=1024 * 1024,
                       help="the longest element a BYTES (string) input may hold")
    serve.add_argument("--http-restricted-api", action="append", default=[], metavar="GROUPS:KEY=VALUE",
                       help="Triton's restricted APIs: e.g. model-repository,logging:admin-key=secret (repeatable)")
    serve.add_argument("--grpc-restricted-api", "--grpc-restricted-protocol", action="append", default=[],
                       metavar="GROUPS:KEY=VALUE", dest="grpc_restricted_api",
                       help="the same for gRPC; clients send the metadata key triton-grpc-protocol-KEY, as Triton's do")
    serve.add_argument("--max-request-bytes", type=_positive_int, default=64 * 1024 * 1024,
                       help="largest request body (HTTP, after decompression) and gRPC message")
    serve.add_argument("--max-tensor-elements", type=_positive_int, default=16 * 1024 * 1024,
                       help="the most elements one tensor of a network request may declare")
    serve.add_argument("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
                       help="Triton's response cache: local,size=BYTES (the local cache only; repeatable, one "
                            "setting each); models use it with response_cache { enable: true }")
    serve.add_argument("--rate-limit", choices=("off", "execution_count"), default="off",
                       help="Triton's rate limiter: execution_count runs an instance only when the resources its "
                            "instance group's rate_limiter names are free (off: rate_limiter blocks are ignored)")
    serve.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]",
                       help="copies of a rate limiter resource, on one device or all (default: the most any loaded "
                            "instance needs); repeatable")
    serve.add_argument("--python-instances", choices=("thread", "process"), default="thread",
                       help="run Python-model instances as threads of the server (default) or each in a process of "
                            "its own, as Triton does (parallel on several cores; a crash fails one batch)")
    serve.add_argument("--backend-directory", type=Path, default=None, metavar="DIR",
                       help="Python-based backends: a model whose config says backend: \"NAME\" runs DIR/NAME/model.py "
                            "(after registered backends and installed entry points)")


# perf_analyzer's --percentile values (triton_nb.perf.stats.PERCENTILES; not imported here, to keep start-up light).
_PERCENTILES = (50, 90, 95, 99)


def _one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Argument mistakes as one line on stderr (no usage block, which is long for these commands)."""

    def error(message: str):
        parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")

    parser.error = error  # type: ignore[method-assign]
    return parser


def _load_range(whole: bool):
    """perf_analyzer's ``start[:end[:step]]``: the values from start up to end inclusive."""

    def parse(text: str) -> list[float]:
        try:
            numbers = [float(part) for part in text.split(":")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected start[:end[:step]], got {text!r}") from None
        if len(numbers) > 3 or not all(math.isfinite(n) for n in numbers):
            raise argparse.ArgumentTypeError(f"expected start[:end[:step]], got {text!r}")
        start, end, step = (numbers + [numbers[0], 1.0][len(numbers) - 1:])[:3]
        if start <= 0 or end < start or step <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: needs 0 < start <= end and a step > 0")
        values = [start + i * step for i in range(int((end - start) / step + 1e-9) + 1)]
        if whole and any(v != int(v) for v in values):
            raise argparse.ArgumentTypeError(f"{text!r}: concurrency values must be whole numbers")
        return [int(v) for v in values] if whole else values

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _int_list(minimum: int):
    """A knob's comma-separated candidate values: ``0,100,500``."""

    def parse(text: str) -> list[int]:
        values = []
        for part in text.split(","):
            try:
                value = int(part.strip().replace("_", ""))
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
            if value < minimum:
                raise argparse.ArgumentTypeError(f"expected values >= {minimum}, got {value}")
            values.append(value)
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"repeated value in {text!r}")
        return values

    return parse


def _add_target_options(parser: argparse.ArgumentParser, model_help: str, max_trials: int) -> None:
    parser.add_argument("-m", "--model-name", required=True, dest="model", metavar="MODEL", help=model_help)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("-u", "--url", metavar="HOST:PORT",
                       help="a running KServe v2 server (real Triton, or 'triton-nb serve')")
    where.add_argument("--model-repository", type=Path, metavar="DIR",
                       help="start an in-kernel server on this repository (explicit mode, all models loaded) "
                            "for the run, and stop it at the end")
    parser.add_argument("-i", "--protocol", choices=("inprocess", "http", "grpc"), default=None,
                        help="with -u: http (default) or grpc; with --model-repository: inprocess (default, "
                             "direct calls), or http/grpc through the server's own endpoints on free ports")
    parser.add_argument("--input-data", default="random", metavar="random|zero|fraud|FILE.json",
                        help="request data: random or zero tensors shaped by the config, generated fraud "
                             "transactions, or a JSON file in perf_analyzer's format (default random)")
    parser.add_argument("-b", "--batch-size", type=_positive_int, default=1, dest="rows_per_request",
                        help="rows per request (default 1)")
    parser.add_argument("--max-trials", "-r", type=_positive_int, default=max_trials, metavar="N",
                        help=f"measurement windows per level at most, when the figures do not settle "
                             f"(default {max_trials})")


def _add_perf_parser(commands: argparse._SubParsersAction) -> None:
    """``triton-nb perf``, with perf_analyzer's flag names."""
    perf = _one_line_errors(commands.add_parser(
        "perf", help="measure latency and throughput at each load level, as perf_analyzer does",
        description="Measure a served model at each concurrency or request rate, as perf_analyzer does: "
                    "throughput, p50/p90/p95/p99 and average latency, and the server's queue and compute time."))
    _add_target_options(perf, "the model to measure", max_trials=10)
    load = perf.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency-range", type=_load_range(whole=True), metavar="START[:END[:STEP]]",
                      help="requests in flight, e.g. 1:32:2")
    load.add_argument("--request-rate-range", type=_load_range(whole=False), metavar="START[:END[:STEP]]",
                      help="requests per second, e.g. 100:2000:100")
    perf.add_argument("--request-distribution", choices=("constant", "poisson"), default=None,
                      help="arrivals with --request-rate-range (default constant)")
    perf.add_argument("--measurement-interval", "-p", type=_positive_int, default=5000, metavar="MS",
                      help="length of a measurement window in ms (default 5000)")
    perf.add_argument("--measurement-request-count", type=_positive_int, default=None, metavar="N",
                      help="end windows after N completed requests instead of after the interval")
    perf.add_argument("--stability-percentage", "-s", type=_positive_float, default=10.0,
                      help="how close the last three windows must agree, in %% (default 10)")
    perf.add_argument("--percentile", type=int, choices=_PERCENTILES, default=None,
                      help="judge stability on this latency percentile instead of the average")
    perf.add_argument("-f", "--latency-report-file", type=Path, default=None, metavar="FILE.csv",
                      help="write perf_analyzer's CSV report")
    perf.add_argument("--plots", type=Path, default=None, metavar="DIR",
                      help="write throughput_vs_latency.png and latency_breakdown.png into DIR")
    perf.add_argument("--shared-memory", choices=("none", "system", "cuda"), default="none",
                      help="system: inputs and outputs in system shared-memory regions registered with the server "
                           "(http or grpc, same host) instead of in the requests; cuda needs a GPU (default none)")
    perf.add_argument("--output-shared-memory-size", type=_positive_int, default=102400, metavar="BYTES",
                      help="with --shared-memory: bytes per row for an output whose size the config does not give "
                           "(BYTES or variable dims; default 102400)")
    sequences = perf.add_argument_group("sequence models", "perf_analyzer's sequence options, for stateful models "
                                        "(a model with sequence_batching gets sequences of 20 by default)")
    sequences.add_argument("--sequence-length", type=_positive_int, default=None, metavar="N",
                           help="requests per sequence, about (default 20 for a sequence model)")
    sequences.add_argument("--sequence-length-variation", type=_percentage, default=20.0, metavar="PCT",
                           help="how far a sequence's length may be from --sequence-length, in %% (default 20)")
    sequences.add_argument("--sequence-id-range", default=None, metavar="START[:END]",
                           help="the sequence ids to use, END excluded, wrapping (default from 1, unbounded)")
    sequences.add_argument("--num-of-sequences", type=_positive_int, default=4, metavar="N",
                           help="sequences active at once with --request-rate-range (default 4)")
    perf.set_defaults(check=lambda args: _check_perf(perf, args))


def _percentage(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0, got {text!r}")
    return value


def _add_tune_parser(commands: argparse._SubParsersAction) -> None:
    """``triton-nb tune``, with Model Analyzer's and perf_analyzer's flag names."""
    tune = _one_line_errors(commands.add_parser(
        "tune", help="search batching knobs under a latency budget, as Model Analyzer does",
        description="Try each candidate config (knob values applied live to the in-kernel server, or through "
                    "the repository load API of a remote server in explicit mode), measure it over the "
                    "concurrency range, and rank the configs under the latency budget. Knob flags take "
                    "comma-separated candidate values; give at least one. The original config is restored at the "
                    "end. Exit status 1 when no config meets the constraints.",
        epilog="--write-config writes DIR/<tuned model>/config.pbtxt and needs --model-repository; with -u the "
               "recommended config.pbtxt is printed instead, for you to copy into the server's repository."))
    _add_target_options(tune, "the model to send requests to (an ensemble, say)", max_trials=5)
    tune.add_argument("--tuned-model", default=None, metavar="NAME",
                      help="the model whose config is tuned (default: -m; for an ensemble, a composing model)")
    tune.add_argument("--latency-budget-ms", "--latency-budget", type=_positive_float, required=True, metavar="MS",
                      help="the most a config's latency (at --percentile) may be")
    tune.add_argument("--min-throughput", type=_positive_float, default=None, metavar="INFER/S")
    tune.add_argument("--search", "--run-config-search-mode", choices=("brute", "quick"), default="brute",
                      help="brute: every combination (default); quick: hill climbing from the first values")
    tune.add_argument("--objective", choices=("throughput", "latency"), default="throughput")
    tune.add_argument("--percentile", type=int, choices=_PERCENTILES, default=99,
                      help="the latency percentile the budget applies to (default 99)")
    knobs = tune.add_argument_group("knobs (comma-separated candidate values)")
    knobs.add_argument("--max-queue-delay-microseconds", type=_int_list(0), default=None, metavar="V,...")
    knobs.add_argument("--instance-count", type=_int_list(1), default=None, metavar="V,...")
    knobs.add_argument("--max-batch-size", type=_int_list(1), default=None, metavar="V,...")
    knobs.add_argument("--preferred-batch-size", type=_int_list(1), default=None, metavar="V,...",
                       help="each value is one preferred batch size to try")
    tune.add_argument("--concurrency-range", type=_load_range(whole=True), default=list(range(1, 17)),
                      metavar="START[:END[:STEP]]", help="the load levels of each config's sweep (default 1:16:1)")
    tune.add_argument("--measurement-interval", "-p", type=_positive_int, default=2000, metavar="MS",
                      help="length of a measurement window in ms (default 2000)")
    tune.add_argument("--write-config", action="store_true",
                      help="write the recommended config to DIR/<tuned model>/config.pbtxt (--model-repository only)")
    tune.add_argument("--plots", type=Path, default=None, metavar="DIR",
                      help="write throughput_vs_latency.png, and knob_heatmap.png when two knobs vary, into DIR")
    tune.set_defaults(check=lambda args: _check_tune(tune, args))


_KNOB_FLAGS = {"max_queue_delay_microseconds": "--max-queue-delay-microseconds", "instance_count": "--instance-count",
               "max_batch_size": "--max-batch-size", "preferred_batch_size": "--preferred-batch-size"}


def _check_target(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.url is not None and args.protocol == "inprocess":
        parser.error("-i inprocess needs --model-repository; a server by -u URL is reached over http or grpc")
    if args.protocol is None:
        args.protocol = "http" if args.url is not None else "inprocess"


def _check_perf(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    _check_target(parser, args)
    if args.request_distribution is not None and args.request_rate_range is None:
        parser.error("--request-distribution applies to --request-rate-range only")
    if args.shared_memory == "cuda":
        parser.error("--shared-memory cuda is not supported: CUDA shared memory needs a GPU; use system")
    if args.shared_memory == "system" and args.protocol == "inprocess":
        parser.error("--shared-memory system needs -i http or -i grpc (in-process calls copy nothing)")
    if args.sequence_id_range is not None:
        from triton_nb.perf.measure import parse_sequence_id_range  # only then: the perf modules load pandas

        try:
            parse_sequence_id_range(args.sequence_id_range)
        except TritonNBError as exc:
            parser.error(f"--sequence-id-range: {exc}")


def _check_tune(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    _check_target(parser, args)
    if all(getattr(args, name) is None for name in _KNOB_FLAGS):
        parser.error(f"give at least one knob to vary: {', '.join(_KNOB_FLAGS.values())}")
    if args.write_config and args.model_repository is None:
        parser.error("--write-config needs --model-repository (with -u the recommended config.pbtxt is printed; "
                     "copy it into the server's repository)")


def _load_frame(args: argparse.Namespace):
    from triton_nb import fraud

    if args.csv is not None:
        print(f"reading {args.rows:,} rows of {args.csv}")
        return fraud.load_tabformer_csv(args.csv, nrows=args.rows)
    print(f"generating {args.rows:,} synthetic transactions (fraud rate {args.fraud_rate:g}, seed {args.seed})")
    return fraud.generate_transactions(args.rows, seed=args.seed, fraud_rate=args.fraud_rate)


def _train(args: argparse.Namespace, out: Path) -> None:
    from triton_nb import fraud

    frame = _load_frame(args)
    started = time.perf_counter()
    options = {} if args.rounds is None else {"num_boost_round": args.rounds}
    model = fraud.train_fraud_model(frame, device=args.device, seed=args.seed, **options)
    seconds = time.perf_counter() - started
    paths = model.save(out)
    metrics = model.evaluation["value"]
    print(f"trained {model.best_iteration + 1} trees on {len(frame):,} rows in {seconds:.1f} s "
          f"(device {model.params['device']})")
    print(f"validation: AUC-PR {metrics['aucpr']:.4f}  ROC-AUC {metrics['roc_auc']:.4f}  "
          f"precision {metrics['precision']:.3f}  recall {metrics['recall']:.3f}  F1 {metrics['f1']:.3f}")
    for name in ("xgboost_json", "xgboost_ubj", "encoders_pkl", "encoders_json", "metrics"):
        print(f"  wrote {paths[name]}")


def _demo(args: argparse.Namespace) -> None:
    from triton_nb.demo import DemoSettings, run_demo

    print(f"triton-nb demo -> {args.out}/")
    run_demo(DemoSettings(out=args.out, rows=args.rows, rounds=args.rounds, fraud_rate=args.fraud_rate,
                          seed=args.seed, device=args.device, csv=args.csv,
                          measurement_interval_ms=args.measurement_interval,
                          latency_budget_ms=args.latency_budget_ms))


def _export(args: argparse.Namespace) -> None:
    from triton_nb import fraud
    from triton_nb.repository import BatchingOptions, export_fraud_repository

    if args.from_model is not None:
        model = fraud.TrainedFraudModel.load(args.from_model)
    else:
        frame = _load_frame(args)
        # One thread: the same trees on every machine, so the checked-in repository is reproducible.
        model = fraud.train_fraud_model(frame, device=args.device, seed=args.seed, nthread=1,
                                        num_boost_round=args.rounds, progress=False)
        print(f"trained {model.best_iteration + 1} trees (validation AUC-PR "
              f"{model.evaluation.loc['aucpr', 'value']:.4f})")
    batching = BatchingOptions(
        max_batch_size=args.max_batch_size,
        dynamic_batching=not args.no_dynamic_batching,
        max_queue_delay_microseconds=args.max_queue_delay_microseconds,
        preferred_batch_size=tuple(args.preferred_batch_size),
        instance_count=args.instance_count,
        instance_kind=args.instance_kind,
    )
    out = export_fraud_repository(
        model, args.out, model_backend=args.model_backend, batching=batching, predict_proba=args.predict_proba,
        treeshap_output=args.treeshap_output, execution_env=args.execution_env, overwrite=args.overwrite,
        warmup=args.warmup,
    )
    print(f"wrote the model repository {out}/ (preprocessing, fil [{args.model_backend}], ensemble)")


def _validate(args: argparse.Namespace) -> int:
    from triton_nb.repository import validate_repository

    problems = validate_repository(args.repository)
    for problem in problems:
        print(problem)
    errors = sum(problem.severity == "error" for problem in problems)
    print(f"{args.repository}: {errors} error(s), {len(problems) - errors} warning(s)")
    return 1 if errors else 0


def _serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from triton_nb import serve

    if args.load_model and args.model_control_mode != "explicit":
        raise TritonNBError("--load-model needs --model-control-mode=explicit")
    if not (args.allow_http or args.allow_grpc):
        raise TritonNBError("at least one of HTTP and gRPC must be allowed")
    if args.rate_limit_resource and args.rate_limit == "off":
        raise TritonNBError("--rate-limit-resource needs --rate-limit execution_count")
    cache_size_bytes = None
    if args.cache_config:
        from triton_nb.server.cache import parse_cache_config

        cache_size_bytes = parse_cache_config(args.cache_config)  # a refused cache name stops here, before any port
    if args.metrics_config:
        from triton_nb.server.metrics import parse_metrics_config

        parse_metrics_config(args.metrics_config)  # an unknown key stops here too, naming itself
    stopping = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = serve(
        args.model_repository, model_control_mode=args.model_control_mode,
        load_models=args.load_model or "*", repository_poll_secs=args.repository_poll_secs,
        http_port=args.http_port if args.allow_http else None, grpc_port=args.grpc_port if args.allow_grpc else None,
        metrics_port=args.metrics_port if args.allow_metrics else None, http_address=args.http_address,
        grpc_address=args.grpc_address, metrics_address=args.metrics_address,
        max_request_bytes=args.max_request_bytes, grpc_max_message_bytes=args.max_request_bytes,
        max_tensor_elements=args.max_tensor_elements,
        exit_timeout_secs=args.exit_timeout_secs, http_restricted_api=args.http_restricted_api,
        http_read_timeout_secs=args.http_read_timeout_secs,
        http_timeout_keep_alive_secs=args.http_timeout_keep_alive_secs,
        max_pending_requests=args.max_pending_requests, max_string_bytes=args.max_string_bytes,
        grpc_restricted_api=args.grpc_restricted_api, cache_size_bytes=cache_size_bytes,
        rate_limit=args.rate_limit, rate_limit_resources=args.rate_limit_resource,
        backend_directory=args.backend_directory, python_instances=args.python_instances,
        metrics_config=args.metrics_config, cpu_metrics=args.allow_cpu_metrics and args.allow_metrics,
        # tritonserver's explicit mode is network model control; so it is here
        network_model_control=args.model_control_mode == "explicit",
    )
    try:
        # (the server froze what it loaded out of the garbage collector's full passes: freeze_gc)
        _print_model_table(server.repository_index())
        names = {"grpc": "GRPCInferenceService", "http": "HTTPService", "metrics": "Metrics Service"}
        for endpoint, address in server.endpoints.items():
            print(f"Started {names[endpoint]} at {address}", flush=True)
        while not stopping.wait(0.5):
            pass
        print("Stopping: waiting for requests in flight", flush=True)
    finally:
        server.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    print("Stopped", flush=True)
    return 0


def _print_model_table(index: list[dict[str, str]]) -> None:
    """The model table tritonserver prints at start."""
    rows = [(e["name"], e.get("version", "-"), e.get("state", "not loaded") + (
        f": {e['reason']}" if e.get("reason") else "")) for e in index]
    header = ("Model", "Version", "Status")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(3)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    print(line)
    for row in [header, None, *rows]:
        if row is None:
            print(line)
            continue
        print("| " + " | ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)) + " |")
    print(line, flush=True)


@contextlib.contextmanager
def _perf_target(args: argparse.Namespace) -> Iterator[Any]:
    """What ``perf`` and ``tune`` measure: the URL, or an in-kernel server started (and stopped) here;
    a remote server's refusals become one-line errors."""
    from tritonclient.utils import InferenceServerException

    from triton_nb.perf.load import make_target

    server = None
    try:
        if args.url is None:
            from triton_nb import serve

            server = serve(args.model_repository, model_control_mode="explicit", load_models="*",
                           http_port=0 if args.protocol == "http" else None,
                           grpc_port=0 if args.protocol == "grpc" else None)
        target = make_target(args.url or server, args.protocol)
        target.config(args.model)  # an unreachable server or unknown model fails here, before any output
        yield target
    except (InferenceServerException, ConnectionError) as exc:
        raise TritonNBError(f"{args.url or args.model_repository}: {exc}") from None
    finally:
        if server is not None:
            server.stop()


def _cell(value: Any, digits: int = 0) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:.{digits}f}" if math.isfinite(number) else "-"


# (header, column, digits) of perf's summary table; the server's compute is input + infer + output.
_PERF_TABLE = (("Infer/s", "throughput_infer_per_sec", 1), ("p50 usec", "latency_p50_us", 0),
               ("p90 usec", "latency_p90_us", 0), ("p95 usec", "latency_p95_us", 0),
               ("p99 usec", "latency_p99_us", 0), ("Avg usec", "latency_avg_us", 0),
               ("Queue usec", "server_queue_us", 0), ("Compute usec", "server_compute_us", 0))


def _perf_line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True))


def _perf(args: argparse.Namespace) -> int:
    from triton_nb.perf import measure, write_perf_analyzer_csv

    by_rate = args.request_rate_range is not None
    levels = args.request_rate_range if by_rate else args.concurrency_range
    level_header = "Request Rate" if by_rate else "Concurrency"
    headers = [level_header, *(header for header, _, _ in _PERF_TABLE)]
    widths = [max(len(header), 9) for header in headers]
    options = {"input_data": args.input_data, "rows_per_request": args.rows_per_request,
               "measurement_interval_ms": args.measurement_interval,
               "measurement_request_count": args.measurement_request_count,
               "stability_percentage": args.stability_percentage, "max_trials": args.max_trials,
               "percentile": args.percentile, "sequence_length": args.sequence_length,
               "sequence_length_variation": args.sequence_length_variation,
               "sequence_id_range": args.sequence_id_range, "num_of_sequences": args.num_of_sequences,
               "shared_memory": args.shared_memory, "output_shared_memory_size": args.output_shared_memory_size}
    if by_rate:
        options["request_distribution"] = args.request_distribution or "constant"
    frames = []
    interrupted = False
    with _perf_target(args) as target:
        where = args.url or f"an in-kernel server on {args.model_repository}"
        window = (f"{args.measurement_request_count} requests" if args.measurement_request_count
                  else f"{args.measurement_interval} ms")
        print(f"*** Measuring '{args.model}' over {args.protocol} ({where}) ***")
        print(f"  {level_header.lower()}: {', '.join(f'{v:g}' for v in levels)}"
              f"{' /s (' + options['request_distribution'] + ')' if by_rate else ''}; windows of {window}, "
              f"stable within {args.stability_percentage:g}% on "
              f"{'p' + str(args.percentile) if args.percentile else 'average'} latency, at most "
              f"{args.max_trials} trials; {args.rows_per_request} row(s) per request"
              f"{'; tensors in system shared memory' if args.shared_memory == 'system' else ''}")
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


def _tune(args: argparse.Namespace) -> int:
    from triton_nb.perf import tune

    knobs = {name: ([(value,) for value in values] if name == "preferred_batch_size" else values)
             for name in _KNOB_FLAGS if (values := getattr(args, name)) is not None}
    tuned = args.tuned_model or args.model
    latency = f"latency_p{args.percentile}_us"

    def on_point(row: dict[str, Any]) -> None:
        print(f"  {row['config']}  concurrency {int(row['concurrency'])}: "
              f"{_cell(row['throughput_infer_per_sec'], 1)} infer/s, p{args.percentile} "
              f"{_cell(row[latency])} usec", flush=True)

    with _perf_target(args) as target:
        where = args.url or f"an in-kernel server on {args.model_repository}"
        print(f"*** Tuning '{tuned}' (requests to '{args.model}' over {args.protocol}, {where}); "
              f"budget p{args.percentile} <= {args.latency_budget_ms:g} ms, objective {args.objective}, "
              f"{args.search} search ***", flush=True)
        result = tune(target, args.model, knobs, concurrency_range=args.concurrency_range,
                      tuned_model=args.tuned_model, search=args.search, latency_budget_ms=args.latency_budget_ms,
                      min_throughput=args.min_throughput, objective=args.objective,
                      latency_percentile=args.percentile, protocol=args.protocol, input_data=args.input_data,
                      rows_per_request=args.rows_per_request, measurement_interval_ms=args.measurement_interval,
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

        budget_us = args.latency_budget_ms * 1e3
        figures = {"throughput_vs_latency": plot_throughput_vs_latency(
            result.measurements, latency=latency, by="config", latency_budget_us=budget_us)}
        varying = [name for name, values in knobs.items() if len(values) > 1]
        if len(varying) == 2:
            figures["knob_heatmap"] = plot_knob_heatmap(result.measurements, x=varying[0], y=varying[1],
                                                        latency=latency, latency_budget_us=budget_us)
        _save_figures(args.plots, figures)
    if result.interrupted:
        return 130
    return 0 if result.recommended is not None else 1


def _print_ranking(ranking: Any, latency: str, percentile: int) -> None:
    headers = ("Rank", "Config", "Meets", "Concurrency", "Infer/s", f"p{percentile} usec", "p50 usec")
    rows = [(str(row["rank"]), str(row["config"]), "yes" if row["feasible"] else "no", str(int(row["concurrency"])),
             _cell(row["throughput_infer_per_sec"], 1), _cell(row[latency]), _cell(row["latency_p50_us"]))
            for _, row in ranking.iterrows()]
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        print("  ".join(cell.ljust(width) if i == 1 else cell.rjust(width)
                        for i, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip())


def _generate(args: argparse.Namespace) -> None:
    from triton_nb import fraud

    frame = fraud.generate_transactions(args.rows, seed=args.seed, fraud_rate=args.fraud_rate)
    path = fraud.write_tabformer_csv(frame, args.out)
    print(f"wrote {len(frame):,} transactions to {path}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``triton-nb`` console script; returns the exit status."""
    args = _build_parser().parse_args(argv)
    handlers = {"demo": _demo, "generate": _generate, "train": lambda a: _train(a, a.out),
                "export": _export, "validate": _validate, "serve": _serve, "perf": _perf, "tune": _tune}
    if hasattr(args, "check"):
        args.check(args)
    try:
        status = handlers[args.command](args)
    except TritonNBError as exc:
        print(f"triton-nb {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # unwritable output folder, unreadable CSV, full disk
        print(f"triton-nb {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return status or 0


if __name__ == "__main__":  # pragma: no cover - python -m triton_nb.cli
    sys.exit(main())
