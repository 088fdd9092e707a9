"""IPython magics: ``%load_ext triton_nb``, then ``%triton``, ``%%triton_infer`` and ``%triton_perf``.

* ``%triton start [REPO] [--http-port P] [--grpc-port P] [--metrics-port P] [--model-control-mode M]``,
  ``%triton stop``, ``%triton status``, ``%triton load|unload|reload MODEL [--config JSON]``,
  ``%triton config MODEL`` (the effective ``config.pbtxt``);
* ``%%triton_infer MODEL [--url URL] [--protocol inprocess|http|grpc] [--version V] [--out VAR]
  [--format auto|csv|json|python] [--binary]``: the cell is the request (CSV rows with a header, JSON
  records, a KServe v2 body, or a Python expression giving a DataFrame or a dict); the answer is a
  DataFrame of inputs and outputs, with the latency and the server's queue/compute breakdown;
* ``%triton_perf MODEL --concurrency-range 1:32:2 [...]``: :func:`triton_nb.perf.measure` with its
  throughput-vs-latency plot.

Settings are traitlets config: ``%config TritonMagics.protocol = "grpc"``, ``TritonMagics.url``,
``TritonMagics.server_variable`` (the name of a variable holding an ``InferenceServer`` to use
instead of the one ``%triton start`` started) and ``TritonMagics.model_repository``.
"""

from __future__ import annotations

import ast
import difflib
import io
import json
import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Unicode

from triton_nb.errors import TritonNBError
from triton_nb.frames import config_datatype, frame_to_inputs, output_columns, to_datatype, values_to_inputs
from triton_nb.fraud.evaluate import label_predictions
from triton_nb.perf.options import COMPRESSIONS, DEFAULT_OUTPUT_SHARED_MEMORY_SIZE, SHARED_MEMORY_KINDS, TENSOR_FORMATS
from triton_nb.server.settings import MODEL_CONTROL_MODES
from triton_nb.transport import PROTOCOLS, Transport, connect

__all__ = ["TritonMagics", "load_ipython_extension", "unload_ipython_extension"]

FORMATS = ("auto", "csv", "json", "python")


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


def _usage(message: object) -> UsageError:
    return UsageError(_one_line(message))


def _unquote(text: str | None) -> str | None:
    """magic_arguments keeps the quotes around an argument (``--config '{"a": 1}'``): drop them."""
    if text is not None and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


# ---------------------------------------------------------------------- model config helpers


def _composing(config: Mapping[str, Any]) -> list[str]:
    steps = (config.get("ensemble_scheduling") or {}).get("step") or []
    return [step["model_name"] for step in steps if step.get("model_name")]


def _v2_arrays(body: Mapping[str, Any]) -> dict[str, np.ndarray]:
    inputs = body.get("inputs")
    if not isinstance(inputs, list):
        raise _usage('a KServe v2 request body needs "inputs": a list of tensors')
    arrays = {}
    for tensor in inputs:
        try:
            name, datatype, shape, data = tensor["name"], tensor["datatype"], tensor["shape"], tensor["data"]
        except (KeyError, TypeError):
            raise _usage('each v2 input needs "name", "datatype", "shape" and "data"') from None
        try:
            array = to_datatype(np.asarray(data, dtype=object if datatype == "BYTES" else None).reshape(-1),
                             datatype, f"input '{name}'").reshape([int(d) for d in shape])
        except ValueError as exc:
            raise _usage(f"input '{name}': {exc}") from None
        arrays[name] = array
    return arrays


