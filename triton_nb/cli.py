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
import os
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triton_nb.errors import ModelLoadFailedError, TritonNBError
from triton_nb.transport import PROTOCOLS

if TYPE_CHECKING:
    import dataclasses

    from triton_nb.server.settings import ServerSettings

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

    demo = commands.add_parser("demo", help="run the whole worked example headless")
    demo.add_argument("--out", type=Path, default=Path("triton-nb-demo"), help="output folder (report in report/)")
    _add_training_options(demo, DEMO_ROWS)
    demo.add_argument("--measurement-interval", type=_positive_int, default=600, metavar="MS",
                      help="measurement window of the batching sweep (default 600 ms)")
    demo.add_argument("--latency-budget-ms", type=float, default=10.0, help="p99 budget of the sweep (default 10)")

    generate = commands.add_parser("generate", help="write synthetic TabFormer transactions as CSV")
    generate.add_argument("--rows", type=_positive_int, required=True, help="how many transactions to write")
    generate.add_argument("--out", type=Path, required=True, help="CSV file to write")
    generate.add_argument("--fraud-rate", type=_fraction, default=0.02,
                          help="share of fraudulent transactions, 0..1 (default 0.02)")
    generate.add_argument("--seed", type=int, default=0, help="random seed: the same seed writes the same rows "
                                                                "(default 0)")

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
    """A boolean flag's value as tritonserver reads it: true, on or 1; false, off or 0 (any case)."""
    lowered = text.lower()
    if lowered in ("true", "on", "1"):
        return True
    if lowered in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _verbosity(text: str) -> int:
    """``--log-verbose``: a level >= 0, or true (1) and false (0), as tritonserver reads it."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a verbosity level (0, 1...) or true/false, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a verbosity level >= 0, got {value}")
    return value


def _whole(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535 (0 picks a free one), got {value}")
    return value


def _serve_flag_help(field: dataclasses.Field[Any]) -> str:
    """A setting's flag help: the first sentence of its documentation, and the default."""
    import re

    from triton_nb.server.settings import plain_text

    text = plain_text(field.metadata["help"])
    first = re.split(r"(?<=\.)\s+(?=[A-Z])", text)[0].rstrip(".")  # "e.g. x" does not end the sentence
    default = field.metadata.get("cli_default", field.default)
    if isinstance(default, tuple):
        default = ", ".join(default) if default else None
    elif isinstance(default, bool):
        default = str(default).lower()  # as --allow-http=false takes it
    shown = "" if default in (None, "") else f" (default {default})"
    if field.metadata.get("repeat"):
        first += "; repeatable"
    if field.metadata.get("cli"):
        first += f"; {field.metadata['cli']}"
    return (first + shown).replace("%", "%%")


# The headings of triton-nb serve --help, in order: tritonserver's groups, then triton-nb's own flags,
# the modes this version does not have, and the flags accepted with no effect.
_SERVE_GROUPS = ("Server", "Model repository", "Logging", "HTTP", "gRPC", "Metrics", "Backend", "Response cache",
                 "Rate limiter", "triton-nb", "SageMaker and Vertex AI", "Accepted, no effect here")
