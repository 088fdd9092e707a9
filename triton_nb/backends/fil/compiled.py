"""The ``tl2cgen`` engine: the trees compiled to C, built in the background and cached on disk.

:class:`Builder` finds or builds the shared library of one model. tl2cgen writes the trees as C;
our dense-batch entry point, the C file ``triton_nb_shim.c`` shipped next to this module, is
compiled into the same library; the system C compiler runs at low priority, one process per
translation unit, and every process is killed when the build is cancelled. Libraries are cached
under :func:`cache_directory`, named by a hash of everything that changes the machine code (the
model file, its model_type, the tl2cgen and Treelite versions, the compiler and its flags, the
OpenMP runtime, the shim's version and text, the platform), and published with an atomic rename.
:class:`CompiledLibrary` loads a built library through ctypes and makes its candidates.

Imports from this package: :mod:`.common`, :mod:`.loading` (the model to build) and
:mod:`.engines` (the candidates it makes).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from triton_nb._native_logs import native_stderr_to_logging, route_native_logs
from triton_nb._optional import optional_module
from triton_nb.backends.fil.common import Cancelled, log
from triton_nb.backends.fil.engines import Candidate
from triton_nb.backends.fil.loading import LoadedModel

# Compilation. -O1: on tl2cgen's deeply nested if-else code it compiles twice as fast as -O3 and
# the code runs as fast or faster (measured: 200 trees of depth 8, gcc 12).
_COMPILE_FLAGS = ("-O1", "-fPIC", "-std=c99")
#: Batches up to this many rows run the compiled model with the GIL held (see the predict below).
HOLD_GIL_MAX_ROWS = 64
_TREES_PER_UNIT = 8  # translation units of ~8 trees compile fastest in parallel
_MAX_UNITS = 64
_POLL_S = 0.02

# Bump when the shim's C interface changes: a library built for another version is refused at load.
_SHIM_VERSION = 1
# Our entry point, compiled into the library next to tl2cgen's code: a dense float32 batch in,
# ``rows x (N_TARGET * MAX_N_CLASS)`` float32 out. NaN means missing (tl2cgen marks a missing
# feature with ``missing = -1``). Rows are split in contiguous chunks over ``nthread`` OpenMP
# threads; ``predict`` accumulates into its result, which is zeroed for every row. It is package
# data, and the same name is used in the build folder.
_SHIM_FILE = "triton_nb_shim.c"


@functools.cache
def _shim_source() -> str:
    """The shim's C source, as shipped in this package.

    Its exact text is hashed into every library's cache key, so any edit to the file, a comment
    included, names new libraries and leaves the cached ones unused (explanations of the C code
    therefore live in the comment above, not in the file).
    """
    return resources.files("triton_nb.backends.fil").joinpath(_SHIM_FILE).read_text(encoding="utf-8")


def cache_directory() -> Path:
    """Where compiled tree libraries are cached: ``$TRITON_NB_CACHE_DIR/tl2cgen``, else
    ``$XDG_CACHE_HOME/triton_nb/tl2cgen``, else ``~/.cache/triton_nb/tl2cgen``."""
    root = os.environ.get("TRITON_NB_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "tl2cgen"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "triton_nb" / "tl2cgen"


def _tl2cgen() -> Any | None:
    """The tl2cgen module, or None (a seam for tests)."""
    module = optional_module("tl2cgen")
    if module is not None:
        route_native_logs()
    return module


def _find_compiler() -> list[str] | None:
    """The C compiler command: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH (None: none)."""
    if sys.platform == "win32":
        return None
    env = os.environ.get("CC", "").strip()
    if env:
        args = shlex.split(env)
        found = shutil.which(args[0])
        return [found, *args[1:]] if found else None
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


@dataclass(frozen=True)
class _CompilerInfo:
    identity: str  # the command and the first line of its --version
    openmp: bool  # -fopenmp compiles and links
    gcc: bool  # GCC proper (its OpenMP code calls libgomp), not clang


_compiler_info: dict[tuple[str, ...], _CompilerInfo | None] = {}
_compiler_info_lock = threading.Lock()


def _compiler_identity(compiler: Sequence[str]) -> _CompilerInfo | None:
    """What a compiler is and whether OpenMP works with it, probed once per process; None: unusable."""
    key = tuple(compiler)
    with _compiler_info_lock:
        if key in _compiler_info:
            return _compiler_info[key]
        try:
            version = subprocess.run([*key, "--version"], capture_output=True, text=True, timeout=30, check=True)
            text = version.stdout.strip()
            with tempfile.TemporaryDirectory(prefix="triton_nb-omp-") as tmp:
                source = Path(tmp) / "probe.c"
                source.write_text("#include <omp.h>\nint probe(void) { return omp_get_max_threads(); }\n")
                probe = subprocess.run(
                    [*key, "-shared", "-fPIC", "-fopenmp", "-o", str(Path(tmp) / "probe.so"), str(source)],
                    capture_output=True, timeout=60,
                )
            lowered = text.lower()
            result: _CompilerInfo | None = _CompilerInfo(
                identity=f"{' '.join(key)}: {text.splitlines()[0] if text else ''}",
                openmp=probe.returncode == 0,
                gcc="clang" not in lowered and ("gcc" in lowered or "free software foundation" in lowered),
            )
        except (OSError, subprocess.SubprocessError):
            result = None
        _compiler_info[key] = result
        return result


def _bundled_openmp(package: str) -> Path | None:
    """The libgomp a manylinux wheel of ``package`` bundles (``<site-packages>/<package>.libs``)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        return None
    libs = Path(spec.origin).resolve().parent.parent / f"{package}.libs"
    found = sorted(libs.glob("libgomp*.so*")) if libs.is_dir() else []
    return found[0] if found else None


