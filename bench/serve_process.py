"""``triton-nb serve`` in a child process, for the benchmarks: the way a deployment runs the server,
with the load generators in other processes."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
_SERVICES = {"HTTPService": "http", "GRPCInferenceService": "grpc"}


@contextlib.contextmanager
def triton_nb_serve(repository: Path, protocols: tuple[str, ...] = ("http",), log_path: Path | None = None,
                    startup_timeout_s: float = 180.0, flags: tuple[str, ...] = ()
                    ) -> Iterator[tuple[subprocess.Popen, dict[str, str]]]:
    """Serve ``repository`` with the ``protocols`` asked for (http, grpc) on free ports, with more
    ``flags`` of ``triton-nb serve``; yields the process and ``{"http": "127.0.0.1:PORT", ...}``.
    Stopped with SIGTERM, as a user would."""
    command = [sys.executable, "-m", "triton_nb.cli", "serve", "--model-repository", str(repository),
               "--http-port", "0", "--grpc-port", "0", "--allow-metrics", "false",
               "--allow-http", str("http" in protocols).lower(), "--allow-grpc", str("grpc" in protocols).lower(),
               *flags]
    log = open(log_path, "wb") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO_ROOT)
    try:
        endpoints: dict[str, str] = {}
        deadline = time.monotonic() + startup_timeout_s
        while len(endpoints) < len(protocols):
            line = process.stdout.readline()
            if not line or time.monotonic() > deadline:
                tail = log_path.read_text()[-4000:] if log_path is not None else ""
                raise RuntimeError(f"triton-nb serve did not start\n{tail}")
            found = re.match(r"Started (\w+) at (\S+)", line)
            if found and found.group(1) in _SERVICES:
                endpoints[_SERVICES[found.group(1)]] = found.group(2)
        threading.Thread(target=process.stdout.read, daemon=True).start()  # keep its pipe drained
        yield process, endpoints
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log_path is not None:
            log.close()
