"""Start ``triton-nb serve`` as a child process and read the ports it reports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_serve(repo: Path, *flags: str, new_session: bool = False
                ) -> tuple[subprocess.Popen[str], dict[str, int], list[str]]:
    """The process (stdout and stderr merged, text), its bound ports by service name
    (HTTPService, GRPCInferenceService, Metrics) and the lines it printed until all three were up."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "triton_nb.cli", "serve", "--model-repository", str(repo), "--http-port", "0",
         "--grpc-port", "0", "--metrics-port=0", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
        start_new_session=new_session)
    lines: list[str] = []
    ports: dict[str, int] = {}
    try:
        while len(ports) < 3:
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
            found = re.match(r"Started (\w+).* at 127\.0\.0\.1:(\d+)", line)
            if found:
                ports[found.group(1)] = int(found.group(2))
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, ports, lines
