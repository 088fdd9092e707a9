"""A Python model's own environment: ``parameters { key: "EXECUTION_ENV_PATH" ... }``.

Triton's Python backend runs a model whose config names an ``EXECUTION_ENV_PATH`` — a conda-pack
archive (``.tar.gz``), usually ``$$TRITON_MODEL_DIRECTORY/<env>.tar.gz`` — with the interpreter and
packages inside it. Here too: the archive is unpacked once into a cache keyed by its SHA-256 (so two
models, two instances or two servers share one unpacked copy, and a changed archive gets a new one),
``bin/conda-unpack`` is run there as conda-pack's documentation says (it rewrites the prefixes baked
into the environment), and the model's instances run as processes of ``bin/python``
(:mod:`triton_nb.backends.python_process`) with the environment's ``bin`` first on ``PATH`` and its
``lib`` on ``LD_LIBRARY_PATH``. A path to an already unpacked environment (a folder) is used as it is.

The cache lives in ``$TRITON_NB_ENV_CACHE``, else ``~/.cache/triton_nb/execution_envs``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from triton_nb.errors import InvalidArgumentError, NotFoundError

__all__ = ["EXECUTION_ENV_PARAMETER", "ExecutionEnvironment", "execution_environment"]

EXECUTION_ENV_PARAMETER = "EXECUTION_ENV_PATH"
_MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
_CHUNK_BYTES = 1 << 20


class ExecutionEnvironment:
    """An unpacked environment: its interpreter and the process environment to run it in."""

    def __init__(self, root: Path) -> None:
        self.root = root
        candidates = [root / "bin" / "python3", root / "bin" / "python"]
        found = next((c for c in candidates if c.exists()), None)
        if found is None:
            raise NotFoundError(f"the execution environment {root} has no bin/python3 or bin/python")
        self.interpreter = str(found)

    def process_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(self.root / "bin"), env.get("PATH", "")])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(self.root / "lib"), env.get("LD_LIBRARY_PATH"))
                                                 if p)
        env.pop("PYTHONHOME", None)  # this kernel's would make the environment's interpreter load ours
        env.pop("VIRTUAL_ENV", None)
        return env


def _cache_root() -> Path:
    configured = os.environ.get("TRITON_NB_ENV_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "triton_nb" / "execution_envs"


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(_CHUNK_BYTES), b""):
            sha.update(chunk)
    return sha.hexdigest()


def _unpack(model: str, archive: Path, target: Path) -> None:
    """Unpack into ``target`` (a fresh folder) and run conda-unpack there."""
    try:
        with tarfile.open(archive) as tar:
            # conda-pack archives hold relative links inside the environment; the data filter
            # refuses anything that would land outside it
            tar.extractall(target, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise InvalidArgumentError(f"model '{model}': {EXECUTION_ENV_PARAMETER} {archive} cannot be unpacked: "
                                   f"{exc}") from exc
    unpack = target / "bin" / "conda-unpack"
    if unpack.exists():
        environment = ExecutionEnvironment(target)
        result = subprocess.run([environment.interpreter, str(unpack)], capture_output=True, text=True,
                                env=environment.process_env(), timeout=600)
        if result.returncode != 0:
            raise InvalidArgumentError(f"model '{model}': conda-unpack in {target} failed: "
                                       f"{(result.stderr or result.stdout).strip()[-500:]}")


def execution_environment(model: str, parameter: str, model_path: Path) -> ExecutionEnvironment:
    """The environment ``EXECUTION_ENV_PATH`` = ``parameter`` names for ``model`` (its folder
    ``model_path``), unpacked into the cache if it is an archive."""
    path = Path(parameter.replace(_MODEL_DIRECTORY, str(model_path)))
    if not path.is_absolute():
        path = model_path / path
    if path.is_dir():
        return ExecutionEnvironment(path)
    if not path.is_file():
        raise NotFoundError(f"model '{model}': {EXECUTION_ENV_PARAMETER} {path} does not exist")
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / _digest(path)
    with (root / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one unpacking at a time, across processes too
        if not (target / ".complete").exists():
            # unpacked in place: conda-unpack writes the folder it runs in into the environment's scripts
            if target.exists():
                shutil.rmtree(target)  # what an interrupted unpacking left
            target.mkdir()
            try:
                _unpack(model, path, target)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            (target / ".complete").touch()
    return ExecutionEnvironment(target)
