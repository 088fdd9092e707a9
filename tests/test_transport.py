"""The transport seam: the same calls, the same answers and the same errors in-process, over HTTP
and over gRPC, against one in-kernel server serving all three."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from tests.helpers.scale_models import write_scale_model
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError, NotFoundError, TritonNBError, UnavailableError
from triton_nb.transport import (
    PROTOCOLS,
    GrpcTransport,
    HttpTransport,
    InProcessTransport,
    SageMakerTransport,
    Transport,
    connect,
)

X = np.array([[1.5, -2.0], [3.0, 0.25]], np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("transport-repo")
    write_scale_model(repo)
    os.environ["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = "scale"  # the model SageMaker's /invocations serves
    try:
        running = serve(repo, http_port=0, grpc_port=0, network_model_control=True, allow_sagemaker=True,
                        sagemaker_port=0)
    finally:
        del os.environ["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"]
    with running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def transport(request, server):
    with connect(server, request.param) as made:
        yield made


def test_connect_makes_the_transport_of_each_protocol(server):
    kinds = {"inprocess": InProcessTransport, "http": HttpTransport, "grpc": GrpcTransport,
             "sagemaker": SageMakerTransport}
    for protocol, kind in kinds.items():
        with connect(server, protocol) as made:
            assert type(made) is kind and made.protocol == protocol and made.service is server
            assert made.url == (None if protocol == "inprocess" else server.endpoints[protocol])
    with connect(server.endpoints["grpc"], "grpc") as remote:
        assert isinstance(remote, GrpcTransport) and remote.service is None
    same = connect(server)
    assert connect(same) is same


def test_infer_answers_alike(transport):
    answer = transport.infer("scale", {"X": X})
    assert list(answer) == ["Y"]
    np.testing.assert_array_equal(answer["Y"], X * 2)
    assert answer["Y"].dtype == np.float32


def test_ainfer_answers_alike(transport):
    async def several():
        return await asyncio.gather(*(transport.ainfer("scale", {"X": X * k}, outputs=["Y"]) for k in range(4)))

    for k, answer in enumerate(asyncio.run(several())):
        np.testing.assert_array_equal(answer["Y"], X * k * 2)


def test_config_metadata_index_and_statistics(transport):
    config = transport.model_config_json("scale")
    assert config["name"] == "scale" and config["max_batch_size"] == 8
    assert [t["name"] for t in config["input"]] == ["X"] and config["input"][0]["data_type"] == "TYPE_FP32"
    metadata = transport.model_metadata("scale")
    assert metadata["name"] == "scale" and metadata["inputs"][0]["datatype"] == "FP32"
    assert "scale" in transport.models()
    assert any(entry["name"] == "scale" and entry["state"] == "READY" for entry in transport.repository_index())

    def successes() -> int:
        stats = transport.statistics("scale")["model_stats"][0]["inference_stats"]
        return int(stats["success"]["count"])  # gRPC's JSON carries 64-bit counts as strings

    before = successes()
    transport.infer("scale", {"X": X})
    assert successes() == before + 1


def test_load_with_a_config_override_and_back(transport):
    original = transport.model_config_json("scale")
    changed = {**original, "dynamic_batching": {"max_queue_delay_microseconds": 123}}
    try:
        transport.load_model("scale", changed)
        delay = transport.model_config_json("scale")["dynamic_batching"]["max_queue_delay_microseconds"]
        assert int(delay) == 123
        np.testing.assert_array_equal(transport.infer("scale", {"X": X})["Y"], X * 2)
    finally:
        transport.load_model("scale", original)
    assert int(transport.model_config_json("scale")["dynamic_batching"]["max_queue_delay_microseconds"]) == 2000


def test_errors_are_ours_and_of_the_same_class(transport):
    with pytest.raises(NotFoundError, match="nothere"):
        transport.infer("nothere", {"X": X})
    with pytest.raises(NotFoundError):
        transport.model_config_json("nothere")
    with pytest.raises(InvalidArgumentError, match="X"):
        transport.infer("scale", {"X": np.ones((2, 3), np.float32)})  # dims are [2]


def test_an_unreachable_server_is_unavailable(tmp_path):
    with serve(tmp_path, http_port=0) as gone:
        url = gone.endpoints["http"]
    with pytest.raises(UnavailableError), HttpTransport(url) as transport:
        transport.model_config_json("scale")


def test_what_connect_refuses(server, tmp_path):
    with pytest.raises(InvalidArgumentError, match="over http or grpc, not inprocess"):
        connect("localhost:8000", "inprocess")
    with pytest.raises(InvalidArgumentError, match="protocol must be one of"):
        connect(server, "websocket")
    with serve(tmp_path) as bare, pytest.raises(InvalidArgumentError, match="has no grpc endpoint"):
        connect(bare, "grpc")
    with pytest.raises(InvalidArgumentError, match="got int"):
        connect(42)
    with pytest.raises(TritonNBError, match="shared memory applies to HTTP and gRPC"):
        Transport.register_system_shared_memory(connect(server), "r", "/r", 64)