_NOT_AVAILABLE = "is not available in this version of triton-nb serve"
_NO_SSL = "they are read only with --grpc-use-ssl=true, which this version does not offer"
_NO_GPU = "the server here manages no GPU memory (models use a GPU through their own libraries)"
_GRPC_TRANSPORT = "the gRPC relay keeps gRPC's own keepalive and connection settings"
_NO_TRACING = "request tracing is not implemented here"
# tritonserver's flags that have no meaning here: flag -> (how its value reads, repeatable, why). Each one
# given is accepted, and said, in one line at start, to have no effect (_serve_no_effect_lines).
_INERT_SERVE_FLAGS: dict[str, tuple[Callable[[str], Any], bool, str]] = {
    "--model-config-name": (str, False, "only a model's config.pbtxt is read here, not configs/<name>.pbtxt"),
    "--model-namespacing": (_flag, False, "one model repository is served, so no two models share a name"),
    "--enable-peer-access": (_flag, False, _NO_GPU),
    "--reuse-http-port": (_flag, False, "each server binds its HTTP port alone"),
    "--http-header-forward-pattern": (str, False, "HTTP headers are not forwarded to models as request parameters"),
    "--http-thread-count": (_positive_int, False, "HTTP is served by one event loop, not a pool of threads"),
    "--reuse-grpc-port": (_flag, False, "each server binds its gRPC port alone"),
    "--grpc-header-forward-pattern": (str, False, "gRPC metadata is not forwarded to models as request parameters"),
    "--grpc-infer-allocation-pool-size": (_whole, False, "request and response objects are not pooled here"),
    "--grpc-server-cert": (str, False, _NO_SSL),
    "--grpc-server-key": (str, False, _NO_SSL),
    "--grpc-root-cert": (str, False, _NO_SSL),
    "--grpc-infer-response-compression-level": (str, False, "gRPC responses are sent uncompressed here"),
    "--grpc-keepalive-time": (_integer, False, _GRPC_TRANSPORT),
    "--grpc-keepalive-timeout": (_integer, False, _GRPC_TRANSPORT),
    "--grpc-keepalive-permit-without-calls": (_flag, False, _GRPC_TRANSPORT),
    "--grpc-http2-max-pings-without-data": (_integer, False, _GRPC_TRANSPORT),
    "--grpc-http2-min-recv-ping-interval-without-data": (_integer, False, _GRPC_TRANSPORT),
    "--grpc-http2-max-ping-strikes": (_integer, False, _GRPC_TRANSPORT),
    "--grpc-max-connection-age": (_integer, False, _GRPC_TRANSPORT),
    "--grpc-max-connection-age-grace": (_integer, False, _GRPC_TRANSPORT),
    "--sagemaker-safe-port-range": (str, False, "no port range is reserved for SageMaker's front end here"),
    "--sagemaker-thread-count": (_positive_int, False, "the SageMaker routes are served by one event loop, "
                                                      "not a pool of threads"),
    "--vertex-ai-port": (_port, False, f"Vertex AI mode {_NOT_AVAILABLE}"),
    "--vertex-ai-thread-count": (_positive_int, False, f"Vertex AI mode {_NOT_AVAILABLE}"),
    "--vertex-ai-default-model": (str, False, f"Vertex AI mode {_NOT_AVAILABLE}"),
    "--allow-gpu-metrics": (_flag, False, "no GPU metrics (nv_gpu_*) are collected here"),
    "--metrics-interval-ms": (_number, False, "metrics are read when /metrics is scraped, not on an interval"),
    "--trace-config": (str, True, _NO_TRACING),
    "--repoagent-directory": (str, False, "repository agents are not supported here"),
    "--cache-directory": (str, False, "the local response cache is built in; no cache library is loaded"),
    "--pinned-memory-pool-byte-size": (_whole, False, _NO_GPU),
    "--cuda-memory-pool-byte-size": (str, True, _NO_GPU),
    "--cuda-virtual-address-size": (str, True, _NO_GPU),
    "--min-supported-compute-capability": (_number, False, _NO_GPU),
    "--buffer-manager-thread-count": (_whole, False, "tensors are copied on the thread that handles the request"),
    "--host-policy": (str, True, "host policies (NUMA node, CPU cores) are not applied here"),
    "--model-load-gpu-limit": (str, True, _NO_GPU),
    "--trace-file": (str, False, _NO_TRACING),
    "--trace-level": (str, True, _NO_TRACING),
    "--trace-rate": (_integer, False, _NO_TRACING),
    "--trace-count": (_integer, False, _NO_TRACING),
    "--trace-log-frequency": (_integer, False, _NO_TRACING),
}
# Boolean flags whose true asks for what this version does not have: false is accepted (it is what
# happens here), true is refused in one line.
_REFUSED_WHEN_TRUE = {
    "--allow-vertex-ai": ("SageMaker and Vertex AI", f"Vertex AI mode {_NOT_AVAILABLE}"),
    "--grpc-use-ssl": ("gRPC", f"gRPC over SSL {_NOT_AVAILABLE}"),
    "--grpc-use-ssl-mutual": ("gRPC", f"gRPC over mutual SSL {_NOT_AVAILABLE}"),
}


