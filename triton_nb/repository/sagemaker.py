"""Packaging a model repository for Amazon SageMaker's Triton container.

SageMaker unpacks ``model.tar.gz`` into the container's model repository, so the model folders
(``ensemble/``, ``fil/``...) must be at the top of the archive — a ``config.pbtxt`` at its root
is a single model folder packed one level too deep, which the container rejects. With more than
one model it must be told which one to serve through ``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME``.
"""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from triton_nb.errors import InvalidArgumentError
from triton_nb.repository.config import CONFIG_FILENAME, is_ensemble
from triton_nb.repository.layout import scan_repository
from triton_nb.repository.validate import errors_only, validate_repository

__all__ = ["DEFAULT_MODEL_ENV", "SageMakerPackage", "package_for_sagemaker", "unpack_model_archive"]

DEFAULT_MODEL_ENV = "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"


@dataclass(frozen=True)
class SageMakerPackage:
    """The archive to upload and the environment the SageMaker model needs."""

    path: Path
    default_model_name: str

    @property
    def environment(self) -> dict[str, str]:
        return {DEFAULT_MODEL_ENV: self.default_model_name}


def _default_model(models: dict, requested: str | None, repository: Path) -> str:
    if requested is not None:
        if requested not in models:
            raise InvalidArgumentError(
                f"default_model_name '{requested}' is not a model of {repository} ({', '.join(sorted(models))})"
            )
        return requested
    if len(models) == 1:
        return next(iter(models))
    ensembles = [name for name, entry in models.items() if entry.config is not None and is_ensemble(entry.config)]
    if len(ensembles) == 1:
        return ensembles[0]
    raise InvalidArgumentError(
        f"{repository} has {len(models)} top-level models ({', '.join(sorted(models))}) and "
        f"{'several' if ensembles else 'no'} ensemble(s); SageMaker needs {DEFAULT_MODEL_ENV}: "
        "pass default_model_name"
    )


def package_for_sagemaker(
    repository: str | os.PathLike[str],
    output: str | os.PathLike[str] = "model.tar.gz",
    *,
    default_model_name: str | None = None,
) -> SageMakerPackage:
    """Write ``model.tar.gz`` with the repository's model folders at its top level.

    The default model is ``default_model_name``, else the only model, else the only ensemble.
    Refuses a model folder given in place of a repository, a repository that does not validate,
    and several models with no default.
    """
    root = Path(repository)
    if (root / CONFIG_FILENAME).is_file():
        raise InvalidArgumentError(
            f"{root} has {CONFIG_FILENAME} at its root: SageMaker's Triton container expects model folders "
            "at the top of model.tar.gz; package the repository that contains this model folder"
        )
    scan = scan_repository(root)
    if not scan.models:
        raise InvalidArgumentError(f"{root} holds no model folders")
    problems = errors_only(validate_repository(root))
    if problems:
        raise InvalidArgumentError(f"{root} does not validate:\n" + "\n".join(map(str, problems)))
    default = _default_model(scan.models, default_model_name, root)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    with tarfile.open(partial, "w:gz") as archive:
        for name in sorted(scan.models):
            archive.add(root / name, arcname=name, filter=_skip_caches)
    os.replace(partial, output)
    return SageMakerPackage(path=output, default_model_name=default)


def _skip_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in Path(info.name).parts else info


def unpack_model_archive(archive: str | os.PathLike[str], destination: str | os.PathLike[str]) -> Path:
    """Unpack a ``model.tar.gz`` into ``destination`` (created), as SageMaker unpacks one into the
    container's model repository; returns ``destination``. Members that would land outside it
    (absolute paths, ``..``, links pointing out) or that are not files and folders are refused,
    naming the member."""
    source, target = Path(archive), Path(destination)
    if not tarfile.is_tarfile(source):
        raise InvalidArgumentError(f"{source} is not a tar archive (SageMaker's model data is a model.tar.gz)")
    target.mkdir(parents=True, exist_ok=True)
    root = target.resolve()
    with tarfile.open(source) as bundle:
        members = bundle.getmembers()
        for member in members:
            landing = (root / member.name).resolve()
            if not (member.isfile() or member.isdir()) or (landing != root and root not in landing.parents):
                raise InvalidArgumentError(f"{source}: member '{member.name}' is not a file or folder inside the "
                                           f"archive; refusing to unpack it")
        # every member was checked above; Python's own "data" filter checks again where it has one
        options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        bundle.extractall(root, members=members, **options)
    return target
