"""tritonserver's command line, pasted into ``triton-nb serve``: every flag of the real
``tritonserver --help`` (2.51) is taken; the ones that work do what tritonserver does with them (the
logging flags, ``--id``, ``--exit-on-error``, ``--strict-readiness``, ``--model-load-retry-count``,
``--backend-config`` for the Python backend's process instances); every other one says, in one line
at start, that it has no effect here and why; SageMaker and Vertex AI modes and gRPC SSL are refused
when asked for. The answers of real Triton these match are in test_real_triton_flags.py."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.real_triton import _layout, tritonserver_unavailable_reason
from triton_nb.cli import _build_parser, main
from triton_nb.cli.serve import _serve_no_effect_lines, _serve_settings
from triton_nb.server.core import Server
from triton_nb.server.settings import ServerSettings
from triton_nb.tensors import InferRequest

ROOT = Path(__file__).resolve().parents[1]

CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [{{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }}]
output [{{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }}]
'''
MODEL_PY = '''
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        {initialize}

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", 2 * pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
'''


def write_model(repo: Path, name: str, initialize: str = "pass") -> Path:
    """A Python model doubling its input; ``initialize`` is the body of its initialize."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    (repo / name / "1" / "model.py").write_text(MODEL_PY.format(initialize=initialize))
    return repo


def good_and_broken(repo: Path) -> Path:
    """A repository with one model that loads and one whose initialize raises."""
    write_model(repo, "good")
    return write_model(repo, "broken", "raise RuntimeError('boom at initialize')")


def _serve_parser() -> argparse.ArgumentParser:
    commands = next(a for a in _build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["serve"]


def _parse(repo: Path, *flags: str) -> argparse.Namespace:
    return _serve_parser().parse_args(["--model-repository", str(repo), *flags])


def tritonserver_help() -> str:
    layout = _layout()
    libs = [str(layout.libs)] + ([str(layout.libpython_dir)] if layout.libpython_dir else [])
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(libs)}
    # tritonserver prints its usage and exits 1 for --help
    result = subprocess.run([str(layout.binary), "--help"], capture_output=True, text=True, env=env, timeout=60,
                            check=False)
    return result.stdout + result.stderr


def example_values(tmp_path: Path) -> dict[str, list[str]]:
    """A valid command-line value of each tritonserver flag whose type alone does not give one (with
    what it needs beside it)."""
    folder = str(tmp_path)
    return {
        "model-repository": [f"--model-repository={folder}"], "model-store": [f"--model-store={folder}"],
        "backend-directory": [f"--backend-directory={folder}"], "log-file": [f"--log-file={tmp_path / 'log'}"],
        "log-format": ["--log-format=ISO8601"], "model-control-mode": ["--model-control-mode=poll"],
        "load-model": ["--load-model=a", "--model-control-mode=explicit"],
        "rate-limit": ["--rate-limit=execution_count"],
        "rate-limit-resource": ["--rate-limit-resource=R:2:0", "--rate-limit=execution_count"],
        "http-restricted-api": ["--http-restricted-api=health:key=value"],
        "grpc-restricted-protocol": ["--grpc-restricted-protocol=inference:key=value"],
        "metrics-config": ["--metrics-config=summary_latencies=true"],
        "cache-config": ["--cache-config=local,size=1048576"],
        "backend-config": ["--backend-config=python,shm-default-byte-size=16777216"],
        "trace-config": ["--trace-config=rate=100"], "host-policy": ["--host-policy=gpu_0,numa-node=0"],
        "sagemaker-safe-port-range": ["--sagemaker-safe-port-range=8000-8999"],
        "cuda-memory-pool-byte-size": ["--cuda-memory-pool-byte-size=0:67108864"],
        "cuda-virtual-address-size": ["--cuda-virtual-address-size=0:1073741824"],
        "model-load-gpu-limit": ["--model-load-gpu-limit=0:0.8"],
        "grpc-infer-response-compression-level": ["--grpc-infer-response-compression-level=high"],
        "min-supported-compute-capability": ["--min-supported-compute-capability=7.5"],
        "metrics-interval-ms": ["--metrics-interval-ms=1000.5"], "disable-auto-complete-config": [
            "--disable-auto-complete-config"], "trace-level": ["--trace-level=TIMESTAMPS"],
    }


