"""A short soak (the long one is bench/bench_soak.py): sustained load on the fraud ensemble with
dynamic batching, in-process and over HTTP — every request answered, none failed, no thread left
growing, resident memory within a loose bound after the warm-up."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.waiting import wait_until
from triton_nb import serve
from triton_nb.perf.inputs import request_inputs
from triton_nb.perf.load import InProcessLoad, NetworkLoad
from triton_nb.repository import export_fraud_repository

RSS_BOUND_MB = 64


def _rss_mb() -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024


def _soak(load, seconds: float) -> tuple[int, int]:
    answered = failed = 0
    load.start()
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.25)
            done = load.take()
            answered += len(done)
            failed += int((~done.ok).sum())
    finally:
        load.stop()
    done = load.take()
    return answered + len(done), failed + int((~done.ok).sum())


@pytest.fixture(scope="module")
def fraud_server(trained, fraud_frame, tmp_path_factory):
    repository = export_fraud_repository(trained, tmp_path_factory.mktemp("soak") / "repo")
    with serve(repository, http_port=0) as server:
        yield server, request_inputs(server.model_config_json("ensemble"), fraud_frame, count=64)


@pytest.mark.slow  # a soak of fixed length, bench-like
@pytest.mark.parametrize("path", ["inprocess", "http"])
def test_a_short_soak_answers_everything_and_grows_nothing(fraud_server, path):
    server, requests = fraud_server

    def load():
        if path == "inprocess":
            return InProcessLoad(server, "ensemble", requests, concurrency=64)
        return NetworkLoad("http", server.endpoints["http"], "ensemble", requests, concurrency=64)

    _soak(load(), 2.0)  # warm-up: caches, the FIL engine choice, connection pools
    threads_before, rss_before = threading.active_count(), _rss_mb()
    answered, failed = _soak(load(), 5.0)
    assert failed == 0 and answered > 100
    # the load's own threads are joined; the server's pool is what it was (a loaded machine may take a
    # while to end the threads that were winding down)
    wait_until(lambda: threading.active_count() <= threads_before, "the load's threads to end", timeout_s=30)
    assert _rss_mb() - rss_before < RSS_BOUND_MB
    assert server.pending_requests == 0  # nothing left waiting
