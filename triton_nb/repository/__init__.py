"""Triton model repositories: configuration, layout, validation, export and packaging."""

from triton_nb.repository.config import (
    ModelConfig,
    Problem,
    config_from_json,
    config_to_json,
    effective_config,
    format_config,
    load_config,
    parse_config,
    save_config,
)
from triton_nb.repository.export import (
    BatchingOptions,
    export_fraud_repository,
    export_tree_model,
    python_twin_repository,
)
from triton_nb.repository.layout import ModelEntry, RepositoryScan, scan_repository
from triton_nb.repository.sagemaker import SageMakerPackage, package_for_sagemaker
from triton_nb.repository.validate import validate_repository

__all__ = [
    "BatchingOptions",
    "ModelConfig",
    "ModelEntry",
    "Problem",
    "RepositoryScan",
    "SageMakerPackage",
    "config_from_json",
    "config_to_json",
    "effective_config",
    "export_fraud_repository",
    "export_tree_model",
    "format_config",
    "load_config",
    "package_for_sagemaker",
    "parse_config",
    "python_twin_repository",
    "save_config",
    "scan_repository",
    "validate_repository",
]