def _inert_dest(flag: str) -> str:
    return "inert_" + flag[2:].replace("-", "_")


def _add_serve_parser(commands: argparse._SubParsersAction) -> None:
    """``triton-nb serve``, with tritonserver's flags and spellings, grouped as tritonserver's --help
    groups them: a flag per server setting that has one (:class:`triton_nb.ServerSettings` declares
    it), the command's own, and tritonserver's flags that have no effect here."""
    import dataclasses

    from triton_nb.server.settings import ServerSettings

    # how a flag's text reads: by the field's "parse" where it has one, else by the field's type
    readers = {"port": _port, "count": _positive_int, "whole": _whole, "positive": _positive_float,
               "verbosity": _verbosity, "bool": _flag, "float": float, "Path": Path}
    serve = _one_line_errors(commands.add_parser(
        "serve", help="serve a model repository over HTTP, gRPC and metrics",
        description="Serve a model repository as tritonserver does. Every tritonserver flag is taken, in its "
                    "spellings (--flag=value or --flag value); a flag that has no effect here says so in one "
                    "line at start."))
    groups = {title: serve.add_argument_group(title) for title in _SERVE_GROUPS}
    repository = groups["Model repository"]
    repository.add_argument("--model-repository", "--model-store", type=Path, action="append", required=True,
                            dest="model_repository", metavar="DIR",
                            help="the model repository folder (one; tritonserver takes several)")
    for field in dataclasses.fields(ServerSettings):
        meta = field.metadata
        if meta["flag"] is None:
            continue
        group = groups[meta.get("group", "triton-nb")]
        kind = field.type.split(" | ")[0]  # the annotation's text: settings.py postpones annotations
        options: dict[str, Any] = {"dest": field.name, "help": _serve_flag_help(field)}
        if meta.get("switch"):  # a flag without a value, as tritonserver's --disable-auto-complete-config
            group.add_argument(meta["flag"], action="store_true", default=field.default, **options)
            continue
        if "choices" in meta:
            options["choices"] = meta["choices"]
        else:
            options["type"] = readers.get(meta.get("parse", kind), str)
        if meta.get("repeat"):
            # no default list: argparse would append to it; an absent flag leaves the setting's default
            options.update(action="append", default=None)
        else:
            options["default"] = meta.get("cli_default", field.default)
        options["metavar"] = meta.get("metavar", "BOOL" if kind == "bool" else None)
        group.add_argument(meta["flag"], *meta.get("aliases", ()), **options)
    repository.add_argument("--strict-model-config", type=_flag, default=None, metavar="BOOL",
                            help="deprecated in tritonserver: true is --disable-auto-complete-config")
    for endpoint, title in (("http", "HTTP"), ("grpc", "gRPC"), ("metrics", "Metrics")):
        groups[title].add_argument(f"--allow-{endpoint}", type=_flag, default=True, metavar="BOOL",
                                   help=f"listen for {title} (default true)")
    cache = groups["Response cache"]
    cache.add_argument("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
                       help="Triton's response cache: local,size=BYTES (the local cache only; repeatable, one "
                            "setting each); models use it with response_cache { enable: true }")
    cache.add_argument("--response-cache-byte-size", type=_whole, default=None, metavar="BYTES",
                       help="deprecated in tritonserver: --cache-config local,size=BYTES")
    for flag, (group_title, why) in _REFUSED_WHEN_TRUE.items():
        groups[group_title].add_argument(flag, type=_flag, default=False, metavar="BOOL",
                                         help=f"false only: {why}")
    for flag, (reader, repeat, why) in _INERT_SERVE_FLAGS.items():
        group = groups["SageMaker and Vertex AI" if flag.startswith(("--sagemaker", "--vertex")) else
                       "Accepted, no effect here"]
        # absent unless given (SUPPRESS), so that only a given flag is reported
        group.add_argument(flag, type=reader, action="append" if repeat else "store", default=argparse.SUPPRESS,
                           dest=_inert_dest(flag), metavar="BOOL" if reader is _flag else "VALUE",
                           help=f"no effect: {why}".replace("%", "%%"))


