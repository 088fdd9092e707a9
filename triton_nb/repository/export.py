"""Exporting the fraud pipeline as a Triton model repository that real Triton serves unchanged.

:func:`export_fraud_repository` writes the example's three models, with the example's names so
the same requests work against it and against the original deployment:

* ``preprocessing/`` — Python backend: ``1/model.py`` (a template of this package) with the
  preprocessing rules (the package ``fraud_encoding/``), the restricted unpickler
  (``fraud_safe_pickle.py``) and ``label_encoders.pkl`` (+ ``.json``) beside it; 14 raw inputs
  (User, Card, Year, Month, Day as FP32; the rest BYTES), output ``OUTPUT`` FP32 [15];
* ``fil/`` — the XGBoost model: ``input__0`` FP32 [15] -> ``output__0`` FP32 [1], served by
  the FIL backend (``model_backend="fil"``), by a Python-backend model with the same tensors
  and FIL semantics (``"python"``, for Triton builds without FIL), or by ONNX Runtime
  (``"onnxruntime"``);
* ``ensemble/`` — preprocessing then fil: the 14 inputs -> ``predictions`` FP32 [1].

With ``warmup=True`` the two composing models get a ``model_warmup`` sample that Triton (and
triton_nb) runs on every instance before the model is READY: preprocessing one realistic
TabFormer transaction (``warmup/*.bin``, one ``input_data_file`` per input), the trees one row of
zeros. (Triton forbids warm-up on an ensemble.)

The repository is written to a temporary folder beside the target, validated, and only then
moved into place: a failure leaves no half-written repository behind.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb._optional import require_module
from triton_nb.errors import InvalidArgumentError, TritonNBError
from triton_nb.fraud.encoding import ENCODED_COLUMNS, FEATURE_NAMES, RAW_INPUT_COLUMNS
from triton_nb.fraud.features import FP32_INPUTS
from triton_nb.fraud.train import TrainedFraudModel
from triton_nb.repository.config import ModelConfig, check_model_config, fil_parameters, load_config, save_config
from triton_nb.repository.fil_semantics import FilSettings
from triton_nb.repository.layout import scan_repository
from triton_nb.repository.tree_export import describe_tree_model, write_fil_model_file, write_onnx_model
from triton_nb.repository.validate import errors_only, validate_repository
from triton_nb.repository.warmup import add_file_sample, add_zero_sample

__all__ = [
    "ENSEMBLE_MODEL",
    "MODEL_BACKENDS",
    "PREPROCESSING_MODEL",
    "TREE_MODEL",
    "WARMUP_TRANSACTION",
    "BatchingOptions",
    "export_fraud_repository",
    "export_tree_model",
    "python_twin_repository",
]

PREPROCESSING_MODEL = "preprocessing"
TREE_MODEL = "fil"  # the example's name, whichever backend serves the trees
ENSEMBLE_MODEL = "ensemble"
MODEL_BACKENDS = ("fil", "python", "onnxruntime")

_INSTANCE_KINDS = ("KIND_AUTO", "KIND_CPU", "KIND_GPU")

#: The preprocessing's warm-up sample: the first transaction of TabFormer's card_transaction.v1.csv
#: (its label column left out), one row as the 14 request tensors carry it.
WARMUP_TRANSACTION: dict[str, float | str] = {
    "User": 0, "Card": 0, "Year": 2002, "Month": 9, "Day": 1, "Time": "06:21", "Amount": "$134.09",
    "Use Chip": "Swipe Transaction", "Merchant Name": "3527213246127876953", "Merchant City": "La Verne",
    "Merchant State": "CA", "Zip": "91750.0", "MCC": "5300", "Errors?": "",
}  # fmt: skip
_PREPROCESSING_SAMPLE = "tabformer_transaction"
_TREE_SAMPLE = "zeros"
_EXECUTION_ENV_PARAMETER = "EXECUTION_ENV_PATH"


@dataclass(frozen=True)
class BatchingOptions:
    """Batching and instance settings written into the configs of the composing models.

    ``max_batch_size`` applies to all three models (an ensemble may not batch more than its
    steps); the dynamic batcher and instance settings to the preprocessing and tree models.
    """

    max_batch_size: int = 4096
    dynamic_batching: bool = True
    max_queue_delay_microseconds: int = 100
    preferred_batch_size: Sequence[int] = ()
    instance_count: int = 1
    instance_kind: str = "KIND_CPU"

    def check(self) -> None:
        if self.max_batch_size < 1:
            raise InvalidArgumentError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_queue_delay_microseconds < 0:
            raise InvalidArgumentError(
                f"max_queue_delay_microseconds must be >= 0, got {self.max_queue_delay_microseconds}"
            )
        bad = [size for size in self.preferred_batch_size if not 1 <= size <= self.max_batch_size]
        if bad:
            raise InvalidArgumentError(
                f"preferred_batch_size {bad} must lie between 1 and max_batch_size ({self.max_batch_size})"
            )
        if self.instance_count < 1:
            raise InvalidArgumentError(f"instance_count must be >= 1, got {self.instance_count}")
        if self.instance_kind not in _INSTANCE_KINDS:
            raise InvalidArgumentError(f"instance_kind must be one of {', '.join(_INSTANCE_KINDS)}, "
                                       f"got {self.instance_kind!r}")

    def apply(self, config: ModelConfig, kind: str | None = None) -> None:
        config.max_batch_size = self.max_batch_size
        if self.dynamic_batching:
            config.dynamic_batching.max_queue_delay_microseconds = self.max_queue_delay_microseconds
            config.dynamic_batching.preferred_batch_size.extend(self.preferred_batch_size)
        group = config.instance_group.add()
        group.count = self.instance_count
        group.kind = mc.ModelInstanceGroup.Kind.Value(kind or self.instance_kind)


# --------------------------------------------------------------------------- configs


def _tensor(collection: Any, name: str, data_type: int, dims: Sequence[int]) -> None:
    tensor = collection.add()
    tensor.name = name
    tensor.data_type = data_type
    tensor.dims.extend(dims)


def _raw_inputs(config: ModelConfig) -> None:
    for name in RAW_INPUT_COLUMNS:
        _tensor(config.input, name, mc.TYPE_FP32 if name in FP32_INPUTS else mc.TYPE_STRING, [1])


def _preprocessing_config(batching: BatchingOptions, execution_env: str | None) -> ModelConfig:
    config = ModelConfig(name=PREPROCESSING_MODEL, backend="python")
    _raw_inputs(config)
    _tensor(config.output, "OUTPUT", mc.TYPE_FP32, [len(FEATURE_NAMES)])
    # Preprocessing is pure CPU work whatever serves the trees.
    batching.apply(config, kind="KIND_CPU")
    if execution_env is not None:
        config.parameters[_EXECUTION_ENV_PARAMETER].string_value = f"$$TRITON_MODEL_DIRECTORY/{execution_env}"
    return config


def _fil_parameters(settings: FilSettings, storage_type: str = "AUTO") -> dict[str, str]:
    flag = {True: "true", False: "false"}
    return {
        "model_type": settings.model_type,
        "output_class": flag[settings.output_class],
        "predict_proba": flag[settings.predict_proba],
        "threshold": repr(settings.threshold),
        "storage_type": storage_type,
    }


def _tree_config(backend: str, settings: FilSettings, batching: BatchingOptions, num_features: int,
                 output_dims: Sequence[int] = (1,), shap_dims: Sequence[int] | None = None,
                 name: str = TREE_MODEL) -> ModelConfig:
    config = ModelConfig(name=name)
    if backend == "onnxruntime":
        config.backend = "onnxruntime"
        config.platform = "onnxruntime_onnx"
    else:
        config.backend = backend
        for name, value in _fil_parameters(settings).items():
            config.parameters[name].string_value = value
    _tensor(config.input, "input__0", mc.TYPE_FP32, [num_features])
    _tensor(config.output, "output__0", mc.TYPE_FP32, output_dims)
    if settings.treeshap_output:
        # FIL computes SHAP values when this output is declared: one per feature, bias last.
        _tensor(config.output, "treeshap_output", mc.TYPE_FP32, shap_dims or [num_features + 1])
    batching.apply(config)
    return config


def _ensemble_config(max_batch_size: int, treeshap_output: bool, num_features: int) -> ModelConfig:
    config = ModelConfig(name=ENSEMBLE_MODEL, platform="ensemble", max_batch_size=max_batch_size)
    _raw_inputs(config)
    _tensor(config.output, "predictions", mc.TYPE_FP32, [1])
    if treeshap_output:
        _tensor(config.output, "shap_values", mc.TYPE_FP32, [num_features + 1])
    preprocessing = config.ensemble_scheduling.step.add(model_name=PREPROCESSING_MODEL, model_version=-1)
    for name in RAW_INPUT_COLUMNS:
        preprocessing.input_map[name] = name
    preprocessing.output_map["OUTPUT"] = "preprocessed_data"
    trees = config.ensemble_scheduling.step.add(model_name=TREE_MODEL, model_version=-1)
    trees.input_map["input__0"] = "preprocessed_data"
    trees.output_map["output__0"] = "predictions"
    if treeshap_output:
        trees.output_map["treeshap_output"] = "shap_values"
    return config


# --------------------------------------------------------------------------- files


def _template(name: str) -> bytes:
    return resources.files("triton_nb.repository.templates").joinpath(name).read_bytes()


def _module_source(package: str, name: str) -> bytes:
    return resources.files(package).joinpath(name).read_bytes()


def _write_package(package: str, target: Path) -> None:
    """Copy a package's modules (``.py`` files, sub-packages too) into the folder ``target``.

    Only the sources go: no ``__pycache__`` (bytecode of this interpreter, which a Triton image's
    Python may not share) and nothing else a working copy may hold beside them.
    """
    _copy_sources(resources.files(package), target)


def _copy_sources(source: Any, target: Path) -> None:
    target.mkdir()
    for entry in sorted(source.iterdir(), key=lambda item: item.name):
        if entry.is_file() and entry.name.endswith(".py"):
            (target / entry.name).write_bytes(entry.read_bytes())
        elif entry.is_dir() and entry.joinpath("__init__.py").is_file():
            _copy_sources(entry, target / entry.name)


def _warmup_filename(tensor: str) -> str:
    """A plain file name for one input's warm-up data (``Errors?`` -> ``errors.bin``)."""
    return re.sub(r"[^0-9a-z]+", "_", tensor.lower()).strip("_") + ".bin"


