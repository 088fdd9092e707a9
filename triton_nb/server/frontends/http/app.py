"""The KServe v2 / Triton HTTP front end: an ASGI application over a server.

The server is reached only through :class:`triton_nb.server.service.InferenceService`.

Connections are served by uvicorn (httptools parser, uvloop) in the HTTP relay process
(:mod:`triton_nb.server.frontends.http.relay`), which hands each request whole to
:mod:`triton_nb.server.frontends.http.link`; the link calls :meth:`HttpApp.answer`, or, for an
inference request, :meth:`HttpApp.begin_infer`. The same application is also served as ASGI in the
server's process, under SageMaker's routes. It is plain ASGI with no framework: the infer route
is the hot path and a framework's request objects, routing and validation cost more than the
whole decode. Routes, bodies and status codes follow Triton's HTTP server
(``src/http_server.cc``): errors are ``{"error": "..."}`` with the status of the error class
(:func:`triton_nb.errors.wire_status`); health answers 200 or 400 with no body.

Inference supports JSON tensors and the binary tensor data extension
(``Inference-Header-Content-Length``; ``binary_data_size`` per input; ``binary_data`` per output
or ``binary_data_output`` for all), requested outputs, the classification extension, request
parameters (``priority``, ``timeout`` in microseconds; the rest reach the model), and request
bodies compressed with ``Content-Encoding: gzip`` or ``deflate``; responses are compressed when
the client sends ``Accept-Encoding`` (tritonclient's ``response_compression_algorithm``).

The system shared-memory extension (``/v2/systemsharedmemory[/region/<name>]/{status,register,
unregister}``; inputs and requested outputs with ``shared_memory_region``/``_offset``/``_byte_size``
parameters) is served from the server's registry (:mod:`triton_nb.server.frontends.shared_memory`), shared
with the gRPC front end; ``/v2/cudasharedmemory/...`` answers as a Triton without a GPU.

Inference requests are read into :class:`~triton_nb.tensors.InferRequest` with
:mod:`triton_nb.server.frontends.request_codec`, as the gRPC front end reads them. Connections are served by
:class:`triton_nb.server.frontends.http.connections.GuardedHttpProtocol` (the read limits uvicorn lacks).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from triton_nb.errors import (
    ForbiddenError,
    InvalidArgumentError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
    TritonNBError,
    UnavailableError,
    wire_message,
    wire_status,
)
from triton_nb.server.frontends.http.wire import (
    api_group,
    compress_body,
    decompress_body,
    dumps_json,
    joinable_signature,
    json_header_length,
    load_parameters,
    raw_request,
    tensor_region,
)
from triton_nb.server.frontends.protocol import (
    SERVER_NAME,
    WireLimits,
    array_from_buffer,
    array_from_joined_values,
    array_from_values,
    array_to_buffer,
    array_to_values,
    check_shape,
    classify,
    server_metadata,
)
from triton_nb.server.frontends.request_codec import infer_request, parse_parameters, parse_version
from triton_nb.server.frontends.shared_memory import SharedMemoryLease, registry_of
from triton_nb.server.observability.logs import LogSettings
from triton_nb.tensors import InferRequest, InferResponse, numpy_to_triton_dtype

if TYPE_CHECKING:
    from triton_nb.server.service import InferenceService

__all__ = ["HttpApp", "MetricsApp", "error_reply"]

log = logging.getLogger(__name__)

_JSON = [(b"content-type", b"application/json")]
_NO_BODY: list[tuple[bytes, bytes]] = []
_NO_SHM_OUTPUTS: dict[str, Any] = {}  # never written to: the outputs of a request without shared memory

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
# (model, request headers, body bytes) -> the JSON header's size, or None when the body is all JSON
HeaderLength = Callable[[str, dict[bytes, bytes], int], "int | None"]


class _Reply:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes = b"", headers: list[tuple[bytes, bytes]] = _JSON) -> None:
        self.status = status
        self.body = body
        self.headers = headers


def _json(document: Any) -> _Reply:
    return _Reply(200, orjson.dumps(document))


def _error_reply(error: BaseException) -> _Reply:
    status, _ = wire_status(error)
    return _Reply(status, orjson.dumps({"error": wire_message(error)}))


def error_reply(error: BaseException) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """``(status, body, headers)`` of the answer to ``error``, for the other HTTP applications."""
    reply = _error_reply(error)
    return reply.status, reply.body, reply.headers


class _InferCall:
    """An inference request on its way: its future, and what its answer needs."""

    __slots__ = ("_accept", "_app", "_batching", "_binary_outputs", "_classes", "_leases", "_model", "future")

    def __init__(self, app: HttpApp, model: str, batching: bool, future: Any,
                 binary_outputs: tuple[bool, dict[str, bool]], classes: dict[str, int], leases: list[SharedMemoryLease],
                 accept: bytes | None) -> None:
        self._app = app
        self._model = model
        self._batching = batching
        self.future = future
        self._binary_outputs = binary_outputs
        self._classes = classes
        self._leases = leases
        self._accept = accept

    def release(self) -> None:
        for lease in self._leases:  # the regions stay mapped until the outputs are written
            lease.release()
        self._leases = []

    def reply(self) -> _Reply:
        """The answer, once :attr:`future` is done; raises the request's error."""
        try:
            if self.future.cancelled():
                raise UnavailableError("the server stopped before the request was answered")
            reply = self._app._encode(self._model, self._batching, self.future.result(), self._binary_outputs,
                                      self._classes, self._leases[0] if self._leases else None)
        finally:
            self.release()
        compressed = compress_body(reply.body, self._accept) if self._accept and reply.body else None
        if compressed is not None:
            # the binary split point stays the length of the uncompressed JSON header, as Triton sends it
            reply = _Reply(reply.status, compressed[0], [*reply.headers, (b"content-encoding", compressed[1])])
        return reply