def _serve_settings(args: argparse.Namespace) -> ServerSettings:
    """The :class:`~triton_nb.ServerSettings` of a parsed ``triton-nb serve`` command line; flag
    mistakes are named by their flags, before anything starts."""
    import dataclasses

    from triton_nb.server.settings import ServerSettings

    if len(args.model_repository) > 1:
        raise TritonNBError(f"--model-repository: one repository is served here, got {len(args.model_repository)}: "
                            + ", ".join(map(str, args.model_repository)))
    for flag, (_, why) in _REFUSED_WHEN_TRUE.items():
        if getattr(args, flag[2:].replace("-", "_")):
            raise TritonNBError(f"{flag}=true: {why}; leave it out or give {flag}=false")
    if args.load_models and args.model_control_mode != "explicit":
        raise TritonNBError("--load-model needs --model-control-mode=explicit")
    if not (args.allow_http or args.allow_grpc or args.allow_sagemaker):
        raise TritonNBError("at least one of HTTP, gRPC and SageMaker must be allowed")
    if args.rate_limit_resources and args.rate_limit == "off":
        raise TritonNBError("--rate-limit-resource needs --rate-limit execution_count")
    if args.response_cache_byte_size is not None and args.cache_config:
        raise TritonNBError("--response-cache-byte-size and --cache-config both given: give one (tritonserver's rule)")
    options = {field.name: getattr(args, field.name) for field in dataclasses.fields(ServerSettings)
               if field.metadata["flag"] is not None and getattr(args, field.name) is not None}
    for endpoint in ("http", "grpc", "metrics"):
        if not getattr(args, f"allow_{endpoint}"):
            options[f"{endpoint}_port"] = None
    options["cpu_metrics"] = args.cpu_metrics and args.allow_metrics
    options["grpc_max_message_bytes"] = args.max_request_bytes
    # tritonserver's explicit mode is network model control; so it is here
    options["network_model_control"] = args.model_control_mode == "explicit"
    if args.strict_model_config:  # deprecated spelling: strict = no auto-complete; the switch wins over false
        options["disable_auto_complete_config"] = True
    if args.response_cache_byte_size is not None:  # deprecated spelling of --cache-config local,size=N
        options["cache_size_bytes"] = args.response_cache_byte_size
    if args.cache_config:
        from triton_nb.server.cache import parse_cache_config

        # a refused cache name stops here, before any port opens
        options["cache_size_bytes"] = parse_cache_config(args.cache_config)
    return ServerSettings(**options)  # a bad value (an unknown --metrics-config key, ...) names itself here


def _serve_no_effect_lines(args: argparse.Namespace) -> list[str]:
    """One line for each flag given that has no effect here, naming it and why."""
    lines = [f"{flag} has no effect here: {why}" for flag, (_, _, why) in _INERT_SERVE_FLAGS.items()
             if hasattr(args, _inert_dest(flag))]
    if args.strict_model_config is not None:
        lines.append("--strict-model-config is deprecated (as in tritonserver): use --disable-auto-complete-config")
    if args.response_cache_byte_size is not None:
        lines.append("--response-cache-byte-size is deprecated (as in tritonserver): use --cache-config local,size=N")
    return lines


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
    parser.add_argument("-i", "--protocol", choices=PROTOCOLS, default=None,
                        help="with -u: http (default) or grpc; with --model-repository: inprocess (default, "
                             "direct calls), or http/grpc through the server's own endpoints on free ports")
    parser.add_argument("--input-data", default="random", metavar="random|zero|fraud|FILE.json",
                        help="request data: random or zero tensors shaped by the config, generated fraud "
                             "transactions, or a JSON file in perf_analyzer's format (default random)")
    parser.add_argument("-b", "--batch-size", type=_rows_argument, default=1, dest="rows_per_request",
                        metavar="ROWS[,ROWS...]", help="rows per request (default 1), or a mix of sizes: 1,8,64")
    parser.add_argument("--max-trials", "-r", type=_positive_int, default=max_trials, metavar="N",
                        help=f"measurement windows per level at most, when the figures do not settle "
                             f"(default {max_trials})")
    _add_payload_options(parser)


