"""The system shared-memory models, sequence and error cases, the same for triton_nb
(tests/frontends/test_shared_memory.py) and for real Triton (tests/test_real_triton_shared_memory.py)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from tests.helpers.scale_models import write_echo_model, write_python_model

ADDSUB_CONFIG = """
name: "addsub"
backend: "python"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ADDSUB_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", a + b),
                                                         pb_utils.Tensor("DIFF", a - b)]))
        return responses
'''

A = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
B = np.array([0.5, 0.5, 1.0, 8.0], dtype=np.float32)
WORDS = np.array([b"ab", b"cde", b""], dtype=np.object_)
REGION_BYTES = 64  # each test region: A and B (16 bytes each) fit, with room for the bounds checks


def write_models(repo: Path) -> Path:
    """The repository both servers serve."""
    write_python_model(repo, "addsub", ADDSUB_CONFIG, ADDSUB_MODEL)
    write_echo_model(repo)
    return repo


class Regions:
    """Shared-memory objects made with tritonclient's helpers, each under a fresh key."""

    def __init__(self) -> None:
        self.handles: dict[str, Any] = {}
        self.keys: dict[str, str] = {}

    def create(self, name: str, byte_size: int = REGION_BYTES) -> Any:
        key = f"/triton_nb_test_{uuid.uuid4().hex}"
        self.keys[name] = key
        self.handles[name] = shm.create_shared_memory_region(name, key, byte_size)
        return self.handles[name]

    def destroy(self) -> None:
        for handle in self.handles.values():
            shm.destroy_shared_memory_region(handle)
        self.handles.clear()


def protocol_module(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def status_list(client: Any, protocol: str, name: str = "") -> list[dict[str, Any]]:
    """Region status in one form for both protocols: HTTP's JSON list; gRPC's map, by name."""
    if protocol == "http":
        return sorted(client.get_system_shared_memory_status(name), key=lambda r: r["name"])
    response = client.get_system_shared_memory_status(name)
    return sorted(({"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                   for r in response.regions.values()), key=lambda r: r["name"])


def failure(call: Any) -> tuple[str, str]:
    """(status, message) of a call that must fail."""
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.status()), caught.value.message()


def infer_addsub(client: Any, protocol: str, in_region: str = "in", a_offset: int = 0, a_size: int = 16,
                 out_region: str = "out", out_size: int = 16) -> Any:
    """SUM in shared memory, DIFF over the wire; A at ``a_offset`` and B at 16 of ``in_region``."""
    module = protocol_module(protocol)
    a = module.InferInput("A", [4], "FP32")
    a.set_shared_memory(in_region, a_size, offset=a_offset)
    b = module.InferInput("B", [4], "FP32")
    b.set_shared_memory(in_region, 16, offset=16)
    total = module.InferRequestedOutput("SUM")
    total.set_shared_memory(out_region, out_size)
    return client.infer("addsub", [a, b], outputs=[total, module.InferRequestedOutput("DIFF")])


def output_metadata(result: Any, protocol: str, name: str) -> dict[str, Any]:
    """An output's entry in the response, in one form for both protocols."""
    output = result.get_output(name)
    if protocol == "http":
        return dict(output)
    entry = {"name": output.name, "datatype": output.datatype, "shape": list(output.shape)}
    if output.parameters:
        entry["parameters"] = dict(output.parameters)
    return entry


def run_sequence(client: Any, protocol: str, regions: Regions) -> dict[str, Any]:
    """The register / infer / status / unregister sequence; what it saw, to compare across servers."""
    seen: dict[str, Any] = {}
    shm.set_shared_memory_region(regions.handles["in"], [A, B])
    client.register_system_shared_memory("in", regions.keys["in"], 32)
    client.register_system_shared_memory("out", regions.keys["out"], 32)
    seen["status"] = [{**r, "key": "<key>" if r["name"] == "in" else "<key2>"} for r in status_list(client, protocol)]
    seen["status_in"] = [r["name"] for r in status_list(client, protocol, "in")]
    result = infer_addsub(client, protocol)
    seen["sum_metadata"] = output_metadata(result, protocol, "SUM")
    seen["sum"] = shm.get_contents_as_numpy(regions.handles["out"], np.float32, [4]).tolist()
    seen["diff"] = result.as_numpy("DIFF").tolist()
    # BYTES: three strings (one empty) in, three out, both in shared memory
    serialized = serialize_byte_tensor(WORDS)
    shm.set_shared_memory_region(regions.handles["words"], [serialized])
    client.register_system_shared_memory("words", regions.keys["words"], REGION_BYTES)
    client.register_system_shared_memory("echoed", regions.keys["echoed"], REGION_BYTES)
    module = protocol_module(protocol)
    words = module.InferInput("IN", [3], "BYTES")
    words.set_shared_memory("words", serialized_byte_size(serialized))
    echoed = module.InferRequestedOutput("OUT")
    echoed.set_shared_memory("echoed", REGION_BYTES)
    result = client.infer("echo", [words], outputs=[echoed])
    seen["echo_metadata"] = output_metadata(result, protocol, "OUT")
    seen["echo"] = shm.get_contents_as_numpy(regions.handles["echoed"], np.object_, [3]).tolist()
    client.unregister_system_shared_memory("in")
    seen["after_one"] = [r["name"] for r in status_list(client, protocol)]
    client.unregister_system_shared_memory()
    seen["after_all"] = status_list(client, protocol)
    return seen


EXPECTED_SEQUENCE = {
    "status": [{"name": "in", "key": "<key>", "offset": 0, "byte_size": 32},
               {"name": "out", "key": "<key2>", "offset": 0, "byte_size": 32}],
    "status_in": ["in"],
    "sum_metadata": {"name": "SUM", "datatype": "FP32", "shape": [4]},
    "sum": (A + B).tolist(),
    "diff": (A - B).tolist(),
    "echo_metadata": {"name": "OUT", "datatype": "BYTES", "shape": [3]},
    "echo": [b"ab!", b"cde!", b"!"],
    "after_one": ["echoed", "out", "words"],
    "after_all": [],
}


def run_errors(client: Any, protocol: str, regions: Regions) -> dict[str, tuple[str, str]]:
    """Each error case once: (status, message) by case, to compare across servers."""
    shm.set_shared_memory_region(regions.handles["in"], [A, B])
    errors: dict[str, tuple[str, str]] = {}
    # a fresh key for the bounds check at registration (Triton 2.51 reuses a closed descriptor for
    # a key registered already, and then fails differently)
    errors["register_beyond"] = failure(lambda: client.register_system_shared_memory(
        "beyond", regions.keys["spare"], REGION_BYTES, offset=8))
    client.register_system_shared_memory("in", regions.keys["in"], 32)
    client.register_system_shared_memory("out", regions.keys["out"], 32)
    errors["duplicate"] = failure(lambda: client.register_system_shared_memory("in", regions.keys["in"], 32))
    errors["missing_key"] = failure(lambda: client.register_system_shared_memory(
        "ghost", f"/triton_nb_test_missing_{uuid.uuid4().hex}", 16))
    errors["status_unknown"] = failure(lambda: client.get_system_shared_memory_status("nowhere"))
    errors["infer_unknown_input_region"] = failure(lambda: infer_addsub(client, protocol, in_region="nowhere"))
    errors["infer_unknown_output_region"] = failure(lambda: infer_addsub(client, protocol, out_region="nowhere"))
    errors["infer_beyond"] = failure(lambda: infer_addsub(client, protocol, a_offset=24))
    errors["infer_offset_beyond"] = failure(lambda: infer_addsub(client, protocol, a_offset=40, a_size=4))
    errors["input_size_mismatch"] = failure(lambda: infer_addsub(client, protocol, a_size=12))
    errors["output_too_small"] = failure(lambda: infer_addsub(client, protocol, out_size=8))
    client.unregister_system_shared_memory("in")
    errors["infer_unregistered"] = failure(lambda: infer_addsub(client, protocol))
    client.unregister_system_shared_memory("never-registered")  # no error, as in Triton
    client.unregister_system_shared_memory()
    return errors


# The words both servers say; status codes where they agree (see test_errors for where they differ).
ERROR_WORDS = {
    "register_beyond": "failed to register shared memory region 'beyond': invalid args",
    "duplicate": "shared memory region 'in' already in manager",
    "missing_key": "Unable to open shared memory region: '/triton_nb_test_missing_",
    "status_unknown": "Unable to find system shared memory region: 'nowhere'",
    "infer_unknown_input_region": "Unable to find shared memory region: 'nowhere'",
    "infer_unknown_output_region": "Unable to find shared memory region: 'nowhere'",
    "infer_beyond": "Invalid offset + byte size for shared memory region: 'in'",
    "infer_offset_beyond": "Invalid offset for shared memory region: 'in'",
    "input_size_mismatch": "input byte size mismatch for input 'A' for model 'addsub'. Expected 16, got 12",
    "output_too_small": "shared memory size specified with the request for output 'SUM' (8 bytes) should be at "
                        "least 16 bytes to hold the results",
    "infer_unregistered": "Unable to find shared memory region: 'in'",
}
TRITON_CODES = {  # Triton 2.51's (HTTP, gRPC) status of each case
    "register_beyond": ("400", "StatusCode.INVALID_ARGUMENT"),
    "duplicate": ("400", "StatusCode.ALREADY_EXISTS"),
    "missing_key": ("500", "StatusCode.INTERNAL"),
    "status_unknown": ("404", "StatusCode.NOT_FOUND"),
    "infer_unknown_input_region": ("404", "StatusCode.NOT_FOUND"),
    "infer_unknown_output_region": ("404", "StatusCode.NOT_FOUND"),
    "infer_beyond": ("400", "StatusCode.INVALID_ARGUMENT"),
    "infer_offset_beyond": ("400", "StatusCode.INVALID_ARGUMENT"),
    "input_size_mismatch": ("400", "StatusCode.INVALID_ARGUMENT"),
    "output_too_small": ("500", "StatusCode.INTERNAL"),
    "infer_unregistered": ("404", "StatusCode.NOT_FOUND"),
}
# Where triton_nb answers a client's mistake as one (Triton answers these 500 / INTERNAL).
OUR_CODES = {**TRITON_CODES, "missing_key": ("400", "StatusCode.INVALID_ARGUMENT"),
             "output_too_small": ("400", "StatusCode.INVALID_ARGUMENT")}


def code_for(protocol: str, case: str, codes: dict[str, tuple[str, str]]) -> str:
    return codes[case][0 if protocol == "http" else 1]

