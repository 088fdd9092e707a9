"""SageMaker's container contract, as Triton's SageMaker front end answers it.

Inside SageMaker's Triton container, ``tritonserver --allow-sagemaker=true`` serves SageMaker's
contract on ``--sagemaker-port`` (Triton's ``src/sagemaker_server.cc``). :class:`SageMakerApp`
answers the same routes, so the code a user writes against a SageMaker endpoint can be tried
against the notebook first:

* ``GET /ping`` — 200 when the server is ready (or live, as ``SAGEMAKER_TRITON_PING_MODE`` says),
  400 otherwise; no body;
* ``POST /invocations`` — inference on the default model (``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME``):
  a KServe v2 JSON body whatever the Content-Type, or, with the Content-Type
  ``application/vnd.sagemaker-triton.binary+json;json-header-size=N``, a JSON header of ``N``
  bytes followed by binary tensors. The answer is JSON (``application/json``) or, when any output
  is binary, binary+json with its own header size in the Content-Type. Compression is not part of
  SageMaker's contract: Content-Encoding and Accept-Encoding are ignored, as Triton ignores them
  there. A header size of 0 (or an empty body) makes the whole body the raw bytes of the model's
  only input, as Triton reads it;
* multi-model endpoints: ``POST /models`` (``{"model_name": ..., "url": ...}``) registers the
  repository at ``url`` and loads its model — the ensemble when it holds one — under the name the
  ``X-Amzn-SageMaker-Target-Model`` header gives (else ``model_name``); ``GET /models``,
  ``GET /models/<name>``, ``POST /models/<name>/invoke`` and ``DELETE /models/<name>`` list, show,
  invoke and unload, with Triton's statuses (409 for a repository or name registered already, 404
  for a model not loaded, 507 for a load that ran out of memory, 400 for other failures). Loading
  runs a repository's code, so it is a model-repository call: allowed only where the server allows
  network loads (``network_model_control``), and restricted by ``http_restricted_api`` as Triton
  restricts it;
* any other route answers 400 with no body, a wrong method 405.

Beyond Triton, ``POST /endpoints/<EndpointName>/invocations`` — the SageMaker runtime API route
that boto3's ``invoke_endpoint`` calls — is answered as SageMaker answers it, so the sample's client
code runs unchanged with ``endpoint_url=``: without ``TargetModel`` as ``/invocations``; with one
(a multi-model endpoint) as that model's ``/models/<hash>/invoke``, loading it first when it is
not loaded yet, as SageMaker does — from the server's model repository folder, which plays the
S3 prefix: ``TargetModel="model-cpu.tar.gz"`` is the archive ``<repository>/model-cpu.tar.gz``
(unpacked into a temporary folder) or a folder of that name. The Content-Type of the answer is what
boto3 returns as ``response["ContentType"]``; a failure comes back wrapped as SageMaker wraps a
container's (424 ``ModelError`` with ``OriginalStatusCode`` and ``OriginalMessage``), a target
that is not there as a ``ValidationError``. The request's signature is not checked: any
credentials do.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from triton_nb.errors import (
    InvalidArgumentError,
    MethodNotAllowedError,
    TritonNBError,
    UnavailableError,
    wire_message,
    wire_status,
)

if TYPE_CHECKING:
    from triton_nb.server.frontends.http.app import HttpApp, Receive, Send
    from triton_nb.server.service import InferenceService

__all__ = ["BINARY_JSON_CONTENT_TYPE", "PING_MODES", "SageMakerApp", "is_out_of_memory", "sagemaker_header_length"]

log = logging.getLogger(__name__)

# The Content-Type of a binary+json body, followed by the JSON header's size in bytes.
BINARY_JSON_CONTENT_TYPE = "application/vnd.sagemaker-triton.binary+json;json-header-size="
_BINARY_JSON = BINARY_JSON_CONTENT_TYPE.encode("latin-1")
PING_MODES = ("ready", "live")
_INT32_MAX = 2**31 - 1
# The header boto3 sends for a multi-model endpoint's target (TargetModel=...).
TARGET_MODEL_HEADER = b"x-amzn-sagemaker-target-model"
# What Triton's SageMaker front end takes for an out-of-memory load or inference (answered 507, so
# SageMaker unloads other models and retries), from SageMakerMMECheckOOMError
_OUT_OF_MEMORY = ("CUDA out of memory", "CUDA_OUT_OF_MEMORY", "Out of memory", "Out Of Memory", "out of memory",
                  "MemoryError", "OutOfMemory", "OOM", "Dst tensor is not initialized",
                  "Src tensor is not initialized", "CNMEM_STATUS_OUT_OF_MEMORY", "CUDNN_STATUS_NOT_INITIALIZED",
                  "CUBLAS_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_NOT_INITIALIZED", "Failed to allocate memory",
                  "failed to allocate memory", "No space left on device")
_ENSEMBLE_PLATFORM = re.compile(r'platform:\s*"ensemble"')
_SYSTEM_FOLDERS = ("/dev/", "/proc/", "/sys/")


def is_out_of_memory(message: str) -> bool:
    """Whether a failure reads as running out of memory, by Triton's list of such messages."""
    return any(words in message for words in _OUT_OF_MEMORY)


