"""perf with perf_analyzer's ``--shared-memory system``: the regions registered for a measurement
(and gone after it), requests that refer to them instead of carrying tensors (HTTP and gRPC, numbers
and BYTES, sequence models), a region that went missing counted as errors, and the options' checks."""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.scale_models import write_echo_model, write_scale_model
from tests.helpers.sequence_models import write_sequence_models
from triton_nb import serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.perf import Sequences, SharedMemory, measure
from triton_nb.perf import load as load_module
from triton_nb.perf.inputs import SharedMemoryPlaces, TensorPlace, encode_grpc, encode_http
from triton_nb.perf.load import SHARED_MEMORY_PREFIX, SystemSharedMemory
from triton_nb.transport import connect

measure_module = importlib.import_module("triton_nb.perf.measure")  # the module, not the function

SHORT = {"measurement_interval_ms": 300, "warmup_ms": 100, "max_trials": 3}
SHM_DIR = Path("/dev/shm")

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("perf-shm")
    write_scale_model(repo, extra="dynamic_batching { max_queue_delay_microseconds: 500 }")
    write_echo_model(repo)
    write_sequence_models(repo)
    with serve(repo, http_port=0, grpc_port=0) as served:
        yield served


def _leftovers(names: list[str]) -> list[str]:
    return [name for name in names if (SHM_DIR / name).exists()]


@pytest.fixture
def seen_regions(server, monkeypatch):
    """The server's region status at the start of each level of a measurement."""
    seen: list[list[dict]] = []
    real = measure_module._measure_level

    def recording(*args, **kwargs):
        seen.append(server.shared_memory.status())
        return real(*args, **kwargs)

    monkeypatch.setattr(measure_module, "_measure_level", recording)
    return seen


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_measurement_in_system_shared_memory(server, seen_regions, protocol):
    results = measure(server, "scale", concurrency_range=2, protocol=protocol, shared_memory="system", **SHORT)
    row = results.iloc[0]
    assert row["errors"] == 0 and row["completed_requests"] > 0 and row["shared_memory"] == "system"
    # while it ran: an input and an output region of this measurement, keyed by their names
    regions = seen_regions[0]
    names = sorted(region["name"] for region in regions)
    assert len(names) == 2 and all(name.startswith(SHARED_MEMORY_PREFIX) for name in names)
    assert names[0].endswith("_inputs") and names[1].endswith("_outputs")
    assert all(region["key"] == "/" + region["name"] and region["byte_size"] > 0 for region in regions)
    # after it: unregistered, and the objects unlinked
    assert server.shared_memory.status() == []
    assert _leftovers(names) == []


