"""``triton-nb serve --allow-sagemaker=true`` started as SageMaker's Triton container starts: the
``SAGEMAKER_*`` variables its start script (Triton's ``docker/sagemaker/serve``) maps to flags, with
a flag on the command line winning, and ``package_for_sagemaker``'s archive served directly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.test_serve_flags import ROOT, write_model
from triton_nb.cli import _build_parser, main
from triton_nb.cli.serve import sagemaker_start
from triton_nb.repository.sagemaker import package_for_sagemaker

REQUEST = json.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}).encode()


def _parse(argv: list[str], environ: dict[str, str]):
    return _build_parser().parse_args(["serve", *sagemaker_start(argv, environ), *argv])


def test_the_start_scripts_variables_become_its_flags_and_the_command_line_wins(tmp_path: Path) -> None:
    repo = write_model(tmp_path / "repo", "good")
    environ = {"SAGEMAKER_BIND_TO_PORT": "9090", "SAGEMAKER_TRITON_LOG_VERBOSE": "2",
               "SAGEMAKER_TRITON_ALLOW_GRPC": "false", "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "4194304",
               "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--id=from-env --log-info=false"}
    args = _parse([f"--model-repository={repo}", "--allow-sagemaker=true"], dict(environ))
    assert (args.sagemaker_port, args.log_verbose, args.allow_grpc, args.server_id) == (9090, 2, False, "from-env")
    assert args.backend_config == ["python,shm-default-byte-size=4194304"]
    assert (args.model_control_mode, args.load_models) == ("explicit", ["good"])  # the only model folder
    given = _parse([f"--model-repository={repo}", "--allow-sagemaker=true", "--sagemaker-port=7070", "--id=cli"],
                   dict(environ))
    assert (given.sagemaker_port, given.server_id) == (7070, "cli")


def test_the_default_model_and_the_ping_mode_are_chosen_as_the_script_chooses_them(tmp_path: Path) -> None:
    repo = write_model(write_model(tmp_path / "repo", "one"), "two")
    environ: dict[str, str] = {}
    with pytest.raises(Exception, match=r"2 model directories in .* \(one, two\): set "
                                        r"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"):
        sagemaker_start([f"--model-repository={repo}"], environ)
    environ = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "two"}
    assert "--load-model=two" in sagemaker_start([f"--model-repository={repo}"], environ)
    assert environ["SAGEMAKER_TRITON_PING_MODE"] == "ready"
    environ = {"SAGEMAKER_MULTI_MODEL": "true"}
    assert not any(flag.startswith("--load-model") for flag in sagemaker_start([f"--model-repository={repo}"],
                                                                                 environ))
    assert environ["SAGEMAKER_TRITON_PING_MODE"] == "live"
    environ = {"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "ready"}
    sagemaker_start([f"--model-repository={repo}"], environ)
    assert environ["SAGEMAKER_TRITON_PING_MODE"] == "ready"


def test_an_inference_type_other_than_infer_is_refused_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("SAGEMAKER_TRITON_INFERENCE_TYPE", "generate")
    repo = write_model(tmp_path / "repo", "good")
    assert main(["serve", f"--model-repository={repo}", "--allow-sagemaker=true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SAGEMAKER_TRITON_INFERENCE_TYPE 'generate'" in err
    # what the start script exports is for the command's run, never left in the caller's process
    assert "SAGEMAKER_TRITON_PING_MODE" not in os.environ and "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" not in os.environ


@contextmanager
def _serving(argv: list[str], environ: dict[str, str]) -> Iterator[int]:
    process = subprocess.Popen([sys.executable, "-m", "triton_nb.cli", "serve", *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", **environ})
    lines: list[str] = []
    try:
        while not any(line.startswith("Started Sagemaker HTTPService") for line in lines):
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        yield int(lines[-1].rsplit(":", 1)[1])
    finally:
        process.terminate()
        process.wait(timeout=60)


def _post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())


def test_the_archive_is_served_in_single_and_multi_model_mode(tmp_path: Path) -> None:
    repo = write_model(tmp_path / "repo", "good")
    archive = package_for_sagemaker(repo, tmp_path / "models" / "model.tar.gz").path
    flags = [f"--model-repository={archive}", "--allow-sagemaker=true", "--allow-http=false",
             "--allow-grpc=false", "--allow-metrics=false", "--sagemaker-port=0"]
    with _serving(flags, {}) as port:  # unpacked, its only model the default
        status, answer = _post(port, "/invocations", REQUEST)
        assert (status, answer["model_name"], answer["outputs"][0]["data"]) == (200, "good", [2.0, 4.0])
    with _serving(flags, {"SAGEMAKER_MULTI_MODEL": "true"}) as port:  # the archive is a target model
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=30) as response:
            assert response.status == 200
        status, answer = _post(port, "/endpoints/local/invocations", REQUEST,
                               {"X-Amzn-SageMaker-Target-Model": "model.tar.gz"})
        assert (status, answer["model_name"], answer["outputs"][0]["data"]) == (200, "model.tar.gz", [2.0, 4.0])