def _openmp_runtime(model: LoadedModel, compiler: _CompilerInfo) -> Path | None:
    """The OpenMP runtime to link the compiled model against: the one its other engines use.

    XGBoost and Treelite wheels bundle their own libgomp. Two OpenMP runtimes in one process each
    keep a team of threads spinning for a while after every parallel region, and on a machine with
    few cores each team then waits for the other's spinning threads to be descheduled: measured
    on 2 cores, 64 rows took 3.4 ms instead of 0.2 ms right after an XGBoost call. Sharing one
    runtime shares one (already warm) thread team. LightGBM uses the system's libgomp, which
    ``-fopenmp`` links by default (None here).
    """
    if not (compiler.openmp and compiler.gcc and sys.platform.startswith("linux")):
        return None
    if model.xgboost is not None:
        return _bundled_openmp("xgboost")
    if model.lightgbm is None:
        return _bundled_openmp("treelite")
    return None


_key_locks: dict[str, threading.Lock] = {}
_key_locks_guard = threading.Lock()
_live_builders: weakref.WeakSet[Builder] = weakref.WeakSet()


def _key_lock(key: str) -> threading.Lock:
    with _key_locks_guard:
        return _key_locks.setdefault(key, threading.Lock())


@atexit.register
def _cancel_all_builds() -> None:
    for builder in list(_live_builders):
        builder.cancel()