class HttpApp:
    """The ASGI application of one server."""

    def __init__(self, server: InferenceService, limits: WireLimits, log_settings: LogSettings,
                 restricted: dict[str, tuple[str, str]] | None = None, *, server_id: str = SERVER_NAME) -> None:
        self._server = server
        self._metadata = server_metadata(server_id)
        self._limits = limits
        self._log_settings = log_settings
        self._shared_memory = registry_of(server)
        # group -> (header as uvicorn gives it: lower-case bytes, expected value as bytes)
        self._restricted = {group: (key.encode("latin-1"), value.encode("latin-1"))
                            for group, (key, value) in (restricted or {}).items()}

    @property
    def service(self) -> InferenceService:
        """The server this front end answers for."""
        return self._server

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off; websockets are not part of the protocol
            return
        status, headers, body = await self.answer(scope, receive)
        # a content-length spares the chunked transfer encoding (and its extra writes)
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def answer(self, scope: dict[str, Any], receive: Receive) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """``(status, headers, body)`` of the answer to one request (``scope`` needs ``method``,
        ``path`` and ``headers``); every failure is an answer. The HTTP relay's link
        (:mod:`triton_nb.server.frontends.http.link`) calls this for each request the relay hands over."""
        try:
            if self._restricted:
                self._check_restricted(scope)
            reply = await self._dispatch(scope, receive)
        except Exception as error:  # every failure is an answer, never a dropped connection
            return self.error_answer(error, scope["method"], scope["path"])
        except asyncio.CancelledError:
            # Only uvicorn cancels, when a stop outlasts its grace (see network.py): the client gets
            # a 503 that says so, not uvicorn's bare 500 and a traceback in the log. The task ends
            # right after this answer, so not re-raising loses nothing.
            reply = _error_reply(UnavailableError("the server stopped before the request was answered"))
        return reply.status, reply.headers, reply.body

    # ------------------------------------------------------------------ routing
    def _check_restricted(self, scope: dict[str, Any]) -> None:
        self.check_restricted(api_group(scope["path"].removeprefix("/").split("/")), scope)

    def check_restricted(self, group: str | None, scope: dict[str, Any]) -> None:
        """Refuse a request to a restricted API group (Triton's names) without its header; the
        SageMaker routes are restricted by the same settings."""
        if group not in self._restricted:
            return
        key, value = self._restricted[group]
        if dict(scope["headers"]).get(key) != value:
            raise ForbiddenError(f"This API is restricted, expecting header '{key.decode('latin-1')}'")

    async def _dispatch(self, scope: dict[str, Any], receive: Receive) -> _Reply:
        method = scope["method"]
        parts = scope["path"].removeprefix("/").split("/")
        if parts[0] != "v2" or "" in parts[1:]:  # "/v2/" and "/v2/models//ready" match no route, as in Triton
            raise NotFoundError("Not Found")
        rest = parts[1:]
        if not rest:
            self._allow(method, "GET")
            return _json(self._metadata)
        head = rest[0]
        if head == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
            self._allow(method, "GET")
            # readiness may ask Python models' is_ready() (up to 5 s each): off the front ends' loop
            ok = self._server.is_server_live() if rest[1] == "live" else await asyncio.to_thread(
                self._server.is_server_ready)
            return _Reply(200 if ok else 400, b"", _NO_BODY)
        if head == "models":
            return await self._models_route(method, rest[1:], scope, receive)
        if head == "repository":
            return await self._repository_route(method, rest[1:], scope, receive)
        if head in ("systemsharedmemory", "cudasharedmemory"):
            return await self._shared_memory_route(head, method, rest[1:], scope, receive)
        if head == "logging" and len(rest) == 1:
            if method == "GET":
                return _json(self._log_settings.to_json())
            self._allow(method, "POST")
            return _json(self._log_settings.update(self._parse_json(await self._body(scope, receive), "logging")))
        raise NotFoundError("Not Found")

    @staticmethod
    def _allow(method: str, allowed: str) -> None:
        if method != allowed:
            raise MethodNotAllowedError("Method Not Allowed")

    async def _models_route(self, method: str, rest: list[str], scope: dict[str, Any], receive: Receive) -> _Reply:
        if rest == ["stats"]:
            self._allow(method, "GET")
            return _json(self._server.statistics())
        if not rest:
            raise NotFoundError("Not Found")
        model = rest[0]
        version: int | None = None
        tail = rest[1:]
        if len(tail) >= 2 and tail[0] == "versions":
            if not (tail[1].isascii() and tail[1].isdigit()):  # not a route, as in Triton ("[0-9]+")
                raise NotFoundError("Not Found")
            version, tail = parse_version(tail[1]), tail[2:]
        action = tail[0] if tail else ""
        if len(tail) > 1:
            raise NotFoundError("Not Found")
        if action == "infer":
            self._allow(method, "POST")
            return await self._infer(model, version, scope, receive)
        self._allow(method, "GET")
        if action == "":
            return _json(self._server.model_metadata(model, version))
        if action == "ready":
            if await asyncio.to_thread(self._server.is_model_ready, model, version):
                return _Reply(200, b"", _NO_BODY)
            return _Reply(400, orjson.dumps({"error": "Model version not ready"}))
        if action == "config":
            return _json(self._server.model_config_json(model, version))
        if action == "stats":
            return _json(self._server.statistics(model, version))
        raise NotFoundError("Not Found")

    async def _repository_route(self, method: str, rest: list[str], scope: dict[str, Any],
                                receive: Receive) -> _Reply:
        self._allow(method, "POST")
        body = await self._body(scope, receive)
        # tritonclient's index call sends no body and no content type: an empty body is {}
        document = self._parse_json(body, "repository request") if body.strip() else {}
        if not isinstance(document, dict):
            raise InvalidArgumentError("the repository request body must be a JSON object")
        if rest == ["index"]:
            ready = document.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidArgumentError(f"repository index: 'ready' must be true or false, got {ready!r}")
            return _json(self._server.repository_index(ready_only=ready))
        if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
            model = rest[1]
            parameters = document.get("parameters", {})
            if not isinstance(parameters, dict):
                raise InvalidArgumentError(f"model '{model}': 'parameters' must be a JSON object")
            self._server.check_network_model_control(model, rest[2])
            loop = asyncio.get_running_loop()
            if rest[2] == "load":
                config, files = load_parameters(model, parameters)
                # loading runs a model's initialize(): seconds, so off the front ends' loop
                await loop.run_in_executor(None, lambda: self._server.load_model(
                    model, config=config, files=files))
            else:
                dependents = parameters.get("unload_dependents", False)
                if not isinstance(dependents, bool):
                    raise InvalidArgumentError(f"model '{model}': 'unload_dependents' must be true or false")
                await loop.run_in_executor(None, lambda: self._server.unload_model(
                    model, unload_dependents=dependents))
            return _Reply(200, b"", _JSON)
        raise NotFoundError("Not Found")

    async def _shared_memory_route(self, kind: str, method: str, rest: list[str], scope: dict[str, Any],
                                   receive: Receive) -> _Reply:
        """``/v2/{system,cuda}sharedmemory[/region/<name>]/{status,register,unregister}``, as Triton."""
        if len(rest) == 1:
            name, action = "", rest[0]
        elif len(rest) == 3 and rest[0] == "region":
            name, action = rest[1], rest[2]
        else:
            raise NotFoundError("Not Found")
        if action not in ("status", "register", "unregister"):
            raise NotFoundError("Not Found")
        self._allow(method, "GET" if action == "status" else "POST")
        registry = self._shared_memory
        cuda = kind == "cudasharedmemory"
        if action == "status":
            return _json(registry.cuda_status(name) if cuda else registry.status(name))
        if action == "unregister":
            registry.cuda_unregister(name) if cuda else registry.unregister(name)
            return _Reply(200, b"", _JSON)
        if cuda:
            registry.cuda_register(name)  # refuses: no GPU
        if not name:
            raise InvalidArgumentError("'region name' is necessary to register system shared memory region")
        body = await self._body(scope, receive)
        document = self._parse_json(body, "shared memory register request")
        if not isinstance(document, dict):
            raise InvalidArgumentError(f"shared memory region '{name}': the register request must be a JSON object")
        if "key" not in document:
            raise InvalidArgumentError("Shared memory register request has no 'key' field")
        if "byte_size" not in document:
            raise InvalidArgumentError("Shared memory register request has no 'byte_size' field")
        key = document["key"]
        if not isinstance(key, str):
            raise InvalidArgumentError(f"shared memory region '{name}': 'key' must be a string, got {key!r}")
        registry.register(name, key, document["byte_size"], document.get("offset", 0))
        return _Reply(200, b"", _JSON)

    # ------------------------------------------------------------------ bodies
    async def read_body(self, scope: dict[str, Any], receive: Receive) -> bytes:
        """A request's body, within the size limit, as sent (for the SageMaker routes, which take no
        compression)."""
        return await self._body(scope, receive, decompress=False)

    async def _body(self, scope: dict[str, Any], receive: Receive, decompress: bool = True) -> bytes:
        limit = self._limits.max_request_bytes
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLargeError(f"request body of {int(declared)} bytes is over the limit of {limit} bytes")
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise InvalidArgumentError("the client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return self._decoded(headers, body) if decompress else body

    def _decoded(self, headers: dict[bytes, bytes], body: bytes) -> bytes:
        """The body as sent, or decompressed as its ``Content-Encoding`` says."""
        encoding = headers.get(b"content-encoding")
        if encoding is not None and encoding.strip().lower() != b"identity":
            return decompress_body(body, encoding.strip().lower(), self._limits.max_request_bytes)
        return body

    @staticmethod
    def _parse_json(body: bytes | memoryview, what: str) -> Any:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            error = exc
        # NaN and Infinity are not JSON, but tritonclient sends them and Triton reads them
        if any(token in bytes(body) for token in (b"NaN", b"Infinity")):
            try:
                return json.loads(bytes(body))
            except ValueError:
                pass
        raise InvalidArgumentError(f"failed to parse the {what} JSON: {error}") from None

    # ------------------------------------------------------------------ inference
    async def infer_with(self, model: str, scope: dict[str, Any], receive: Receive,
                         header_length: HeaderLength) -> _Reply:
        """Inference for another contract over the same codec (SageMaker's,
        :mod:`triton_nb.server.frontends.sagemaker`): ``header_length`` reads the JSON header's size, and
        compression is not part of it, either way."""
        return await self._infer(model, None, scope, receive, header_length)

    async def _infer(self, model: str, version: int | None, scope: dict[str, Any], receive: Receive,
                     header_length: HeaderLength | None = None) -> _Reply:
        # the model first, as Triton: a request to an unknown model is a 404 whatever its body
        config = self._infer_config(model, version)
        body = await self._body(scope, receive, decompress=header_length is None)
        call = self._begin_infer(model, version, config, dict(scope["headers"]), body, header_length)
        try:
            await asyncio.wrap_future(call.future)
        finally:
            if not call.future.done():  # cancelled while it waited: its leases go with it
                call.release()
        return call.reply()

    def _infer_config(self, model: str, version: int | None) -> Any:
        config = self._server.input_config(model, version)
        if config.model_transaction_policy.decoupled:
            raise InvalidArgumentError(
                f"model '{model}': HTTP end point doesn't support models with decoupled transaction policy "
                f"(use gRPC streaming)")
        return config

    def infer_route(self, method: str, path: str) -> tuple[str, str] | None:
        """``(model, version as written, "" for the latest)`` when ``method`` and ``path`` are a plain
        KServe v2 inference request that :meth:`begin_infer` can take whole (no restricted API to
        check); None for anything else, which :meth:`answer` takes."""
        if method != "POST" or self._restricted:
            return None
        parts = path.split("/")  # "", "v2", "models", model, ["versions", version,] "infer"
        if len(parts) == 5 and parts[4] == "infer":
            version = ""
        elif len(parts) == 7 and parts[6] == "infer" and parts[4] == "versions" and parts[5].isascii() \
                and parts[5].isdigit():
            version = parts[5]
        else:
            return None
        if parts[1] != "v2" or parts[2] != "models" or not parts[3]:
            return None
        return parts[3], version

    def begin_infer(self, model: str, version_text: str, headers: dict[bytes, bytes], body: bytes) -> _InferCall:
        """Start a KServe v2 inference request whose body arrived whole and within the size limit
        (see :meth:`infer_route`), on any thread: decoded and queued here; :meth:`_InferCall.reply`
        answers it once its ``future`` is done. Raises what :meth:`answer` would turn into an error
        answer."""
        version = parse_version(version_text) if version_text else None
        config = self._infer_config(model, version)
        return self._begin_infer(model, version, config, headers, self._decoded(headers, body), None)

    def _begin_infer(self, model: str, version: int | None, config: Any, headers: dict[bytes, bytes], body: bytes,
                     header_length: HeaderLength | None, document: Any = None) -> _InferCall:
        """``document``: the body's JSON, where the caller has parsed it already (an all-JSON body)."""
        kserve = header_length is None  # KServe v2's own route: its header and compression
        split = (header_length or json_header_length)(model, headers, len(body))
        leases: list[SharedMemoryLease] = []  # filled only by a request that uses shared memory
        try:
            if split == 0:  # a raw binary request: the body is the model's only input, as Triton reads it,
                # answered with binary outputs, as Triton answers it
                request, binary_outputs, classes = raw_request(model, version, config, body), (True, {}), {}
            else:
                if split is None:
                    binary = memoryview(b"")
                    if document is None:
                        document = self._parse_json(body, "inference request")
                else:
                    document = self._parse_json(memoryview(body)[:split], "inference request")
                    binary = memoryview(body)[split:]
                request, binary_outputs, classes = self._decode(model, version, document, binary, leases)
            future = self._server.infer_async(request)
        except BaseException:
            for lease in leases:
                lease.release()
            raise
        return _InferCall(self, model, config.max_batch_size > 0, future, binary_outputs, classes, leases,
                          headers.get(b"accept-encoding") if kserve else None)

    def begin_infer_burst(self, requests: list[tuple[str, str, dict[bytes, bytes], bytes]]) \
            -> list[_InferCall | Exception]:
        """:meth:`begin_infer` for the ``(model, version as written, headers, body)`` of a burst of
        requests that arrived together (one read of the relay's), in order: each one's call, or the
        error it raised.

        All-JSON requests of one signature (the same model, input names, datatypes and shapes, the
        data as flat lists, everything else but the ``id`` alike) are decoded together, each input
        read once for all of them with its rows joined, and queued as one carried request where
        the server takes them so (:meth:`InferenceService.infer_carried_async`: an ensemble on its
        chain road); the others, and every group the server does not take or whose joined reading
        fails, one by one, exactly as alone. Each request is still answered, counted and failed
        alone. (Measured 2026-12-07, the fraud twin over HTTP, wrk with 2,048 distinct rows,
        alternated with the code before in one run, medians of 5 rounds' ratios: 1.08x at 16 in
        flight, 1.25x at 32, p99 lower; docs/performance.md, "Both cores".)"""
        if len(requests) == 1:
            return [self._begin_one(*requests[0])]
        calls: list[Any] = [None] * len(requests)
        groups: dict[tuple, list[tuple[int, Any, dict[bytes, bytes]]]] = {}
        for position, (model, version_text, headers, body) in enumerate(requests):
            document = key = None
            if headers.get(b"inference-header-content-length") is None and b"content-encoding" not in headers:
                try:
                    document = orjson.loads(body)
                    key = joinable_signature(model, version_text, document)
                    if key is not None:
                        groups.setdefault(key, []).append((position, document, headers))
                        continue
                except (orjson.JSONDecodeError, TypeError):  # the request alone says what is wrong
                    document = None
            calls[position] = self._begin_one(model, version_text, headers, body, document)
        for (model, version_text, *_), members in groups.items():
            if len(members) < 2 or not self._begin_joined(model, version_text, members, calls):
                for position, document, headers in members:
                    calls[position] = self._begin_one(model, version_text, headers, requests[position][3], document)
        return calls

    def _begin_one(self, model: str, version_text: str, headers: dict[bytes, bytes], body: bytes,
                   document: Any = None) -> _InferCall | Exception:
        try:
            version = parse_version(version_text) if version_text else None
            config = self._infer_config(model, version)
            return self._begin_infer(model, version, config, headers, self._decoded(headers, body), None, document)
        except Exception as error:
            return error

    def _begin_joined(self, model: str, version_text: str, members: list[tuple[int, Any, dict[bytes, bytes]]],
                      calls: list[Any]) -> bool:
        """Queue a group of :func:`joinable_signature` as one carried request and put each one's
        call in ``calls``; False, with nothing queued, where it is not taken so."""
        documents = [document for _, document, _ in members]
        try:
            version = parse_version(version_text) if version_text else None
            config = self._infer_config(model, version)
            # The first request decoded alone: every check the signature's requests share, once.
            leases: list[SharedMemoryLease] = []
            first, binary_outputs, classes = self._decode(model, version, documents[0], memoryview(b""), leases)
            if leases:  # outputs to shared memory: each request its own lease, so each alone
                for lease in leases:
                    lease.release()
                return False
            inputs: dict[str, np.ndarray] = {}
            for index, entry in enumerate(documents[0]["inputs"]):
                shape = entry["shape"]
                if not shape:
                    return False
                values = [value for document in documents for value in document["inputs"][index]["data"]]
                array = array_from_joined_values(model, entry["name"], entry["datatype"],
                                                 (shape[0] * len(documents), *shape[1:]), values)
                if array is None:
                    return False
                inputs[entry["name"]] = array
            rows = documents[0]["inputs"][0]["shape"][0] if inputs else 0
            carried = InferRequest(
                model_name=model, inputs=inputs, model_version=first.model_version,
                requested_outputs=first.requested_outputs, request_id=first.request_id, priority=first.priority,
                timeout_microseconds=first.timeout_microseconds, parameters=first.parameters,
                carried_rows=(rows,) * len(documents),
                carried_request_ids=tuple(document.get("id", "") for document in documents))
        except Exception:  # each request alone says what is wrong
            return False
        try:
            futures = self._server.infer_carried_async(carried)
        except Exception as error:  # the server failed them together: each is answered with the error
            for position, _, _ in members:
                calls[position] = error
            return True
        if futures is None:
            return False
        batching = config.max_batch_size > 0
        for (position, _, headers), future in zip(members, futures, strict=True):
            calls[position] = _InferCall(self, model, batching, future, binary_outputs, classes, [],
                                         headers.get(b"accept-encoding"))
        return True

    def error_answer(self, error: BaseException, method: str,
                     path: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """``(status, headers, body)`` of the answer to a request that failed with ``error``."""
        if not isinstance(error, TritonNBError):
            log.error("HTTP %s %s failed", method, path, exc_info=error)
        reply = _error_reply(error)
        return reply.status, reply.headers, reply.body

    def _lease(self, leases: list[SharedMemoryLease]) -> SharedMemoryLease:
        if not leases:
            leases.append(self._shared_memory.lease())
        return leases[0]

    def _decode(self, model: str, version: int | None, document: Any, binary: memoryview,
                leases: list[SharedMemoryLease]) -> tuple[InferRequest, tuple[bool, dict[str, bool]], dict[str, int]]:
        if not isinstance(document, dict):
            raise InvalidArgumentError(f"model '{model}': the inference request must be a JSON object")
        inputs = document.get("inputs")
        if not isinstance(inputs, list):  # empty is fine: a model whose inputs are all optional
            raise InvalidArgumentError(f"model '{model}': the inference request needs an 'inputs' list")
        arrays: dict[str, np.ndarray] = {}
        offset = 0
        for entry in inputs:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise InvalidArgumentError(f"model '{model}': every input needs a 'name'")
            name = entry["name"]
            if name in arrays:
                raise InvalidArgumentError(f"model '{model}': input '{name}' is given more than once")
            shape = check_shape(model, name, entry.get("shape"), self._limits)
            datatype = entry.get("datatype")
            parameters = entry.get("parameters") or {}
            if isinstance(parameters, dict) and "shared_memory_region" in parameters:
                if "data" in entry or "binary_data_size" in parameters:
                    raise InvalidArgumentError(
                        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
                        "'parameters', 'shared_memory_region' in 'parameters'. But set"
                        + (" 'data'" if "data" in entry else "")
                        + (" 'binary_data_size'" if "binary_data_size" in parameters else "")
                        + " 'shared_memory_region'")
                arrays[name] = self._lease(leases).read_input(model, name, datatype, shape,
                                                              tensor_region(parameters))
                continue
            size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
            if size is not None:
                if isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(binary):
                    raise InvalidArgumentError(
                        f"model '{model}': input '{name}' says binary_data_size {size!r}; only "
                        f"{len(binary) - offset} bytes of binary data are left")
                arrays[name] = array_from_buffer(model, name, datatype, shape, binary[offset:offset + size])
                offset += size
            elif "data" in entry:
                arrays[name] = array_from_values(model, name, datatype, shape, entry["data"])
            else:
                raise InvalidArgumentError(f"model '{model}': input '{name}' has neither 'data' nor binary data")
        if offset != len(binary):
            raise InvalidArgumentError(
                f"model '{model}': {len(binary) - offset} bytes of binary data are not claimed by any input's "
                f"binary_data_size")
        parameters = document.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InvalidArgumentError(f"model '{model}': request 'parameters' must be a JSON object")
        read = parse_parameters(model, parameters.items())
        binary_default = read.binary_data_output
        binary_outputs: dict[str, bool] = {}
        classes: dict[str, int] = {}
        requested = None
        outputs = document.get("outputs")
        if outputs is not None:
            if not isinstance(outputs, list):
                raise InvalidArgumentError(f"model '{model}': 'outputs' must be a list")
            requested = []
            for entry in outputs:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise InvalidArgumentError(f"model '{model}': every requested output needs a 'name'")
                name = entry["name"]
                requested.append(name)
                options = entry.get("parameters") or {}
                if not isinstance(options, dict):
                    raise InvalidArgumentError(f"model '{model}': output '{name}' parameters must be an object")
                if "shared_memory_region" in options:
                    if options.get("classification") is not None:
                        raise InvalidArgumentError("Output can't set both 'shared_memory_region' and 'classification'")
                    if options.get("binary_data") is True:
                        raise InvalidArgumentError("Output can't set both 'shared_memory_region' and 'binary_data'")
                    self._lease(leases).bind_output(name, tensor_region(options))
                    continue
                binary_outputs[name] = options.get("binary_data", binary_default) is True
                if options.get("classification") is not None:
                    classes[name] = options["classification"]
        request = infer_request(model, version, arrays, requested, document.get("id", ""), read)
        return request, (binary_default, binary_outputs), classes

    def _encode(self, model: str, batching: bool, response: InferResponse, binary_outputs: tuple[bool, dict[str, bool]],
                classes: dict[str, int], lease: SharedMemoryLease | None = None) -> _Reply:
        binary_default, per_output = binary_outputs
        outputs = []
        buffers = []
        non_finite = False
        in_shared_memory = lease.outputs if lease is not None else _NO_SHM_OUTPUTS
        for name, array in response.outputs.items():
            if name in in_shared_memory:
                # written into its region; the response carries its metadata only, as Triton's
                lease.write_output(name, array)  # type: ignore[union-attr]
                outputs.append({"name": name, "datatype": numpy_to_triton_dtype(array.dtype),
                                "shape": list(array.shape)})
                continue
            if name in classes:
                array = classify(model, name, array, classes[name], batching,
                                 self._server.output_labels(model, name, response.model_version))
            entry: dict[str, Any] = {"name": name, "datatype": numpy_to_triton_dtype(array.dtype),
                                     "shape": list(array.shape)}
            if per_output.get(name, binary_default):
                data = array_to_buffer(array)
                entry["parameters"] = {"binary_data_size": len(data)}
                buffers.append(data)
            else:
                entry["data"] = array_to_values(model, name, array)
                non_finite = non_finite or (array.dtype.kind == "f" and not np.isfinite(array).all())
            outputs.append(entry)
        document: dict[str, Any] = {"model_name": response.model_name,
                                    "model_version": str(response.model_version)}
        if response.request_id:
            document["id"] = response.request_id
        if response.parameters:
            document["parameters"] = response.parameters
        document["outputs"] = outputs
        header = dumps_json(document, non_finite)
        if not buffers:
            return _Reply(200, header)
        return _Reply(200, header + b"".join(buffers), [
            (b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", str(len(header)).encode()),
        ])


class MetricsApp:
    """``GET /metrics``: Prometheus text of the server's statistics, on its own port as Triton does."""

    def __init__(self, server: InferenceService) -> None:
        self._server = server

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != "/metrics":
            status, body, headers = 404, b"", _NO_BODY
        elif scope["method"] != "GET":
            status, body, headers = 405, b"", _NO_BODY
        else:
            status, body = 200, self._server.metrics_text()
            headers = [(b"content-type", b"text/plain; charset=utf-8; version=0.0.4")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
