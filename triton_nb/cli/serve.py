"""``triton-nb serve``: a model repository served with tritonserver's flags, and SageMaker's
container start (its ``SAGEMAKER_*`` variables, its ``model.tar.gz``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triton_nb.cli._args import (
    any_float,
    any_int,
    one_line_errors,
    port_number,
    positive_float,
    positive_int,
    true_or_false,
    verbosity_level,
    whole_number,
)
from triton_nb.errors import ModelLoadFailedError, TritonNBError

if TYPE_CHECKING:
    import dataclasses

    from triton_nb.server.settings import ServerSettings


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
    "--model-namespacing": (true_or_false, False, "one model repository is served, so no two models share a name"),
    "--enable-peer-access": (true_or_false, False, _NO_GPU),
    "--reuse-http-port": (true_or_false, False, "each server binds its HTTP port alone"),
    "--http-header-forward-pattern": (str, False, "HTTP headers are not forwarded to models as request parameters"),
    "--http-thread-count": (positive_int, False, "HTTP is served by one event loop, not a pool of threads"),
    "--reuse-grpc-port": (true_or_false, False, "each server binds its gRPC port alone"),
    "--grpc-header-forward-pattern": (str, False, "gRPC metadata is not forwarded to models as request parameters"),
    "--grpc-infer-allocation-pool-size": (whole_number, False, "request and response objects are not pooled here"),
    "--grpc-server-cert": (str, False, _NO_SSL),
    "--grpc-server-key": (str, False, _NO_SSL),
    "--grpc-root-cert": (str, False, _NO_SSL),
    "--grpc-infer-response-compression-level": (str, False, "gRPC responses are sent uncompressed here"),
    "--grpc-keepalive-time": (any_int, False, _GRPC_TRANSPORT),
    "--grpc-keepalive-timeout": (any_int, False, _GRPC_TRANSPORT),
    "--grpc-keepalive-permit-without-calls": (true_or_false, False, _GRPC_TRANSPORT),
    "--grpc-http2-max-pings-without-data": (any_int, False, _GRPC_TRANSPORT),
    "--grpc-http2-min-recv-ping-interval-without-data": (any_int, False, _GRPC_TRANSPORT),
    "--grpc-http2-max-ping-strikes": (any_int, False, _GRPC_TRANSPORT),
    "--grpc-max-connection-age": (any_int, False, _GRPC_TRANSPORT),
    "--grpc-max-connection-age-grace": (any_int, False, _GRPC_TRANSPORT),
    "--sagemaker-safe-port-range": (str, False, "no port range is reserved for SageMaker's front end here"),
    "--sagemaker-thread-count": (positive_int, False, "the SageMaker routes are served by one event loop, "
                                                      "not a pool of threads"),
    "--vertex-ai-port": (port_number, False, f"Vertex AI mode {_NOT_AVAILABLE}"),
    "--vertex-ai-thread-count": (positive_int, False, f"Vertex AI mode {_NOT_AVAILABLE}"),
    "--vertex-ai-default-model": (str, False, f"Vertex AI mode {_NOT_AVAILABLE}"),
    "--allow-gpu-metrics": (true_or_false, False, "no GPU metrics (nv_gpu_*) are collected here"),
    "--metrics-interval-ms": (any_float, False, "metrics are read when /metrics is scraped, not on an interval"),
    "--trace-config": (str, True, _NO_TRACING),
    "--repoagent-directory": (str, False, "repository agents are not supported here"),
    "--cache-directory": (str, False, "the local response cache is built in; no cache library is loaded"),
    "--pinned-memory-pool-byte-size": (whole_number, False, _NO_GPU),
    "--cuda-memory-pool-byte-size": (str, True, _NO_GPU),
    "--cuda-virtual-address-size": (str, True, _NO_GPU),
    "--min-supported-compute-capability": (any_float, False, _NO_GPU),
    "--buffer-manager-thread-count": (whole_number, False, "tensors are copied on the thread that handles the request"),
    "--host-policy": (str, True, "host policies (NUMA node, CPU cores) are not applied here"),
    "--model-load-gpu-limit": (str, True, _NO_GPU),
    "--trace-file": (str, False, _NO_TRACING),
    "--trace-level": (str, True, _NO_TRACING),
    "--trace-rate": (any_int, False, _NO_TRACING),
    "--trace-count": (any_int, False, _NO_TRACING),
    "--trace-log-frequency": (any_int, False, _NO_TRACING),
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


def add_serve_parser(commands: argparse._SubParsersAction) -> None:
    """``triton-nb serve``, with tritonserver's flags and spellings, grouped as tritonserver's --help
    groups them: a flag per server setting that has one (:class:`triton_nb.ServerSettings` declares
    it), the command's own, and tritonserver's flags that have no effect here."""
    import dataclasses

    from triton_nb.server.settings import ServerSettings

    # how a flag's text reads: by the field's "parse" where it has one, else by the field's type
    readers = {"port": port_number, "count": positive_int, "whole": whole_number, "positive": positive_float,
               "verbosity": verbosity_level, "bool": true_or_false, "float": float, "Path": Path}
    serve = one_line_errors(commands.add_parser(
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
    repository.add_argument("--strict-model-config", type=true_or_false, default=None, metavar="BOOL",
                            help="deprecated in tritonserver: true is --disable-auto-complete-config")
    for endpoint, title in (("http", "HTTP"), ("grpc", "gRPC"), ("metrics", "Metrics")):
        groups[title].add_argument(f"--allow-{endpoint}", type=true_or_false, default=True, metavar="BOOL",
                                   help=f"listen for {title} (default true)")
    cache = groups["Response cache"]
    cache.add_argument("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
                       help="Triton's response cache: local,size=BYTES (the local cache only; repeatable, one "
                            "setting each); models use it with response_cache { enable: true }")
    cache.add_argument("--response-cache-byte-size", type=whole_number, default=None, metavar="BYTES",
                       help="deprecated in tritonserver: --cache-config local,size=BYTES")
    for flag, (group_title, why) in _REFUSED_WHEN_TRUE.items():
        groups[group_title].add_argument(flag, type=true_or_false, default=False, metavar="BOOL",
                                         help=f"false only: {why}")
    for flag, (reader, repeat, why) in _INERT_SERVE_FLAGS.items():
        group = groups["SageMaker and Vertex AI" if flag.startswith(("--sagemaker", "--vertex")) else
                       "Accepted, no effect here"]
        # absent unless given (SUPPRESS), so that only a given flag is reported
        group.add_argument(flag, type=reader, action="append" if repeat else "store", default=argparse.SUPPRESS,
                           dest=_inert_dest(flag), metavar="BOOL" if reader is true_or_false else "VALUE",
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


def serve_command(args: argparse.Namespace) -> int:
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


def sagemaker_start(argv: list[str], environ: MutableMapping[str, str]) -> list[str]:
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


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in a command line (``--flag=value`` or ``--flag value``), the last one given."""
    value = None
    for index, arg in enumerate(argv):
        if arg.startswith(f"{flag}="):
            value = arg.split("=", 1)[1]
        elif arg == flag and index + 1 < len(argv):
            value = argv[index + 1]
    return value


def serve_archive(argv: list[str], multi_model: bool) -> list[str]:
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