def test_without_shared_memory_the_column_says_none(server, seen_regions):
    results = measure(server, "scale", concurrency_range=1, protocol="http", **SHORT)
    assert results["shared_memory"].tolist() == ["none"] and seen_regions == [[]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_inputs_and_outputs_in_shared_memory(server, seen_regions, protocol):
    results = measure(server, "echo", concurrency_range=2, protocol=protocol,
                      shared_memory=SharedMemory(kind="system", output_size_bytes=256), **SHORT)
    assert results["errors"].iloc[0] == 0 and results["completed_requests"].iloc[0] > 0
    outputs = next(region for region in seen_regions[0] if region["name"].endswith("_outputs"))
    assert outputs["byte_size"] == 16 * 256  # 16 distinct requests, 256 bytes each for the BYTES output
    assert server.shared_memory.status() == []


def test_a_sequence_model_over_http_in_shared_memory(server):
    """The load generator patches sequence parameters into payloads that carry no tensors."""
    results = measure(server, "card_count", concurrency_range=2, protocol="http", shared_memory="system",
                      sequences=Sequences(sequence_length=3), **SHORT)
    row = results.iloc[0]
    assert row["errors"] == 0 and row["completed_requests"] > 0 and row["sequence_length"] == 3
    assert server.shared_memory.status() == []


def test_the_server_writes_outputs_into_the_region(server):
    requests = [{"X": np.array([[1.5, -2.0]], np.float32)}, {"X": np.array([[3.0, 4.0]], np.float32)}]
    config = server.model_config_json("scale")
    with connect(server, "http") as client, \
            SystemSharedMemory(client, config, requests) as regions:
        load = load_module.NetworkLoad("http", server.endpoints["http"], "scale", requests, concurrency=1,
                                       shared_memory=regions)
        load.start()
        done = 0
        deadline = time.monotonic() + 30
        while done < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
            done += int(load.take().ok.sum())
        load.stop()
        assert done >= 4
        data = (SHM_DIR / regions.output_region).read_bytes()  # the object, as any process sees it
        for request, places in zip(requests, regions.places, strict=True):
            place = places.outputs["Y"]
            written = np.frombuffer(data[place.offset_bytes:place.offset_bytes + place.byte_size], np.float32)
            np.testing.assert_array_equal(written, request["X"].ravel() * 2)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_region_that_went_missing_counts_as_errors(server, protocol):
    requests = [{"X": np.ones((1, 2), np.float32)}]
    config = server.model_config_json("scale")
    with connect(server, protocol) as client, \
            SystemSharedMemory(client, config, requests) as regions:
        server.shared_memory.unregister(regions.input_region)  # gone before the first request
        load = load_module.NetworkLoad(protocol, server.endpoints[protocol], "scale", requests, concurrency=2,
                                       shared_memory=regions)
        load.start()
        completions = load.take()
        deadline = time.monotonic() + 30
        while len(completions.ok) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
            fresh = load.take()
            completions.extend(fresh.start_ns, fresh.end_ns, fresh.ok)
        load.stop()
    assert len(completions.ok) >= 4 and not completions.ok.any()
    assert server.shared_memory.status() == []


def test_the_encoders_refer_to_the_regions_and_carry_no_tensor():
    x = np.array([[1.25, 2.5]], np.float32)
    places = SharedMemoryPlaces({"X": TensorPlace("in_r", 64, 8)}, {"Y": TensorPlace("out_r", 128, 8)})
    body, header = encode_http("scale", {"X": x}, places)
    assert header == len(body) and x.tobytes() not in body  # the JSON header alone
    document = json.loads(body)
    assert document["inputs"] == [{"name": "X", "shape": [1, 2], "datatype": "FP32", "parameters": {
        "shared_memory_region": "in_r", "shared_memory_byte_size": 8, "shared_memory_offset": 64}}]
    assert document["outputs"] == [{"name": "Y", "parameters": {
        "shared_memory_region": "out_r", "shared_memory_byte_size": 8, "shared_memory_offset": 128}}]
    assert body.endswith(b"}}")  # the parameters object last: where the load generator patches sequences
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest.FromString(encode_grpc("scale", {"X": x}, places))
    assert len(request.raw_input_contents) == 0
    parameters = request.inputs[0].parameters
    assert (parameters["shared_memory_region"].string_param, parameters["shared_memory_byte_size"].int64_param,
            parameters["shared_memory_offset"].int64_param) == ("in_r", 8, 64)
    assert [output.name for output in request.outputs] == ["Y"]
    assert request.outputs[0].parameters["shared_memory_offset"].int64_param == 128


class _RecordingClient:
    """A client that records registrations; ``fail_at`` makes that registration fail."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.registered: list[tuple[str, str, int]] = []
        self.unregistered: list[str] = []
        self.fail_at = fail_at

    def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None:
        if len(self.registered) == self.fail_at:
            raise ConnectionError("refused")
        self.registered.append((name, key, byte_size))

    def unregister_system_shared_memory(self, name: str) -> None:
        self.unregistered.append(name)


def test_the_layout_sizes_outputs_from_the_config_and_shares_repeats():
    config = {"max_batch_size": 8, "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [3]},
                                              {"name": "S", "data_type": "TYPE_STRING", "dims": [1]},
                                              {"name": "V", "data_type": "TYPE_INT64", "dims": [-1]}]}
    first, second = {"X": np.zeros((4, 3), np.float32)}, {"X": np.ones((4, 3), np.float32)}
    client = _RecordingClient()
    regions = SystemSharedMemory(client, config, [first, second, first], rows_per_request=4,
                                 output_shared_memory_size=100)
    assert regions.places[0] is regions.places[2] and regions.places[0] != regions.places[1]
    outputs = regions.places[1].outputs
    assert {name: place.byte_size for name, place in outputs.items()} == {"Y": 4 * 3 * 4, "S": 400, "V": 400}
    assert regions.places[1].inputs["X"].offset_bytes == 64  # after the first request's 48 bytes, aligned
    with regions:
        assert [name for name, _, _ in client.registered] == regions.regions
        assert all((SHM_DIR / name).exists() for name in regions.regions)
    assert sorted(client.unregistered) == sorted(regions.regions) and _leftovers(regions.regions) == []


def test_a_failed_registration_undoes_what_was_done():
    client = _RecordingClient(fail_at=1)
    regions = SystemSharedMemory(client, {"output": []}, [{"X": np.zeros((1, 2), np.float32)}])
    with pytest.raises(ConnectionError):
        regions.open()
    assert client.unregistered == [regions.input_region] and _leftovers(regions.regions) == []


def test_what_shared_memory_cannot_do(server):
    with pytest.raises(InvalidArgumentError, match=r"shared_memory 'cuda' is not supported: CUDA shared memory"):
        measure(server, "scale", concurrency_range=1, protocol="http", shared_memory="cuda")
    with pytest.raises(InvalidArgumentError, match=r"shared_memory 'system' applies to HTTP and gRPC"):
        measure(server, "scale", concurrency_range=1, protocol="inprocess", shared_memory="system")
    with pytest.raises(InvalidArgumentError, match=r"shared_memory must be one of none, system, cuda"):
        measure(server, "scale", concurrency_range=1, protocol="http", shared_memory="posix")
    with pytest.raises(InvalidArgumentError, match=r"output_size_bytes \(--output-shared-memory-size\) must be a "
                                                   r"whole number of bytes >= 1, got 0"):
        measure(server, "scale", concurrency_range=1, protocol="http",
                shared_memory=SharedMemory(kind="system", output_size_bytes=0))
    assert server.shared_memory.status() == []


def test_the_regions_go_when_a_measurement_fails(server, monkeypatch):
    seen = []

    def failing(*args, **kwargs):
        seen.append([region["name"] for region in server.shared_memory.status()])
        raise RuntimeError("the load broke")

    monkeypatch.setattr(measure_module, "_measure_level", failing)
    with pytest.raises(RuntimeError, match="the load broke"):
        measure(server, "scale", concurrency_range=1, protocol="grpc", shared_memory="system", **SHORT)
    assert len(seen[0]) == 2 and server.shared_memory.status() == [] and _leftovers(seen[0]) == []