def _leading_int(text: str) -> int | None:
    """The integer at the start of ``text`` as C++'s ``std::stoi`` reads it (leading blanks, a
    sign, digits; the rest ignored), or None when there is none."""
    stripped = text.lstrip(" \t\n\r\f\v")
    end = 1 if stripped[:1] in ("+", "-") else 0
    while end < len(stripped) and stripped[end].isascii() and stripped[end].isdigit():
        end += 1
    digits = stripped[:end]
    return int(digits) if digits.lstrip("+-") else None


def sagemaker_header_length(model: str, headers: dict[bytes, bytes], body_bytes: int) -> int:
    """The JSON header's size of a SageMaker inference body: the size the binary+json Content-Type
    names, else the whole body (a JSON body, whatever its Content-Type). Errors in Triton's words
    (``SagemakerAPIServer::GetInferenceHeaderLength``)."""
    content_type = headers.get(b"content-type")
    if content_type is None or _BINARY_JSON not in content_type:
        return body_bytes
    text = content_type.decode("latin-1")
    if not content_type.startswith(_BINARY_JSON):
        raise InvalidArgumentError(f"expect MIME type for binary data starts with '{BINARY_JSON_CONTENT_TYPE}', "
                                   f"got: {text}")
    size_text = text[len(BINARY_JSON_CONTENT_TYPE):]
    size = _leading_int(size_text)
    # Triton 2.51 read the size with atoi (so "abc" meant 0); the current server refuses it so
    if size is None:
        raise InvalidArgumentError(f"Unable to parse inference header size, got: {size_text}")
    if not -_INT32_MAX - 1 <= size <= _INT32_MAX:
        raise InvalidArgumentError(f"Unable to parse inference header size, value is out of range, got: {size_text}")
    if size < 0 or size > body_bytes:
        raise InvalidArgumentError(f"inference header size should be in range (0, {body_bytes}), got: {size_text}")
    return size


def sagemaker_reply_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """An HTTP inference answer's headers as SageMaker's front end sends them: binary outputs make
    a binary+json Content-Type carrying the JSON header's size (in place of
    ``Inference-Header-Content-Length``); anything else is ``application/json``."""
    size = next((value for key, value in headers if key == b"inference-header-content-length"), None)
    content_type = b"application/json" if size is None else _BINARY_JSON + size
    return [(b"content-type", content_type)]