def _add_preprocessing_warmup(config: ModelConfig, folder: Path) -> None:
    values = {name: np.array([WARMUP_TRANSACTION[name]], dtype=np.float32 if name in FP32_INPUTS else object)
              for name in RAW_INPUT_COLUMNS}
    add_file_sample(config, folder, _PREPROCESSING_SAMPLE, values, {name: _warmup_filename(name) for name in values})


def _write_preprocessing(folder: Path, model: TrainedFraudModel, batching: BatchingOptions,
                         execution_env: str | os.PathLike[str] | None, warmup: bool = False) -> None:
    version = folder / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_bytes(_template("preprocessing_model.py"))
    _write_package("triton_nb.fraud.encoding", version / "fraud_encoding")
    (version / "fraud_safe_pickle.py").write_bytes(_module_source("triton_nb.fraud", "safe_pickle.py"))
    model.preprocessor.save_encoders(version)
    archive_name = _place_execution_env(folder, execution_env) if execution_env is not None else None
    config = _preprocessing_config(batching, archive_name)
    if warmup:
        _add_preprocessing_warmup(config, folder)
    save_config(config, folder)


def _place_execution_env(folder: Path, execution_env: str | os.PathLike[str]) -> str:
    """Put a conda-pack archive inside the model folder and return its name there.

    ``"pack"`` packs the running conda environment with conda-pack; a path copies an archive
    made beforehand. Either way the archive ends up inside the model folder, so the config
    refers to it as ``$$TRITON_MODEL_DIRECTORY/<name>`` and never to a path outside.
    """
    if str(execution_env) == "pack":
        try:
            import conda_pack
        except ImportError:
            raise InvalidArgumentError(
                "execution_env='pack' needs conda-pack (pip install conda-pack) inside a conda environment"
            ) from None
        target = folder / "preprocessing_env.tar.gz"
        try:
            conda_pack.pack(output=str(target), ignore_missing_files=True)
        except conda_pack.CondaPackException as exc:
            raise InvalidArgumentError(f"execution_env='pack': conda-pack failed: {exc}") from None
        return target.name
    source = Path(execution_env)
    if not source.is_file() or not source.name.endswith((".tar.gz", ".tgz")):
        raise InvalidArgumentError(f"execution_env: {source} is not a conda-pack archive (.tar.gz)")
    shutil.copyfile(source, folder / source.name)
    return source.name