@pytest.mark.real_triton
def test_every_flag_of_the_real_tritonserver_help_is_taken(tmp_path):
    reason = tritonserver_unavailable_reason()
    assert reason is None, reason
    listed = re.findall(r"^  --([a-z0-9-]+)(?: <(.+)>)?$", tritonserver_help(), flags=re.MULTILINE)
    assert len(listed) > 80 and ("strict-readiness", "boolean") in listed  # the usage was read
    examples = example_values(tmp_path)
    by_type = {"boolean": "false", "integer": "3", "float": "2.5", "string": "name"}
    refused = []
    for flag, kind in listed:
        if flag == "help":
            continue
        flags = examples.get(flag) or [f"--{flag}={by_type[kind]}"]
        try:
            base = [] if flag in ("model-repository", "model-store") else ["--model-repository", str(tmp_path)]
            args = _serve_parser().parse_args([*base, *flags])
            assert isinstance(_serve_settings(args), ServerSettings)
        except (SystemExit, Exception) as exc:
            refused.append(f"{' '.join(flags)}: {exc!r}")
    assert refused == []


def test_a_flag_with_no_effect_says_so_in_one_line_naming_it_and_why(tmp_path):
    lines = _serve_no_effect_lines(_parse(tmp_path, "--http-thread-count", "8", "--log-info=false"))
    assert lines == ["--http-thread-count has no effect here: HTTP is served by one event loop, not a pool of threads"]
    # repeated, still one line
    lines = _serve_no_effect_lines(_parse(tmp_path, "--trace-config=rate=1", "--trace-config=level=TIMESTAMPS"))
    assert len(lines) == 1 and lines[0].startswith("--trace-config has no effect here: ")
    assert _serve_no_effect_lines(_parse(tmp_path, "--strict-readiness=false", "--id=x")) == []


