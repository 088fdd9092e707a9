"""Scanning a Triton model repository: models, versions, version policy, files, fingerprints.

Triton's layout: ``<repository>/<model>/config.pbtxt`` and numeric version folders
``<repository>/<model>/<version>/`` holding the model files. Which versions are served is the
``version_policy``: the latest N (default 1), all, or a specific list. A content fingerprint
per model version (the config plus every file of that version) tells a poller when a model
changed on disk, the way Triton's POLL mode notices edits.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.repository.config import CONFIG_FILENAME, ModelConfig, effective_config, load_config
from triton_nb.repository.warmup import WARMUP_FOLDER

__all__ = ["ModelEntry", "RepositoryScan", "is_model_folder", "read_model_config", "scan_repository",
           "select_versions"]

# Folders of a model that Triton reads for other purposes and never takes for versions
# (model_lifecycle.cc VersionsToLoad: warm-up data, sequence initial state, config overrides).
_TRITON_FOLDERS = frozenset({WARMUP_FOLDER, "initial_state", "configs"})


@dataclass
class ModelEntry:
    """One model folder of a repository."""

    name: str
    path: Path
    config: ModelConfig | None  # None when config.pbtxt is missing or does not parse
    error: str | None = None  # why the config could not be read
    versions: list[int] = field(default_factory=list)  # every numeric version folder, ascending
    ignored: list[str] = field(default_factory=list)  # non-numeric entries Triton skips

    @property
    def selected_versions(self) -> list[int]:
        """The versions the version policy serves."""
        if self.config is None:
            return []
        return select_versions(self.config, self.versions)

    def version_path(self, version: int) -> Path:
        return self.path / str(version)

    def version_files(self, version: int) -> list[Path]:
        """Every file of a version folder, recursively, sorted (for stable fingerprints)."""
        root = self.version_path(version)
        return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)

    def fingerprint(self, version: int) -> str:
        """SHA-256 over the config file, the names and bytes of the version's files and those of
        the warm-up data (``warmup/``), which the load reads too."""
        digest = hashlib.sha256()
        config_path = self.path / CONFIG_FILENAME
        if config_path.is_file():
            digest.update(config_path.read_bytes())
        root = self.version_path(version)
        for path in self.version_files(version):
            digest.update(b"\0" + path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
        warmup = self.path / WARMUP_FOLDER
        for path in sorted(p for p in warmup.rglob("*") if p.is_file()) if warmup.is_dir() else ():
            digest.update(b"\1" + path.relative_to(warmup).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
        return digest.hexdigest()


@dataclass
class RepositoryScan:
    """What is on disk in a repository folder."""

    path: Path
    models: dict[str, ModelEntry]

    def __getitem__(self, name: str) -> ModelEntry:
        try:
            return self.models[name]
        except KeyError:
            raise NotFoundError(f"no model '{name}' in repository {self.path}") from None


def select_versions(config: ModelConfig, available: list[int]) -> list[int]:
    """Apply a version policy to the available version numbers (ascending result)."""
    available = sorted(available)
    choice = config.version_policy.WhichOneof("policy_choice")
    if choice == "all":
        return available
    if choice == "specific":
        wanted = set(config.version_policy.specific.versions)
        return [v for v in available if v in wanted]
    count = config.version_policy.latest.num_versions if choice == "latest" else 1
    return available[-max(count, 1):] if available else []


def read_model_config(folder: str | os.PathLike[str], *, auto_complete_config: bool = True) -> ModelConfig:
    """The config a model folder declares, as Triton reads it: its ``config.pbtxt``; or, for a
    folder without one whose version folder holds a ``model.py``, a Python-backend config for the
    model's ``auto_complete_config`` to fill in — Triton serves such a folder when auto-complete
    is on (its default; ``--disable-auto-complete-config`` turns it off, and then the folder is
    refused with Triton's message)."""
    folder = Path(folder)
    path = folder / CONFIG_FILENAME
    if path.is_file():
        return load_config(path)
    if not auto_complete_config:
        raise NotFoundError(f"Poll failed for model directory '{folder.name}': failed to open text file for read "
                            f"{path}: No such file or directory")
    if _holds_python_model(folder):
        return ModelConfig(name=folder.name, backend="python")
    return load_config(path)  # its own message: no configuration here


def is_model_folder(folder: str | os.PathLike[str], *, auto_complete_config: bool = True) -> bool:
    """Whether Triton takes ``folder`` for a model (without reading its config): it holds a
    ``config.pbtxt`` or, with auto-complete on, a version folder's ``model.py``."""
    folder = Path(folder)
    return (folder / CONFIG_FILENAME).is_file() or (auto_complete_config and _holds_python_model(folder))


def _holds_python_model(folder: Path) -> bool:
    return any(child.name.isdigit() and (child / "model.py").is_file() for child in folder.iterdir())


def _scan_model(folder: Path, auto_complete_config: bool = True) -> ModelEntry:
    entry = ModelEntry(name=folder.name, path=folder, config=None)
    try:
        entry.config = effective_config(read_model_config(folder, auto_complete_config=auto_complete_config),
                                        folder.name)
    except (InvalidArgumentError, NotFoundError) as exc:
        entry.error = str(exc)
    for child in sorted(folder.iterdir()):
        if not child.is_dir() or child.name.startswith(".") or child.name in ("__pycache__", *_TRITON_FOLDERS):
            continue
        if child.name.isdigit():
            entry.versions.append(int(child.name))
        else:
            entry.ignored.append(child.name)
    entry.versions.sort()
    return entry


def scan_repository(path: str | os.PathLike[str], *, auto_complete_config: bool = True) -> RepositoryScan:
    """Read the layout of a repository: every model folder, its config and its versions.

    A model whose config is missing or broken is still listed, with ``error`` saying why, so
    one bad model never hides the others. ``auto_complete_config``: whether a Python model's
    folder without ``config.pbtxt`` is a model (see :func:`read_model_config`).
    """
    root = Path(path)
    if not root.exists():
        raise NotFoundError(f"model repository {root} does not exist")
    if not root.is_dir():
        raise InvalidArgumentError(f"model repository {root} is not a folder")
    if (root / CONFIG_FILENAME).is_file():
        raise InvalidArgumentError(
            f"{root} holds a {CONFIG_FILENAME} itself: that is a model folder; the repository is its parent"
        )
    models = {
        child.name: _scan_model(child, auto_complete_config)
        for child in sorted(root.iterdir())
        if child.is_dir() and not child.name.startswith(".") and child.name != "__pycache__"
    }
    return RepositoryScan(path=root, models=models)
