"""``triton_nb.show_versions()``: what is installed, for a bug report or to see which extras are there.

The core is what ``pip install triton-nb`` installs (train, export, serve, tune); each extra is
one optional feature and the packages that enable it. Both tables mirror pyproject.toml (a test
keeps them equal). Versions are read from the installed distributions' metadata, so nothing
here imports a package (an optional one could be slow to import, or fail without a GPU).
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import TextIO

__all__ = ["CORE_PACKAGES", "EXTRAS", "Extra", "show_versions"]

# [project.dependencies], by distribution name
CORE_PACKAGES: tuple[str, ...] = (
    "numpy", "pandas", "xgboost", "treelite", "tl2cgen", "scikit-learn", "matplotlib", "ipywidgets",
    "ipython", "jupyterlab", "tqdm", "prometheus-client", "tritonclient", "protobuf", "ml_dtypes", "grpcio",
    "uvicorn", "httptools", "uvloop", "orjson",
)


@dataclass(frozen=True)
class Extra:
    """One pyproject extra: its name, what it enables and the distributions it installs."""

    name: str
    enables: str
    packages: tuple[str, ...]

    @property
    def pip_command(self) -> str:
        return f"pip install 'triton-nb[{self.name}]'"


# [project.optional-dependencies] that add a feature (all, dev and docs only group others or tools)
EXTRAS: tuple[Extra, ...] = (
    Extra("dask", "training on a Dask cluster (train_fraud_model(..., client=...))", ("dask", "distributed")),
    Extra("lightgbm", "exporting LightGBM models; LightGBM's own engine and SHAP values in FIL", ("lightgbm",)),
    Extra("onnx", "exporting tree models as ONNX and serving them (the onnxruntime backend)",
          ("onnx", "onnxmltools", "skl2onnx", "onnxruntime")),
    Extra("sagemaker", "calling a SageMaker endpoint with boto3 (or the server's, allow_sagemaker=True)", ("boto3",)),
    Extra("gpu", "cuDF preprocessing, cuML's FIL and ONNX Runtime on CUDA (NVIDIA GPU, CUDA 12)",
          ("cudf-cu12", "cuml-cu12", "onnxruntime-gpu")),
)

_NOT_INSTALLED = "not installed"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return _NOT_INSTALLED


def _triton_nb_version() -> str:
    from triton_nb._version import __version__

    return __version__


def show_versions(file: TextIO | None = None) -> None:
    """Print Python, the platform, triton_nb's version, each core dependency's version and, for
    each extra, what it enables, its packages' versions (or "not installed") and the ``pip
    install`` command that adds it. ``file`` defaults to standard output."""
    out = file if file is not None else sys.stdout
    lines = [
        f"triton_nb    {_triton_nb_version()}",
        f"Python       {platform.python_version()} ({platform.python_implementation()}, {sys.executable})",
        f"platform     {platform.platform()}",
        "",
        "core (pip install triton-nb):",
    ]
    width = max(map(len, CORE_PACKAGES + tuple(p for e in EXTRAS for p in e.packages))) + 2
    lines += [f"  {name:<{width}}{_version(name)}" for name in CORE_PACKAGES]
    for extra in EXTRAS:
        versions = {name: _version(name) for name in extra.packages}
        missing = sum(v == _NOT_INSTALLED for v in versions.values())
        state = "installed" if not missing else ("not installed" if missing == len(versions) else "partly installed")
        lines += ["", f"[{extra.name}] {extra.enables}: {state}; {extra.pip_command}"]
        lines += [f"  {name:<{width}}{version}" for name, version in versions.items()]
    print("\n".join(lines), file=out)