def _table(arrays: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Tensors as columns (:func:`triton_nb.frames.output_columns`), bytes decoded for display."""
    shown = {}
    for name, array in arrays.items():
        values = np.asarray(array)
        if values.dtype == object and values.size:
            values = np.vectorize(lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else v,
                                  otypes=[object])(values)
        shown[name] = values.reshape(1) if values.ndim == 0 else values
    columns = output_columns(shown)
    if len({len(v) for v in columns.values()}) > 1:  # tensors of different lengths: padded with NaN
        return pd.concat([pd.Series(v, name=k) for k, v in columns.items()], axis=1)
    return pd.DataFrame(columns)


def _stat_totals(statistics: Mapping[str, Any], names: list[str]) -> dict[str, int]:
    totals = dict.fromkeys(("requests", "queue", "compute_input", "compute_infer", "compute_output"), 0)
    for entry in statistics.get("model_stats", []):
        if entry.get("name") not in names:
            continue
        stats = entry.get("inference_stats", {})
        totals["requests"] += int(stats.get("success", {}).get("count", 0))
        for key in ("queue", "compute_input", "compute_infer", "compute_output"):
            totals[key] += int(stats.get(key, {}).get("ns", 0))
    return totals


def _numbers(text: str, kind: type, flag: str) -> list:
    """``"1,8,64"`` -> ``[1, 8, 64]``, or a one-line usage error naming ``flag``."""
    try:
        return [kind(part) for part in _unquote(text).split(",")]
    except ValueError:
        raise _usage(f"{flag} must be comma-separated numbers, got {text!r}") from None


def _parse_range(text: str) -> str:
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.strip().isdigit() for p in parts):
        raise _usage(f"--concurrency-range must be start[:end[:step]] in whole numbers, got {text!r}")
    return text


# ---------------------------------------------------------------------- the magics


@magics_class
class TritonMagics(Magics):
    """``%triton``, ``%%triton_infer`` and ``%triton_perf`` (see the module's docstring)."""

    protocol = Unicode("inprocess", help="Default protocol of %%triton_infer and %triton_perf: "
                                         "inprocess, http or grpc.").tag(config=True)
    url = Unicode("", help="Default host:port of a remote server (empty: the in-kernel server).").tag(config=True)
    server_variable = Unicode("", help="Name of a user variable holding the InferenceServer to use, instead "
                                       "of the one %triton start started.").tag(config=True)
    model_repository = Unicode("model_repository", help="Repository %triton start serves when given none."
                               ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.server: Any = None

    # ------------------------------------------------------------------ helpers
    def _server(self) -> Any:
        from triton_nb.server.core import Server

        if self.server_variable:
            if self.server_variable not in self.shell.user_ns:
                raise _usage(f"TritonMagics.server_variable names '{self.server_variable}', which is not defined")
            server = self.shell.user_ns[self.server_variable]
            if not isinstance(server, Server):  # the engine will do: the magics need no client() or tune()
                raise _usage(f"'{self.server_variable}' is a {type(server).__name__}, not an InferenceServer")
            return server
        if self.server is None:
            raise _usage("no in-kernel server: run %triton start [REPO] first, or set "
                         "%config TritonMagics.server_variable = 'name'")
        return self.server

    def _target(self, url: str | None, protocol: str | None, binary: bool = False) -> Transport:
        """The transport a magic's requests take: to ``url`` (over http unless gRPC is asked for), or to
        the in-kernel server, in-process or through one of its own endpoints."""
        protocol = protocol or self.protocol
        url = url if url is not None else self.url
        if protocol not in PROTOCOLS:
            raise _usage(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        try:
            if url:
                return connect(url, "http" if protocol == "inprocess" else protocol, binary=binary)
            server = self._server()
            if protocol != "inprocess" and protocol not in server.endpoints:
                raise _usage(f"the in-kernel server has no {protocol} endpoint: start it with --{protocol}-port 0")
            return connect(server, protocol, binary=binary)
        except TritonNBError as exc:
            raise _usage(exc) from None

    @staticmethod
    def _check_model(name: str, known: list[str]) -> None:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise _usage(f"unknown model '{name}'{hint}; the repository has: {', '.join(known) or 'nothing'}")

    def _status(self, server: Any) -> pd.DataFrame:
        served, hit_ratio = {}, {}
        for entry in server.statistics().get("model_stats", []):
            key = (entry["name"], entry["version"])
            stats = entry["inference_stats"]
            served[key] = int(stats["success"]["count"])
            hits, misses = int(stats["cache_hit"]["count"]), int(stats["cache_miss"]["count"])
            hit_ratio[key] = hits / (hits + misses) if hits + misses else math.nan  # NaN: never looked up
        rows = []
        for entry in server.repository_index():
            name, version, state = entry["name"], entry.get("version", ""), entry.get("state", "")
            try:
                depth: Any = server.queue_depth(name, int(version)) if state == "READY" else math.nan
            except TritonNBError:
                depth = math.nan
            rows.append({"model": name, "version": version, "state": state or "NOT LOADED",
                         "reason": entry.get("reason", ""), "queue_depth": depth,
                         "requests_served": served.get((name, version), 0),
                         "cache_hit_ratio": hit_ratio.get((name, version), math.nan),
                         "warnings": "; ".join(server.config_warnings(name))})
        return pd.DataFrame(rows, columns=["model", "version", "state", "reason", "queue_depth", "requests_served",
                                           "cache_hit_ratio", "warnings"])

    # ------------------------------------------------------------------ %triton
    @magic_arguments()
    @argument("action", choices=["start", "stop", "status", "load", "unload", "reload", "config"],
              help="start [REPO] | stop | status | load|unload|reload MODEL [--config JSON] | config MODEL")
    @argument("target", nargs="?", default=None, help="the repository (start) or the model")
    @argument("--http-port", type=int, default=None, help="start: serve HTTP on this port (0: a free one)")
    @argument("--grpc-port", type=int, default=None, help="start: serve gRPC on this port (0: a free one)")
    @argument("--metrics-port", type=int, default=None, help="start: serve metrics on this port (0: a free one)")
    @argument("--model-control-mode", default="explicit", choices=list(MODEL_CONTROL_MODES),
              help="start: Triton's model control mode")
    @argument("--config", default=None, help="load/reload: a config override: Triton's JSON (the whole config, "
                                             "as Triton's load API), or the name of a variable holding it")
    @line_magic
    def triton(self, line: str) -> Any:
        """Start, stop and inspect the in-kernel Triton server; load, unload and reload its models."""
        args = parse_argstring(self.triton, line)
        args.target, args.config = _unquote(args.target), _unquote(args.config)
        try:
            return getattr(self, f"_triton_{args.action}")(args)
        except TritonNBError as exc:
            raise _usage(exc) from None

    def _triton_start(self, args: Any) -> Any:
        # The one import that runs up the layers: %triton start hands the user the public
        # InferenceServer, whose tune() is built on this layer's panel (tests/test_layering.py).
        from triton_nb.serving import serve

        if self.server is not None:
            raise _usage("a server is already running: %triton stop first")
        repository = args.target or self.model_repository
        self.server = serve(repository, model_control_mode=args.model_control_mode, http_port=args.http_port,
                            grpc_port=args.grpc_port, metrics_port=args.metrics_port)
        self.shell.user_ns["triton_server"] = self.server
        endpoints = ", ".join(f"{k} {v}" for k, v in self.server.endpoints.items()) or "in-process only"
        print(f"triton_nb server on {repository} ({endpoints}); it is `triton_server`")
        return self._status(self.server)

    def _triton_stop(self, args: Any) -> None:
        if self.server is None:
            raise _usage("no server started with %triton start is running")
        self.server.stop()
        if self.shell.user_ns.get("triton_server") is self.server:
            del self.shell.user_ns["triton_server"]
        self.server = None
        print("triton_nb server stopped")

    def _triton_status(self, args: Any) -> pd.DataFrame:
        return self._status(self._server())

    def _model_arg(self, args: Any, server: Any) -> str:
        if not args.target:
            raise _usage(f"%triton {args.action} needs a model name")
        self._check_model(args.target, sorted({entry["name"] for entry in server.repository_index()}))
        return args.target

    def _triton_load(self, args: Any) -> pd.DataFrame:
        server = self._server()
        name = self._model_arg(args, server)
        config: Any = args.config
        if config is not None and config.isidentifier() and config in self.shell.user_ns:
            config = self.shell.user_ns[config]  # --config VAR: a JSON string, a dict or a ModelConfig
        if isinstance(config, str):
            try:
                json.loads(config)
            except json.JSONDecodeError as exc:
                raise _usage(f"--config is not valid JSON (nor a variable holding a config): {exc}") from None
        started = time.perf_counter()
        server.load_model(name, config=config)
        print(f"{'reloaded' if args.action == 'reload' else 'loaded'} '{name}' in "
              f"{time.perf_counter() - started:.2f} s")
        return self._status(server)

    _triton_reload = _triton_load

    def _triton_unload(self, args: Any) -> pd.DataFrame:
        server = self._server()
        name = self._model_arg(args, server)
        server.unload_model(name)
        print(f"unloaded '{name}'")
        return self._status(server)

    def _triton_config(self, args: Any) -> None:
        from triton_nb.repository.config import format_config

        server = self._server()
        name = self._model_arg(args, server)
        print(format_config(server.model_config(name)), end="")

    # ------------------------------------------------------------------ %%triton_infer
    @magic_arguments()
    @argument("model", help="the model to run")
    @argument("--url", default=None, help="host:port of a remote server (default: the in-kernel server)")
    @argument("--protocol", default=None, choices=list(PROTOCOLS), help="default: TritonMagics.protocol")
    @argument("--version", type=int, default=None, help="the model version (default: the latest)")
    @argument("--out", default=None, help="also store the result DataFrame in this variable")
    @argument("--format", default="auto", choices=list(FORMATS),
              help="the cell: CSV with a header, JSON (records or a KServe v2 body) or a Python expression")
    @argument("--binary", action="store_true", help="http: binary tensors instead of JSON")
    @cell_magic
    def triton_infer(self, line: str, cell: str) -> pd.DataFrame:
        """Run one inference; the cell is the request. Returns the inputs and outputs as a DataFrame."""
        args = parse_argstring(self.triton_infer, line)
        target = self._target(args.url, args.protocol, args.binary)
        try:
            return self._infer(target, args, cell)
        except UsageError:
            raise
        except TritonNBError as exc:  # also a remote server's refusal: the transport raises ours
            raise _usage(exc) from None
        finally:
            target.close()

    def _infer(self, target: Transport, args: Any, cell: str) -> pd.DataFrame:
        model, version = args.model, args.version
        self._check_model(model, target.models())
        config = target.model_config_json(model, version)
        shown, arrays = self._request(config, cell, args.format)
        outputs = [spec["name"] for spec in config.get("output", [])]
        names = _composing(config) or [model]
        before = self._safe_stats(target, names)
        started = time.perf_counter()
        result = target.infer(model, arrays, outputs=outputs, model_version=version)
        latency_ms = (time.perf_counter() - started) * 1e3
        after = self._safe_stats(target, names)
        answer = _table({name: result[name] for name in outputs if result.get(name) is not None})
        fraud = label_predictions(result)
        if fraud is not None:
            answer = pd.concat([answer, fraud], axis=1)
        shown = shown.reset_index(drop=True)
        answer = answer.rename(columns={c: f"{c} (output)" for c in answer.columns if c in shown.columns})
        frame = pd.concat([shown, answer.reset_index(drop=True)], axis=1)
        timing: dict[str, Any] = {"model": model, "protocol": target.protocol, "latency_ms": latency_ms}
        summary = f"{model} via {target.protocol}: {len(frame)} row(s), latency {latency_ms:.2f} ms"
        if before is not None and after is not None:
            delta = {k: after[k] - before[k] for k in after}
            timing.update({f"server_{k}_ms": delta[k] / 1e6 for k in delta if k != "requests"})
            compute = delta["compute_input"] + delta["compute_infer"] + delta["compute_output"]
            summary += (f" | server: queue {delta['queue'] / 1e6:.3f} ms, compute {compute / 1e6:.3f} ms "
                        f"(input {delta['compute_input'] / 1e6:.3f}, infer {delta['compute_infer'] / 1e6:.3f}, "
                        f"output {delta['compute_output'] / 1e6:.3f})")
        frame.attrs["triton"] = timing
        print(summary)
        if args.out:
            self.shell.user_ns[args.out] = frame
        return frame

    @staticmethod
    def _safe_stats(target: Transport, names: list[str]) -> dict[str, int] | None:
        try:
            return _stat_totals(target.statistics(), names)
        except Exception:  # the breakdown is extra: a server without statistics still answers
            return None

    def _request(self, config: Mapping[str, Any], cell: str, fmt: str) -> tuple[pd.DataFrame, dict]:
        """(the inputs to show, the tensors to send) from the cell."""
        body = cell.strip()
        if not body:
            raise _usage("the cell is empty: give CSV rows with a header, JSON or a Python expression")
        if fmt == "auto":
            fmt = self._detect(body)
        if fmt == "json":
            try:
                data = json.loads(body)
            except json.JSONDecodeError as exc:
                raise _usage(f"the cell is not valid JSON: {exc}") from None
            return self._from_json(config, data)
        if fmt == "python":
            try:
                value = eval(compile(body, "<triton_infer>", "eval"), self.shell.user_ns)  # the user's own cell
            except SyntaxError as exc:
                raise _usage(f"the cell is not a Python expression: {exc.msg} (line {exc.lineno})") from None
            except Exception as exc:
                raise _usage(f"the expression raised {type(exc).__name__}: {exc}") from None
            if isinstance(value, pd.DataFrame):
                return value, frame_to_inputs(config, value)
            if isinstance(value, Mapping):
                arrays = values_to_inputs(config, value)
                return _table(arrays), arrays
            raise _usage(f"the expression gives a {type(value).__name__}; a DataFrame or a dict is needed")
        return self._from_csv(config, body)

    @staticmethod
    def _detect(body: str) -> str:
        if body[0] in "[{":
            try:
                json.loads(body)
                return "json"
            except json.JSONDecodeError:
                try:
                    ast.parse(body, mode="eval")
                    return "python"
                except SyntaxError:
                    return "json"  # reported as malformed JSON
        try:
            ast.parse(body, mode="eval")
            return "python"
        except SyntaxError:
            return "csv"

    @staticmethod
    def _from_json(config: Mapping[str, Any], data: Any) -> tuple[pd.DataFrame, dict]:
        if isinstance(data, Mapping) and "inputs" in data:
            arrays = _v2_arrays(data)
            return _table(arrays), arrays
        if isinstance(data, Mapping):
            data = [data]
        if not isinstance(data, list) or not all(isinstance(r, Mapping) for r in data):
            raise _usage('JSON input must be a list of records (objects) or a KServe v2 body {"inputs": [...]}')
        frame = pd.DataFrame(data)
        return frame, frame_to_inputs(config, frame)

    @staticmethod
    def _from_csv(config: Mapping[str, Any], body: str) -> tuple[pd.DataFrame, dict]:
        try:
            frame = pd.read_csv(io.StringIO(body), dtype=str, keep_default_na=False, skipinitialspace=True)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
            raise _usage(f"the cell is not valid CSV: {exc}") from None
        if len(frame) == 0:
            raise _usage("the CSV has a header but no rows")
        # numbers for the numeric inputs (User, Card...), text as written for the rest (Zip, MCC...)
        shown = frame.copy()
        for spec in config.get("input", []):
            if config_datatype(spec) != "BYTES":
                for column in [c for c in frame.columns if c == spec["name"] or c.startswith(spec["name"] + "_")]:
                    try:
                        shown[column] = pd.to_numeric(frame[column].replace("", np.nan))
                    except (TypeError, ValueError):
                        raise _usage(f"CSV column '{column}' must be numbers for {config_datatype(spec)}, got "
                                     f"{frame[column].tolist()[:3]}") from None
        return shown, frame_to_inputs(config, shown)

    # ------------------------------------------------------------------ %triton_perf
    @magic_arguments()
    @argument("model", help="the model to measure")
    @argument("--concurrency-range", default="1:8:2", help="perf_analyzer's start:end:step")
    @argument("--url", default=None, help="host:port of a remote server (default: the in-kernel server)")
    @argument("--protocol", default=None, choices=list(PROTOCOLS), help="default: TritonMagics.protocol")
    @argument("--measurement-interval", type=int, default=5000, help="milliseconds per measurement window")
    @argument("--input-data", default=None, help="random, zero, fraud or a JSON file (default: fraud for the fraud "
                                                 "ensemble's inputs, else random)")
    @argument("--rows-per-request", default="1", help="rows in each request, or a mix of sizes: 1,8,64")
    @argument("--rows-per-request-weights", default=None, help="with a mix: the share of each size, e.g. 0.7,0.2,0.1")
    @argument("--input-tensor-format", default="binary", choices=TENSOR_FORMATS, help="HTTP: request tensors")
    @argument("--output-tensor-format", default="binary", choices=TENSOR_FORMATS, help="HTTP: output tensors")
    @argument("--request-compression", default="none", choices=COMPRESSIONS, help="HTTP bodies")
    @argument("--response-compression", default="none", choices=COMPRESSIONS,
              help="HTTP: ask for compressed answers (Accept-Encoding)")
    @argument("--grpc-compression-algorithm", default="none", choices=COMPRESSIONS,
              help="gRPC: compress request messages")
    @argument("--sequence-length", type=int, default=None,
              help="sequence models: requests per sequence, about (default 20 for a model with sequence_batching)")
    @argument("--sequence-length-variation", type=float, default=20.0,
              help="sequence models: how far a sequence's length may vary, in %% (default 20)")
    @argument("--sequence-id-range", default=None, help="sequence models: START[:END] of the ids (END excluded)")
    @argument("--shared-memory", default="none", choices=SHARED_MEMORY_KINDS,
              help="system: tensors in shared-memory regions registered with the server (http or grpc)")
    @argument("--output-shared-memory-size", type=int, default=DEFAULT_OUTPUT_SHARED_MEMORY_SIZE,
              help="with --shared-memory system: bytes per row for BYTES or variable-shape outputs")
    @argument("--out", default=None, help="also store the results DataFrame in this variable")
    @line_magic
    def triton_perf(self, line: str) -> pd.DataFrame:
        """Measure throughput and latency (perf_analyzer's way) and plot throughput against latency."""
        from IPython.display import display

        from triton_nb import perf

        args = parse_argstring(self.triton_perf, line)
        concurrency = _parse_range(args.concurrency_range)
        protocol = args.protocol or self.protocol
        url = args.url if args.url is not None else self.url
        if url:
            target: Any = url
            protocol = "http" if protocol == "inprocess" else protocol
            input_data = args.input_data or "random"
        else:
            target = self._server()
            self._check_model(args.model, sorted({entry["name"] for entry in target.repository_index()}))
            input_data = args.input_data or self._default_input_data(target, args.model)
        rows = _numbers(args.rows_per_request, int, "--rows-per-request")
        weights = (_numbers(args.rows_per_request_weights, float, "--rows-per-request-weights")
                   if args.rows_per_request_weights else None)
        try:
            results = perf.measure(target, args.model, concurrency_range=concurrency, protocol=protocol,
                                   input_data=input_data, rows_per_request=rows[0] if len(rows) == 1 else rows,
                                   rows_per_request_weights=weights,
                                   wire=perf.Wire(input_tensor_format=args.input_tensor_format,
                                                  output_tensor_format=args.output_tensor_format,
                                                  request_compression=args.request_compression,
                                                  response_compression=args.response_compression,
                                                  grpc_compression_algorithm=args.grpc_compression_algorithm),
                                   measurement_interval_ms=args.measurement_interval,
                                   sequences=perf.Sequences(sequence_length=args.sequence_length,
                                                            sequence_length_variation=args.sequence_length_variation,
                                                            sequence_id_range=_unquote(args.sequence_id_range)),
                                   shared_memory=perf.SharedMemory(kind=args.shared_memory,
                                                                   output_size_bytes=args.output_shared_memory_size))
        except TritonNBError as exc:
            raise _usage(exc) from None
        figure = perf.plot_throughput_vs_latency(results)
        display(figure)
        import matplotlib.pyplot as plt

        plt.close(figure)
        if args.out:
            self.shell.user_ns[args.out] = results
        return results

    @staticmethod
    def _default_input_data(server: Any, model: str) -> str:
        from triton_nb.fraud import RAW_INPUT_COLUMNS

        try:
            names = {spec["name"] for spec in server.model_config_json(model).get("input", [])}
        except TritonNBError:
            return "random"
        return "fraud" if names == set(RAW_INPUT_COLUMNS) else "random"

    # ------------------------------------------------------------------ teardown
    def stop(self) -> None:
        """Stop the server ``%triton start`` started, if any."""
        if self.server is not None:
            self.server.stop()
            if self.shell is not None and self.shell.user_ns.get("triton_server") is self.server:
                del self.shell.user_ns["triton_server"]
            self.server = None


def _registered(ipython: Any) -> TritonMagics | None:
    return next((c for c in getattr(ipython, "configurables", []) if isinstance(c, TritonMagics)), None)


def load_ipython_extension(ipython: Any) -> None:
    """Register :class:`TritonMagics` once (loading again changes nothing)."""
    if _registered(ipython) is not None or "TritonMagics" in ipython.magics_manager.registry:
        return
    magics = TritonMagics(shell=ipython)
    ipython.register_magics(magics)
    if magics not in ipython.configurables:  # Magics adds itself in recent IPython; %config needs it there
        ipython.configurables.append(magics)


def unload_ipython_extension(ipython: Any) -> None:
    """Stop the server ``%triton start`` started (the magics stay registered, as IPython has no way back)."""
    magics = _registered(ipython) or ipython.magics_manager.registry.get("TritonMagics")
    if magics is not None:
        magics.stop()
