"""Start and stop the real ``tritonserver`` of PyPI's ``nvidia-pytriton`` wheel.

The wheel ships Triton 2.51's server binary with its Python backend (no FIL backend), which serves a
Python-backend repository, for example the fraud ensemble exported with ``model_backend="python"``
or any repository turned into one by :func:`triton_nb.repository.python_twin_repository`. This is
how :func:`triton_nb.perf.replay` compares a sweep's pick with real Triton without a GPU or a
container, and how the tests check that what triton_nb writes loads on the real thing.

Installing it (its numpy<2 pin would downgrade the environment, so without its dependencies, and
numpy 1.x for the Python backend's stub beside it)::

    pip install --no-deps nvidia-pytriton==0.7.0
    pip install --target "$(python -c 'import sys; print(sys.prefix)')/triton-stub-site" "numpy<2" "pandas<3"

Nothing in site-packages is modified: every run gets its own temporary backend directory and a tiny
"virtual environment" that the Python backend's stub interpreter uses to find the packages of the
interpreter that started it. That stub (pybind11 built against NumPy 1.x) silently corrupts every
tensor under NumPy 2: inputs read wrong and outputs come back empty. The stub therefore gets an
"overlay" directory searched before this interpreter's site-packages, holding ``numpy<2`` (and
``pandas<3``, the last pandas that imports with NumPy 1): ``$REAL_TRITON_STUB_SITE``
(``os.pathsep``-separated) if set, else ``<sys.prefix>/triton-stub-site`` if it exists.

Usage::

    with TritonServerProcess(repo, extra_args=["--model-control-mode=explicit", "--load-model=*"]) as server:
        client = tritonclient.http.InferenceServerClient(server.http_url)
"""


from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import http.client
import importlib.metadata
import importlib.util
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from triton_nb.errors import TritonNBError

__all__ = [
    "TritonServerProcess",
    "TritonServerStartError",
    "TritonServerUnavailable",
    "tritonserver_unavailable_reason",
]

PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
DEFAULT_STUB_SITE = Path(sys.prefix) / "triton-stub-site"
STUB_SITE_ENV = "REAL_TRITON_STUB_SITE"
_STOP_TIMEOUT_S = 15.0
_START_ATTEMPTS = 3  # free ports are picked before the server binds them, so another process can win the race


class TritonServerUnavailable(TritonNBError, RuntimeError):
    """tritonserver cannot run on this machine; the message says why in one line (and what to install)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


class TritonServerStartError(TritonNBError, RuntimeError):
    """The server exited or did not become ready in time; the message has its error lines and log tail."""


@dataclass(frozen=True)
class _Layout:
    binary: Path
    backends: Path
    caches: Path
    stub: Path
    libs: Path
    libpython_dir: Path | None  # None: the dynamic loader finds the system's libpython
    python_home: Path  # <prefix>/bin of the libpython the stub loads; its stdlib is <prefix>/lib/pythonX.Y


def _missing_shared_libs(binary: Path, ld_library_path: str) -> list[str]:
    """Names of shared libraries that ``ldd`` cannot resolve for ``binary`` (empty if ldd is absent)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    env = {**os.environ, "LD_LIBRARY_PATH": ld_library_path}
    result = subprocess.run([ldd, str(binary)], env=env, capture_output=True, text=True, timeout=30, check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if "not found" in line]


def _interpreter_libpython() -> tuple[Path, Path] | None:
    """(LIBDIR, home) of the running interpreter's own shared libpython, if it was built with one.

    Embedding the very build that runs this process keeps the stub's stdlib and C core identical to
    the ones the installed packages were used with, and needs no system package.
    """
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return None
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    prefix = Path(sys.base_prefix)
    if not libdir or not soname or not (Path(libdir) / soname).is_file():
        return None
    if not (prefix / "lib" / f"python{PY_VERSION}" / "os.py").is_file():
        return None
    return Path(libdir), prefix / "bin"


