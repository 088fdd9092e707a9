"""``triton-nb serve`` and real tritonserver 2.51 on the same repository (one model that loads, one
whose initialize raises), with the same flags: by default (``--exit-on-error`` true) both exit with
status 1 naming the failed model; with ``--exit-on-error=false`` both serve the rest, and
``/v2/health/ready`` answers 400 with strict readiness and 200 without; ``--id`` names both."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import tritonclient.http as httpclient

from tests.helpers.real_triton import RealTritonServer, TritonServerStartError, tritonserver_unavailable_reason
from tests.helpers.waiting import wait_until
from tests.test_serve_flags import ROOT, _get, good_and_broken, write_model

pytestmark = pytest.mark.real_triton


@pytest.fixture(autouse=True)
def _needs_tritonserver() -> None:
    reason = tritonserver_unavailable_reason()
    assert reason is None, reason


def _serve(repo, *flags: str) -> tuple[subprocess.Popen[str], int, list[str]]:
    """triton-nb serve on HTTP only; its process, HTTP port and lines until it started (or ended)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "triton_nb.cli", "serve", f"--model-repository={repo}", "--http-port=0",
         "--allow-grpc=false", "--allow-metrics=false", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines: list[str] = []
    while line := process.stdout.readline():
        lines.append(line)
        if line.startswith("Started HTTPService"):
            return process, int(line.rsplit(":", 1)[1]), lines
    process.wait(timeout=60)
    return process, 0, lines


def test_by_default_both_exit_with_status_1_naming_the_model_that_failed(tmp_path):
    repo = good_and_broken(tmp_path / "repo")
    with pytest.raises(TritonServerStartError, match=r"exited with code 1") as real:
        RealTritonServer(repo, wait_for="live").start()
    assert "failed to load 'broken'" in str(real.value)
    assert "error: creating server: Internal - failed to load all models" in str(real.value)
    process, port, lines = _serve(repo)
    assert port == 0 and process.returncode == 1, "".join(lines)
    assert "error: creating server: failed to load all models: 'broken': " in "".join(lines)
    assert "boom at initialize" in lines[-1]
    # the model table, as tritonserver prints it before it exits: what loaded, what did not and why
    assert any(re.match(r"\| good +\| 1 +\| READY", line) for line in lines), "".join(lines)
    assert any(re.match(r"\| broken .*UNAVAILABLE: .*boom at initialize", line) for line in lines), "".join(lines)


def _unload_and_ask(url: str) -> list[int]:
    """Unload model a, wait until the index says it is unloaded, then ask server and model readiness."""
    client = httpclient.InferenceServerClient(url)
    client.unload_model("a")
    wait_until(lambda: any(entry["name"] == "a" and entry.get("reason") == "unloaded"
                           for entry in client.get_model_repository_index()), "model a unloaded")
    client.close()
    return [_get(f"http://{url}{path}")[0] for path in ("/v2/health/ready", "/v2/models/a/ready")]


def test_an_unloaded_model_leaves_a_strictly_ready_server_ready_on_both(tmp_path):
    repo = write_model(write_model(tmp_path / "repo", "a"), "b")
    flags = ("--model-control-mode=explicit", "--load-model=a")
    with RealTritonServer(repo, extra_args=flags) as real:
        expected = _unload_and_ask(real.http_url)
    assert expected == [200, 400]  # real Triton's answers, the reference
    process, port, _ = _serve(repo, *flags)
    try:
        assert _unload_and_ask(f"127.0.0.1:{port}") == expected
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.mark.parametrize(("strict", "status"), [("true", 400), ("false", 200)])
def test_without_exit_on_error_both_serve_and_answer_readiness_alike(tmp_path, strict, status):
    repo = good_and_broken(tmp_path / "repo")
    flags = ("--exit-on-error=false", f"--strict-readiness={strict}", "--id=fraud-east")
    with RealTritonServer(repo, wait_for="live", extra_args=flags) as real:
        expected = {path: _get(f"http://{real.http_url}{path}")[0]
                    for path in ("/v2/health/ready", "/v2/models/good/ready", "/v2/models/broken/ready")}
        real_name = _get(f"http://{real.http_url}/v2")[1]
    assert expected["/v2/health/ready"] == status  # what real Triton answered, the reference
    process, port, lines = _serve(repo, *flags)
    try:
        assert port, "".join(lines)
        answered = {path: _get(f"http://127.0.0.1:{port}{path}")[0] for path in expected}
        name = _get(f"http://127.0.0.1:{port}/v2")[1]
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert answered == expected
    assert b'"name":"fraud-east"' in real_name and b'"name":"fraud-east"' in name
