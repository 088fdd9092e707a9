"""The ``triton-nb`` command.

Sub-commands:

* ``demo``     — the main job, headless: generate data, train, and write the artefacts;
* ``generate`` — write synthetic TabFormer transactions as CSV;
* ``train``    — train the fraud model on synthetic data or a real TabFormer CSV;
* ``export``   — write the example as a Triton model repository;
* ``validate`` — check a model repository the way Triton does when loading it;
* ``serve``    — serve a model repository over HTTP, gRPC and metrics, as ``tritonserver`` does.

User mistakes end with a one-line message on stderr and exit status 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

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
    demo.add_argument("--out", type=Path, default=Path("triton-nb-demo"), help="report folder")
    _add_training_options(demo, DEMO_ROWS)

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

    validate = commands.add_parser("validate", help="check a model repository as Triton would")
    validate.add_argument("repository", type=Path)

    _add_serve_parser(commands)
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
    serve.add_argument("--model-control-mode", choices=("none", "poll", "explicit"), default="none")
    serve.add_argument("--load-model", action="append", default=None, metavar="NAME",
                       help="in explicit mode, a model to load at start ('*' for all); repeatable")
    serve.add_argument("--repository-poll-secs", type=float, default=15.0)
    serve.add_argument("--exit-timeout-secs", type=float, default=30.0,
                       help="on SIGINT/SIGTERM, how long requests in flight have to finish")
    serve.add_argument("--max-request-bytes", type=_positive_int, default=64 * 1024 * 1024,
                       help="largest request body (HTTP, after decompression) and gRPC message")


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
    out: Path = args.out
    from triton_nb import fraud
    from triton_nb.repository import export_fraud_repository, validate_repository

    print(f"triton-nb demo -> {out}/")
    _train(args, out / "model")
    repository = export_fraud_repository(
        fraud.TrainedFraudModel.load(out / "model"), out / "model_repository", overwrite=True
    )
    problems = validate_repository(repository)
    print(f"exported the Triton model repository {repository}/ ({len(problems)} validation problem(s))")
    _serve_in_process(repository, fraud.TrainedFraudModel.load(out / "model"), args.seed)
    print("demo finished")


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


def _serve_in_process(repository: Path, model, seed: int) -> None:
    """Serve the exported repository in this process and check it answers like XGBoost."""
    import numpy as np

    from triton_nb import fraud, serve

    holdout = fraud.generate_transactions(2_000, seed=seed + 1)
    with serve(repository) as server:
        client = server.client()
        started = time.perf_counter()
        predictions = client.infer("ensemble", holdout).as_numpy("predictions")[:, 0]
        seconds = time.perf_counter() - started
    agree = float(np.mean(predictions == model.predict(holdout)))
    print(f"served {len(holdout):,} transactions through the in-process server's ensemble in {seconds * 1e3:.0f} ms; "
          f"{agree:.1%} agree with XGBoost, {int(predictions.sum())} flagged as fraud")


def _serve(args: argparse.Namespace) -> int:
    import gc
    import signal
    import threading

    from triton_nb import serve

    if args.load_model and args.model_control_mode != "explicit":
        raise TritonNBError("--load-model needs --model-control-mode=explicit")
    if not (args.allow_http or args.allow_grpc):
        raise TritonNBError("at least one of HTTP and gRPC must be allowed")
    stopping = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = serve(
        args.model_repository, model_control_mode=args.model_control_mode,
        load_models=args.load_model or "*", repository_poll_secs=args.repository_poll_secs,
        http_port=args.http_port if args.allow_http else None, grpc_port=args.grpc_port if args.allow_grpc else None,
        metrics_port=args.metrics_port if args.allow_metrics else None, http_address=args.http_address,
        grpc_address=args.grpc_address, metrics_address=args.metrics_address,
        max_request_bytes=args.max_request_bytes, grpc_max_message_bytes=args.max_request_bytes,
        exit_timeout_secs=args.exit_timeout_secs,
    )
    try:
        # Everything loaded so far lives as long as the server: keep it out of the cyclic garbage
        # collector's scans, whose full passes over a large heap are the worst latency outliers.
        gc.collect()
        gc.freeze()
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


def _generate(args: argparse.Namespace) -> None:
    from triton_nb import fraud

    frame = fraud.generate_transactions(args.rows, seed=args.seed, fraud_rate=args.fraud_rate)
    path = fraud.write_tabformer_csv(frame, args.out)
    print(f"wrote {len(frame):,} transactions to {path}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``triton-nb`` console script; returns the exit status."""
    args = _build_parser().parse_args(argv)
    handlers = {"demo": _demo, "generate": _generate, "train": lambda a: _train(a, a.out),
                "export": _export, "validate": _validate, "serve": _serve}
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
