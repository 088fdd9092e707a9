"""``triton-nb perf`` and ``triton-nb tune``: tables, perf_analyzer's CSV, plots, configs, one-line errors."""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers.scale_models import write_picky_model, write_scale_model
from triton_nb import serve
from triton_nb.cli import main
from triton_nb.perf.options import Sequences, SharedMemory, Wire
from triton_nb.repository.config import load_config

PERF_ANALYZER_HEADER = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
                        "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,"
                        "p90 latency,p95 latency,p99 latency,Avg latency")
SHORT = ["--measurement-interval", "200", "--max-trials", "3"]


@pytest.fixture
def repo(tmp_path):
    write_scale_model(tmp_path / "repo", extra="dynamic_batching { max_queue_delay_microseconds: 100 }")
    return tmp_path / "repo"


def _table(printed: str, first: str) -> list[list[str]]:
    """The rows of the summary table whose header starts with ``first``."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    rows = []
    for line in lines[start + 1:]:
        if not re.match(r"^\s+\d", line):
            break
        rows.append(line.split())
    return rows


def test_perf_concurrency_in_process_writes_csv_and_plots(repo, tmp_path, capsys):
    csv, plots = tmp_path / "out.csv", tmp_path / "plots"
    assert main(["perf", "-m", "scale", "--model-repository", str(repo), "--concurrency-range", "1:2:1", *SHORT,
                 "-f", str(csv), "--plots", str(plots)]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("Concurrency"))
    for column in ("Infer/s", "p50 usec", "p90 usec", "p95 usec", "p99 usec", "Avg usec", "Queue usec",
                   "Compute usec"):
        assert column in header
    rows = _table(printed, "Concurrency")
    assert [row[0] for row in rows] == ["1", "2"]
    assert all(float(row[1]) > 0 and int(row[2]) > 0 for row in rows)
    lines = csv.read_text().splitlines()
    assert lines[0] == PERF_ANALYZER_HEADER
    assert [line.split(",")[0] for line in lines[1:]] == ["1", "2"]
    for name in ("throughput_vs_latency.png", "latency_breakdown.png"):
        assert (plots / name).stat().st_size > 1000, name


def test_perf_prints_the_first_error_of_a_level_whose_requests_fail(tmp_path, capsys):
    write_picky_model(tmp_path / "repo")
    data = tmp_path / "data.json"
    data.write_text('{"data": [{"X": [-1.0, 2.0]}]}')
    assert main(["perf", "-m", "picky", "--model-repository", str(tmp_path / "repo"), "--concurrency-range", "1",
                 "--input-data", str(data), *SHORT]) == 0
    printed = capsys.readouterr().out
    (row,) = _table(printed, "Concurrency")
    assert row[-1] == "error(s)"  # the row's note: "<n> error(s)"
    assert "  first error: model 'picky': input 'X' must not be negative" in printed.splitlines()


def test_perf_request_rate_over_http_with_a_repository(repo, tmp_path, capsys):
    csv = tmp_path / "rate.csv"
    assert main(["perf", "-m", "scale", "--model-repository", str(repo), "-i", "http", "--request-rate-range",
                 "50:100:50", "--request-distribution", "poisson", *SHORT, "-f", str(csv)]) == 0
    printed = capsys.readouterr().out
    assert "over http" in printed
    assert [row[0] for row in _table(printed, "Request Rate")] == ["50", "100"]
    lines = csv.read_text().splitlines()
    assert lines[0] == PERF_ANALYZER_HEADER.replace("Concurrency", "Request Rate", 1)
    assert len(lines) == 3


def test_perf_over_sagemakers_invocations_with_json_bodies(repo, capsys):
    before = os.environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")
    assert main(["perf", "-m", "scale", "--model-repository", str(repo), "-i", "sagemaker", "--concurrency-range",
                 "1", "--input-tensor-format", "json", "--output-tensor-format", "json", *SHORT]) == 0
    # set while the server was made, as the container's variable; not left behind in this process
    assert os.environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME") == before
    printed = capsys.readouterr().out
    assert "over sagemaker" in printed
    (row,) = _table(printed, "Concurrency")
    assert row[0] == "1" and "error" not in " ".join(row)


def test_tune_writes_the_recommended_config_and_plots(repo, tmp_path, capsys):
    plots = tmp_path / "tplots"
    assert main(["tune", "-m", "scale", "--model-repository", str(repo), "--latency-budget-ms", "100",
                 "--max-queue-delay-microseconds", "0,300", "--instance-count", "1,2", "--concurrency-range", "1",
                 *SHORT, "--write-config", "--plots", str(plots)]) == 0
    printed = capsys.readouterr().out
    ranking = printed[printed.index("Rank"):].splitlines()
    assert ranking[0].split()[:3] == ["Rank", "Config", "Meets"]
    assert [line.split()[0] for line in ranking[1:5]] == ["1", "2", "3", "4"]
    found = re.search(r"recommended for 'scale': max_queue_delay_microseconds=(\d+), instance_count=(\d+)", printed)
    assert found, printed
    config = load_config(repo / "scale" / "config.pbtxt")
    assert config.name == "scale"
    assert config.dynamic_batching.max_queue_delay_microseconds == int(found[1])
    assert config.instance_group[0].count == int(found[2])
    assert f"wrote {repo / 'scale' / 'config.pbtxt'}" in printed
    for name in ("throughput_vs_latency.png", "knob_heatmap.png"):
        assert (plots / name).stat().st_size > 1000, name


def test_perf_and_tune_by_url_print_the_config_instead_of_writing_it(repo, capsys):
    before = (repo / "scale" / "config.pbtxt").read_text()
    with serve(repo, http_port=0, network_model_control=True) as server:
        url = server.endpoints["http"]
        assert main(["perf", "-m", "scale", "-u", url, "--concurrency-range", "1", *SHORT]) == 0
        assert [row[0] for row in _table(capsys.readouterr().out, "Concurrency")] == ["1"]
        assert main(["tune", "-m", "scale", "-u", url, "--latency-budget-ms", "100", "--preferred-batch-size",
                     "2,4", "--concurrency-range", "1", *SHORT]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"recommended for 'scale': preferred_batch_size=\[[24]\]", printed)
    assert "recommended config.pbtxt:" in printed and "preferred_batch_size" in printed
    assert (repo / "scale" / "config.pbtxt").read_text() == before


def test_tune_replays_its_top_configs_on_a_server_by_url(repo, tmp_path, capsys):
    """The whole --replay-url path against a second in-kernel server by URL (real Triton's own test
    is tests/perf/test_real_triton_replay.py)."""
    other = tmp_path / "other"
    write_scale_model(other, extra="dynamic_batching { max_queue_delay_microseconds: 100 }")
    with serve(other, http_port=0, network_model_control=True) as server:
        url = server.endpoints["http"]
        assert main(["tune", "-m", "scale", "--model-repository", str(repo), "--latency-budget-ms", "100",
                     "--max-queue-delay-microseconds", "0,300", "--concurrency-range", "1", *SHORT,
                     "--replay-url", url, "--replay-top", "1", "--replay-rounds", "1"]) == 0
        delay = server.client().get_model_config("scale")["dynamic_batching"]["max_queue_delay_microseconds"]
    printed = capsys.readouterr().out
    assert "Triton rank" in printed and "(our pick)" in printed
    assert re.search(rf"real Triton at {re.escape(url)} gives our pick 'delay_us=\d+' 1\.00 of the best", printed)
    assert delay == 100  # the server's own config is back


@pytest.mark.parametrize(("argv", "message"), [
    (["perf", "-m", "scale", "--model-repository", "REPO"], r"--concurrency-range --request-rate-range is required"),
    (["perf", "-m", "scale", "--model-repository", "REPO", "--concurrency-range", "1", "--request-rate-range", "5"],
     r"not allowed with"),
    (["perf", "-m", "scale", "-u", "localhost:1", "-i", "inprocess", "--concurrency-range", "1"],
     r"-i inprocess needs --model-repository"),
    (["perf", "-m", "scale", "-u", "localhost:1", "-i", "udp", "--concurrency-range", "1"], r"invalid choice: 'udp'"),
    (["perf", "-m", "scale", "--model-repository", "REPO", "--concurrency-range", "2:1"], r"'2:1'"),
    (["perf", "-m", "scale", "--model-repository", "REPO", "--concurrency-range", "1",
      "--request-distribution", "poisson"], r"--request-distribution applies to --request-rate-range only"),
    (["perf", "-m", "nosuch", "--model-repository", "REPO", "--concurrency-range", "1"], r"nosuch"),
    (["perf", "-m", "scale", "-u", "127.0.0.1:1", "--concurrency-range", "1"], r"127\.0\.0\.1:1"),
    (["tune", "-m", "scale", "--model-repository", "REPO", "--latency-budget-ms", "5"],
     r"give at least one knob to vary"),
    (["tune", "-m", "scale", "--model-repository", "REPO", "--latency-budget-ms", "5", "--instance-count", "1,x"],
     r"--instance-count"),
    (["tune", "-m", "scale", "-u", "localhost:1", "--latency-budget-ms", "5", "--instance-count", "1,2",
      "--write-config"], r"--write-config needs --model-repository"),
    (["tune", "-m", "scale", "--model-repository", "REPO", "--latency-budget-ms", "5", "--instance-count", "1",
      "--replay-url", "127.0.0.1:1"], r"^triton-nb tune: error: replay on 127\.0\.0\.1:1: "),
    (["tune", "-m", "scale", "--model-repository", "REPO", "--latency-budget-ms", "5", "--instance-count", "1",
      "--replay-url", "127.0.0.1:1", "--replay-top", "0"], r"--replay-top"),
])
def test_mistakes_exit_2_with_one_line(repo, capsys, argv, message):
    argv = [str(repo) if arg == "REPO" else arg for arg in argv]
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own checks
        status = exc.code
    assert status == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"triton-nb {argv[0]}: error: ")
    assert re.search(message, lines[0]), lines[0]


def _exits_2_with_one_line(repo, capsys, flags: list[str], message: str) -> None:
    """``triton-nb perf`` with ``flags`` exits 2 with one line on stderr matching ``message``."""
    try:
        status = main(["perf", "-m", "scale", "--model-repository", str(repo), "--concurrency-range", "1", *flags])
    except SystemExit as exc:  # argparse's own checks
        status = exc.code
    assert status == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1, captured.err
    assert re.search(message, captured.err), captured.err


@pytest.fixture
def measured_options(monkeypatch):
    """The options each ``perf.measure`` call got from the command, in order (the calls still run)."""
    import triton_nb.perf

    seen: list[dict] = []
    real_measure = triton_nb.perf.measure

    def recording_measure(*args, **options):
        seen.append(options)
        return real_measure(*args, **options)

    monkeypatch.setattr(triton_nb.perf, "measure", recording_measure)
    return seen


def test_perf_sequence_flags_reach_the_measurement(tmp_path, capsys, measured_options):
    from tests.helpers.sequence_models import write_sequence_models


    write_sequence_models(tmp_path / "seq")
    seen = measured_options
    assert main(["perf", "-m", "card_count", "--model-repository", str(tmp_path / "seq"), "-i", "grpc",
                 "--concurrency-range", "2", "--sequence-length", "3", "--sequence-length-variation", "0",
                 "--sequence-id-range", "100:104", *SHORT]) == 0
    rows = _table(capsys.readouterr().out, "Concurrency")
    assert [row[0] for row in rows] == ["2"] and "error" not in " ".join(rows[0])
    assert seen[0]["sequences"] == Sequences(sequence_length=3, sequence_length_variation=0.0,
                                             sequence_id_range="100:104", num_of_sequences=4)


@pytest.mark.parametrize(("flags", "message"), [
    (["--sequence-length", "0"], r"argument --sequence-length: expected"),
    (["--sequence-length-variation", "-5"], r"argument --sequence-length-variation: expected a percentage >= 0"),
    (["--sequence-id-range", "0:5"], r"--sequence-id-range: sequence_id_range must start at 1"),
    (["--sequence-id-range", "9:3"], r"--sequence-id-range: .*the end is excluded"),
    (["--num-of-sequences", "0"], r"argument --num-of-sequences"),
])
def test_bad_sequence_flags_exit_2_with_one_line(repo, capsys, flags, message):
    _exits_2_with_one_line(repo, capsys, flags, message)


def test_perf_shared_memory_flags_reach_the_measurement(repo, capsys, measured_options):
    seen = measured_options
    assert main(["perf", "-m", "scale", "--model-repository", str(repo), "-i", "http", "--concurrency-range", "2",
                 "--shared-memory", "system", "--output-shared-memory-size", "4096", *SHORT]) == 0
    printed = capsys.readouterr().out
    assert "tensors in system shared memory" in printed
    rows = _table(printed, "Concurrency")
    assert [row[0] for row in rows] == ["2"] and "error" not in " ".join(rows[0])
    assert seen[0]["shared_memory"] == SharedMemory(kind="system", output_size_bytes=4096)


@pytest.mark.parametrize(("flags", "message"), [
    (["--shared-memory", "cuda", "-i", "http"], r"argument --shared-memory: cuda is not supported: CUDA shared "
                                                r"memory needs a GPU; use system"),
    (["--shared-memory", "system"], r"--shared-memory system needs -i http or -i grpc"),
    (["--shared-memory", "posix"], r"argument --shared-memory: expected none or system, got 'posix'"),
    (["--shared-memory", "system", "-i", "grpc", "--output-shared-memory-size", "0"],
     r"argument --output-shared-memory-size"),
])
def test_bad_shared_memory_flags_exit_2_with_one_line(repo, capsys, flags, message):
    _exits_2_with_one_line(repo, capsys, flags, message)


def test_perf_payload_flags_reach_the_measurement_and_the_table(repo, capsys, measured_options):
    seen = measured_options
    assert main(["perf", "-m", "scale", "--model-repository", str(repo), "-i", "http", "--concurrency-range", "2",
                 "--input-tensor-format", "json", "--output-tensor-format", "json", "--request-compression", "gzip",
                 "--response-compression", "deflate", "-b", "1,4", "--batch-size-weights", "3,1", *SHORT]) == 0
    printed = capsys.readouterr().out
    assert "input tensor format json" in printed and "{1: 3, 4: 1} row(s) per request" in printed
    header = next(line for line in printed.splitlines() if line.startswith("Concurrency"))
    assert "Req bytes" in header and "Resp bytes" in header
    row = _table(printed, "Concurrency")[0]
    assert int(row[9]) > 0 and int(row[10]) > 0  # the bytes, after the level and eight timings
    assert seen[0]["wire"] == Wire(input_tensor_format="json", output_tensor_format="json",
                                   request_compression="gzip", response_compression="deflate")
    assert (seen[0]["rows_per_request"], seen[0]["rows_per_request_weights"]) == ([1, 4], [3.0, 1.0])


@pytest.mark.parametrize(("flags", "message"), [
    (["--input-tensor-format", "json"], r"--input-tensor-format applies to -i http or -i sagemaker, not inprocess"),
    (["--request-compression", "gzip", "-i", "grpc"], r"--request-compression applies to -i http, not grpc"),
    (["--grpc-compression-algorithm", "gzip", "-i", "http"], r"--grpc-compression-algorithm applies to -i grpc"),
    (["--input-tensor-format", "csv"], r"argument --input-tensor-format: invalid choice: 'csv'"),
    (["-b", "1,x"], r"argument -b/--batch-size: expected comma-separated whole numbers"),
    (["-b", "1,4", "--batch-size-weights", "1"], r"--batch-size-weights gives 1 weight\(s\) for 2 size\(s\)"),
])
def test_bad_payload_flags_exit_2_with_one_line(repo, capsys, flags, message):
    _exits_2_with_one_line(repo, capsys, flags, message)


def test_tune_sweeps_the_same_load_levels_by_default_as_perf_tune():
    import inspect

    from triton_nb.cli import _build_parser
    from triton_nb.perf import tune
    from triton_nb.perf.stats import parse_range

    args = _build_parser().parse_args(["tune", "-m", "m", "--model-repository", "r", "--latency-budget-ms", "10"])
    default = inspect.signature(tune).parameters["concurrency_range"].default
    assert args.concurrency_range == [int(c) for c in parse_range(default, "concurrency_range")]
