"""The in-process client: tritonclient-like calls on an in-kernel server, with no network.

Inputs are numpy arrays (used as they are: no copies) or a pandas DataFrame, whose columns are
matched to the model's inputs by name and converted to each input's datatype and shape — so a
raw TabFormer DataFrame goes straight into the fraud ensemble. Results have ``as_numpy(name)``
and ``as_pandas()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.errors import InvalidArgumentError
from triton_nb.server.types import (
    InferRequest,
    InferResponse,
    numpy_to_triton_dtype,
    text_to_bytes,
    triton_to_numpy_dtype,
)

if TYPE_CHECKING:
    from triton_nb.server.core import InferenceServer

__all__ = ["InProcessClient", "InferResult"]


class InferResult:
    """The result of one inference, like tritonclient's ``InferResult``."""

    def __init__(self, response: InferResponse) -> None:
        self._response = response

    def as_numpy(self, name: str) -> np.ndarray | None:
        return self._response.outputs.get(name)

    def as_pandas(self) -> pd.DataFrame:
        """Outputs as columns: ``name`` for one value per row, ``name_0..k`` for several."""
        columns: dict[str, Any] = {}
        for name, array in self._response.outputs.items():
            if array.ndim == 1:
                columns[name] = array
            elif array.ndim == 2 and array.shape[1] == 1:
                columns[name] = array[:, 0]
            elif array.ndim == 2:
                for i in range(array.shape[1]):
                    columns[f"{name}_{i}"] = array[:, i]
            else:
                columns[name] = list(array)
        return pd.DataFrame(columns)

    def get_response(self) -> dict[str, Any]:
        """The KServe v2 response header: model, version, id and output descriptions."""
        response = self._response
        return {
            "model_name": response.model_name,
            "model_version": str(response.model_version),
            "id": response.request_id,
            "outputs": [
                {"name": n, "datatype": numpy_to_triton_dtype(a.dtype), "shape": list(a.shape)}
                for n, a in response.outputs.items()
            ],
        }

    @property
    def response(self) -> InferResponse:
        return self._response


