"""System shared memory against a real Triton Inference Server (2.51, nvidia-pytriton's binary): the
same repository, the same register / infer / status / unregister sequence and the same error cases,
with stock tritonclient clients, over HTTP and gRPC — the same results and the same words.

Where the two differ, on purpose, the test says so: a key that cannot be opened and an output
region too small are client errors here (400 / INVALID_ARGUMENT), where Triton answers 500 /
INTERNAL. The sequence keeps every registered offset at 0: Triton 2.51 adds a region's registered
offset twice when a request uses it (fixed in 2.52; triton_nb has the fixed behaviour, see
tests/frontends/test_shared_memory.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason
from tests.helpers.shared_memory_cases import (  # the same models, sequence and cases as the in-kernel tests
    ERROR_WORDS,
    EXPECTED_SEQUENCE,
    OUR_CODES,
    TRITON_CODES,
    Regions,
    code_for,
    failure,
    run_errors,
    run_sequence,
    write_models,
)
from triton_nb import serve

pytestmark = pytest.mark.real_triton


def _require_tritonserver() -> None:
    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, str]]]:
    """{"real": (http, grpc), "ours": (http, grpc)}: both servers on the same repository."""
    _require_tritonserver()
    repo = write_models(tmp_path_factory.mktemp("shm-real") / "repo")
    with RealTritonServer(repo, startup_timeout_s=90.0) as real, serve(repo, http_port=0, grpc_port=0) as ours:
        yield {"real": (real.http_url, real.grpc_url),
               "ours": (f"127.0.0.1:{ours.http_port}", f"127.0.0.1:{ours.grpc_port}")}


def _client(urls: dict[str, tuple[str, str]], server: str, protocol: str) -> Any:
    http, grpc = urls[server]
    return httpclient.InferenceServerClient(http) if protocol == "http" else grpcclient.InferenceServerClient(grpc)


def _on_both(urls: dict[str, tuple[str, str]], protocol: str, run: Any) -> dict[str, Any]:
    """``run(client, protocol, regions)`` on each server, with fresh regions and clean registries."""
    seen = {}
    for server in ("real", "ours"):
        client = _client(urls, server, protocol)
        regions = Regions()
        try:
            for name in ("in", "out", "words", "echoed", "spare"):
                regions.create(name)
            seen[server] = run(client, protocol, regions)
        finally:
            try:
                client.unregister_system_shared_memory()
            finally:
                regions.destroy()
                client.close()
    return seen


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_same_sequence_gives_the_same_results(urls: dict[str, tuple[str, str]], protocol: str) -> None:
    seen = _on_both(urls, protocol, run_sequence)
    assert seen["real"] == EXPECTED_SEQUENCE
    assert seen["ours"] == seen["real"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_same_errors_in_the_same_words(urls: dict[str, tuple[str, str]], protocol: str) -> None:
    seen = _on_both(urls, protocol, run_errors)
    for case, words in ERROR_WORDS.items():
        for server, codes in (("real", TRITON_CODES), ("ours", OUR_CODES)):
            status, message = seen[server][case]
            assert words in message, (server, case, message)
            assert status == code_for(protocol, case, codes), (server, case, status, message)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_metadata_and_cuda_shared_memory_without_a_gpu(urls: dict[str, tuple[str, str]], protocol: str) -> None:
    for server in ("real", "ours"):
        client = _client(urls, server, protocol)
        try:
            if protocol == "http":
                extensions = client.get_server_metadata()["extensions"]
                assert client.get_cuda_shared_memory_status() == [], server
            else:
                extensions = client.get_server_metadata().extensions
                assert len(client.get_cuda_shared_memory_status().regions) == 0, server
            assert {"system_shared_memory", "cuda_shared_memory"} <= set(extensions), server
            status, message = failure(lambda: client.get_cuda_shared_memory_status("gpu0"))  # noqa: B023
            assert "Unable to find cuda shared memory region: 'gpu0'" in message, server
            assert status in ("404", "StatusCode.NOT_FOUND"), server
            # Triton answers a handle it cannot open (no GPU here) as an invalid argument; so do we
            status, _ = failure(lambda: client.register_cuda_shared_memory("gpu0", b"\0" * 64, 0, 16))  # noqa: B023
            assert status in ("400", "StatusCode.INVALID_ARGUMENT"), server
            client.unregister_cuda_shared_memory()
        finally:
            client.close()