def _require_onnx_tools(library: str, name: str) -> None:
    """Fail before anything is written, naming the model, when the [onnx] extra is missing."""
    purpose = f"Exporting model '{name}' for the onnxruntime backend"
    for module in ("onnx", "skl2onnx" if library == "sklearn" else "onnxmltools"):
        require_module(module, purpose)


def _write_tree_files(version: Path, model: Any, backend: str, settings: FilSettings, proba_width: int) -> str:
    """The model files of one tree model's version folder; returns the FIL model_type used."""
    if backend == "onnxruntime":
        write_onnx_model(model, version, settings, proba_width)
        return settings.model_type
    model_type, _ = write_fil_model_file(model, version, settings.model_type)
    if backend == "python":
        (version / "model.py").write_bytes(_template("tree_model.py"))
        (version / "fil_semantics.py").write_bytes(_module_source("triton_nb.repository", "fil_semantics.py"))
    return model_type


# the FIL model types the Python twin loads (with XGBoost), and where real Triton's FIL finds each
_TWIN_MODEL_TYPES = ("xgboost", "xgboost_json", "xgboost_ubj")


def python_twin_repository(
    source: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, overwrite: bool = False
) -> Path:
    """Copy the repository ``source`` to ``out_dir`` with every FIL model served by its Python twin.

    A tritonserver without the FIL backend (the nvidia-pytriton wheel's, Triton builds for CPU
    only) then serves the same models under the same names, with the same tensors, shapes and FIL
    semantics: each FIL model's config gets ``backend: "python"`` (everything else, batching,
    instances and FIL's parameters, which the twin reads, stays) and each version folder the twin's
    ``model.py`` beside its model file. GPU instance groups become CPU ones (the twin runs
    XGBoost on the CPU). Other models are copied unchanged. A FIL model that is not an XGBoost
    model (LightGBM, Treelite checkpoints) is refused, naming it: the twin serves XGBoost only.
    """
    source = Path(source)
    scan = scan_repository(source)
    out_dir = Path(out_dir)
    with _staged_directory(out_dir, overwrite) as staging:
        for entry in scan.models.values():
            target = staging / entry.name
            shutil.copytree(entry.path, target, ignore=shutil.ignore_patterns("__pycache__"))
            config = entry.config
            if config is None or config.backend != "fil":
                continue
            model_type = fil_parameters(config).get("model_type", "xgboost")
            if model_type not in _TWIN_MODEL_TYPES:
                raise InvalidArgumentError(
                    f"model '{entry.name}': model_type '{model_type}' has no Python twin (it serves "
                    f"{', '.join(_TWIN_MODEL_TYPES)})")
            twin = load_config(entry.path / "config.pbtxt")  # the file as written, not the effective config
            twin.backend = "python"
            for group in twin.instance_group:
                if group.kind == mc.ModelInstanceGroup.KIND_GPU:
                    group.kind = mc.ModelInstanceGroup.KIND_CPU
                    del group.gpus[:]
            save_config(twin, target / "config.pbtxt")
            for version in entry.versions:
                (target / str(version) / "model.py").write_bytes(_template("tree_model.py"))
                (target / str(version) / "fil_semantics.py").write_bytes(
                    _module_source("triton_nb.repository", "fil_semantics.py"))
    return out_dir