class SageMakerApp:
    """The ASGI application of SageMaker's container contract over one server.

    Inference goes through the server's HTTP application (``http``), so a request decodes and an
    answer encodes exactly as on ``/v2/models/<name>/infer``; this class maps the routes, the
    header size and the content types.
    """

    def __init__(self, server: InferenceService, http: HttpApp, *, default_model: str,
                 ping_mode: str = "ready", model_data: Path | None = None) -> None:
        if ping_mode not in PING_MODES:
            raise InvalidArgumentError(f"SAGEMAKER_TRITON_PING_MODE must be one of {', '.join(PING_MODES)}, "
                                       f"got {ping_mode!r}")
        self._server = server
        self._http = http
        self.default_model = default_model
        self.ping_mode = ping_mode
        # multi-model endpoints: model_name (SageMaker's hash) -> (the name it serves under, its repository)
        self._loaded: dict[str, tuple[str, Path]] = {}
        self._loaded_lock = threading.Lock()
        # the runtime route's stand-in for the endpoint's S3 prefix, and where its archives unpack
        self._model_data = model_data
        self._unpacked: tempfile.TemporaryDirectory[str] | None = None
        self._target_locks: dict[str, asyncio.Lock] = {}

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        from triton_nb.server.frontends.http.app import error_reply

        if scope["type"] != "http":
            return
        try:
            status, body, headers = await self._dispatch(scope, receive)
        except Exception as error:  # every failure is an answer, never a dropped connection
            if not isinstance(error, TritonNBError):
                log.exception("SageMaker %s %s failed", scope["method"], scope["path"])
            status, body, headers = error_reply(error)
        except asyncio.CancelledError:  # a stop that outlasted its grace, as on the HTTP port
            status, body, headers = error_reply(UnavailableError("the server stopped before the request was "
                                                                 "answered"))
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _dispatch(self, scope: dict[str, Any], receive: Receive) -> tuple[int, bytes, list]:
        method, path = scope["method"], scope["path"]
        if path == "/ping":
            _allow(method, "GET")
            ok = self._server.is_server_ready() if self.ping_mode == "ready" else self._server.is_server_live()
            return (200 if ok else 400), b"", []
        if path == "/invocations":
            _allow(method, "POST")
            return await self._invoke(self.default_model, scope, receive)
        parts = path.split("/")
        if len(parts) == 4 and parts[1] == "endpoints" and parts[2] and parts[3] == "invocations":
            _allow(method, "POST")
            return await self._runtime_invoke(scope, receive)
        # Triton's pattern: /models, /models/, /models/<name>, /models/<name>/invoke
        if parts[1] == "models" and len(parts) <= 4:
            name = parts[2] if len(parts) > 2 else ""
            action = parts[3] if len(parts) == 4 else ""
            if (len(parts) < 4 or (name and action == "invoke")):
                return await self._models_route(method, name, action, scope, receive)
        # Triton's answer to a route it does not know: 400, no body
        return 400, b"", []

    async def _ensure_loaded(self, target: str) -> str:
        """The hash a runtime call's ``TargetModel`` is loaded under, loading it from the model
        data folder first if need be (SageMaker downloads it from the endpoint's S3 prefix)."""
        hash_name = hashlib.md5(target.encode("utf-8")).hexdigest()  # a name, not a secret
        lock = self._target_locks.setdefault(target, asyncio.Lock())
        async with lock:  # one load per target, however many calls arrive before it is done
            with self._loaded_lock:
                if hash_name in self._loaded:
                    return hash_name
            source = self._model_source(target)
            url = source
            if source.is_file():
                from triton_nb.repository.sagemaker import unpack_model_archive

                if self._unpacked is None:
                    self._unpacked = tempfile.TemporaryDirectory(prefix="triton-nb-sagemaker-")
                into = Path(self._unpacked.name) / hash_name / "model"
                url = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: unpack_model_archive(source, into))
            status, body, _ = await self._register_and_load(hash_name, target, str(url))
            if status != 200:
                message = orjson.loads(body).get("error", "") if body else ""
                raise _ValidationError(f"Failed to load model '{target}' (status {status}): {message}")
        return hash_name

    def _model_source(self, target: str) -> Path:
        if self._model_data is None:
            raise _ValidationError(f"TargetModel '{target}': this endpoint serves no multi-model data")
        if "/" in target or "\\" in target or target in ("", ".", ".."):
            raise _ValidationError(f"TargetModel '{target}' must name a file or folder of the model data, not a "
                                   f"path")
        source = self._model_data / target
        if not source.exists():
            raise _ValidationError(f"Could not find model data for TargetModel '{target}' (looked for "
                                   f"{source})")
        return source

    # ------------------------------------------------------------------ multi-model endpoints
    async def _models_route(self, method: str, name: str, action: str, scope: dict[str, Any],
                            receive: Receive) -> tuple[int, bytes, list]:
        if method == "GET":  # Triton's route matches GET .../invoke as GET of the model
            self._http.check_restricted("model-repository", scope)
            return self._show(name) if name else self._list()
        if method == "POST" and action == "invoke":
            return await self._invoke_loaded(name, scope, receive)
        if method == "POST" and not name:
            self._http.check_restricted("model-repository", scope)
            return await self._load(scope, receive)
        if method == "DELETE" and name:
            self._http.check_restricted("model-repository", scope)
            return await self._unload(name, scope)
        return 400, b"", []

    def _list(self) -> tuple[int, bytes, list]:
        with self._loaded_lock:
            loaded = list(self._loaded.items())
        # Triton 2.51 asks readiness of the hash, not of the model it loaded, and so lists an empty
        # object for every model; here each ready model is listed as the contract describes
        models = [{"modelName": hash_name, "modelUrl": str(repository)} for hash_name, (served, repository)
                  in loaded if self._server.is_model_ready(served)]
        return 200, orjson.dumps({"models": models}), _JSON

    def _show(self, name: str) -> tuple[int, bytes, list]:
        with self._loaded_lock:
            entry = self._loaded.get(name)
        if entry is None:
            return 404, b"", []
        return 200, orjson.dumps({"modelName": name, "modelUrl": str(entry[1])}), _JSON

    async def _load(self, scope: dict[str, Any], receive: Receive) -> tuple[int, bytes, list]:
        body = await self._http.read_body(scope, receive)
        try:
            document = orjson.loads(body) if body.strip() else {}
        except orjson.JSONDecodeError as exc:
            # Triton 2.51 answers 400 and then aborts on the missing key; here the server serves on
            raise InvalidArgumentError(f"failed to parse the load model request JSON: {exc}") from None
        if not isinstance(document, dict):
            raise InvalidArgumentError("the load model request must be a JSON object with 'model_name' and 'url'")
        hash_name, url = document.get("model_name", ""), document.get("url")
        if not isinstance(hash_name, str) or not isinstance(url, str) or not url:
            raise InvalidArgumentError("the load model request needs 'model_name' and 'url' strings ('url': the "
                                       "model repository folder to load)")
        target = dict(scope["headers"]).get(TARGET_MODEL_HEADER)
        served = target.decode("utf-8", "replace") if target else hash_name
        if not served:
            raise InvalidArgumentError("the load model request names no model: give 'model_name' or the "
                                       "X-Amzn-SageMaker-Target-Model header")
        self._server.check_network_model_control(served, "load")
        return await self._register_and_load(hash_name, served, url)

    async def _register_and_load(self, hash_name: str, served: str, url: str) -> tuple[int, bytes, list]:
        """Triton's multi-model load: register the repository at ``url`` with its model mapped to
        ``served``, load it, and remember it under ``hash_name``; undone if the load fails."""
        repository, folder = _model_location(url)
        loop = asyncio.get_running_loop()
        # registering and loading run a model's initialize(): seconds, so off the front ends' loop
        await loop.run_in_executor(None, lambda: self._server.register_model_repository(
            repository, {folder: served}))
        try:
            await loop.run_in_executor(None, lambda: self._server.load_model(served))
        except Exception as error:
            await loop.run_in_executor(None, lambda: self._server.unregister_model_repository(repository))
            log.warning("SageMaker load of '%s' from %s failed: %s", served, url, error)
            return _load_failure(error)
        with self._loaded_lock:
            self._loaded[hash_name] = (served, repository)
        log.info("SageMaker loaded TargetModel '%s' (model_name '%s') from %s", served, hash_name, url)
        return 200, b"", []

    async def _unload(self, name: str, scope: dict[str, Any]) -> tuple[int, bytes, list]:
        with self._loaded_lock:
            entry = self._loaded.get(name)
        if entry is None:
            return 404, b"", []
        served, repository = entry
        self._server.check_network_model_control(served, "unload")
        loop = asyncio.get_running_loop()
        # Triton unloads the model and its dependents (an ensemble's steps), then unregisters
        await loop.run_in_executor(None, lambda: self._server.unload_model(served, unload_dependents=True))
        for step in self._composing_models(repository, served):
            await loop.run_in_executor(None, lambda step=step: self._server.unload_model(step))
        await loop.run_in_executor(None, lambda: self._server.unregister_model_repository(repository))
        with self._loaded_lock:
            self._loaded.pop(name, None)
        return 200, b"", []

    def _composing_models(self, repository: Path, served: str) -> list[str]:
        """The other models a registered repository brought (an ensemble's steps), to unload with it."""
        return [folder.name for folder in sorted(repository.iterdir())
                if folder.is_dir() and (folder / "config.pbtxt").is_file() and folder.name != served
                and self._server.is_model_ready(folder.name)]

    async def _invoke_loaded(self, name: str, scope: dict[str, Any], receive: Receive) -> tuple[int, bytes, list]:
        self._http.check_restricted("inference", scope)
        with self._loaded_lock:
            known = name in self._loaded
        if not known:
            return 404, b"", []
        target = dict(scope["headers"]).get(TARGET_MODEL_HEADER)
        model = target.decode("utf-8", "replace") if target else name
        try:
            return await self._invoke(model, scope, receive)
        except Exception as error:
            # the multi-model invoke answers every failure 400, or 507 when memory ran out
            if not isinstance(error, TritonNBError):
                log.exception("SageMaker invoke of '%s' failed", model)
            message = wire_message(error)
            status = 507 if is_out_of_memory(message) else 400
            return status, orjson.dumps({"error": message}), _JSON

    async def _invoke(self, model: str, scope: dict[str, Any], receive: Receive) -> tuple[int, bytes, list]:
        reply = await self._http.infer_with(model, scope, receive, sagemaker_header_length)
        return reply.status, reply.body, sagemaker_reply_headers(reply.headers)

    async def _runtime_invoke(self, scope: dict[str, Any], receive: Receive) -> tuple[int, bytes, list]:
        """``invoke_endpoint`` as the SageMaker runtime answers it: the container's answer, or its
        failure wrapped as a ``ModelError`` (424), which boto3 raises as
        ``client.exceptions.ModelError``."""
        from triton_nb.server.frontends.http.app import error_reply

        target = dict(scope["headers"]).get(TARGET_MODEL_HEADER)
        try:
            if target:
                hash_name = await self._ensure_loaded(target.decode("utf-8", "replace"))
                status, body, headers = await self._invoke_loaded(hash_name, scope, receive)
            else:
                status, body, headers = await self._invoke(self.default_model, scope, receive)
        except _ValidationError as error:
            return 400, orjson.dumps({"message": str(error)}), [(b"content-type", b"application/json"),
                                                                 (b"x-amzn-errortype", b"ValidationError")]
        except Exception as error:
            if not isinstance(error, TritonNBError):
                log.exception("SageMaker runtime invocation failed")
            status, body, headers = error_reply(error)
        if status == 200:
            return status, body, headers
        try:
            original = orjson.loads(body).get("error", "") if body else ""
        except (orjson.JSONDecodeError, AttributeError):
            original = body.decode("utf-8", "replace")
        kind = "client" if 400 <= status < 500 else "server"
        document = {
            "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
            "LogStreamArn": "",
            "OriginalMessage": original,
            "OriginalStatusCode": status,
            "message": f"Received {kind} error ({status}) from primary with message \"{original}\". See the "
                       f"server's log for more information.",
        }
        return 424, orjson.dumps(document), [(b"content-type", b"application/json"),
                                             (b"x-amzn-errortype", b"ModelError")]


