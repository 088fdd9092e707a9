"""The rate limiter against real Triton 2.51: the same two held models, which need one copy of
resource R each, run one at a time under ``--rate-limit=execution_count`` on both servers, and
together without it (and with two copies set by ``--rate-limit-resource``). Requests go over HTTP
with stock tritonclient to both."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

import triton_nb
from tests.helpers.rate_limited_models import write_held_models
from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason

WAIT_S = 60
CASES = {  # tritonserver flags -> do the two run together?
    "rate limited, one copy": (("--rate-limit=execution_count",), False),
    "rate limiting off": ((), True),
    "rate limited, two copies set": (("--rate-limit=execution_count", "--rate-limit-resource=R:2"), True),
}


def _ran_together(http_url: str, folders: dict[str, Path], expected: bool) -> bool:
    """Whether held_b starts while held_a is held. Where it should, it gets the whole wait (a busy
    machine may take seconds to start it); where it should not, one second is long enough for an
    instance that may run to start."""
    client = httpclient.InferenceServerClient(http_url, concurrency=2, network_timeout=WAIT_S)
    x = np.ones((1, 2), np.float32)

    def infer(model: str):
        tensor = httpclient.InferInput("X", [1, 2], "FP32")
        tensor.set_data_from_numpy(x)
        return client.async_infer(model, [tensor])

    try:
        first = infer("held_a")
        deadline = time.monotonic() + WAIT_S
        while not (folders["held_a"] / "running").exists():
            assert time.monotonic() < deadline, "held_a never started"
            time.sleep(0.01)
        second = infer("held_b")
        deadline = time.monotonic() + (WAIT_S if expected else 1.0)
        while time.monotonic() < deadline and not (folders["held_b"] / "running").exists():
            time.sleep(0.01)
        together = (folders["held_b"] / "running").exists()
    finally:
        for folder in folders.values():
            (folder / "open").touch()
    for request in (first, second):
        np.testing.assert_array_equal(request.get_result().as_numpy("Y"), x * 2)
    client.close()
    return together


def _flags_as_options(flags: tuple[str, ...]) -> dict:
    options: dict = {"rate_limit_resources": []}
    for flag in flags:
        key, value = flag.removeprefix("--").split("=")
        if key == "rate-limit":
            options["rate_limit"] = value
        else:
            options["rate_limit_resources"].append(value)
    return options


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("server", ["triton_nb", pytest.param("real_triton", marks=pytest.mark.real_triton)])
def test_held_models_share_one_resource_as_triton_schedules_them(tmp_path, server, case):
    flags, expected = CASES[case]
    folders = write_held_models(tmp_path)
    if server == "real_triton":
        reason = tritonserver_unavailable_reason()
        if reason is not None:
            pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)
        with RealTritonServer(tmp_path, extra_args=flags) as real:
            assert _ran_together(real.http_url, folders, expected) is expected
        return
    with triton_nb.serve(tmp_path, http_port=0, **_flags_as_options(flags)) as ours:
        assert _ran_together(f"127.0.0.1:{ours.http_port}", folders, expected) is expected