# --------------------------------------------------------------------------- writing safely


@contextmanager
def _staged_directory(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``out_dir``; move it into place on success."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidArgumentError(f"cannot export to {out_dir}: it is a file")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise InvalidArgumentError(f"{out_dir} exists and is not empty; pass overwrite=True to replace it")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write the repository to {out_dir}: {exc.strerror or exc}") from None
    try:
        yield staging
        if out_dir.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, retired / out_dir.name)
            os.replace(staging, out_dir)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, out_dir)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise InvalidArgumentError(f"cannot write the repository to {out_dir}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# --------------------------------------------------------------------------- the export


def export_fraud_repository(
    model: TrainedFraudModel,
    out_dir: str | os.PathLike[str],
    *,
    model_backend: str = "fil",
    batching: BatchingOptions | None = None,
    predict_proba: bool = False,
    treeshap_output: bool = False,
    execution_env: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    warmup: bool = False,
) -> Path:
    """Write the fraud example's model repository (preprocessing, fil, ensemble) to ``out_dir``.

    ``predict_proba=True`` makes ``predictions`` the fraud probability instead of the 0/1
    class at ``model.threshold``; ``treeshap_output=True`` adds per-feature SHAP values
    (``shap_values`` in the ensemble, bias last). ``execution_env`` packs the preprocessing
    environment for Triton's ``EXECUTION_ENV_PATH``: ``"pack"`` (conda-pack the running
    conda environment) or the path of an archive made beforehand. ``warmup=True`` adds
    ``model_warmup`` samples (see the module's docstring), so the first request after a load
    does not pay for lazy initialisation. Returns ``out_dir``.
    """
    if model_backend not in MODEL_BACKENDS:
        raise InvalidArgumentError(f"model_backend must be one of {', '.join(MODEL_BACKENDS)}, got {model_backend!r}")
    batching = batching or BatchingOptions()
    batching.check()
    if model_backend == "onnxruntime" and treeshap_output:
        raise InvalidArgumentError("treeshap_output is a FIL feature; ONNX Runtime cannot produce SHAP values")
    if model_backend == "onnxruntime":
        _require_onnx_tools("xgboost", TREE_MODEL)
    booster = model.booster[: model.best_iteration + 1]
    num_features = booster.num_features()
    if num_features != len(FEATURE_NAMES):
        raise InvalidArgumentError(
            f"the tree model takes {num_features} features but the preprocessing produces {len(FEATURE_NAMES)} "
            f"({', '.join(FEATURE_NAMES)})"
        )
    missing = [c for c in ENCODED_COLUMNS if c not in getattr(model.preprocessor, "classes_", {})]
    if missing:
        raise InvalidArgumentError(f"the preprocessor has no label encoder for {', '.join(missing)}")
    settings = FilSettings(
        model_type="xgboost_json",
        output_class=True,
        predict_proba=predict_proba,
        threshold=float(model.threshold),
        treeshap_output=treeshap_output,
    )
    out_dir = Path(out_dir)
    with _staged_directory(out_dir, overwrite) as staging:
        _write_preprocessing(staging / PREPROCESSING_MODEL, model, batching, execution_env, warmup)
        _write_tree_files(staging / TREE_MODEL / "1", booster, model_backend, settings, proba_width=1)
        tree_config = _tree_config(model_backend, settings, batching, num_features)
        if warmup:
            add_zero_sample(tree_config, _TREE_SAMPLE, batch_size=1)
        save_config(tree_config, staging / TREE_MODEL)
        ensemble = staging / ENSEMBLE_MODEL
        (ensemble / "1").mkdir(parents=True)
        save_config(_ensemble_config(batching.max_batch_size, treeshap_output, num_features), ensemble)
        problems = errors_only(validate_repository(staging))
        if problems:  # a bug in the exporter, never the user's doing: say so plainly
            raise TritonNBError("the exported repository does not validate:\n" + "\n".join(map(str, problems)))
    return out_dir


def export_tree_model(
    model: Any,
    repository: str | os.PathLike[str],
    *,
    name: str = TREE_MODEL,
    model_backend: str = "fil",
    model_type: str | None = None,
    predict_proba: bool = False,
    proba_width: int | None = None,
    threshold: float = 0.5,
    treeshap_output: bool = False,
    batching: BatchingOptions | None = None,
    overwrite: bool = False,
) -> Path:
    """Export any XGBoost, LightGBM or scikit-learn forest as model ``name`` of ``repository``.

    The folder holds ``config.pbtxt`` (``input__0`` -> ``output__0`` with FIL's semantics) and
    ``1/`` with the file the backend loads: ``xgboost.json``/``.ubj``, ``model.txt`` or
    ``checkpoint.tl`` (scikit-learn, through Treelite) for ``"fil"``; ``model.onnx`` for
    ``"onnxruntime"``; ``model.py`` with ``xgboost.json`` for ``"python"`` (XGBoost only).

    ``output__0`` is the class (binary: 1.0 when ``p > threshold``; multiclass: argmax) or,
    with ``predict_proba``, the probabilities: ``[num_classes]`` for multiclass, ``[2]`` (``1-p,
    p``) or ``[1]`` (``proba_width=1``, P(class 1)) for binary. Regressors give their value.
    ``treeshap_output`` adds the SHAP output (``[num_features + 1]``, or ``[num_classes,
    num_features + 1]`` for multiclass; bias last). These are the configured dims; FIL (and the
    ``"python"`` twin) answer with every dim of size 1 squeezed out, so ``[1]`` answers ``[rows]``
    (:func:`~triton_nb.repository.fil_semantics.answer_row_dims`).
    """
    if model_backend not in MODEL_BACKENDS:
        raise InvalidArgumentError(f"model_backend must be one of {', '.join(MODEL_BACKENDS)}, got {model_backend!r}")
    batching = batching or BatchingOptions()
    batching.check()
    info = describe_tree_model(model)
    classifier = info.task != "regression"
    if predict_proba and not classifier:
        raise InvalidArgumentError(f"predict_proba needs a classifier; this {info.library} model is a regressor")
    if model_backend == "python" and info.library != "xgboost":
        raise InvalidArgumentError(f"model_backend 'python' serves XGBoost models; this is a {info.library} model")
    if model_backend == "onnxruntime" and treeshap_output:
        raise InvalidArgumentError("treeshap_output is a FIL feature; ONNX Runtime cannot produce SHAP values")
    if model_backend == "onnxruntime":
        _require_onnx_tools(info.library, name)
    # Treelite imports scikit-learn's binary forests as two-class models: FIL then answers by
    # argmax over two probabilities, so their probability output must be two wide.
    two_class_forest = info.library == "sklearn" and info.task == "binary" and type(model).__name__ in (
        "RandomForestClassifier", "ExtraTreesClassifier")
    width = proba_width if proba_width is not None else 2
    if width not in (1, 2) or (two_class_forest and predict_proba and width != 2):
        raise InvalidArgumentError(
            f"proba_width must be 1 or 2{' (2 for a scikit-learn binary forest)' if two_class_forest else ''}, "
            f"got {width}"
        )
    if not predict_proba or info.task != "binary":
        output_dims = [info.num_classes] if predict_proba else [1]
    else:
        output_dims = [width]
    multiclass = info.task == "multiclass"
    shap_dims = [info.num_classes, info.num_features + 1] if multiclass else [info.num_features + 1]
    default_type = "xgboost_json" if model_backend == "python" else model_type
    settings = FilSettings(
        model_type=default_type or {"xgboost": "xgboost_json", "lightgbm": "lightgbm"}.get(
            info.library, "treelite_checkpoint"),
        output_class=classifier,
        predict_proba=predict_proba,
        threshold=float(threshold),
        treeshap_output=treeshap_output,
    )
    target = Path(repository) / name
    with _staged_directory(target, overwrite) as staging:
        version = staging / "1"
        version.mkdir()
        model_type = _write_tree_files(version, model, model_backend, settings, width)
        settings = FilSettings(model_type, settings.output_class, settings.predict_proba, settings.threshold,
                               settings.treeshap_output)
        config = _tree_config(model_backend, settings, batching, info.num_features, output_dims, shap_dims, name)
        problems = [p for p in check_model_config(config, name) if p.severity == "error"]
        if problems:
            raise TritonNBError("the exported model does not validate:\n" + "\n".join(map(str, problems)))
        save_config(config, staging)
    return target
