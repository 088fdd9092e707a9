"""``triton-nb perf`` and ``tune``, with perf_analyzer's and Model Analyzer's flag names."""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from triton_nb.cli._args import comma_list, environment_set, one_line_errors, positive_float, positive_int
from triton_nb.errors import TritonNBError
from triton_nb.transport import PROTOCOLS

# perf_analyzer's --percentile values (triton_nb.perf.stats.PERCENTILES; not imported here, to keep start-up light).
_PERCENTILES = (50, 90, 95, 99)


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


def _candidates(minimum: int) -> Callable[[str], list]:
    """A tune knob's candidate values, comma-separated (``0,100,500``): whole numbers, none repeated."""
    return comma_list(int, minimum=minimum, unique=True)


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
    parser.add_argument("--max-trials", "-r", type=positive_int, default=max_trials, metavar="N",
                        help=f"measurement windows per level at most, when the figures do not settle "
                             f"(default {max_trials})")
    _add_payload_options(parser)


def _add_payload_options(parser: argparse.ArgumentParser) -> None:
    """The payload flags of ``perf`` and ``tune`` (as :func:`triton_nb.perf.measure` takes them)."""
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
    group.add_argument("--batch-size-weights", type=comma_list(float, minimum=0), default=None, metavar="W,...",
                       help="with -b S1,S2,...: the share of requests of each size (default equal)")


def _rows_argument(text: str) -> int | list[int]:
    """``-b``: one number of rows per request, or a comma-separated mix of sizes (``1,8,64``)."""
    values = comma_list(int, minimum=1)(text)
    return values[0] if len(values) == 1 else values


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


def add_perf_parser(commands: argparse._SubParsersAction) -> None:
    """``triton-nb perf``, with perf_analyzer's flag names."""
    perf = one_line_errors(commands.add_parser(
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
    perf.add_argument("--measurement-interval", "-p", type=positive_int, default=5000, metavar="MS",
                      help="length of a measurement window in ms (default 5000)")
    perf.add_argument("--measurement-request-count", type=positive_int, default=None, metavar="N",
                      help="end windows after N completed requests instead of after the interval")
    perf.add_argument("--stability-percentage", "-s", type=positive_float, default=10.0,
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
    perf.add_argument("--output-shared-memory-size", type=positive_int, default=102400, metavar="BYTES",
                      help="with --shared-memory: bytes per row for an output whose size the config does not give "
                           "(BYTES or variable dims; default 102400)")
    sequences = perf.add_argument_group("sequence models", "perf_analyzer's sequence options, for stateful models "
                                        "(a model with sequence_batching gets sequences of 20 by default)")
    sequences.add_argument("--sequence-length", type=positive_int, default=None, metavar="N",
                           help="requests per sequence, about (default 20 for a sequence model)")
    sequences.add_argument("--sequence-length-variation", type=_percentage, default=20.0, metavar="PCT",
                           help="how far a sequence's length may be from --sequence-length, in %% (default 20)")
    sequences.add_argument("--sequence-id-range", default=None, metavar="START[:END]",
                           help="the sequence ids to use, END excluded, wrapping (default from 1, unbounded)")
    sequences.add_argument("--num-of-sequences", type=positive_int, default=4, metavar="N",
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


def add_tune_parser(commands: argparse._SubParsersAction) -> None:
    """``triton-nb tune``, with Model Analyzer's and perf_analyzer's flag names."""
    tune = one_line_errors(commands.add_parser(
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
    tune.add_argument("--latency-budget-ms", "--latency-budget", type=positive_float, required=True, metavar="MS",
                      help="the most a config's latency (at --percentile) may be")
    tune.add_argument("--min-throughput", type=positive_float, default=None, metavar="INFER/S")
    tune.add_argument("--search", "--run-config-search-mode", choices=("brute", "quick"), default="brute",
                      help="brute: every combination (default); quick: hill climbing from the first values")
    tune.add_argument("--objective", choices=("throughput", "latency"), default="throughput")
    tune.add_argument("--percentile", type=int, choices=_PERCENTILES, default=99,
                      help="the latency percentile the budget applies to (default 99)")
    knobs = tune.add_argument_group("knobs (comma-separated candidate values)")
    knobs.add_argument("--max-queue-delay-microseconds", type=_candidates(0), default=None, metavar="V,...")
    knobs.add_argument("--instance-count", type=_candidates(1), default=None, metavar="V,...")
    knobs.add_argument("--max-batch-size", type=_candidates(1), default=None, metavar="V,...")
    knobs.add_argument("--preferred-batch-size", type=_candidates(1), default=None, metavar="V,...",
                       help="each value is one preferred batch size to try")
    tune.add_argument("--concurrency-range", type=_load_range(whole=True), default=list(range(1, 33)),
                      metavar="START[:END[:STEP]]",
                      help="the load levels of each config's sweep (default 1:32:1, as perf.tune's)")
    tune.add_argument("--measurement-interval", "-p", type=positive_int, default=2000, metavar="MS",
                      help="length of a measurement window in ms (default 2000)")
    tune.add_argument("--write-config", action="store_true",
                      help="write the recommended config to DIR/<tuned model>/config.pbtxt (--model-repository only)")
    tune.add_argument("--plots", type=Path, default=None, metavar="DIR",
                      help="write throughput_vs_latency.png, and knob_heatmap.png when two knobs vary, into DIR")
    replay = tune.add_argument_group(
        "replay on real Triton",
        "after the sweep, measure its best configs again on a running tritonserver in explicit model control mode, "
        "as the sweep measured them, and print both rankings side by side")
    replay.add_argument("--replay-url", default=None, metavar="HOST:PORT|start",
                        help="the tritonserver to replay on, reached over -i grpc, else http; checked before "
                             "the sweep starts, and left with its original config. 'start': start the "
                             "nvidia-pytriton wheel's tritonserver over the Python twin of --model-repository "
                             "for the replay, and stop it after")
    replay.add_argument("--replay-top", type=positive_int, default=3, metavar="N",
                        help="how many of the sweep's best configs to replay, the recommended one always (default 3)")
    replay.add_argument("--replay-rounds", type=positive_int, default=2, metavar="N",
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
            with environment_set(sagemaker):
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


def perf_command(args: argparse.Namespace) -> int:
    from triton_nb.perf.commands import run_perf  # the perf modules load pandas: only for this command

    return run_perf(args, _perf_target)


def tune_command(args: argparse.Namespace) -> int:
    from triton_nb.perf.commands import run_tune

    knobs = {name: ([(value,) for value in values] if name == "preferred_batch_size" else values)
             for name in _KNOB_FLAGS if (values := getattr(args, name)) is not None}
    return run_tune(args, _perf_target, knobs)
