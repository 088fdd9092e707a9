"""Every option of the in-kernel server, declared once: :class:`ServerSettings`.

Each field carries its type, its default and its documentation where it is declared; the same
declaration gives :class:`~triton_nb.server.core.Server` its parameter documentation and
``triton-nb serve`` its flags (name, type, default, choices and help), so none of them is stated
twice. The metadata of a field (``dataclasses.fields(ServerSettings)[i].metadata``):

``help``
    What the option does (reStructuredText; its first sentence is the flag's help).
``flag``, ``aliases``
    The ``triton-nb serve`` flag that sets it (``tritonserver``'s name where it has one), or None.
``cli``
    Why a field has no flag of its own, or how ``triton-nb serve`` sets it otherwise.
``cli_default``
    The flag's default where ``tritonserver``'s differs from the in-process one (the ports: a
    notebook needs no network unless it asks; the control mode).
``choices``, ``repeat``, ``metavar``, ``parse``
    The values it takes; whether the flag repeats (one value each); how the flag's text reads
    (``"port"``, ``"count"``: a whole number >= 1, ``"whole"``: >= 0, ``"positive"``: a number > 0,
    ``"verbosity"``: a whole number or true/false; otherwise the field's type).
``group``
    The heading ``triton-nb serve --help`` lists its flag under (tritonserver's groups).

Validation is eager and in one place (:meth:`ServerSettings.__post_init__`): a bad value raises
:class:`~triton_nb.errors.InvalidArgumentError` (or NotFoundError for a missing folder) naming the
field and the value, before anything loads or listens.

This module stays light (the standard library and the errors): ``triton-nb serve --help`` builds
its flags from it without importing the server.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.server.scheduling.rate_limiter import RATE_LIMIT_MODES, parse_rate_limit_resource

__all__ = ["LOG_FORMATS", "MODEL_CONTROL_MODES", "PYTHON_INSTANCE_KINDS", "ServerSettings", "parameters_doc",
           "plain_text"]

MODEL_CONTROL_MODES = ("none", "explicit", "poll")
LOG_FORMATS = ("default", "ISO8601")
PYTHON_INSTANCE_KINDS = ("thread", "process")

_MiB = 1024 * 1024


def _setting(default: Any, help: str, *, flag: str | None = None, cli: str | None = None, **metadata: Any) -> Any:
    """A field with its documentation; ``flag`` or ``cli`` (why there is no flag) is required."""
    if flag is None and cli is None:
        # every option is reachable from triton-nb serve, or says why not
        raise TypeError("a setting needs flag= or cli=")
    return field(default=default, metadata={"help": " ".join(help.split()), "flag": flag, "cli": cli, **metadata})


@dataclass(frozen=True)
class ServerSettings:
    """The options of an in-kernel server (:class:`triton_nb.InferenceServer`), validated.

    ``ServerSettings(http_port=0)`` checks every value at once; ``dataclasses.replace(settings,
    ...)`` makes a changed copy (checked again). A sequence option also takes one string, and a
    list: it is kept as a tuple.
    """

    model_control_mode: str = _setting(
        "explicit", """How models are loaded: ``none`` (everything at start; no load/unload calls), ``explicit``
        (``load_models`` at start, then :meth:`~triton_nb.InferenceServer.load_model`) or ``poll``
        (everything, then reload what changes), as Triton's ``--model-control-mode``.""",
        flag="--model-control-mode", group="Model repository", choices=MODEL_CONTROL_MODES, cli_default="none")
    load_models: tuple[str, ...] = _setting(
        ("*",), """In explicit mode, the models to load at start (``*`` for all), as ``--load-model``. An empty
        list loads none.""",
        flag="--load-model", group="Model repository", repeat=True, metavar="NAME")
    repository_poll_secs: float = _setting(
        15.0, """In poll mode, how often the repository is scanned for changes, in seconds.""",
        flag="--repository-poll-secs", group="Model repository")
    http_port: int | None = _setting(
        None, """Serve KServe v2 HTTP on this port (0 picks a free one; ``http_port`` on the server reports
        what was bound). None leaves it off: in-process calls need no network.""",
        flag="--http-port", group="HTTP", parse="port", cli_default=8000, cli="off with --allow-http=false")
    grpc_port: int | None = _setting(
        None, """Serve Triton's gRPC API on this port (0 picks a free one). Off by default in process (``None``).""",
        flag="--grpc-port", group="gRPC", parse="port", cli_default=8001, cli="off with --allow-grpc=false")
    metrics_port: int | None = _setting(
        None, """Serve Prometheus metrics on this port (0 picks a free one). Off by default in process (``None``).""",
        flag="--metrics-port", group="Metrics", parse="port", cli_default=8002, cli="off with --allow-metrics=false")
    http_address: str = _setting(
        "127.0.0.1", """The interface HTTP listens on; 0.0.0.0 serves beyond this machine (a warning is logged
        for any address but loopback).""", flag="--http-address", group="HTTP")
    grpc_address: str = _setting("127.0.0.1", """The interface gRPC listens on.""", flag="--grpc-address", group="gRPC")
    metrics_address: str = _setting(
        "127.0.0.1", """The interface the metrics endpoint listens on.""", flag="--metrics-address", group="Metrics")
    max_request_bytes: int = _setting(
        64 * _MiB, """The largest HTTP request body, after decompression.""",
        flag="--max-request-bytes", group="triton-nb", parse="count", cli="also sets grpc_max_message_bytes")
    max_tensor_elements: int = _setting(
        16 * _MiB, """The most elements one tensor of a network request may declare.""",
        flag="--max-tensor-elements", group="triton-nb", parse="count")
    grpc_max_message_bytes: int = _setting(
        64 * _MiB, """The largest gRPC message, in either direction.""",
        cli="set to --max-request-bytes, which bounds a request over either protocol")
    exit_timeout_secs: float = _setting(
        30.0, """On stop, how long requests in flight over the network have to finish before the rest are
        failed, in seconds (Triton's ``--exit-timeout-secs``; ``triton-nb serve`` stops on SIGINT and
        SIGTERM).""", flag="--exit-timeout-secs", group="Server")
    http_read_timeout_secs: float = _setting(
        60.0, """An HTTP request must arrive whole (head and body) within this many seconds of its first
        byte, or it is answered 408 and its connection closed (slow clients).""",
        flag="--http-read-timeout-secs", group="HTTP", parse="positive")
    http_timeout_keep_alive_secs: float = _setting(
        75.0, """An HTTP connection idle this many seconds, with no request under way, is closed.""",
        flag="--http-timeout-keep-alive-secs", group="HTTP", parse="positive")
    http_restricted_api: tuple[str, ...] = _setting(
        (), """Triton's restricted APIs: ``<group>[,<group>...]:<key>=<value>`` (one or several) lets requests
        to those API groups (health, metadata, inference, shared-memory, model-config, model-repository,
        statistics, trace, logging) through only with that header; others get 403.""",
        flag="--http-restricted-api", group="HTTP", repeat=True, metavar="GROUPS:KEY=VALUE")
    grpc_restricted_api: tuple[str, ...] = _setting(
        (), """The same for gRPC: clients send the metadata key ``triton-grpc-protocol-<key>``, as Triton's do;
        others get PERMISSION_DENIED.""",
        flag="--grpc-restricted-api", group="gRPC", aliases=("--grpc-restricted-protocol",), repeat=True,
        metavar="GROUPS:KEY=VALUE")
    max_pending_requests: int = _setting(
        65536, """Requests that may wait or run at once, server-wide; past it requests are refused at once with
        UNAVAILABLE (503), which bounds memory when clients outpace the models.""",
        flag="--max-pending-requests", group="triton-nb", parse="count")
    max_string_bytes: int = _setting(
        _MiB, """The longest element a BYTES (string) input may hold, on every path (in-process too). The
        fraud pipeline's strings are a few dozen bytes; the limit stops one enormous value from costing
        the preprocessing its memory and time. Raise it for models that take documents.""",
        flag="--max-string-bytes", group="triton-nb", parse="count")
    network_model_control: bool = _setting(
        False, """Let HTTP and gRPC clients load and unload models (the repository API). Off by default, even in
        explicit mode: a load may carry a ``model.py`` as a file override, which is code this process
        would run for anyone who can reach the port. The notebook's own calls (``load_model``, the
        magics, the tuner) are not network calls and always work.""",
        cli="on with --model-control-mode=explicit, as tritonserver's explicit mode allows network loads")
    disable_auto_complete_config: bool = _setting(
        False, """Do not complete models' configs, as tritonserver's ``--disable-auto-complete-config``: a
        Python model's ``auto_complete_config`` is not called, and a model folder without
        ``config.pbtxt`` is refused (with auto-complete on, the default, a folder holding only a
        version's ``model.py`` is served as a Python model that its ``auto_complete_config``
        describes, as Triton serves it).""",
        flag="--disable-auto-complete-config", group="Model repository", switch=True)
    freeze_gc: bool = _setting(
        True, """Once the models are loaded, collect garbage and freeze what exists (``gc.freeze``), so that the
        cyclic collector's full passes no longer walk the notebook's data and libraries while requests
        are in flight (measured: the fraud ensemble's p99 at 64 in flight 64 ms -> 6.7 ms). The last
        server to stop unfreezes. See :mod:`triton_nb.server.collector`.""",
        cli="in-process only: triton-nb serve always freezes, its process holds nothing but the server")
    cache_size_bytes: int | None = _setting(
        None, """Triton's local response cache of this many bytes (``tritonserver --cache-config
        local,size=N``), shared by every model whose config says ``response_cache { enable: true }``: an
        identical request is answered from it without running the model. None or 0: no cache, as Triton
        without ``--cache-config``, and the models' flags do nothing. See :mod:`triton_nb.server.cache` and
        :meth:`~triton_nb.InferenceServer.update_response_cache`.""",
        cli="set by --cache-config local,size=BYTES, tritonserver's form")
    rate_limit: str = _setting(
        "off", """Triton's rate limiter: ``execution_count`` runs an instance only when the resources its
        instance group's ``rate_limiter`` names are free; ``off`` ignores every ``rate_limiter`` block, as
        Triton does.""", flag="--rate-limit", group="Rate limiter", choices=RATE_LIMIT_MODES)
    rate_limit_resources: tuple[str, ...] = _setting(
        (), """Copies of a rate limiter resource, ``NAME:COUNT[:DEVICE]``, on one device or all (default: the
        most any loaded instance needs), with the ``execution_count`` rate limit only.""",
        flag="--rate-limit-resource", group="Rate limiter", repeat=True, metavar="NAME:COUNT[:DEVICE]")
    backend_directory: Path | None = _setting(  # noqa: RUF009 - _setting returns a dataclasses.field
        None, """A folder of Python-based backends, as Triton's ``--backend-directory``: a config saying
        ``backend: "NAME"`` runs ``<backend_directory>/NAME/model.py`` (after backends registered with
        :func:`triton_nb.backends.register_backend` and installed entry points; see
        :mod:`triton_nb.backends.registry`).""",
        flag="--backend-directory", group="Backend", metavar="DIR")
    python_instances: str = _setting(
        "thread", """How Python-model instances run: ``thread`` (threads of this process, with no hand-off cost)
        or ``process`` (a process per instance, as Triton's stubs: parallel on several cores, and a crash
        fails one batch, not the kernel). A model with ``EXECUTION_ENV_PATH`` runs in processes of its
        environment's interpreter either way. See :mod:`triton_nb.backends.python_process`.""",
        flag="--python-instances", group="triton-nb", choices=PYTHON_INSTANCE_KINDS)
    metrics_config: tuple[str, ...] | Mapping[str, Any] = _setting(
        (), """Triton's ``--metrics-config`` settings, e.g. ``summary_latencies=true`` (several, or a dict of
        them). The keys are ``counter_latencies``, ``summary_latencies``, ``summary_quantiles`` (e.g.
        ``0.5:0.05,0.99:0.001``) and ``histogram_latencies``; an unknown key is an error naming it. See
        :mod:`triton_nb.server.observability.metrics`.""",
        flag="--metrics-config", group="Metrics", repeat=True, metavar="KEY=VALUE")
    cpu_metrics: bool = _setting(
        True, """Export Triton's CPU metrics (``nv_cpu_utilization``, ``nv_cpu_memory_total_bytes``,
        ``nv_cpu_memory_used_bytes``: system-wide, from ``/proc``), as ``--allow-cpu-metrics``.""",
        flag="--allow-cpu-metrics", group="Metrics", cli="ignored unless --allow-metrics")

    server_id: str = _setting(
        "triton_nb", """The server's name in its metadata (``GET /v2``, gRPC ``ServerMetadata``), as tritonserver's
        ``--id``.""", flag="--id", group="Server", metavar="NAME")
    allow_sagemaker: bool = _setting(
        False, """Serve SageMaker's container contract (``GET /ping``, ``POST /invocations`` and the SageMaker
        runtime route boto3 calls) on ``sagemaker_port``, as ``tritonserver --allow-sagemaker=true`` does
        in SageMaker's Triton container (see the SageMaker guide). As there, the model ``/invocations``
        serves is the environment's ``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`` and ``/ping`` answers
        readiness, or liveness with ``SAGEMAKER_TRITON_PING_MODE=live``.""",
        flag="--allow-sagemaker", group="SageMaker and Vertex AI")
    sagemaker_port: int = _setting(
        8080, """The port of the SageMaker contract (0 picks a free one), on ``http_address``; used with
        ``allow_sagemaker``.""", flag="--sagemaker-port", group="SageMaker and Vertex AI", parse="port")
    exit_on_error: bool = _setting(
        False, """Fail the start when a model fails to load, naming it, as tritonserver's ``--exit-on-error``:
        :meth:`~triton_nb.InferenceServer.start` raises and ``triton-nb serve`` exits with status 1. In
        process the default is off (a notebook keeps the models that loaded, and a failed one reports
        why in the repository index); ``triton-nb serve`` defaults to tritonserver's true.""",
        flag="--exit-on-error", group="Model repository", cli_default=True)
    strict_readiness: bool = _setting(
        True, """Server readiness (``/v2/health/ready``, gRPC ``ServerReady``) also needs every model to be
        ready, as tritonserver's ``--strict-readiness``; off, a live server is ready even while models
        are unavailable.""", flag="--strict-readiness", group="Model repository")
    model_load_thread_count: int = _setting(
        1, """How many models load at once at start (ensembles after the models they compose), as
        tritonserver's ``--model-load-thread-count``. In process the default loads one by one, in the
        repository's order; ``triton-nb serve`` defaults to tritonserver's 4.""",
        flag="--model-load-thread-count", group="Model repository", parse="count", cli_default=4)
    model_load_retry_count: int = _setting(
        0, """How many more times a model that fails to load at start is tried, as tritonserver's
        ``--model-load-retry-count``.""", flag="--model-load-retry-count", group="Model repository",
        parse="whole")
    log_verbose: int = _setting(
        0, """Verbose logging: 0 off, 1 or more logs the ``triton_nb`` loggers at DEBUG, as tritonserver's
        ``--log-verbose`` (which also takes true and false).""", flag="--log-verbose", group="Logging",
        parse="verbosity", metavar="LEVEL")
    log_info: bool = _setting(
        True, """Log the ``triton_nb`` loggers' INFO records, as tritonserver's ``--log-info``.""",
        flag="--log-info", group="Logging")
    log_warning: bool = _setting(
        True, """Log their WARNING records, as ``--log-warning``.""", flag="--log-warning", group="Logging")
    log_error: bool = _setting(
        True, """Log their ERROR records, as ``--log-error``.""", flag="--log-error", group="Logging")
    log_format: str = _setting(
        "default", """How a log line starts, as tritonserver's ``--log-format``: ``default`` (``I1207
        02:08:08.123456 1234 core.py:150]``) or ``ISO8601`` (``2026-12-07T02:08:08Z I 1234
        core.py:150]``); it applies to the log file and to ``triton-nb serve``'s console (in process
        without a log file, the notebook's own logging formats the records).""",
        flag="--log-format", group="Logging", choices=LOG_FORMATS)
    log_file: Path | None = _setting(  # noqa: RUF009 - _setting returns a dataclasses.field
        None, """Write the log to this file (appended to) instead of the console, as tritonserver's
        ``--log-file``; in process, the records still reach the notebook's logging as well.""",
        flag="--log-file", group="Logging", metavar="FILE")
    backend_config: tuple[str, ...] = _setting(
        (), """Backend settings, ``BACKEND,KEY=VALUE`` (or ``KEY=VALUE`` for all backends), as tritonserver's
        ``--backend-config``. The Python backend's ``shm-default-byte-size`` (the first size of a process
        instance's shared-memory arena, >= 1 MiB), ``shm-region-prefix-name`` (its file names' prefix)
        and ``stub-timeout-seconds`` (how long a model's process may take to start) work here; every
        other setting is accepted and said, in one line at start, to have no effect here. See
        :mod:`triton_nb.backends.backend_config`.""",
        flag="--backend-config", group="Backend", repeat=True, metavar="BACKEND,KEY=VALUE")

    def __post_init__(self) -> None:
        store = self._store
        _choice("model_control_mode", self.model_control_mode, MODEL_CONTROL_MODES)
        for name in ("load_models", "http_restricted_api", "grpc_restricted_api", "rate_limit_resources"):
            store(name, _strings(name, getattr(self, name)))
        if not _number(self.repository_poll_secs) or self.repository_poll_secs <= 0:
            raise InvalidArgumentError(f"repository_poll_secs must be > 0, got {self.repository_poll_secs}")
        for name in ("http_port", "grpc_port", "metrics_port", "sagemaker_port"):
            port = getattr(self, name)
            if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
                raise InvalidArgumentError(f"{name} must be a port number 0..65535 (0 picks a free one), got {port!r}")
        for name in ("http_address", "grpc_address", "metrics_address"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidArgumentError(f"{name} must be an interface address, got {getattr(self, name)!r}")
        for name in ("max_request_bytes", "max_tensor_elements", "grpc_max_message_bytes", "max_pending_requests",
                     "max_string_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be >= 1, got {value}")
        if not _number(self.exit_timeout_secs) or self.exit_timeout_secs < 0:
            raise InvalidArgumentError(f"exit_timeout_secs must be >= 0, got {self.exit_timeout_secs}")
        for name in ("http_timeout_keep_alive_secs", "http_read_timeout_secs"):
            value = getattr(self, name)
            if not (_number(value) and math.isfinite(value) and value > 0):
                raise InvalidArgumentError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.http_restricted_api or self.grpc_restricted_api:
            # protocol.py brings numpy; imported only when there is something to check
            from triton_nb.server.frontends.protocol import parse_restricted_api

            parse_restricted_api(self.http_restricted_api, "http_restricted_api")
            parse_restricted_api(self.grpc_restricted_api, "grpc_restricted_api")
        if not isinstance(self.server_id, str) or not self.server_id:
            raise InvalidArgumentError(f"server_id must be a non-empty string, got {self.server_id!r}")
        for name, least in (("model_load_thread_count", 1), ("model_load_retry_count", 0), ("log_verbose", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidArgumentError(f"{name} must be a whole number >= {least}, got {value!r}")
        _choice("log_format", self.log_format, LOG_FORMATS)
        if self.log_file is not None:
            store("log_file", Path(self.log_file))
        store("backend_config", _strings("backend_config", self.backend_config))
        if self.backend_config:
            from triton_nb.backends.backend_config import parse_backend_config

            parse_backend_config(self.backend_config)  # a malformed or bad value names itself now
        for name in ("network_model_control", "disable_auto_complete_config", "freeze_gc", "cpu_metrics",
                     "exit_on_error", "strict_readiness", "log_info", "log_warning", "log_error", "allow_sagemaker"):
            store(name, bool(getattr(self, name)))
        if self.cache_size_bytes is not None:
            if isinstance(self.cache_size_bytes, bool) or int(self.cache_size_bytes) < 0:
                raise InvalidArgumentError(f"cache_size_bytes must be >= 0, got {self.cache_size_bytes}")
            store("cache_size_bytes", int(self.cache_size_bytes))
        _choice("rate_limit", self.rate_limit, RATE_LIMIT_MODES)
        if self.rate_limit_resources and self.rate_limit == "off":
            raise InvalidArgumentError("rate_limit_resources need rate_limit='execution_count'")
        for resource in self.rate_limit_resources:
            parse_rate_limit_resource(resource)
        if self.backend_directory is not None:
            store("backend_directory", Path(self.backend_directory))
            if not self.backend_directory.is_dir():
                raise NotFoundError(f"backend_directory {self.backend_directory} does not exist or is not a folder")
        _choice("python_instances", self.python_instances, PYTHON_INSTANCE_KINDS)
        value = self.metrics_config
        if value is None:
            store("metrics_config", ())
        elif isinstance(value, Mapping):
            store("metrics_config", dict(value))
        elif not dataclasses.is_dataclass(value):  # a parsed MetricsConfig is kept as it is
            store("metrics_config", _strings("metrics_config", value))
        if self.metrics_config:
            # metrics.py brings prometheus_client; a bad key names itself now, before anything loads
            from triton_nb.server.observability.metrics import parse_metrics_config

            parse_metrics_config(self.metrics_config)

    def _store(self, name: str, value: Any) -> None:
        # A frozen instance still normalizes what it was given (one string for a sequence, a list, a
        # str path), so that what it holds is immutable and of one type.
        object.__setattr__(self, name, value)

    @classmethod
    def from_options(cls, settings: ServerSettings | None = None, /, **options: Any) -> ServerSettings:
        """``settings`` (or the defaults) with ``options`` changed; an option that is not a field is a
        TypeError naming it, as an unknown keyword argument is."""
        unknown = [name for name in options if name not in _FIELD_NAMES]
        if unknown:
            hints = [match for name in unknown for match in difflib.get_close_matches(name, _FIELD_NAMES, n=1)]
            raise TypeError(f"unknown server option(s) {', '.join(map(repr, unknown))}"
                            + (f" (did you mean {', '.join(map(repr, hints))}?)" if hints else "")
                            + "; the options are ServerSettings' fields")
        if settings is None:
            return cls(**options)
        return dataclasses.replace(settings, **options) if options else settings


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(ServerSettings))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def _strings(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be a string or a list of strings, got {value!r}") from None
    if not all(isinstance(item, str) for item in items):
        raise InvalidArgumentError(f"{name} must be a string or a list of strings, got {value!r}")
    return items


def plain_text(text: str) -> str:
    """reStructuredText markup (``literal``, :role:`target`) as plain text, for a flag's help."""
    text = re.sub(r":\w+:`~?([^`]+)`", lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1),
                  text)
    return text.replace("``", "")


def parameters_doc(indent: str = "    ") -> str:
    """The numpy-style entries of every setting (``name : type, default X`` and its help), for the
    ``Parameters`` section of a docstring that takes the settings as keyword options."""
    lines = []
    for f in dataclasses.fields(ServerSettings):
        lines.append(f"{indent}{f.name} : {f.type}, default {f.default!r}")
        body = indent + "    "  # wrapped at 100 columns, as the rest of the docstrings
        lines.append(textwrap.fill(f.metadata["help"], 100, initial_indent=body, subsequent_indent=body,
                                   break_on_hyphens=False, break_long_words=False))
    return "\n".join(lines)


ServerSettings.__doc__ = ((ServerSettings.__doc__ or "").rstrip() + "\n\n    Attributes\n    ----------\n"
                          + parameters_doc() + "\n")
