"""Fixtures of the backend tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_nb.backends.base import ModelContext
from triton_nb.backends.python import PythonBackend
from triton_nb.repository import load_config
from triton_nb.repository.config import effective_config


@pytest.fixture
def backends():
    """Create backends from model folders; every one is finalized after the test."""
    created: list[PythonBackend] = []

    def make(folder: Path, server=None, version: int = 1, instance_name: str | None = None,
             device_id: int = 0) -> PythonBackend:
        config = effective_config(load_config(folder), folder_name=folder.name)
        context = ModelContext(
            name=folder.name,
            version=version,
            config=config,
            model_path=folder,
            version_path=folder / str(version),
            repository_path=folder.parent,
            instance_name=instance_name or f"{folder.name}_0",
            device_id=device_id,
            server=server,
        )
        backend = PythonBackend(context)
        created.append(backend)
        return backend

    yield make
    for backend in created:
        backend.finalize()
