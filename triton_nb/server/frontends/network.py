"""The network front ends' lifecycle: HTTP, gRPC and metrics endpoints on one background thread.

:class:`NetworkFrontends` owns one thread running one event loop (uvloop when installed) that
serves the metrics and SageMaker applications with uvicorn, and the links to the two relay
processes that terminate HTTP and gRPC on another core (:mod:`triton_nb.server.frontends.http.relay`,
:mod:`triton_nb.server.frontends.grpc.relay`).
Nothing runs on the caller's thread or event loop — a Jupyter kernel's loop is not driven between
cells (ipykernel 7), so the front ends never rely on it.

Listening sockets are bound in :meth:`NetworkFrontends.start`, on the caller's thread, so a port
that is taken fails the start with a clear message instead of a log line in a thread; port 0
picks a free port and the bound ports are reported (:attr:`NetworkFrontends.ports`).

Stopping is graceful, as Triton's: listeners close first, requests in flight are answered (the
core is still serving them), then the loop ends. After ``exit_timeout_secs`` the core fails what is
still queued; the front ends wait a few seconds more (``_ANSWER_GRACE_S``) so those failures reach
the clients as answers, and only then cut what is left (HTTP answers 503, gRPC UNAVAILABLE).

Slow and idle clients: HTTP connections are served, in the HTTP relay, by
:class:`triton_nb.server.frontends.http.connections.GuardedHttpProtocol` — a request must arrive whole within
``http_read_timeout_secs`` (else 408), a connection idle for ``http_timeout_keep_alive_secs``
is closed, a request head is at most 64 KiB (else 431). There is no cap on the number of
connections: uvicorn's ``limit_concurrency`` counts idle connections too, so a client holding
many of them open would get every other client refused (503) — the timeouts free such
connections instead, and the process's file descriptor limit bounds them meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import math
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triton_nb.errors import InvalidArgumentError, UnavailableError
from triton_nb.server.frontends.protocol import SERVER_NAME, WireLimits, parse_restricted_api
from triton_nb.server.observability.logs import LogSettings

if TYPE_CHECKING:
    from triton_nb.server.service import InferenceService

__all__ = ["FrontendOptions", "NetworkFrontends"]

log = logging.getLogger(__name__)

_LOOPBACK_NAMES = ("localhost",)
# After exit_timeout_secs the core fails the requests still queued (and, a hung model's, the ones
# executing); the front ends stay up this much longer so those failures reach the clients as
# answers, not as connections cut by uvicorn's or gRPC's own shutdown.
_ANSWER_GRACE_S = 5.0


@dataclass(frozen=True)
class FrontendOptions:
    """Where and how the front ends listen. A port of None leaves that endpoint off; 0 picks a
    free port. Addresses default to loopback: serving beyond this machine is a decision."""

    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    http_address: str = "127.0.0.1"
    grpc_address: str = "127.0.0.1"
    metrics_address: str = "127.0.0.1"
    max_request_bytes: int = 64 * 1024 * 1024
    max_tensor_elements: int = 16 * 1024 * 1024
    grpc_max_message_bytes: int = 64 * 1024 * 1024
    http_timeout_keep_alive_secs: float = 75.0
    http_read_timeout_secs: float = 60.0
    exit_timeout_secs: float = 30.0
    http_restricted_api: tuple[str, ...] = ()
    grpc_restricted_api: tuple[str, ...] = ()
    server_id: str = SERVER_NAME
    # SageMaker's container contract (triton_nb.server.frontends.sagemaker) on a port of its own
    sagemaker_port: int | None = None
    sagemaker_address: str = "127.0.0.1"
    sagemaker_default_model: str = ""
    sagemaker_ping_mode: str = "ready"
    sagemaker_model_data: str = ""  # the runtime route's TargetModel folder (the server's repository)

    def __post_init__(self) -> None:
        for name in ("http_port", "grpc_port", "metrics_port", "sagemaker_port"):
            port = getattr(self, name)
            if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
                raise InvalidArgumentError(f"{name} must be a port number 0..65535 (0 picks a free one), got {port!r}")
        for name in ("max_request_bytes", "max_tensor_elements", "grpc_max_message_bytes"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.exit_timeout_secs < 0:
            raise InvalidArgumentError(f"exit_timeout_secs must be >= 0, got {self.exit_timeout_secs}")
        for name in ("http_timeout_keep_alive_secs", "http_read_timeout_secs"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise InvalidArgumentError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.sagemaker_ping_mode not in ("ready", "live"):
            raise InvalidArgumentError(f"SAGEMAKER_TRITON_PING_MODE must be 'ready' or 'live', got "
                                       f"{self.sagemaker_ping_mode!r}")
        parse_restricted_api(self.http_restricted_api, "http_restricted_api")  # refused now, not at start
        parse_restricted_api(self.grpc_restricted_api, "grpc_restricted_api")

    @property
    def enabled(self) -> bool:
        return any(p is not None for p in (self.http_port, self.grpc_port, self.metrics_port, self.sagemaker_port))


def _is_loopback(address: str) -> bool:
    if address in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _bind(address: str, port: int, what: str) -> socket.socket:
    if not _is_loopback(address):
        log.warning("%s listens on %s, reachable beyond this machine: anyone who can connect can use it",
                    what, address)
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InvalidArgumentError(f"{what} address {address!r} cannot be resolved: {exc}") from None
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(sockaddr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise UnavailableError(f"{what} cannot listen on {address}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; stay usable without it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class NetworkFrontends:
    """The HTTP, gRPC and metrics endpoints of one server (an :class:`InferenceService`)."""

    def __init__(self, server: InferenceService, options: FrontendOptions,
                 log_settings: LogSettings | None = None) -> None:
        self._server = server
        self.options = options
        self.log_settings = LogSettings() if log_settings is None else log_settings
        self.ports: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._uvicorn: list[Any] = []  # the metrics and SageMaker endpoints
        self._http: Any = None  # the HTTP relay (frontends.http.link.HttpRelay)
        self._http_app: Any = None
        self._grpc: Any = None
        self._tasks: list[asyncio.Task] = []
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._stop_began: float | None = None  # the loop's time when begin_stop was called
        self._limits = WireLimits(options.max_request_bytes, options.max_tensor_elements)

    # ------------------------------------------------------------------ start
    def start(self) -> dict[str, int]:
        """Bind, then serve on the front ends' thread; returns the bound ports by endpoint."""
        options = self.options
        sockets: dict[str, socket.socket] = {}
        try:
            if options.http_port is not None:
                sockets["http"] = _bind(options.http_address, options.http_port, "HTTP service")
            if options.metrics_port is not None:
                sockets["metrics"] = _bind(options.metrics_address, options.metrics_port, "metrics service")
            if options.sagemaker_port is not None:
                sockets["sagemaker"] = _bind(options.sagemaker_address, options.sagemaker_port, "SageMaker service")
        except BaseException:
            for sock in sockets.values():
                sock.close()
            raise
        self.ports = {name: sock.getsockname()[1] for name, sock in sockets.items()}
        try:
            self._http_app = self._new_http_app()
            if "http" in sockets:
                self._start_http_relay(sockets.pop("http"))
            if options.grpc_port is not None:
                self._start_grpc_relay()
        except BaseException:
            for sock in sockets.values():
                sock.close()
            if self._http is not None:
                self._http.kill()
            raise
        self._loop = _new_loop()
        self._thread = threading.Thread(target=self._run, args=(sockets,), name="triton-nb-frontends", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            self._thread.join()
            self.kill()
            raise self._start_error
        return dict(self.ports)

    def _new_http_app(self) -> Any:
        from triton_nb.server.frontends.http.app import HttpApp

        restricted = parse_restricted_api(self.options.http_restricted_api, "http_restricted_api")
        return HttpApp(self._server, self._limits, self.log_settings, restricted, server_id=self.options.server_id)

    def _start_http_relay(self, listener: socket.socket) -> None:
        """HTTP is terminated in a relay process (see :mod:`triton_nb.server.frontends.http.relay` for
        why); it serves the socket bound here, so this process closes its copy once the relay has it."""
        from triton_nb.server.frontends.http.link import HttpRelay

        options = self.options
        try:
            self._http = HttpRelay(self._http_app, listener, max_request_bytes=options.max_request_bytes,
                                   read_timeout_s=options.http_read_timeout_secs,
                                   keep_alive_s=options.http_timeout_keep_alive_secs,
                                   exit_timeout_s=options.exit_timeout_secs,
                                   grace_s=options.exit_timeout_secs + _ANSWER_GRACE_S)
        finally:
            listener.close()

    def _start_grpc_relay(self) -> None:
        """gRPC is terminated in a relay process (see :mod:`triton_nb.server.frontends.grpc.relay` for why)."""
        from triton_nb.server.frontends.grpc.link import GrpcRelay
        from triton_nb.server.frontends.grpc.servicer import GrpcServicer

        options = self.options
        if not _is_loopback(options.grpc_address):
            log.warning("gRPC service listens on %s, reachable beyond this machine: anyone who can connect can "
                        "use it", options.grpc_address)
        servicer = GrpcServicer(self._server, self._limits, self.log_settings, server_id=self.options.server_id)
        restricted = parse_restricted_api(options.grpc_restricted_api, "grpc_restricted_api")
        self._grpc = GrpcRelay(servicer, options.grpc_address, options.grpc_port, options.grpc_max_message_bytes,
                               restricted=restricted)
        self.ports["grpc"] = self._grpc.port

    def _run(self, sockets: dict[str, socket.socket]) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve(sockets))
        except BaseException as exc:  # a start failure is re-raised on the caller's thread
            self._start_error = exc
            self._ready.set()
        finally:
            for sock in sockets.values():
                sock.close()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self, sockets: dict[str, socket.socket]) -> None:
        import uvicorn

        from triton_nb.server.frontends.http.app import MetricsApp
        from triton_nb.server.frontends.http.connections import GuardedHttpProtocol

        options = self.options
        http = self._http_app
        apps = {"metrics": MetricsApp(self._server)}
        if "sagemaker" in sockets:
            from triton_nb.server.frontends.sagemaker import SageMakerApp

            apps["sagemaker"] = SageMakerApp(self._server, http, default_model=options.sagemaker_default_model,
                                             ping_mode=options.sagemaker_ping_mode,
                                             model_data=Path(options.sagemaker_model_data)
                                             if options.sagemaker_model_data else None)
        sweepers = []
        for name, sock in sockets.items():
            config = uvicorn.Config(
                apps[name], lifespan="off", log_config=None, access_log=False,
                # uvicorn's httptools protocol, with read deadlines and a head limit
                http=functools.partial(GuardedHttpProtocol, read_timeout_s=options.http_read_timeout_secs),
                timeout_keep_alive=options.http_timeout_keep_alive_secs,  # type: ignore[arg-type] # a float works
                timeout_graceful_shutdown=math.ceil(options.exit_timeout_secs + _ANSWER_GRACE_S),
                # the body limit is checked by the application, which names it in the error
            )
            server = uvicorn.Server(config)
            self._uvicorn.append(server)
            task = asyncio.ensure_future(server.serve(sockets=[sock]))
            self._tasks.append(task)
            sweepers.append(asyncio.ensure_future(self._sweep(server, task)))
        waits = list(self._tasks)
        if self._http is not None:
            waits.append((await self._http.connect()).closed)
        if self._grpc is not None:
            link = await self._grpc.connect()
            waits.append(link.closed)
        for server in self._uvicorn:
            while not server.started:
                if any(task.done() for task in self._tasks):
                    for task in self._tasks:
                        if task.done() and task.exception() is not None:
                            raise task.exception()
                    raise UnavailableError("the HTTP front end stopped while starting")
                await asyncio.sleep(0.005)
        self._ready.set()
        await asyncio.gather(*waits, return_exceptions=True)
        for sweeper in sweepers:
            sweeper.cancel()
        # requests uvicorn cancelled at the end of its grace answer 503 as they unwind: let them
        # write it before the loop closes
        leftovers = [t for server in self._uvicorn for t in server.server_state.tasks]
        if leftovers:
            await asyncio.wait(leftovers, timeout=1.0)

    async def _sweep(self, server: Any, serving: asyncio.Future) -> None:
        """Check every connection's read and idle clocks, about once a second (more often for a
        short timeout). Also while stopping: a request still arriving then has at most
        ``exit_timeout_secs`` to arrive, as the requests in flight have to be answered, so a slow
        client cannot hold the stop up (uvicorn waits for every connection to close)."""
        from triton_nb.server.frontends.http.connections import sweep_connections

        options = self.options
        period = max(0.05, min(1.0, options.http_read_timeout_secs / 4, options.http_timeout_keep_alive_secs / 4,
                               options.exit_timeout_secs / 4))
        loop = asyncio.get_running_loop()
        while not serving.done():
            await asyncio.sleep(period)
            cutoff = None if self._stop_began is None else self._stop_began + options.exit_timeout_secs
            sweep_connections(server.server_state.connections, loop.time(), cutoff)

    # ------------------------------------------------------------------ stop
    def begin_stop(self) -> None:
        """Stop accepting connections and requests; requests in flight carry on."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._thread is None or not self._thread.is_alive():
            return

        def signal_exit() -> None:
            self._stop_began = loop.time()
            for server in self._uvicorn:
                server.should_exit = True
            if self._http is not None:  # it answers what is in flight, then ends
                self._http.begin_stop()

        if self._grpc is not None:
            # new calls are refused at once; the relay ends once the calls in flight are answered
            self._grpc.begin_stop(self.options.exit_timeout_secs + _ANSWER_GRACE_S)

        with contextlib.suppress(RuntimeError):  # the loop closed in between
            loop.call_soon_threadsafe(signal_exit)

    def wait(self, timeout_s: float | None) -> bool:
        """Wait for the front ends' thread (and the gRPC relay) to end; True when they did."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for relay in (self._grpc, self._http):
            if relay is not None and not relay.wait(None if deadline is None else max(
                    0.0, deadline - time.monotonic())):
                return False
        if self._thread is None:
            return True
        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def kill(self) -> None:
        """After a stop that timed out: end the relay processes at once."""
        for relay in (self._grpc, self._http):
            if relay is not None:
                relay.kill()

    def stop(self) -> None:
        self.begin_stop()
        self.wait(self.options.exit_timeout_secs + _ANSWER_GRACE_S + 5)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
