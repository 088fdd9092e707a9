"""One way to reach a server: in-process, over HTTP, or over gRPC.

A :class:`Transport` is the seam between what talks to a server (the measurements of
:mod:`triton_nb.perf`, the Tuner, ``%%triton_infer``, the demo) and how the words travel. Every
transport offers the same calls with the same answers: tensors in and out as numpy arrays,
Triton's JSON forms of configs, metadata, statistics and the repository index, and errors of
:mod:`triton_nb.errors` (a refusal over HTTP or gRPC becomes the class of its wire status, so
``except NotFoundError`` works whichever way the request went). The same tests run against the
three (``tests/test_transport.py``).

* :class:`InProcessTransport`: calls on an in-kernel server (its in-process client), no copies;
* :class:`HttpTransport` / :class:`GrpcTransport`: tritonclient's clients, against any KServe v2
  server by ``host:port``, real Triton included, or the in-kernel server's own endpoints.

:func:`connect` picks one from what a user has: a server object (with a protocol: in-process or
one of its endpoints) or a URL. A transport to an in-kernel server keeps it as :attr:`service`,
whichever protocol it speaks, so live knobs (``update_batching``) can still be turned on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from triton_nb._deprecation import version_or_latest, warn_deprecated
from triton_nb.errors import (
    ForbiddenError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonNBError,
    UnavailableError,
)
from triton_nb.server.service import InferenceService

__all__ = ["PROTOCOLS", "GrpcTransport", "HttpTransport", "InProcessTransport", "SageMakerTransport", "Transport",
           "connect"]

#: The protocols a transport speaks.
PROTOCOLS = ("inprocess", "http", "grpc", "sagemaker")

Tensors = dict[str, np.ndarray]
# SageMaker's binary+json Content-Type, followed by the JSON header's size (the server's
# triton_nb.server.frontends.sagemaker spells it too: a client does not import the server)
_SAGEMAKER_BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="


def _version(model_version: int | str | None, stacklevel: int = 5) -> int | None:
    """A call's ``model_version``: a number, or None for the version the policy serves ("" and -1
    are that too, deprecated)."""
    if model_version is None:  # the usual case, on every request's path
        return None
    return version_or_latest(model_version, parameter="model_version", stacklevel=stacklevel)


def _wire(version: int | None) -> str:
    """The version as Triton's protocols spell it: "" for the latest."""
    return "" if version is None else str(version)