class Builder:
    """Finds or builds the compiled library of one model; cancellable from another thread.

    Builds of the same library inside this process are serialised (the second finds the first's
    result in the cache); across processes the atomic rename makes concurrent builds harmless.
    """

    def __init__(self, model: LoadedModel, threads: int, label: str) -> None:
        self.model = model
        self.label = label
        self.jobs = max(1, threads)
        self.reason = ""  # why there is no library, when there is none
        self._stop = threading.Event()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._procs_lock = threading.Lock()
        self._launched = 0
        self.library_path: Path | None = None
        tl2cgen = _tl2cgen()
        compiler = _find_compiler()
        identity = _compiler_identity(compiler) if compiler else None
        if tl2cgen is None:
            self.reason = "tl2cgen is not installed (pip install tl2cgen)"
        elif compiler is None or identity is None:
            self.reason = "no working C compiler was found (set CC, or install gcc or clang)"
        if self.reason:
            self.compiler: list[str] = []
            self.openmp = False
            self.key = ""
            return
        import treelite

        assert compiler is not None and identity is not None and tl2cgen is not None
        self.compiler = compiler
        self.openmp = identity.openmp
        self.flags = [*_COMPILE_FLAGS, *(["-fopenmp"] if self.openmp else [])]
        self.runtime = _openmp_runtime(model, identity)
        digest = hashlib.sha256()
        for part in (model.file_hash, model.model_type, tl2cgen.__version__, treelite.__version__, identity.identity,
                     " ".join(self.flags), str(self.runtime), str(_SHIM_VERSION),
                     hashlib.sha256(_shim_source().encode()).hexdigest(), sys.platform, os.uname().machine):
            digest.update(part.encode())
            digest.update(b"\0")
        self.key = digest.hexdigest()[:32]
        self.library_path = cache_directory() / f"{self.key}{_library_suffix()}"
        _live_builders.add(self)

    @property
    def available(self) -> bool:
        return not self.reason

    def cached(self) -> Path | None:
        path = self.library_path
        return path if path is not None and path.is_file() else None

    def cancel(self) -> None:
        self._stop.set()
        with self._procs_lock:
            procs = list(self._procs)
        for proc in procs:
            with contextlib.suppress(OSError):
                proc.kill()

    def _check(self) -> None:
        if self._stop.is_set():
            raise Cancelled()

    def build(self) -> Path:
        """The library's path, from the cache or compiled now (raises Cancelled, RuntimeError)."""
        assert self.library_path is not None
        lock = _key_lock(self.key)
        while not lock.acquire(timeout=0.1):
            self._check()
        try:
            self._check()
            cached = self.cached()
            if cached is not None:
                return cached
            return self._compile()
        finally:
            lock.release()

    def _compile(self) -> Path:
        tl2cgen = _tl2cgen()
        assert tl2cgen is not None and self.library_path is not None
        cache = self.library_path.parent
        try:
            cache.mkdir(parents=True, exist_ok=True)
            _remove_stale_builds(cache)
            workdir = Path(tempfile.mkdtemp(prefix=f".build-{self.key}-", dir=cache))
        except OSError as exc:
            raise RuntimeError(f"cannot write the cache directory {cache}: {exc}") from exc
        try:
            units = max(1, min(_MAX_UNITS, math.ceil(self.model.treelite.num_tree / _TREES_PER_UNIT)))
            params = {"parallel_comp": units} if units > 1 else {}
            # TL2cgen's own Treelite writes to stderr when it reads the model (see _native_logs)
            with native_stderr_to_logging("tl2cgen"):
                tl2cgen.generate_c_code(self.model.treelite, str(workdir), params)
            self._check()
            header = (workdir / "header.h").read_text()
            match = re.search(r"void\s+predict\s*\(\s*union\s+Entry\s*\*\s*\w+\s*,\s*int\s+\w+\s*,\s*(\w+)\s*\*",
                              header)
            leaf_type = match.group(1) if match else "float"
            (workdir / _SHIM_FILE).write_text(_shim_source())
            defines = [f"-DTNB_LEAF_T={leaf_type}", f"-DTNB_SHIM_VERSION={_SHIM_VERSION}"]
            sources = sorted(workdir.glob("*.c"), key=lambda p: -p.stat().st_size)  # longest first
            objects = [source.with_suffix(".o") for source in sources]
            commands = [[*self.compiler, "-c", *self.flags, *defines, "-o", str(obj), str(src)]
                        for src, obj in zip(sources, objects, strict=True)]
            self._run_all(commands, workdir)
            target = workdir / f"model{_library_suffix()}"
            link = [*self.compiler, "-shared", *_COMPILE_FLAGS, "-o", str(target), *map(str, objects), "-lm"]
            default_link = [*link, *(["-fopenmp"] if self.openmp else [])]
            if self.runtime is None:
                self._run_all([default_link], workdir)
            else:
                # Link the OpenMP runtime the other engines use (see _openmp_runtime), not the system's.
                try:
                    self._run_all([[*link, str(self.runtime), f"-Wl,-rpath,{self.runtime.parent}"]], workdir)
                except RuntimeError as exc:
                    log.debug("%s: linking against %s failed (%s); using the default", self.label, self.runtime, exc)
                    self._run_all([default_link], workdir)
            self._check()
            os.replace(target, self.library_path)  # atomic: readers see no library or a whole one
            return self.library_path
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _run_all(self, commands: list[list[str]], workdir: Path) -> None:
        """Run the commands, ``self.jobs`` at a time, at low priority; raise on the first failure."""
        nice = shutil.which("nice")
        pending = list(commands)
        running: list[tuple[subprocess.Popen[bytes], Path]] = []
        try:
            while pending or running:
                self._check()
                while pending and len(running) < self.jobs:
                    command = pending.pop(0)
                    self._launched += 1
                    log_path = workdir / f"cc-{self._launched}.log"
                    with open(log_path, "wb") as log_file:
                        proc = subprocess.Popen(
                            [nice, "-n", "10", *command] if nice else command,
                            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, cwd=workdir,
                        )
                    with self._procs_lock:
                        self._procs.append(proc)
                    running.append((proc, log_path))
                    self._check()
                time.sleep(_POLL_S)
                for proc, log_path in list(running):
                    if proc.poll() is None:
                        continue
                    running.remove((proc, log_path))
                    with self._procs_lock:
                        self._procs.remove(proc)
                    self._check()
                    if proc.returncode != 0:
                        output = log_path.read_text(errors="replace").strip().splitlines()
                        raise RuntimeError(
                            f"the C compiler failed (exit {proc.returncode}): {' | '.join(output[-5:])[:800]}"
                        )
        finally:
            for proc, _ in running:
                with contextlib.suppress(OSError):
                    proc.kill()
                with contextlib.suppress(subprocess.SubprocessError):
                    proc.wait(timeout=5)
                with self._procs_lock, contextlib.suppress(ValueError):
                    self._procs.remove(proc)


