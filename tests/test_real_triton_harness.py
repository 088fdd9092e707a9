"""The real-Triton harness itself: a server that dies on its own while a test uses it is reported
as such (TritonServerCrashed, with its log), and its clients are not left waiting for their timeout
by the stub processes that outlive it."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.helpers.real_triton import RealTritonServer, TritonServerCrashed, tritonserver_unavailable_reason
from tests.helpers.scale_models import write_gated_model

pytestmark = pytest.mark.real_triton

WAIT_S = 60


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_that_dies_under_a_test_is_reported_and_its_clients_are_released(tmp_path):
    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)
    folder = write_gated_model(tmp_path)
    server = RealTritonServer(tmp_path, extra_args=("--model-control-mode=explicit",))
    with pytest.raises(TritonServerCrashed) as crashed, server:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=WAIT_S)
        # the load goes over the connection the request will use, accepted before the stub started:
        # the stub inherits it, as Triton's stubs inherit whatever the server had open
        client.load_model("gated")
        tensor = httpclient.InferInput("X", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        request = client.async_infer("gated", [tensor])
        deadline = time.monotonic() + WAIT_S
        while not (folder / "running").exists():  # the stub holds the batch: its process is alive
            assert time.monotonic() < deadline, "the gated model never started"
            time.sleep(0.01)
        pgid = server.pid
        os.kill(pgid, signal.SIGSEGV)  # what Triton 2.51 now and then does to itself
        # the stub still runs, and held the server's connections open until the harness ended it
        with pytest.raises(Exception) as failed:
            request.get_result()
        assert "timed out" not in str(failed.value).lower()
        assert not isinstance(failed.value, TimeoutError)
        client.close()
        raise AssertionError("the request failed as the server died")
    assert crashed.value.__cause__ is not None and "the request failed" in str(crashed.value.__cause__)
    assert f"exit code {-signal.SIGSEGV}" in str(crashed.value)
    assert "Started HTTPService" in str(crashed.value)  # the log comes with it
    deadline = time.monotonic() + WAIT_S
    while _group_alive(pgid):
        assert time.monotonic() < deadline, "the server's stub processes outlived it"
        time.sleep(0.05)