class InferAsyncRequest:
    """A request in flight (``async_infer``), like tritonclient.http's."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def get_result(self, timeout: float | None = None) -> InferResult:
        return InferResult(self._future.result(timeout=timeout))


def _version(model_version: str | int) -> int:
    if model_version in ("", None):
        return -1
    try:
        return int(model_version)
    except ValueError:
        raise InvalidArgumentError(f"model_version must be a number, got {model_version!r}") from None


class InProcessClient:
    """Calls on an :class:`~triton_nb.server.core.InferenceServer` in this process."""

    def __init__(self, server: InferenceServer) -> None:
        self._server = server

    # ------------------------------------------------------------------ inference
    def _request(
        self,
        model_name: str,
        inputs: Mapping[str, Any] | pd.DataFrame,
        outputs: Sequence[str] | None,
        model_version: str | int,
        request_id: str,
        priority: int,
        timeout_microseconds: int | None,
        parameters: Mapping[str, Any] | None,
    ) -> InferRequest:
        version = _version(model_version)
        if isinstance(inputs, pd.DataFrame):
            arrays = self._from_frame(self._server.input_config(model_name, version), inputs)
        elif isinstance(inputs, Mapping):
            arrays = dict(inputs)
            # Only text given as unicode needs the config (to become BYTES); numpy arrays pass as they are.
            if any(not isinstance(v, np.ndarray) or v.dtype.kind == "U" for v in arrays.values()):
                config = self._server.input_config(model_name, version)
                arrays = {name: self._array(config, name, value) for name, value in arrays.items()}
        else:
            raise InvalidArgumentError(
                f"inputs must be a dict of name -> numpy array or a pandas DataFrame, got {type(inputs).__name__}"
            )
        return InferRequest(
            model_name=model_name,
            model_version=version,
            inputs=arrays,
            requested_outputs=list(outputs) if outputs else None,
            request_id=request_id,
            parameters=dict(parameters or {}),
            priority=priority,
            timeout_microseconds=timeout_microseconds or 0,
        )

    @staticmethod
    def _array(config: mc.ModelConfig, name: str, value: Any) -> np.ndarray:
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        spec = next((t for t in config.input if t.name == name), None)
        if spec is not None and spec.data_type == mc.TYPE_STRING and array.dtype.kind == "U":
            return np.char.encode(array, "utf-8").astype(object)  # Triton carries BYTES as bytes
        return array

    @staticmethod
    def _from_frame(config: mc.ModelConfig, frame: pd.DataFrame) -> dict[str, np.ndarray]:
        """Columns matched to inputs by name; each converted to the input's datatype and shape."""
        missing = [t.name for t in config.input if t.name not in frame.columns and not t.optional]
        if missing:
            raise InvalidArgumentError(
                f"model '{config.name}': the DataFrame has no column(s) {', '.join(map(repr, missing))}")
        if len(frame) == 0:
            raise InvalidArgumentError(f"model '{config.name}': the DataFrame has no rows")
        arrays = {}
        for spec in config.input:
            if spec.name not in frame.columns:
                continue
            column = frame[spec.name]
            if spec.data_type == mc.TYPE_STRING:
                values = text_to_bytes(column)
            else:
                dtype = triton_to_numpy_dtype(mc.DataType.Name(spec.data_type))
                try:
                    values = column.to_numpy(dtype=dtype)
                except (TypeError, ValueError) as exc:
                    raise InvalidArgumentError(
                        f"model '{config.name}': column '{spec.name}' cannot become {numpy_to_triton_dtype(dtype)}: "
                        f"{exc}") from None
            dims = [d if d != -1 else 1 for d in spec.dims]
            rows = len(frame) if config.max_batch_size > 0 else None
            shape = ([rows] if rows is not None else []) + dims
            if int(np.prod(shape)) != values.size:
                raise InvalidArgumentError(
                    f"model '{config.name}': column '{spec.name}' gives {values.size} values; input shape is {shape}")
            arrays[spec.name] = values.reshape(shape)
        return arrays

    def infer(
        self,
        model_name: str,
        inputs: Mapping[str, Any] | pd.DataFrame,
        outputs: Sequence[str] | None = None,
        model_version: str | int = "",
        request_id: str = "",
        priority: int = 0,
        timeout_microseconds: int | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> InferResult:
        """Run an inference and wait for it. ``timeout_microseconds`` bounds the wait (and is
        the request's queue timeout where the model's queue policy allows an override)."""
        request = self._request(model_name, inputs, outputs, model_version, request_id, priority,
                                timeout_microseconds, parameters)
        wait = None if timeout_microseconds is None else timeout_microseconds / 1e6
        return InferResult(self._server.infer(request, timeout_s=wait))

    def async_infer(
        self, model_name: str, inputs: Mapping[str, Any] | pd.DataFrame, **options: Any
    ) -> InferAsyncRequest:
        """Start an inference; ``get_result()`` on the returned object waits for it."""
        request = self._request(model_name, inputs, options.get("outputs"), options.get("model_version", ""),
                                options.get("request_id", ""), options.get("priority", 0),
                                options.get("timeout_microseconds"), options.get("parameters"))
        return InferAsyncRequest(self._server.infer_async(request))

    def stream_infer(
        self, model_name: str, inputs: Mapping[str, Any] | pd.DataFrame, **options: Any
    ) -> Iterator[InferResult]:
        """Responses of a decoupled model, as they come (Triton's streaming), until the final one."""
        import queue

        request = self._request(model_name, inputs, options.get("outputs"), options.get("model_version", ""),
                                options.get("request_id", ""), options.get("priority", 0),
                                options.get("timeout_microseconds"), options.get("parameters"))
        arrivals: queue.SimpleQueue = queue.SimpleQueue()
        request.response_sender = lambda response, final: arrivals.put((response, final))
        future = self._server.infer_async(request)
        future.add_done_callback(lambda f: arrivals.put((f.exception(), True)) if f.exception() else None)
        while True:
            item, final = arrivals.get()
            if isinstance(item, BaseException):
                raise item
            if item is not None:
                if item.error is not None:
                    raise item.error
                yield InferResult(item)
            if final:
                return

    async def ainfer(self, model_name: str, inputs: Mapping[str, Any] | pd.DataFrame, **options: Any) -> InferResult:
        """``await client.ainfer(...)``: the awaitable variant, for asyncio code."""
        pending = self.async_infer(model_name, inputs, **options)
        return InferResult(await asyncio.wrap_future(pending._future))

    # ------------------------------------------------------------------ the rest of the API
    def is_server_live(self) -> bool:
        return self._server.is_server_live()

    def is_server_ready(self) -> bool:
        return self._server.is_server_ready()

    def is_model_ready(self, model_name: str, model_version: str | int = "") -> bool:
        return self._server.is_model_ready(model_name, _version(model_version))

    def get_model_config(self, model_name: str, model_version: str | int = "") -> dict[str, Any]:
        """Triton's JSON form of the effective config (as tritonclient.http returns it)."""
        return self._server.model_config_json(model_name, _version(model_version))

    def get_model_metadata(self, model_name: str, model_version: str | int = "") -> dict[str, Any]:
        return self._server.model_metadata(model_name, _version(model_version))

    def load_model(self, model_name: str, config: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        self._server.load_model(model_name, config=config, files=dict(files) if files else None)

    def unload_model(self, model_name: str, unload_dependents: bool = False) -> None:
        self._server.unload_model(model_name, unload_dependents=unload_dependents)

    def get_inference_statistics(self, model_name: str = "", model_version: str | int = "") -> dict[str, Any]:
        version = None if model_version in ("", None) else _version(model_version)
        return self._server.statistics(model_name or None, version)

    def get_model_repository_index(self) -> list[dict[str, str]]:
        return self._server.repository_index()