def _remove_stale_builds(cache: Path, age_s: float = 24 * 3600) -> None:
    """Remove build folders a killed process left behind (a day old: no build takes that long)."""
    now = time.time()
    for folder in cache.glob(".build-*"):
        with contextlib.suppress(OSError):
            if now - folder.stat().st_mtime > age_s:
                shutil.rmtree(folder, ignore_errors=True)


def _library_suffix() -> str:
    return ".dylib" if sys.platform == "darwin" else ".so"


class CompiledLibrary:
    """A shared library built from the model by tl2cgen, with our dense-batch entry point."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        if self._lib.triton_nb_shim_version() != _SHIM_VERSION:
            raise RuntimeError(f"{path} was built for another version of triton_nb")
        self._lib.triton_nb_num_outputs.restype = ctypes.c_int32
        self._lib.get_num_feature.restype = ctypes.c_int32
        self.num_outputs = int(self._lib.triton_nb_num_outputs())
        self.num_feature = int(self._lib.get_num_feature())
        # Two handles on one entry point: CDLL releases the GIL for the call, PyDLL keeps it.
        self._predict, self._predict_holding_gil = (
            self._entry(library) for library in (self._lib, ctypes.PyDLL(str(path))))

    @staticmethod
    def _entry(library: ctypes.CDLL) -> Callable[..., int]:
        fn = library.triton_nb_predict
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        return fn

    def candidate(self, threads: int) -> Candidate:
        releasing, holding = self._predict, self._predict_holding_gil
        num_outputs = self.num_outputs

        def predict(x: np.ndarray) -> np.ndarray:
            rows = x.shape[0]
            out = np.empty((rows, num_outputs), dtype=np.float32)
            # A small batch keeps the GIL: its call is over in microseconds, while taking the GIL
            # back from the threads that grabbed it meanwhile can take a switch interval (5 ms).
            fn = holding if rows <= HOLD_GIL_MAX_ROWS else releasing
            if fn(x.ctypes.data, rows, x.shape[1], threads, out.ctypes.data) != 0:
                raise MemoryError("the compiled tree model could not allocate its work buffer")
            return out

        return Candidate("tl2cgen", threads, predict)
