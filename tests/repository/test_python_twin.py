"""python_twin_repository: a repository's FIL models served by their Python-backend twins."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from triton_nb.errors import InvalidArgumentError
from triton_nb.repository import load_config, python_twin_repository, save_config, validate_repository

COMMITTED = Path(__file__).resolve().parents[2] / "model_repository"


def test_fil_models_become_python_twins_and_the_rest_is_copied(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(COMMITTED, source)
    config = load_config(source / "fil" / "config.pbtxt")
    config.instance_group[0].kind = config.instance_group[0].KIND_GPU
    config.instance_group[0].gpus.append(0)
    save_config(config, source / "fil" / "config.pbtxt")

    twin = python_twin_repository(source, tmp_path / "twin")
    fil = load_config(twin / "fil" / "config.pbtxt")
    assert fil.backend == "python"
    assert fil.instance_group[0].kind == fil.instance_group[0].KIND_CPU and not fil.instance_group[0].gpus
    assert fil.parameters["model_type"].string_value == config.parameters["model_type"].string_value
    assert fil.dynamic_batching == config.dynamic_batching and fil.max_batch_size == config.max_batch_size
    assert {p.name for p in (twin / "fil" / "1").iterdir()} >= {"model.py", "fil_semantics.py", "xgboost.json"}
    for unchanged in ("preprocessing/config.pbtxt", "ensemble/config.pbtxt", "preprocessing/1/model.py"):
        assert (twin / unchanged).read_bytes() == (source / unchanged).read_bytes()
    assert not [p for p in validate_repository(twin) if p.severity == "error"]


def test_a_fil_model_the_twin_cannot_serve_is_refused_by_name(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(COMMITTED, source)
    config = load_config(source / "fil" / "config.pbtxt")
    config.parameters["model_type"].string_value = "lightgbm"
    save_config(config, source / "fil" / "config.pbtxt")
    with pytest.raises(InvalidArgumentError, match="model 'fil': model_type 'lightgbm' has no Python twin"):
        python_twin_repository(source, tmp_path / "twin")
    assert not (tmp_path / "twin").exists()  # nothing half-written
