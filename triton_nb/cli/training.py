"""``triton-nb demo``, ``generate`` and ``train``: the worked example's data and model."""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from triton_nb.cli._args import fraction_0_1, one_line_errors, positive_float, positive_int

DEMO_ROWS = 200_000


def add_training_options(
    parser: argparse.ArgumentParser, default_rows: int, default_rounds: int | None = None
) -> None:
    parser.add_argument("--rows", type=positive_int, default=default_rows, metavar="N",
                        help=f"rows to generate, or to read from --csv (default {default_rows:,})")
    parser.add_argument("--csv", type=Path, default=None, metavar="FILE",
                        help="train on a real TabFormer CSV (card_transaction.v1.csv) instead of synthetic data")
    parser.add_argument("--rounds", type=positive_int, default=default_rounds, metavar="N",
                        help="maximum boosting rounds (early stopping may end sooner)")
    parser.add_argument("--fraud-rate", type=fraction_0_1, default=0.02, metavar="RATE",
                        help="share of fraudulent transactions generated, 0..1 (default 0.02)")
    parser.add_argument("--seed", type=int, default=0, metavar="N",
                        help="random seed for data, split and training (default 0)")
    parser.add_argument("--device", type=_device, default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                        help="where XGBoost trains: auto (a GPU when XGBoost sees one, else the CPU; default), "
                             "cpu, or cuda (cuda:N for the N-th GPU)")


def _device(text: str) -> str:
    """``--device``: the values :func:`triton_nb.fraud.train_fraud_model` takes, checked here so that a
    misspelt one ends in one line before any data is generated."""
    if text in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", text):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}")


def check_device(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--device cuda`` where XGBoost cannot train on a GPU: one line now, not after the data is made."""
    if args.device.startswith("cuda"):
        from triton_nb._optional import xgboost_cuda_available  # imports XGBoost: only when a GPU is asked for

        if not xgboost_cuda_available():
            parser.error(f"--device {args.device}: no usable CUDA device (none is visible, or this XGBoost build "
                         f"has no CUDA support); use --device auto or --device cpu")


def add_training_parsers(commands: argparse._SubParsersAction) -> None:
    """``triton-nb demo``, ``generate`` and ``train``."""
    demo = one_line_errors(commands.add_parser("demo", help="run the whole worked example headless"))
    demo.add_argument("--out", type=Path, default=Path("triton-nb-demo"), metavar="DIR",
                      help="output folder (report in report/; default triton-nb-demo)")
    add_training_options(demo, DEMO_ROWS)
    demo.add_argument("--measurement-interval", "-p", type=positive_int, default=600, metavar="MS",
                      help="measurement window of the batching sweep (default 600 ms)")
    demo.add_argument("--latency-budget-ms", type=positive_float, default=10.0, metavar="MS",
                      help="p99 budget of the sweep (default 10)")
    demo.set_defaults(check=lambda args: check_device(demo, args))

    generate = one_line_errors(commands.add_parser("generate", help="write synthetic TabFormer transactions as CSV"))
    generate.add_argument("--rows", type=positive_int, required=True, metavar="N",
                          help="how many transactions to write")
    generate.add_argument("--out", type=Path, required=True, metavar="FILE", help="CSV file to write")
    generate.add_argument("--fraud-rate", type=fraction_0_1, default=0.02, metavar="RATE",
                          help="share of fraudulent transactions, 0..1 (default 0.02)")
    generate.add_argument("--seed", type=int, default=0, metavar="N",
                          help="random seed: the same seed writes the same rows (default 0)")

    train = one_line_errors(commands.add_parser("train", help="train the fraud model and save it"))
    train.add_argument("--out", type=Path, required=True, metavar="DIR",
                       help="folder for xgboost.json/.ubj, label_encoders.pkl/.json and metrics.json")
    add_training_options(train, DEMO_ROWS)
    train.set_defaults(check=lambda args: check_device(train, args))


def load_frame(args: argparse.Namespace):
    from triton_nb import fraud

    if args.csv is not None:
        print(f"reading {args.rows:,} rows of {args.csv}")
        return fraud.load_tabformer_csv(args.csv, nrows=args.rows)
    print(f"generating {args.rows:,} synthetic transactions (fraud rate {args.fraud_rate:g}, seed {args.seed})")
    return fraud.generate_transactions(args.rows, seed=args.seed, fraud_rate=args.fraud_rate)


def train_command(args: argparse.Namespace, out: Path) -> None:
    from triton_nb import fraud

    frame = load_frame(args)
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


def demo_command(args: argparse.Namespace) -> None:
    from triton_nb.demo import DemoSettings, run_demo

    print(f"triton-nb demo -> {args.out}/")
    run_demo(DemoSettings(out=args.out, rows=args.rows, rounds=args.rounds, fraud_rate=args.fraud_rate,
                          seed=args.seed, device=args.device, csv=args.csv,
                          measurement_interval_ms=args.measurement_interval,
                          latency_budget_ms=args.latency_budget_ms))


def generate_command(args: argparse.Namespace) -> None:
    from triton_nb import fraud

    frame = fraud.generate_transactions(args.rows, seed=args.seed, fraud_rate=args.fraud_rate)
    path = fraud.write_tabformer_csv(frame, args.out)
    print(f"wrote {len(frame):,} transactions to {path}")