class Transport:
    """The calls every way of reaching a server offers (see the module)."""

    #: "inprocess", "http", "grpc" or "sagemaker"
    protocol: str
    #: ``host:port`` of a network transport; None in-process
    url: str | None = None
    #: the in-kernel server behind this transport, when there is one (None for a remote server)
    service: InferenceService | None = None

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], *, outputs: Sequence[str] | None = None,
              model_version: int | str | None = None, parameters: Mapping[str, Any] | None = None) -> Tensors:
        """Run one inference; the answer's tensors by name (``outputs``: the ones to return,
        default all)."""
        raise NotImplementedError

    async def ainfer(self, model: str, inputs: Mapping[str, np.ndarray], *, outputs: Sequence[str] | None = None,
                     model_version: int | str | None = None, parameters: Mapping[str, Any] | None = None) -> Tensors:
        """:meth:`infer` for asyncio code. Network transports run the blocking call on the loop's
        default executor (tritonclient's clients are blocking), so the loop never waits on a socket;
        over HTTP those calls take turns (see :class:`HttpTransport`)."""
        call = functools.partial(self.infer, model, inputs, outputs=outputs, model_version=_version(model_version),
                                 parameters=parameters)
        return await asyncio.get_running_loop().run_in_executor(None, call)

    def model_config_json(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        """The effective config in Triton's JSON form (a dict, as HTTP's ``/config`` answers), the
        same as :meth:`triton_nb.InferenceServer.model_config_json` gives."""
        raise NotImplementedError

    def model_config(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        """Deprecated: :meth:`model_config_json` (the same dict). On a server object,
        ``model_config()`` is the protobuf ``ModelConfig``; one name, one type."""
        warn_deprecated(f"{type(self).__name__}.model_config() is deprecated: call model_config_json() (the same "
                        "dict; InferenceServer.model_config() is the protobuf ModelConfig)")
        return self.model_config_json(model, _version(model_version))

    def model_metadata(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def load_model(self, model: str, config: Mapping[str, Any] | str | None = None) -> None:
        """Load (or reload) ``model``, with ``config`` (Triton's JSON form, the whole config) in
        place of its ``config.pbtxt`` when given: Triton's repository load API."""
        raise NotImplementedError

    def unload_model(self, model: str) -> None:
        raise NotImplementedError

    def statistics(self, model: str = "", model_version: int | str | None = None) -> dict[str, Any]:
        """Triton's statistics-extension JSON (``{"model_stats": [...]}``); every model when ``model``
        is empty."""
        raise NotImplementedError

    def repository_index(self) -> list[dict[str, Any]]:
        """The repository index: a dict per model (version), with ``name``, ``version``, ``state``."""
        raise NotImplementedError

    def models(self) -> list[str]:
        """The names in the repository, sorted."""
        return sorted({entry["name"] for entry in self.repository_index()})

    def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        """Register a system shared-memory region with the server (HTTP and gRPC only)."""
        raise InvalidArgumentError(f"shared memory applies to HTTP and gRPC, not {self.protocol}")

    def unregister_system_shared_memory(self, name: str = "") -> None:
        raise InvalidArgumentError(f"shared memory applies to HTTP and gRPC, not {self.protocol}")

    def close(self) -> None:
        """Release the connection (nothing to do in-process)."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f" {self.url}" if self.url else ""
        return f"<{type(self).__name__}{where}>"


class InProcessTransport(Transport):
    """Calls on an in-kernel server in this process, through its in-process client."""

    protocol = "inprocess"

    def __init__(self, server: InferenceService) -> None:
        from triton_nb.client import InProcessClient

        self.service = server
        self._client = InProcessClient(server)

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], *, outputs: Sequence[str] | None = None,
              model_version: int | str | None = None, parameters: Mapping[str, Any] | None = None) -> Tensors:
        result = self._client.infer(model, inputs, outputs=outputs, model_version=_version(model_version),
                                    parameters=parameters)
        return dict(result.response.outputs)

    async def ainfer(self, model: str, inputs: Mapping[str, np.ndarray], *, outputs: Sequence[str] | None = None,
                     model_version: int | str | None = None, parameters: Mapping[str, Any] | None = None) -> Tensors:
        result = await self._client.ainfer(model, inputs, outputs=outputs, model_version=_version(model_version),
                                           parameters=parameters)
        return dict(result.response.outputs)

    def model_config_json(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        return self._client.get_model_config(model, _version(model_version))

    def model_metadata(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        return self._client.get_model_metadata(model, _version(model_version))

    def load_model(self, model: str, config: Mapping[str, Any] | str | None = None) -> None:
        self.service.load_model(model, config=dict(config) if isinstance(config, Mapping) else config)

    def unload_model(self, model: str) -> None:
        self._client.unload_model(model)

    def statistics(self, model: str = "", model_version: int | str | None = None) -> dict[str, Any]:
        return self._client.get_inference_statistics(model, _version(model_version))

    def repository_index(self) -> list[dict[str, Any]]:
        return self._client.get_model_repository_index()


# A refusal's wire status -> our class: the inverse of errors.wire_status, so a request refused over
# the network raises what the same request raises in-process.
_BY_STATUS: dict[str, type[TritonNBError]] = {}
for _kind in (InvalidArgumentError, NotFoundError, UnavailableError, ForbiddenError, InternalError):
    _BY_STATUS[str(_kind.http_status)] = _kind
    _BY_STATUS[f"StatusCode.{_kind.grpc_code}"] = _kind


def _translated(exc: BaseException, url: str, protocol: str) -> TritonNBError:
    """A tritonclient or socket error as one of ours, with the server's own message."""
    if isinstance(exc, TritonNBError):
        return exc
    if isinstance(exc, OSError):
        return UnavailableError(f"cannot reach the {protocol} server at {url}: {exc}")
    status = exc.status() if callable(getattr(exc, "status", None)) else None
    message = exc.message() if callable(getattr(exc, "message", None)) else str(exc)
    kind = _BY_STATUS.get(str(status), UnavailableError if "failed to connect" in (message or "") else InternalError)
    return kind(message or type(exc).__name__)


class _NetworkTransport(Transport):
    """What HTTP and gRPC share: a tritonclient client of ``host:port`` and the error translation."""

    def __init__(self, url: str, service: InferenceService | None = None) -> None:
        self.url = url.removeprefix("http://").removeprefix("https://").rstrip("/")
        self.service = service
        module = self._module()
        self._module_ = module
        with self._errors():
            self.client = module.InferenceServerClient(self.url)

    @staticmethod
    def _module() -> Any:
        raise NotImplementedError

    @contextlib.contextmanager
    def _errors(self) -> Any:
        try:
            yield
        except TritonNBError:
            raise
        except Exception as exc:
            raise _translated(exc, self.url or "", self.protocol) from None

    def _inputs(self, inputs: Mapping[str, np.ndarray]) -> list[Any]:
        from tritonclient.utils import np_to_triton_dtype

        tensors = []
        for name, array in inputs.items():
            array = np.asarray(array)
            tensor = self._module_.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            self._set_data(tensor, array)
            tensors.append(tensor)
        return tensors

    def _set_data(self, tensor: Any, array: np.ndarray) -> None:
        tensor.set_data_from_numpy(array)

    def _requested(self, outputs: Sequence[str]) -> list[Any]:
        return [self._module_.InferRequestedOutput(name) for name in outputs]

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], *, outputs: Sequence[str] | None = None,
              model_version: int | str | None = None, parameters: Mapping[str, Any] | None = None) -> Tensors:
        with self._errors():
            result = self.client.infer(model, self._inputs(inputs), model_version=_wire(_version(model_version)),
                                       outputs=self._requested(outputs) if outputs else None,
                                       parameters=dict(parameters) if parameters else None)
            names = list(outputs) if outputs else [spec["name"] for spec in self._answer(result).get("outputs", [])]
            answer = {}
            for name in names:
                array = result.as_numpy(name)
                if array is not None:
                    answer[name] = array
            return answer

    @staticmethod
    def _answer(result: Any) -> dict[str, Any]:
        """The response header (model, id, output descriptions) as JSON."""
        return result.get_response()

    def load_model(self, model: str, config: Mapping[str, Any] | str | None = None) -> None:
        text = json.dumps(dict(config)) if isinstance(config, Mapping) else config
        with self._errors():
            self.client.load_model(model, config=text)

    def unload_model(self, model: str) -> None:
        with self._errors():
            self.client.unload_model(model)

    def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        with self._errors():
            self.client.register_system_shared_memory(name, key, byte_size, offset)

    def unregister_system_shared_memory(self, name: str = "") -> None:
        with self._errors():
            self.client.unregister_system_shared_memory(name)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing is best effort: the server may be gone
            self.client.close()


class HttpTransport(_NetworkTransport):
    """KServe v2 over HTTP with ``tritonclient.http``. ``binary``: tensors as binary data (the
    default, as tritonclient sends them) or as JSON lists.

    tritonclient's HTTP client runs on gevent and belongs to the thread that made it: use a
    transport from the thread that connected it. :meth:`ainfer` therefore sends from a thread of
    its own, with a client of its own, one request after another; a load that needs many requests
    in flight is :mod:`triton_nb.perf`'s job."""

    protocol = "http"

    def __init__(self, url: str, *, binary: bool = True, service: InferenceService | None = None) -> None:
        self.binary = binary
        self._sender: concurrent.futures.ThreadPoolExecutor | None = None
        self._sender_transport: HttpTransport | None = None
        super().__init__(url, service)

    async def ainfer(self, model: str, inputs: Mapping[str, np.ndarray], *, outputs: Sequence[str] | None = None,
                     model_version: int | str | None = None, parameters: Mapping[str, Any] | None = None) -> Tensors:
        if self._sender is None:
            self._sender = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="triton-nb-http-ainfer")
        call = functools.partial(self._send, model, inputs, outputs, _version(model_version), parameters)
        return await asyncio.get_running_loop().run_in_executor(self._sender, call)

    def _send(self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
              model_version: int | None, parameters: Mapping[str, Any] | None) -> Tensors:
        """On the sender thread: through the sender's own client, made there on first use."""
        if self._sender_transport is None:
            self._sender_transport = HttpTransport(self.url or "", binary=self.binary)
        return self._sender_transport.infer(model, inputs, outputs=outputs, model_version=model_version,
                                            parameters=parameters)

    def close(self) -> None:
        if self._sender is not None:
            if self._sender_transport is not None:
                self._sender.submit(self._sender_transport.close).result()
            self._sender.shutdown()
            self._sender = self._sender_transport = None
        super().close()

    @staticmethod
    def _module() -> Any:
        import tritonclient.http as module

        return module

    def _set_data(self, tensor: Any, array: np.ndarray) -> None:
        tensor.set_data_from_numpy(array, binary_data=self.binary)

    def _requested(self, outputs: Sequence[str]) -> list[Any]:
        return [self._module_.InferRequestedOutput(name, binary_data=self.binary) for name in outputs]

    def model_config_json(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        with self._errors():
            return self.client.get_model_config(model, _wire(_version(model_version)))

    def model_metadata(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        with self._errors():
            return self.client.get_model_metadata(model, _wire(_version(model_version)))

    def statistics(self, model: str = "", model_version: int | str | None = None) -> dict[str, Any]:
        with self._errors():
            return self.client.get_inference_statistics(model, _wire(_version(model_version)))

    def repository_index(self) -> list[dict[str, Any]]:
        with self._errors():
            return list(self.client.get_model_repository_index())


class GrpcTransport(_NetworkTransport):
    """``inference.GRPCInferenceService`` with ``tritonclient.grpc``; answers in the JSON forms
    HTTP gives (``as_json``), so callers never see protobuf messages."""

    protocol = "grpc"

    @staticmethod
    def _module() -> Any:
        import tritonclient.grpc as module

        return module

    @staticmethod
    def _answer(result: Any) -> dict[str, Any]:
        return result.get_response(as_json=True)

    def model_config_json(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        with self._errors():
            return self.client.get_model_config(model, _wire(_version(model_version)), as_json=True)["config"]

    def model_metadata(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        with self._errors():
            return self.client.get_model_metadata(model, _wire(_version(model_version)), as_json=True)

    def statistics(self, model: str = "", model_version: int | str | None = None) -> dict[str, Any]:
        with self._errors():
            return self.client.get_inference_statistics(model, _wire(_version(model_version)), as_json=True)

    def repository_index(self) -> list[dict[str, Any]]:
        with self._errors():
            return list(self.client.get_model_repository_index(as_json=True).get("models", []))


class SageMakerTransport(Transport):
    """SageMaker's ``POST /invocations`` on an in-kernel server started with ``allow_sagemaker=True``:
    inference on the endpoint's default model (``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME``), as JSON or,
    with ``binary``, binary+json — the two payloads of the AWS sample. SageMaker's contract has no
    route for a model's config, statistics or the repository, so those calls go to the server
    itself; an answer from another model than the one asked for is refused, naming both."""

    protocol = "sagemaker"

    def __init__(self, url: str, *, service: InferenceService, binary: bool = True) -> None:
        self.url = url.removeprefix("http://").rstrip("/")
        self.service = service
        self.binary = binary
        self._server = InProcessTransport(service)

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], *, outputs: Sequence[str] | None = None,
              model_version: int | str | None = None, parameters: Mapping[str, Any] | None = None) -> Tensors:
        import http.client

        import tritonclient.http as httpclient
        from tritonclient.utils import np_to_triton_dtype

        self._server.model_config_json(model)  # an unknown model is NotFound, as over the other protocols
        tensors = []
        for name, array in inputs.items():
            array = np.asarray(array)
            tensors.append(httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
            tensors[-1].set_data_from_numpy(array, binary_data=self.binary)
        requested = [httpclient.InferRequestedOutput(name, binary_data=self.binary) for name in outputs or ()]
        body, json_bytes = httpclient.InferenceServerClient.generate_request_body(
            tensors, outputs=requested or None, parameters=dict(parameters) if parameters else None)
        content_type = "application/json" if json_bytes is None else f"{_SAGEMAKER_BINARY_JSON}{json_bytes}"
        host, _, port = self.url.rpartition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=300)
        try:
            connection.request("POST", "/invocations", body=body, headers={"Content-Type": content_type})
            response = connection.getresponse()
            answer, answered_type = response.read(), response.getheader("Content-Type") or ""
        except OSError as exc:
            raise _translated(exc, self.url, self.protocol) from None
        finally:
            connection.close()
        if response.status != 200:
            try:
                message = json.loads(answer).get("error", "")
            except ValueError:
                message = answer.decode("utf-8", "replace")
            raise _BY_STATUS.get(str(response.status), InternalError)(message or f"HTTP {response.status}")
        header_size = (int(answered_type[len(_SAGEMAKER_BINARY_JSON):])
                       if answered_type.startswith(_SAGEMAKER_BINARY_JSON) else None)
        result = httpclient.InferenceServerClient.parse_response_body(answer, header_length=header_size)
        served = result.get_response().get("model_name")
        if served != model:
            raise InvalidArgumentError(f"the SageMaker endpoint at {self.url} serves model '{served}' "
                                       f"(SAGEMAKER_TRITON_DEFAULT_MODEL_NAME), not '{model}'")
        names = list(outputs) if outputs else [spec["name"] for spec in result.get_response().get("outputs", [])]
        return {name: result.as_numpy(name) for name in names if result.as_numpy(name) is not None}

    def model_config_json(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        return self._server.model_config_json(model, _version(model_version))

    def model_metadata(self, model: str, model_version: int | str | None = None) -> dict[str, Any]:
        return self._server.model_metadata(model, _version(model_version))

    def statistics(self, model: str = "", model_version: int | str | None = None) -> dict[str, Any]:
        return self._server.statistics(model, _version(model_version))

    def repository_index(self) -> list[dict[str, Any]]:
        return self._server.repository_index()

    def load_model(self, model: str, config: Mapping[str, Any] | str | None = None) -> None:
        self._server.load_model(model, config)

    def unload_model(self, model: str) -> None:
        self._server.unload_model(model)


def connect(target: Any, protocol: str | None = None, *, binary: bool = True) -> Transport:
    """A transport to ``target``: a :class:`Transport` (returned as it is), an in-kernel server
    (``protocol`` "inprocess", the default, or "http"/"grpc" through its own endpoint), or a
    ``host:port`` URL of any KServe v2 server (``protocol`` "http", the default, or "grpc").
    ``binary``: HTTP tensors as binary data (default) or JSON."""
    if isinstance(target, Transport):
        return target
    if protocol is not None and protocol not in PROTOCOLS:
        raise InvalidArgumentError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if isinstance(target, str):
        protocol = protocol or "http"
        if protocol in ("inprocess", "sagemaker"):
            # SageMaker's contract has no route for a model's config, which the callers need
            raise InvalidArgumentError(f"a server at a URL ({target}) is reached over http or grpc, not {protocol}")
        return HttpTransport(target, binary=binary) if protocol == "http" else GrpcTransport(target)
    if isinstance(target, InferenceService):
        protocol = protocol or "inprocess"
        if protocol == "inprocess":
            return InProcessTransport(target)
        endpoint = target.endpoints.get(protocol)
        if endpoint is None:
            start = "allow_sagemaker=True" if protocol == "sagemaker" else f"{protocol}_port=0 (or a port)"
            raise InvalidArgumentError(f"the server has no {protocol} endpoint: start it with {start} to reach it "
                                       f"over {protocol}")
        if protocol == "http":
            return HttpTransport(endpoint, binary=binary, service=target)
        if protocol == "sagemaker":
            return SageMakerTransport(endpoint, service=target, binary=binary)
        return GrpcTransport(endpoint, service=target)
    raise InvalidArgumentError(f"reach an InferenceServer or a 'host:port' URL, got {type(target).__name__}")