_JSON = [(b"content-type", b"application/json")]


def _model_location(url: str) -> tuple[Path, str]:
    """``(repository, model folder)`` of a load's ``url``: a model folder (``config.pbtxt`` at its
    root) is served from its parent; a repository serves its ensemble, or its only model."""
    path = Path(os.path.normpath(os.path.abspath(url)))
    if any(str(path).startswith(folder) or f"{path}/" == folder for folder in _SYSTEM_FOLDERS):
        raise InvalidArgumentError(f"Invalid URL: {url}. \"url\" property value cannot start with /dev/, /proc/, "
                                   f"or /sys/.")
    if not path.is_dir():
        raise InvalidArgumentError(f"failed to register '{url}', repository not found")
    if (path / "config.pbtxt").is_file():
        return path.parent, path.name
    folders = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    ensembles = [p.name for p in folders if (p / "config.pbtxt").is_file()
                 and _ENSEMBLE_PLATFORM.search((p / "config.pbtxt").read_text(encoding="utf-8", errors="replace"))]
    if ensembles:
        return path, ensembles[0]
    if len(folders) == 1:
        return path, folders[0].name
    # Triton takes whichever folder its directory listing gives last; naming the choice is kinder
    raise InvalidArgumentError(f"'{url}' holds {len(folders)} model folders and no ensemble: give the url of one "
                               f"model folder, or add an ensemble")


def _load_failure(error: BaseException) -> tuple[int, bytes, list]:
    """A failed multi-model load as Triton answers it: 409 for a name taken, 507 for memory, else 400."""
    message = wire_message(error)
    status, _ = wire_status(error)
    if status != 409:
        status = 507 if is_out_of_memory(message) else 400
    return status, orjson.dumps({"error": message}), _JSON


class _ValidationError(Exception):
    """A runtime call SageMaker itself refuses (answered 400 ``ValidationError``)."""


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise MethodNotAllowedError("Method Not Allowed")