@functools.cache
def _layout() -> _Layout:
    """Locate everything the server needs, or raise :class:`TritonServerUnavailable` with a one-line reason."""
    if not sys.platform.startswith("linux"):
        raise TritonServerUnavailable(f"tritonserver from nvidia-pytriton runs on Linux only, not {sys.platform}")
    # find_spec, not import: pytriton's own dependencies (numpy<2 pin) need not be installed to use its binary
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonServerUnavailable("nvidia-pytriton, whose tritonserver this starts, is not installed "
                                      "(pip install --no-deps nvidia-pytriton==0.7.0)")
    package = Path(next(iter(spec.submodule_search_locations)))
    root = package / "tritonserver"
    binary = root / "bin" / "tritonserver"
    if not os.access(binary, os.X_OK):
        raise TritonServerUnavailable(f"no executable tritonserver at {binary}")
    libs = next((p for p in (package.parent / "nvidia_pytriton.libs", root / "external_libs") if p.is_dir()), None)
    if libs is None:
        raise TritonServerUnavailable(f"nvidia-pytriton's bundled libraries are missing next to {package}")
    stub = root / "python_backend_stubs" / PY_VERSION / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonServerUnavailable(f"nvidia-pytriton has no Python backend stub for Python {PY_VERSION}")
    if not (root / "backends" / "python" / "libtriton_python.so").is_file():
        raise TritonServerUnavailable(f"nvidia-pytriton has no Python backend under {root / 'backends'}")
    if shutil.which("bash") is None:
        raise TritonServerUnavailable("bash is not on PATH (the Python backend launches its stub through it)")

    own = _interpreter_libpython()
    if own is not None:
        libpython_dir, home = own
    else:
        libpython_dir, home = None, Path("/usr/bin")
        if not (home.parent / "lib" / f"python{PY_VERSION}" / "os.py").is_file():
            raise TritonServerUnavailable(
                f"the Python {PY_VERSION} standard library is not in /usr/lib (apt-get install libpython{PY_VERSION})"
            )
    ld_path = os.pathsep.join(str(p) for p in (libs, libpython_dir) if p is not None)
    for program in (binary, stub):
        missing = _missing_shared_libs(program, ld_path)
        if missing:
            hint = f" (apt-get install libpython{PY_VERSION})" if any("libpython" in m for m in missing) else ""
            raise TritonServerUnavailable(f"{program.name} cannot load {', '.join(missing)}{hint}")
    return _Layout(binary, root / "backends", root / "caches", stub, libs, libpython_dir, home)


def default_stub_site() -> tuple[Path, ...]:
    """The overlay directories the stub searches first, unless a server is given its own."""
    configured = os.environ.get(STUB_SITE_ENV)
    if configured:
        return tuple(Path(p).resolve() for p in configured.split(os.pathsep) if p)
    return (DEFAULT_STUB_SITE,) if DEFAULT_STUB_SITE.is_dir() else ()


def _stub_site_dirs() -> list[str]:
    """Site directories of the running interpreter, which the stub interpreter should see too."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return dirs


def _check_stub_numpy(stub_site: Iterable[Path]) -> None:
    """Raise :class:`TritonServerUnavailable` unless the stub will import a NumPy 1.x."""
    search = [str(p) for p in stub_site] + _stub_site_dirs()
    found = next(iter(importlib.metadata.distributions(name="numpy", path=search)), None)
    if found is None:
        raise TritonServerUnavailable("numpy is not installed where the Python backend stub looks for it")
    if int(found.version.split(".")[0]) >= 2:
        raise TritonServerUnavailable(
            f"the Python backend stub would import numpy {found.version} from {found.locate_file('')}, and "
            f'Triton 2.51\'s stub corrupts tensors with numpy>=2: pip install --target {DEFAULT_STUB_SITE} "numpy<2" '
            f'"pandas<3" (or set {STUB_SITE_ENV})'
        )


def tritonserver_unavailable_reason() -> str | None:
    """None when a real tritonserver can run here (with the default stub overlay), else a one-line reason."""
    try:
        _layout()
        _check_stub_numpy(default_stub_site())
    except TritonServerUnavailable as exc:
        return str(exc)
    return None


_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """Run in the child before exec: the kernel kills the server if the process that started it dies, even by SIGKILL.

    The signal follows the *thread* that started the server, so start it from a thread that outlives it.
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _answers_200(url: str) -> bool:
    # refused connections, 503 (HTTPError is an OSError) and half-written answers all mean "not yet"
    with contextlib.suppress(OSError, http.client.HTTPException), urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200
    return False


