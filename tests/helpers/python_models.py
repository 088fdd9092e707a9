"""Helpers of the Python-backend tests: model folders written as for real Triton, requests, and a
fake server for BLS."""

from __future__ import annotations

import textwrap
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from triton_nb.tensors import InferRequest, InferResponse


def write_model(root: Path, name: str, source: str, config: str, files: dict[str, str] | None = None,
                version: int = 1) -> Path:
    folder = root / name
    version_dir = folder / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(config), encoding="utf-8")
    (version_dir / "model.py").write_text(textwrap.dedent(source), encoding="utf-8")
    for filename, text in (files or {}).items():
        (version_dir / filename).write_text(textwrap.dedent(text), encoding="utf-8")
    return folder


def request(model: str, **inputs: np.ndarray) -> InferRequest:
    return InferRequest(model_name=model, inputs=inputs)


SIMPLE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [{{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }}]
output [{{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }}]
"""


class FakeServer:
    """A ServerHandle that records BLS requests and answers them with ``answer``."""

    def __init__(self, answer=None) -> None:
        self.requests: list[InferRequest] = []
        self.answer = answer or (lambda r: InferResponse(r.model_name, 1, outputs={"Y": r.inputs["X"] * 10}))

    def infer(self, request: InferRequest) -> InferResponse:
        self.requests.append(request)
        return self.answer(request)

    def infer_async(self, request: InferRequest) -> Future:
        future: Future = Future()
        try:
            future.set_result(self.infer(request))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def is_model_ready(self, name: str, version: int = -1) -> bool:
        return name == "other"
