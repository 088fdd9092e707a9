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
import os
import sys
from collections.abc import Sequence

from triton_nb.cli._args import environment_set
from triton_nb.cli.perf import add_perf_parser, add_tune_parser, perf_command, tune_command
from triton_nb.cli.repository import add_repository_parsers, export_command, validate_command
from triton_nb.cli.serve import add_serve_parser, sagemaker_start, serve_archive, serve_command
from triton_nb.cli.training import add_training_parsers, demo_command, generate_command, train_command
from triton_nb.errors import TritonNBError

__all__ = ["main"]


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _build_parser() -> argparse.ArgumentParser:
    from triton_nb._version import __version__

    parser = argparse.ArgumentParser(
        prog="triton-nb",
        description="Train, export, serve and tune tabular models the way NVIDIA Triton does.",
        epilog="Run 'triton-nb COMMAND --help' for a command's options. A mistake ends with one line on stderr "
               "and exit status 2.")
    parser.add_argument("--version", action="version", version=f"triton-nb {__version__}")
    parser.add_argument("--log-level", type=str.upper, choices=_LOG_LEVELS, default="WARNING",
                        help="how much of triton_nb's own log to print on stderr (default WARNING); "
                             "serve's --log-* flags take over for the server")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_training_parsers(commands)
    add_repository_parsers(commands)
    add_serve_parser(commands)
    add_perf_parser(commands)
    add_tune_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``triton-nb`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _build_parser().parse_args(argv)
    if args.command != "serve":  # serve's --log-* flags set the server's logging as tritonserver's do
        import logging

        logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("triton_nb").setLevel(args.log_level)
    exported: dict[str, str] = {}  # what the SageMaker start script exports, for this command's run
    if args.command == "serve":
        at = argv.index("serve") + 1
        try:
            multi_model = args.allow_sagemaker and os.environ.get("SAGEMAKER_MULTI_MODEL") == "true"
            given = serve_archive(argv[at:], multi_model)
            environ = dict(os.environ)
            derived = sagemaker_start(given, environ) if args.allow_sagemaker else []
            exported = {name: value for name, value in environ.items() if os.environ.get(name) != value}
        except TritonNBError as exc:
            print(f"triton-nb serve: error: {exc}", file=sys.stderr)
            return 2
        args = _build_parser().parse_args([*argv[:at], *derived, *given])
    handlers = {"demo": demo_command, "generate": generate_command, "train": lambda a: train_command(a, a.out),
                "export": export_command, "validate": validate_command, "serve": serve_command, "perf": perf_command,
                "tune": tune_command}
    if hasattr(args, "check"):
        args.check(args)
    try:
        with environment_set(exported):
            status = handlers[args.command](args)
    except TritonNBError as exc:
        print(f"triton-nb {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # unwritable output folder, unreadable CSV, full disk
        print(f"triton-nb {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return status or 0