@pytest.mark.parametrize(("flag", "words"), [
    ("--allow-vertex-ai=1", "--allow-vertex-ai=true: Vertex AI mode is not available in this version"),
    ("--grpc-use-ssl=on", "--grpc-use-ssl=true: gRPC over SSL is not available in this version"),
])
def test_a_mode_this_version_lacks_is_refused_in_one_line(tmp_path, capsys, flag, words):
    assert main(["serve", "--model-repository", str(tmp_path), flag]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert _serve_settings(_parse(tmp_path, flag.split("=")[0] + "=false")) == _serve_settings(_parse(tmp_path))


@pytest.mark.parametrize(("flags", "words"), [
    (["--strict-readiness=maybe"], "argument --strict-readiness: expected true or false, got 'maybe'"),
    (["--strict-readiness"], "argument --strict-readiness: expected one argument"),  # tritonserver needs the value
    (["--log-verbose=loud"], "argument --log-verbose: expected a verbosity level (0, 1...) or true/false, got 'loud'"),
    (["--http-thread-count=many"], "argument --http-thread-count: expected a whole number, got 'many'"),
    (["--backend-config=python,stub-timeout-seconds=0"], "stub-timeout-seconds must be >= 1 s, got 0"),
    (["--backend-config=,shm-default-byte-size=1"], "--backend-config names no backend before ','"),
    (["--response-cache-byte-size=10", "--cache-config=local,size=10"],
     "--response-cache-byte-size and --cache-config"),
])
def test_a_bad_value_is_one_line_naming_the_flag_and_the_value(tmp_path, capfd, flags, words):
    if "argument" in words:  # argparse's refusal ends the command with status 2
        with pytest.raises(SystemExit, match="2"):
            main(["serve", "--model-repository", str(tmp_path), *flags])
    else:
        assert main(["serve", "--model-repository", str(tmp_path), *flags]) == 2
    err = capfd.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(("flags", "verbose", "log_info"), [
    (["--log-verbose=true"], 1, True), (["--log-verbose", "2", "--log-info", "off"], 2, False),
])
def test_the_logging_flags_read_as_tritonserver_reads_them(tmp_path, flags, verbose, log_info):
    settings = _serve_settings(_parse(tmp_path, *flags))
    assert (settings.log_verbose, settings.log_info) == (verbose, log_info)


def test_the_deprecated_spellings_work_as_their_replacements(tmp_path):
    args = _parse(tmp_path, "--strict-model-config=true", "--response-cache-byte-size=4096")
    settings = _serve_settings(args)
    assert settings.disable_auto_complete_config and settings.cache_size_bytes == 4096
    assert [line.split(" is ")[0] for line in _serve_no_effect_lines(args)] == [
        "--strict-model-config", "--response-cache-byte-size"]


def test_only_one_model_repository_is_served(tmp_path, capsys):
    assert main(["serve", "--model-repository", str(tmp_path), "--model-store", str(tmp_path / "b")]) == 2
    assert "--model-repository: one repository is served here, got 2" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the server's side


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_strict_readiness_needs_every_model_and_without_it_a_live_server_is_ready(tmp_path):
    repo = good_and_broken(tmp_path / "repo")
    for strict, status in ((True, 400), (False, 200)):
        with Server(repo, model_control_mode="none", strict_readiness=strict, http_port=0) as server:
            assert not server.is_model_ready("broken") and server.is_model_ready("good")
            assert server.is_server_ready() is (not strict)
            assert _get(f"http://127.0.0.1:{server.http_port}/v2/health/ready")[0] == status


def test_exit_on_error_fails_the_start_naming_the_model_and_off_serves_the_rest(tmp_path):
    repo = good_and_broken(tmp_path / "repo")
    with pytest.raises(Exception, match=r"failed to load all models: 'broken': .*boom at initialize") as failure:
        Server(repo, model_control_mode="none", exit_on_error=True).start()
    assert type(failure.value).__name__ == "ModelLoadFailedError"
    with Server(repo, model_control_mode="none") as server:  # in process, the default is off
        assert server.is_model_ready("good")


def test_the_id_is_the_servers_name_in_its_metadata(tmp_path):
    import tritonclient.grpc as grpcclient

    with Server(write_model(tmp_path / "repo", "good"), server_id="fraud-east", http_port=0, grpc_port=0) as server:
        assert b'"name":"fraud-east"' in _get(f"http://127.0.0.1:{server.http_port}/v2")[1]
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            assert client.get_server_metadata().name == "fraud-east"
        finally:
            client.close()


def test_the_log_flags_choose_severities_format_and_file(tmp_path):
    repo = good_and_broken(tmp_path / "repo")
    log_file = tmp_path / "server.log"
    with Server(repo, model_control_mode="none", log_file=log_file, log_format="ISO8601"):
        pass
    text = log_file.read_text()
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ W \d+ core\.py:\d+\] model 'broken' failed to load", text,
                     flags=re.MULTILINE), text
    log_file.unlink()
    with Server(repo, model_control_mode="none", log_file=log_file, log_warning=False):
        pass
    assert "failed to load" not in log_file.read_text()
    with Server(repo, model_control_mode="none", log_file=log_file, log_verbose=1):
        pass
    assert re.search(r"^W\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ core\.py:\d+\] model 'broken'", log_file.read_text(),
                     flags=re.MULTILINE)


def test_model_load_retry_count_tries_a_failed_load_again(tmp_path):
    marker = tmp_path / "tried"
    # fails the first time only: a model whose resource appears after its first attempt
    repo = write_model(tmp_path / "repo", "flaky", f"first = not os.path.exists({str(marker)!r}); "
                       f"open({str(marker)!r}, 'w').close()\n        if first: raise RuntimeError('not yet')")
    with Server(repo, model_control_mode="none") as server:
        assert not server.is_model_ready("flaky")
    marker.unlink()
    with Server(repo, model_control_mode="none", model_load_retry_count=1) as server:
        assert server.is_model_ready("flaky")


