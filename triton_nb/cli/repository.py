"""``triton-nb export`` and ``validate``: write the example as a Triton model repository, and
check a repository as Triton would."""

from __future__ import annotations

import argparse
from pathlib import Path

from triton_nb.cli._args import (
    CommandHelpFormatter,
    SpacedListAlias,
    comma_list,
    deprecated_spelling,
    one_line_errors,
    positive_int,
    whole_number,
)
from triton_nb.cli.training import add_training_options, check_device, load_frame

# model_repository/ is exported from a small deterministic run so it stays small and reproducible.
EXPORT_ROWS = 20_000
EXPORT_ROUNDS = 40


def _check_export(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.deprecated_out is not None:
        deprecated_spelling(parser, "--out", "--model-repository")
        args.model_repository = args.deprecated_out
    if args.from_model is None:  # --device is read only when a model is trained here
        check_device(parser, args)


def _check_validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.deprecated_repository is not None:
        deprecated_spelling(parser, f"'{parser.prog} DIR'", f"'{parser.prog} --model-repository DIR'")
        args.model_repository = args.deprecated_repository


def add_repository_parsers(commands: argparse._SubParsersAction) -> None:
    """``triton-nb export`` and ``validate``."""
    export = one_line_errors(commands.add_parser(
        "export", help="write the fraud example as a Triton model repository", formatter_class=CommandHelpFormatter))
    target = export.add_mutually_exclusive_group(required=True)
    target.add_argument("--model-repository", type=Path, metavar="DIR", help="the repository folder to write")
    # the earlier spelling, deprecated: read for a release, with a line naming --model-repository
    target.add_argument("--out", type=Path, dest="deprecated_out", help=argparse.SUPPRESS)
    export.add_argument("--from-model", type=Path, default=None, metavar="DIR",
                        help="a folder written by 'triton-nb train' (default: train a small model first)")
    add_training_options(export, EXPORT_ROWS, default_rounds=EXPORT_ROUNDS)
    export.add_argument("--model-backend", choices=("fil", "python", "onnxruntime"), default="fil",
                        help="what serves the trees: Triton's FIL backend (default), a Python-backend twin "
                             "running XGBoost, or ONNX Runtime")
    export.add_argument("--max-batch-size", type=positive_int, default=4096, metavar="N",
                        help="the models' max_batch_size (default 4096)")
    export.add_argument("--max-queue-delay-microseconds", type=whole_number, default=100, metavar="US",
                        help="how long the dynamic batcher waits to fill a batch (default 100)")
    export.add_argument("--preferred-batch-size", type=comma_list(int, minimum=1), action=SpacedListAlias,
                        default=[], metavar="N,...", help="the dynamic batcher's preferred batch sizes, "
                                                          "comma-separated (default none)")
    export.add_argument("--no-dynamic-batching", action="store_true", help="batch only what a request brings")
    export.add_argument("--instance-count", type=positive_int, default=1, metavar="N",
                        help="model instances of the tree model (default 1)")
    export.add_argument("--instance-kind", choices=("KIND_CPU", "KIND_GPU", "KIND_AUTO"), default="KIND_CPU",
                        help="where the tree model's instances run (default KIND_CPU)")
    export.add_argument("--predict-proba", action="store_true", help="predictions = P(fraud) instead of 0/1")
    export.add_argument("--treeshap-output", action="store_true", help="add per-feature SHAP values")
    export.add_argument("--execution-env", default=None, metavar="FILE|pack",
                        help="conda-pack archive for the preprocessing model's EXECUTION_ENV_PATH, or 'pack'")
    export.add_argument("--overwrite", action="store_true", help="replace an existing repository")
    export.add_argument("--warmup", action="store_true",
                        help="add model_warmup samples (a TabFormer transaction, a row of zeros) that run on every "
                             "instance before the models are READY")
    export.set_defaults(check=lambda args: _check_export(export, args))

    validate = one_line_errors(commands.add_parser("validate", help="check a model repository as Triton would"))
    target = validate.add_mutually_exclusive_group(required=True)
    target.add_argument("--model-repository", type=Path, metavar="DIR", help="the repository folder to check")
    # the earlier spelling, deprecated: a positional folder, read for a release with a line naming the flag
    target.add_argument("deprecated_repository", type=Path, nargs="?", metavar="DIR", help=argparse.SUPPRESS)
    validate.set_defaults(check=lambda args: _check_validate(validate, args))


def export_command(args: argparse.Namespace) -> None:
    from triton_nb import fraud
    from triton_nb.repository import BatchingOptions, export_fraud_repository

    if args.from_model is not None:
        model = fraud.TrainedFraudModel.load(args.from_model)
    else:
        frame = load_frame(args)
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
        model, args.model_repository, model_backend=args.model_backend, batching=batching,
        predict_proba=args.predict_proba, treeshap_output=args.treeshap_output, execution_env=args.execution_env,
        overwrite=args.overwrite, warmup=args.warmup,
    )
    print(f"wrote the model repository {out}/ (preprocessing, fil [{args.model_backend}], ensemble)")


def validate_command(args: argparse.Namespace) -> int:
    from triton_nb.repository import validate_repository

    problems = validate_repository(args.model_repository)
    for problem in problems:
        print(problem)
    errors = sum(problem.severity == "error" for problem in problems)
    print(f"{args.model_repository}: {errors} error(s), {len(problems) - errors} warning(s)")
    return 1 if errors else 0
