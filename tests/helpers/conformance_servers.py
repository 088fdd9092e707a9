"""Start triton_nb or real NVIDIA Triton on a model repository, for the front-end conformance tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason

SERVER_KINDS = ["triton_nb", "real_triton"]
# the kinds as pytest parameters: real Triton's carries the `real_triton` mark (`pytest -m "not real_triton"`
# runs the triton_nb half alone)
SERVER_PARAMS = [pytest.param(kind, marks=pytest.mark.real_triton) if kind == "real_triton" else kind
                 for kind in SERVER_KINDS]
EXPLICIT_ALL = ("--model-control-mode=explicit", "--load-model=*")


@dataclass(frozen=True)
class Endpoint:
    """Where a running server listens: ``http_url``/``grpc_url`` as tritonclient takes them ("host:port")."""

    kind: str
    http_url: str
    grpc_url: str
    metrics_url: str
    server: Any

    def __str__(self) -> str:
        return self.kind


@dataclass(frozen=True)
class _Server:
    endpoint: Endpoint
    stop: Callable[[], None]


def start_server(kind: str, repo: Path) -> _Server:
    """Start ``kind`` ("triton_nb" or "real_triton") on ``repo`` with every model loaded, explicit control."""
    if kind == "real_triton":
        reason = tritonserver_unavailable_reason()
        if reason is not None:
            pytest.fail(f"real Triton cannot run here: {reason}")
        real = RealTritonServer(repo, extra_args=EXPLICIT_ALL)
        real.start()
        return _Server(Endpoint(kind, real.http_url, real.grpc_url, real.metrics_url, real), real.stop)
    import triton_nb

    ours = triton_nb.serve(repo, model_control_mode="explicit", http_port=0, grpc_port=0, metrics_port=0,
                           network_model_control=True)
    endpoint = Endpoint(
        kind,
        f"127.0.0.1:{ours.http_port}",
        f"127.0.0.1:{ours.grpc_port}",
        f"http://127.0.0.1:{ours.metrics_port}/metrics",
        ours,
    )
    return _Server(endpoint, ours.stop)