def test_model_load_thread_count_loads_models_at_once_and_ensembles_after(tmp_path):
    repo = tmp_path / "repo"
    for name in ("a", "b", "c"):
        write_model(repo, name)
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text('''name: "chain"
platform: "ensemble"
max_batch_size: 0
input [{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }]
ensemble_scheduling { step [
  { model_name: "a" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "t" } },
  { model_name: "b" model_version: -1 input_map { key: "X" value: "t" } output_map { key: "Y" value: "Y" } }
] }
''')
    with Server(repo, model_control_mode="none", model_load_thread_count=4) as server:
        assert server.is_server_ready()
        response = server.infer(InferRequest("chain", {"X": np.array([1, 2], dtype=np.float32)}))
        np.testing.assert_array_equal(response.outputs["Y"], [4, 8])


def test_the_python_backend_config_sizes_and_names_a_process_instances_arena(tmp_path):
    repo = write_model(tmp_path / "repo", "good")
    prefix = f"flagtest{os.getpid()}_"
    settings = ServerSettings(model_control_mode="none", python_instances="process", backend_config=(
        "python,shm-default-byte-size=4194304", f"python,shm-region-prefix-name={prefix}",
        "python,stub-timeout-seconds=60", "python,shm-growth-byte-size=1048576"))
    with Server(repo, settings) as server:
        server.infer(InferRequest("good", {"X": np.array([1, 2], dtype=np.float32)}))
        arenas = [entry for entry in os.scandir("/dev/shm") if entry.name.startswith(prefix)]
        assert arenas and {entry.stat().st_size for entry in arenas} == {4194304}


def test_the_sagemaker_start_scripts_command_line_serves_with_one_line_per_inert_flag(tmp_path):
    # docker/sagemaker/serve's command line with every optional variable set, as the script runs it
    # (--sagemaker-port=0 for a free port)
    repo = write_model(tmp_path / "repo", "good")
    flags = ["--allow-sagemaker=true", "--allow-http=false", "--model-control-mode=explicit",
             f"--model-repository={repo}", "--model-namespacing=true", "--sagemaker-port=0",
             "--sagemaker-safe-port-range=8000-8999",
             "--allow-grpc=false", "--allow-metrics=false", "--buffer-manager-thread-count=2",
             "--sagemaker-thread-count=16", "--log-verbose=true", "--log-info=true", "--log-warning=true",
             "--log-error=true", "--backend-config=python,shm-default-byte-size=16777216",
             "--backend-config=python,shm-growth-byte-size=1048576", "--backend-config=tensorflow,version=2",
             "--model-load-gpu-limit", "0:0.8", "--load-model=good"]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "good"}
    process = subprocess.Popen([sys.executable, "-m", "triton_nb.cli", "serve", *flags], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=environment)
    lines: list[str] = []
    try:
        while not any(line.startswith("Started Sagemaker HTTPService") for line in lines):
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert not any(line.startswith("Started HTTPService") for line in lines)  # --allow-http=false
        port = int(lines[-1].rsplit(":", 1)[1])
        assert _get(f"http://127.0.0.1:{port}/ping")[0] == 200
    finally:
        process.terminate()
        process.wait(timeout=60)
    inert = ["--model-namespacing", "--sagemaker-safe-port-range", "--buffer-manager-thread-count",
             "--sagemaker-thread-count", "--model-load-gpu-limit", "python,shm-growth-byte-size",
             "tensorflow,version"]
    said = [line for line in lines if "has no effect here" in line]
    for flag in inert:
        assert sum(flag in line for line in said) == 1, (flag, said)
    assert len(said) == len(inert)
    # the server's own warnings reach the console in tritonserver's format
    assert any(re.match(r"W\d{4} \S+ \d+ core\.py:\d+\] --backend-config=tensorflow,version=2 has no effect", line)
               for line in lines), said