def _metrics_enabled(args: Iterable[str]) -> bool:
    """Whether tritonserver will serve metrics, given extra command-line flags (the last one wins)."""
    enabled = True
    args = list(args)
    for i, arg in enumerate(args):
        if arg.startswith("--allow-metrics="):
            value = arg.partition("=")[2]
        elif arg == "--allow-metrics" and i + 1 < len(args):
            value = args[i + 1]
        else:
            continue
        enabled = value.strip().lower() not in {"false", "0", "no", "off"}
    return enabled


def _free_ports(count: int) -> list[int]:
    """Ports the kernel reports free on 127.0.0.1; all sockets are held together so the ports differ."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


class TritonServerProcess:
    """A real ``tritonserver`` process serving ``model_repository`` on free loopback ports.

    Use it as a context manager, or call :meth:`start` and :meth:`stop` (stop is idempotent and
    also runs at interpreter exit, so the process is never left behind).

    ``extra_args`` are appended to the command line (later flags win), e.g.
    ``("--exit-on-error=false", "--strict-readiness=false")`` to serve a repository in which some
    models fail to load. ``stub_site`` replaces :func:`default_stub_site` as the directories the
    Python backend's interpreter searches before this interpreter's site-packages.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        *,
        extra_args: Iterable[str] = (),
        startup_timeout_s: float = 90.0,
        stub_site: Iterable[str | os.PathLike[str]] | None = None,
        python_based_backends: Iterable[str | os.PathLike[str]] = (),
        wait_for: str = "ready",
    ) -> None:
        """``python_based_backends``: folders holding a ``model.py`` each, served as Python-based
        backends named after the folder (copied into the server's backend directory). ``wait_for``:
        the health endpoint (``ready`` or ``live``) that must answer 200 before :meth:`start`
        returns; ``live`` for a server that strict readiness keeps unready (a model failed)."""
        self.model_repository = Path(model_repository).resolve()
        self.python_based_backends = tuple(Path(p).resolve() for p in python_based_backends)
        self.stub_site = default_stub_site() if stub_site is None else tuple(Path(p).resolve() for p in stub_site)
        self.extra_args = tuple(extra_args)
        self.startup_timeout_s = startup_timeout_s
        if wait_for not in ("ready", "live"):
            raise ValueError(f"wait_for must be 'ready' or 'live', got {wait_for!r}")
        self.wait_for = wait_for
        self.startup_s: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._work_dir: Path | None = None
        self._log_path: Path | None = None
        self._final_log = ""
        self._stopping = False
        self._ready_process: subprocess.Popen[bytes] | None = None
        self.died_with: int | None = None  # the exit code (negative: the signal) of a death on its own
        self._ports: tuple[int, int, int] | None = None
        self._shm_prefix = f"real_triton_{uuid.uuid4().hex[:12]}_"

    # -- addresses -----------------------------------------------------------------------------

    def _port(self, index: int) -> int:
        if self._ports is None:
            raise RuntimeError("TritonServerProcess is not started")
        return self._ports[index]

    @property
    def http_url(self) -> str:
        """``127.0.0.1:PORT``, the form ``tritonclient.http.InferenceServerClient`` takes."""
        return f"127.0.0.1:{self._port(0)}"

    @property
    def grpc_url(self) -> str:
        """``127.0.0.1:PORT``, the form ``tritonclient.grpc.InferenceServerClient`` takes."""
        return f"127.0.0.1:{self._port(1)}"

    @property
    def metrics_url(self) -> str:
        """``http://127.0.0.1:PORT/metrics``, Prometheus text format."""
        return f"http://127.0.0.1:{self._port(2)}/metrics"

    @property
    def log_path(self) -> Path:
        """The file that receives the server's stdout and stderr (deleted by :meth:`stop`)."""
        if self._log_path is None:
            raise RuntimeError("TritonServerProcess is not started")
        return self._log_path

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self._process is not None else None

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> TritonServerProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()  # the log stays readable after it

    def start(self) -> None:
        """Start the server and wait until ``/v2/health/<wait_for>`` answers 200.

        Raises :class:`TritonServerUnavailable` or :class:`TritonServerStartError` (with the log's errors and tail).
        """
        if self._process is not None:
            raise RuntimeError("TritonServerProcess is already started")
        layout = _layout()
        _check_stub_numpy(self.stub_site)
        if not self.model_repository.is_dir():
            raise FileNotFoundError(f"model repository {self.model_repository} is not a directory")
        self._work_dir = Path(tempfile.mkdtemp(prefix="real-triton-"))
        atexit.register(self.stop)
        try:
            backends = self._prepare_backends(layout)
            env = self._server_env(layout)
            for attempt in range(1, _START_ATTEMPTS + 1):
                http_port, grpc_port, metrics_port = _free_ports(3)
                self._ports = (http_port, grpc_port, metrics_port)
                self._log_path = self._work_dir / f"tritonserver-{attempt}.log"
                try:
                    self._launch(layout, backends, env)
                    return
                except TritonServerStartError:
                    if attempt == _START_ATTEMPTS or "already in use" not in self.log_tail(200):
                        raise
        except BaseException:
            self.stop()
            raise

    def _prepare_backends(self, layout: _Layout) -> Path:
        """A private backend directory: links to the wheel's backends plus a copy of the stub for this Python."""
        assert self._work_dir is not None
        backends = self._work_dir / "backends"
        backends.mkdir()
        for backend in layout.backends.iterdir():
            if backend.name != "python":
                (backends / backend.name).symlink_to(backend, target_is_directory=True)
        python = backends / "python"
        python.mkdir()
        for item in (layout.backends / "python").iterdir():
            if item.name not in {"triton_python_backend_stub", "__pycache__"}:
                (python / item.name).symlink_to(item)
        shutil.copy2(layout.stub, python / "triton_python_backend_stub")
        for folder in self.python_based_backends:
            target = backends / folder.name
            shutil.copytree(folder, target)
            # Triton resolves the Python backend's library from the backend's own folder, which must
            # hold a copy (a link makes it load the default Python backend's model path instead)
            shutil.copy2(layout.backends / "python" / "libtriton_python.so", target / "libtriton_python.so")
        return backends

    def _server_env(self, layout: _Layout) -> dict[str, str]:
        """Environment that lets the server load its libraries and the stub find this interpreter's packages.

        The stub embeds libpython in isolated mode, so PYTHONPATH is ignored; it does locate
        ``python3`` on PATH and honours a ``pyvenv.cfg`` next to it. A throw-away venv whose
        ``home`` is the embedded libpython's prefix (so the stdlib matches) and whose site-packages
        holds a .pth that adds this interpreter's site directories (so .pth files there, editable
        installs included, are processed too) gives the stub the same packages as this interpreter.
        """
        assert self._work_dir is not None
        venv = self._work_dir / "stub-venv"
        bin_dir = venv / "bin"
        site_packages = venv / "lib" / f"python{PY_VERSION}" / "site-packages"
        bin_dir.mkdir(parents=True)
        site_packages.mkdir(parents=True)
        for name in ("python3", "python", f"python{PY_VERSION}"):
            (bin_dir / name).symlink_to(sys.executable)
        (venv / "pyvenv.cfg").write_text(
            f"home = {layout.python_home}\ninclude-system-site-packages = false\nversion = {PY_VERSION}\n"
        )
        # appended in this order after the stdlib, so the overlay's numpy<2 wins over this interpreter's numpy
        site_dirs = [os.fspath(d) for d in self.stub_site] + _stub_site_dirs()
        lines = [f"import site; site.addsitedir({d!r})" for d in site_dirs]
        (site_packages / "_real_triton_site.pth").write_text("\n".join(lines) + "\n")

        env = dict(os.environ)
        # bundled libs come first: the stub copy lost the $ORIGIN-relative rpath that found them
        ld_path = [str(layout.libs)]
        if layout.libpython_dir is not None:
            ld_path.append(str(layout.libpython_dir))
        if env.get("LD_LIBRARY_PATH"):
            ld_path.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(ld_path)
        env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", os.defpath)])
        return env

    def _launch(self, layout: _Layout, backends: Path, env: dict[str, str]) -> None:
        assert self._work_dir is not None and self._log_path is not None and self._ports is not None
        http_port, grpc_port, metrics_port = self._ports
        # the stub puts '' (the cwd) on sys.path: run from an empty directory so nothing stray is importable
        cwd = self._work_dir / "cwd"
        cwd.mkdir(exist_ok=True)
        args = [
            str(layout.binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backends}",
            f"--cache-directory={layout.caches}",
            "--http-address=127.0.0.1",
            f"--http-port={http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={grpc_port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={metrics_port}",
            "--log-verbose=0",
            # below our own SIGTERM grace period, so a graceful stop finishes before SIGKILL
            "--exit-timeout-secs=10",
            # the default shm region names are the same in every server: parallel servers would collide
            f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}",
            *self.extra_args,
        ]
        started = time.monotonic()
        self._stopping = False
        with open(self._log_path, "wb") as log:
            self._process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,  # its own process group, so SIGKILL also reaches the stub processes
                preexec_fn=_die_with_parent,
            )
        threading.Thread(target=self._watch, args=(self._process,), name="real-triton-watch", daemon=True).start()
        # HTTP is ready before the metrics endpoint starts, and a metrics port lost to another
        # process makes the server exit only then: wait for both, then make sure it did not fail
        urls = [f"http://127.0.0.1:{http_port}/v2/health/{self.wait_for}"]
        if _metrics_enabled(self.extra_args):
            urls.append(self.metrics_url)
        deadline = started + self.startup_timeout_s
        while True:
            code = self._process.poll()
            if code is not None:
                self._process = None
                raise TritonServerStartError(
                    f"tritonserver exited with code {code} before it was ready{self._report()}"
                )
            # an endpoint that failed to start means the server is on its way out: the next poll reports it
            if all(_answers_200(url) for url in urls) and not any("failed to start" in e for e in self._errors()):
                self._ready_process = self._process  # from now on the watcher reports a death
                if self._process.poll() is None:  # else it died before that: the next turn reports it
                    self.startup_s = time.monotonic() - started
                    return
                continue
            if time.monotonic() > deadline:
                report = self._report()
                self._terminate()
                raise TritonServerStartError(f"tritonserver was not ready after {self.startup_timeout_s:.0f} s{report}")
            time.sleep(0.1)

    def _watch(self, process: subprocess.Popen[bytes]) -> None:
        """When the server dies on its own, end its stub processes at once: they hold its
        connections open, so a client would otherwise wait for its whole timeout."""
        code = process.wait()
        if self._stopping or process is not self._ready_process:
            return  # stopped by us, or exited before it was ready (start reports that)
        self.died_with = code
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    def _terminate(self) -> None:
        """SIGTERM, then SIGKILL to the whole process group after the grace period."""
        self._stopping = True
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # stubs that outlived the server, or a hung server
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)

    def stop(self) -> None:
        """Stop the server (if running) and delete its temporary files; safe to call repeatedly."""
        self._terminate()
        atexit.unregister(self.stop)
        if self._log_path is not None and self._log_path.is_file():
            self._final_log = self._log_path.read_text(encoding="utf-8", errors="replace")
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None
        # a killed Python backend cannot unlink its shared memory; the prefix is unique to this server
        shm = Path("/dev/shm")
        if shm.is_dir():
            for leftover in shm.glob(f"{self._shm_prefix}*"):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def _errors(self) -> list[str]:
        """The server's error-level log lines (``E1129 12:00:00.000 ...``)."""
        return [line for line in self.log_tail(100_000).splitlines() if line[:1] == "E" and line[1:2].isdigit()]

    def _report(self) -> str:
        """Error lines first (the model-status tables push them out of a short tail), then the tail."""
        errors = self._errors()
        text = "\nerrors:\n" + "\n".join(errors[-20:]) if errors else ""
        return text + f"\nlog tail:\n{self.log_tail()}"

    def log_tail(self, n_lines: int = 60) -> str:
        """The last ``n_lines`` lines the server wrote (also available after :meth:`stop`)."""
        if self._log_path is not None and self._log_path.is_file():
            text = self._log_path.read_text(encoding="utf-8", errors="replace")
        else:
            text = self._final_log
        return "\n".join(text.splitlines()[-n_lines:])