def _add_payload_options(parser: argparse.ArgumentParser) -> None:
    """The payload flags of ``perf`` and ``tune`` (the fields of :class:`triton_nb.perf.Wire`)."""
    from triton_nb.perf.options import COMPRESSIONS, TENSOR_FORMATS  # the one list of each (no plots loaded)

    group = parser.add_argument_group("payload", "how requests travel (client-side; the server is not changed)")
    group.add_argument("--input-tensor-format", choices=TENSOR_FORMATS, default="binary",
                       help="HTTP: request tensors as binary data (default) or JSON")
    group.add_argument("--output-tensor-format", choices=TENSOR_FORMATS, default="binary",
                       help="HTTP: ask for binary (default) or JSON output tensors")
    group.add_argument("--request-compression", choices=COMPRESSIONS, default="none",
                       help="HTTP: compress request bodies (once per distinct request, before the load)")
    group.add_argument("--response-compression", choices=COMPRESSIONS, default="none",
                       help="HTTP: ask for compressed answers (Accept-Encoding); the client decompresses them")
    group.add_argument("--grpc-compression-algorithm", choices=COMPRESSIONS, default="none",
                       help="gRPC: compress request messages")
    group.add_argument("--batch-size-weights", type=_number_list(float), default=None, metavar="W,...",
                       help="with -b S1,S2,...: the share of requests of each size (default equal)")


def _rows_argument(text: str) -> int | list[int]:
    """``-b``: one number of rows per request, or a comma-separated mix of sizes (``1,8,64``)."""
    values = _number_list(int)(text)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"rows per request must be >= 1, got {text!r}")
    return values[0] if len(values) == 1 else values


