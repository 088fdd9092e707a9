"""The ``triton-nb`` command.

Sub-commands:

* ``demo``     — the main job, headless: generate data, train, and write the artefacts;
* ``generate`` — write synthetic TabFormer transactions as CSV;
* ``train``    — train the fraud model on synthetic data or a real TabFormer CSV;
* ``export``   — write the example as a Triton model repository;
* ``validate`` — check a model repository the way Triton does when loading it.

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
    return parser


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


def _generate(args: argparse.Namespace) -> None:
    from triton_nb import fraud

    frame = fraud.generate_transactions(args.rows, seed=args.seed, fraud_rate=args.fraud_rate)
    path = fraud.write_tabformer_csv(frame, args.out)
    print(f"wrote {len(frame):,} transactions to {path}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``triton-nb`` console script; returns the exit status."""
    args = _build_parser().parse_args(argv)
    handlers = {"demo": _demo, "generate": _generate, "train": lambda a: _train(a, a.out),
                "export": _export, "validate": _validate}
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
