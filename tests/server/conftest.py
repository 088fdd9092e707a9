"""Fixtures for the server tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.scale_models import write_scale_model


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_scale_model(tmp_path)
    return tmp_path