def _number_list(kind: type) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            values = [kind(part.strip()) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
        if not all(math.isfinite(v) for v in values):
            raise argparse.ArgumentTypeError(f"expected finite numbers, got {text!r}")
        return values

    return parse


def _check_payload(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Mistakes the flags' choices cannot catch, as one usage error naming the flag."""
    formats = [name for name in ("input_tensor_format", "output_tensor_format") if getattr(args, name) != "binary"]
    if formats and args.protocol not in ("http", "sagemaker"):
        parser.error(f"--{formats[0].replace('_', '-')} applies to -i http or -i sagemaker, not {args.protocol}")
    http_only = [name for name in ("request_compression", "response_compression") if getattr(args, name) != "none"]
    if http_only and args.protocol != "http":
        parser.error(f"--{http_only[0].replace('_', '-')} applies to -i http, not {args.protocol}")
    if args.grpc_compression_algorithm != "none" and args.protocol != "grpc":
        parser.error(f"--grpc-compression-algorithm applies to -i grpc, not {args.protocol}")
    sizes = args.rows_per_request if isinstance(args.rows_per_request, list) else [args.rows_per_request]
    if args.batch_size_weights is not None and len(args.batch_size_weights) != len(sizes):
        parser.error(f"--batch-size-weights gives {len(args.batch_size_weights)} weight(s) for {len(sizes)} "
                     f"size(s) of -b")


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
    perf.add_argument("--shared-memory", type=_shared_memory_kind, default="none", metavar="{none,system}",
                      help="system: inputs and outputs in system shared-memory regions registered with the server "
                           "(http or grpc, same host) instead of in the requests (default none)")
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


def _shared_memory_kind(text: str) -> str:
    """perf_analyzer's --shared-memory: none or system here; its third kind, cuda, is named when asked
    for, not offered (CUDA shared memory needs a GPU, which the server here does not manage)."""
    if text == "cuda":
        raise argparse.ArgumentTypeError("cuda is not supported: CUDA shared memory needs a GPU; use system")
    if text not in ("none", "system"):
        raise argparse.ArgumentTypeError(f"expected none or system, got {text!r}")
    return text


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
    tune.add_argument("--concurrency-range", type=_load_range(whole=True), default=list(range(1, 33)),
                      metavar="START[:END[:STEP]]",
                      help="the load levels of each config's sweep (default 1:32:1, as perf.tune's)")
    tune.add_argument("--measurement-interval", "-p", type=_positive_int, default=2000, metavar="MS",
                      help="length of a measurement window in ms (default 2000)")
    tune.add_argument("--write-config", action="store_true",
                      help="write the recommended config to DIR/<tuned model>/config.pbtxt (--model-repository only)")
    tune.add_argument("--plots", type=Path, default=None, metavar="DIR",
                      help="write throughput_vs_latency.png, and knob_heatmap.png when two knobs vary, into DIR")
    replay = tune.add_argument_group(
        "replay on real Triton",
        "after the sweep, measure its best configs again on a running tritonserver in explicit model control mode, "
        "as the sweep measured them, and print both rankings side by side")
    replay.add_argument("--replay-url", default=None, metavar="HOST:PORT",
                        help="the tritonserver to replay on, reached over -i grpc, else http; checked before "
                             "the sweep starts, and left with its original config")
    replay.add_argument("--replay-top", type=_positive_int, default=3, metavar="N",
                        help="how many of the sweep's best configs to replay, the recommended one always (default 3)")
    replay.add_argument("--replay-rounds", type=_positive_int, default=2, metavar="N",
                        help="measure each config N times, the order reversed every other round (default 2)")
    tune.set_defaults(check=lambda args: _check_tune(tune, args))


_KNOB_FLAGS = {"max_queue_delay_microseconds": "--max-queue-delay-microseconds", "instance_count": "--instance-count",
               "max_batch_size": "--max-batch-size", "preferred_batch_size": "--preferred-batch-size"}


def _check_target(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.url is not None and args.protocol in ("inprocess", "sagemaker"):
        parser.error(f"-i {args.protocol} needs --model-repository; a server by -u URL is reached over http or grpc")
    if args.protocol is None:
        args.protocol = "http" if args.url is not None else "inprocess"


def _check_perf(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    _check_target(parser, args)
    _check_payload(parser, args)
    if args.request_distribution is not None and args.request_rate_range is None:
        parser.error("--request-distribution applies to --request-rate-range only")
    if args.shared_memory == "system" and args.protocol == "inprocess":
        parser.error("--shared-memory system needs -i http or -i grpc (in-process calls copy nothing)")
    if args.sequence_id_range is not None:
        from triton_nb.perf.options import parse_sequence_id_range

        try:
            parse_sequence_id_range(args.sequence_id_range)
        except TritonNBError as exc:
            parser.error(f"--sequence-id-range: {exc}")


def _check_tune(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    _check_target(parser, args)
    _check_payload(parser, args)
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
    import logging
    import signal
    import threading

    from triton_nb import InferenceServer

    settings = _serve_settings(args)
    for line in _serve_no_effect_lines(args):
        print(f"triton-nb serve: {line}", file=sys.stderr, flush=True)
    stopping = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = InferenceServer(args.model_repository[0], settings)
    if settings.log_file is None:  # tritonserver logs to its console unless --log-file says otherwise
        server.log_settings.add_handler(logging.StreamHandler(sys.stderr))
    try:
        try:
            server.start()
        except ModelLoadFailedError as exc:
            # --exit-on-error: the model table, then tritonserver's last line and its status
            _print_model_table(exc.repository_index)
            print(f"error: creating server: {exc}", file=sys.stderr, flush=True)
            return 1
        # (the server froze what it loaded out of the garbage collector's full passes: freeze_gc)
        _print_model_table(server.repository_index())
        names = {"grpc": "GRPCInferenceService", "http": "HTTPService", "metrics": "Metrics Service",
                 "sagemaker": "Sagemaker HTTPService"}
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
    """What ``perf`` and ``tune`` measure: a transport to the URL, or to an in-kernel server started
    (and stopped) here; a remote server's refusals are errors of triton_nb's own, one line each."""
    from triton_nb.transport import connect

    server = None
    transport = None
    try:
        if args.url is None:
            from triton_nb import serve

            # /invocations serves the model measured, as the container would with this variable
            sagemaker = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": args.model} if args.protocol == "sagemaker" else {}
            with _environment(sagemaker):
                server = serve(args.model_repository, model_control_mode="explicit", load_models="*",
                               http_port=0 if args.protocol == "http" else None,
                               grpc_port=0 if args.protocol == "grpc" else None,
                               allow_sagemaker=bool(sagemaker), sagemaker_port=0)
        transport = connect(args.url or server, args.protocol)
        transport.model_config_json(args.model)  # an unreachable server or unknown model fails here, before any output
        yield transport
    except TritonNBError as exc:
        if args.url is None:
            raise
        raise TritonNBError(f"{args.url}: {exc}") from None
    finally:
        if transport is not None:
            transport.close()
        if server is not None:
            server.stop()


def _perf(args: argparse.Namespace) -> int:
    from triton_nb.perf.commands import run_perf  # the perf modules load pandas: only for this command

    return run_perf(args, _perf_target)


def _tune(args: argparse.Namespace) -> int:
    from triton_nb.perf.commands import run_tune

    knobs = {name: ([(value,) for value in values] if name == "preferred_batch_size" else values)
             for name in _KNOB_FLAGS if (values := getattr(args, name)) is not None}
    return run_tune(args, _perf_target, knobs)


def _generate(args: argparse.Namespace) -> None:
    from triton_nb import fraud

    frame = fraud.generate_transactions(args.rows, seed=args.seed, fraud_rate=args.fraud_rate)
    path = fraud.write_tabformer_csv(frame, args.out)
    print(f"wrote {len(frame):,} transactions to {path}")


# SageMaker's container start script (Triton's docker/sagemaker/serve): the environment variables it
# turns into tritonserver flags when they are set
_SAGEMAKER_FLAG_VARIABLES = {
    "SAGEMAKER_BIND_TO_PORT": "--sagemaker-port",
    "SAGEMAKER_SAFE_PORT_RANGE": "--sagemaker-safe-port-range",
    "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": "--model-namespacing",
    "SAGEMAKER_TRITON_ALLOW_GRPC": "--allow-grpc",
    "SAGEMAKER_TRITON_ALLOW_METRICS": "--allow-metrics",
    "SAGEMAKER_TRITON_METRICS_PORT": "--metrics-port",
    "SAGEMAKER_TRITON_GRPC_PORT": "--grpc-port",
    "SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT": "--buffer-manager-thread-count",
    "SAGEMAKER_TRITON_THREAD_COUNT": "--sagemaker-thread-count",
    "SAGEMAKER_TRITON_LOG_VERBOSE": "--log-verbose",
    "SAGEMAKER_TRITON_LOG_INFO": "--log-info",
    "SAGEMAKER_TRITON_LOG_WARNING": "--log-warning",
    "SAGEMAKER_TRITON_LOG_ERROR": "--log-error",
    "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "--backend-config=python,shm-default-byte-size",
    "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "--backend-config=python,shm-growth-byte-size",
    "SAGEMAKER_TRITON_TENSORFLOW_VERSION": "--backend-config=tensorflow,version",
}


def _sagemaker_start(argv: list[str], environ: MutableMapping[str, str]) -> list[str]:
    """``triton-nb serve --allow-sagemaker=true`` started as SageMaker's container starts tritonserver:
    the flags its start script makes of the ``SAGEMAKER_*`` variables go first, so a flag given on
    the command line wins; the default model (the only model folder, when none is named) and the
    ping mode are exported as the script exports them. ``environ`` is updated in place."""
    derived = [f"{flag}={environ[name]}" for name, flag in _SAGEMAKER_FLAG_VARIABLES.items() if environ.get(name)]
    derived += environ.get("SAGEMAKER_TRITON_ADDITIONAL_ARGS", "").split()
    multi_model = environ.get("SAGEMAKER_MULTI_MODEL") == "true"
    environ["SAGEMAKER_TRITON_PING_MODE"] = environ.get("SAGEMAKER_TRITON_OVERRIDE_PING_MODE") or (
        "live" if multi_model else "ready")
    inference_type = environ.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer")
    if inference_type != "infer":
        raise TritonNBError(f"SAGEMAKER_TRITON_INFERENCE_TYPE '{inference_type}': only 'infer' is served here "
                            f"(generate and generate_stream are for LLM backends)")
    derived.append("--model-control-mode=explicit")
    if multi_model:  # models come through /models (or the runtime route's TargetModel), none at start
        return derived
    repository = _flag_value(argv, "--model-repository") or _flag_value(argv, "--model-store")
    default = environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")
    if repository is not None and Path(repository).is_dir() and not default:
        folders = sorted(p.name for p in Path(repository).iterdir() if p.is_dir() and not p.name.startswith("."))
        if len(folders) != 1:
            raise TritonNBError(
                f"{len(folders)} model directories in {repository} ({', '.join(folders) or 'none'}): set "
                f"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to the one to serve, as SageMaker's container needs")
        default = environ["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = folders[0]
    if default:
        derived.append(f"--load-model={default}")
    return derived


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in the process environment while the block runs (the server reads the SageMaker
    variables when it is made), as they were before afterwards: ``main`` may run in a caller's process."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in a command line (``--flag=value`` or ``--flag value``), the last one given."""
    value = None
    for index, arg in enumerate(argv):
        if arg.startswith(f"{flag}="):
            value = arg.split("=", 1)[1]
        elif arg == flag and index + 1 < len(argv):
            value = argv[index + 1]
    return value


def _serve_archive(argv: list[str], multi_model: bool) -> list[str]:
    """A ``--model-repository`` that names a ``model.tar.gz`` (``package_for_sagemaker``'s): unpacked
    into a temporary folder that is served, as SageMaker unpacks it into the container's model
    repository; in multi-model mode its folder is served instead, the archive being a target model
    there. The folder is removed when the command ends."""
    import tempfile

    from triton_nb.repository.sagemaker import unpack_model_archive

    rewritten = list(argv)
    for index, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag not in ("--model-repository", "--model-store"):
            continue
        if not value:  # --model-repository PATH
            index, value = index + 1, argv[index + 1] if index + 1 < len(argv) else ""
        archive = Path(value)
        if not archive.is_file():
            continue
        if multi_model:
            served = archive.parent
        else:
            holder = tempfile.TemporaryDirectory(prefix="triton-nb-model-")
            _UNPACKED.append(holder)
            served = unpack_model_archive(archive, Path(holder.name) / "model")
        rewritten[index] = f"{flag}={served}" if rewritten[index].startswith(f"{flag}=") else str(served)
    return rewritten


_UNPACKED: list[Any] = []  # the unpacked archives' folders, removed when the process ends


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
            given = _serve_archive(argv[at:], multi_model)
            environ = dict(os.environ)
            derived = _sagemaker_start(given, environ) if args.allow_sagemaker else []
            exported = {name: value for name, value in environ.items() if os.environ.get(name) != value}
        except TritonNBError as exc:
            print(f"triton-nb serve: error: {exc}", file=sys.stderr)
            return 2
        args = _build_parser().parse_args([*argv[:at], *derived, *given])
    handlers = {"demo": _demo, "generate": _generate, "train": lambda a: _train(a, a.out),
                "export": _export, "validate": _validate, "serve": _serve, "perf": _perf, "tune": _tune}
    if hasattr(args, "check"):
        args.check(args)
    try:
        with _environment(exported):
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
