"""Fixtures for the front-end conformance tests: the same tests against triton_nb and real NVIDIA Triton.

``endpoint`` is module-scoped and parametrized over ``["triton_nb", "real_triton"]`` (the second with the
``real_triton`` mark): each test module
that uses it starts each server once, on its own copy of the conformance repository, with explicit
model control (all models loaded at start), so the repository tests can unload and load models.
``http_client`` and ``grpc_client`` are tritonclient clients of that server, one per module.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers.conformance_repo import write_conformance_repo
from tests.helpers.conformance_servers import SERVER_PARAMS, Endpoint, start_server


@pytest.fixture(scope="module", params=SERVER_PARAMS)
def endpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """A running server (triton_nb or real Triton) serving a fresh copy of the conformance repository."""
    repo = write_conformance_repo(tmp_path_factory.mktemp(f"conformance-{request.param}") / "repo")
    started = start_server(request.param, repo)
    try:
        yield started.endpoint
    finally:
        started.stop()


@pytest.fixture(scope="module")
def http_client(endpoint):
    client = httpclient.InferenceServerClient(endpoint.http_url, network_timeout=60.0)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(endpoint):
    client = grpcclient.InferenceServerClient(endpoint.grpc_url)
    yield client
    client.close()
