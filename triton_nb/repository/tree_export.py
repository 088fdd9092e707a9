"""Exporting tree models for Triton: the FIL backend's model files and an ONNX twin.

* :func:`describe_tree_model` — what a fitted XGBoost, LightGBM or scikit-learn forest is:
  library, task, number of features and classes (what a ``config.pbtxt`` needs);
* :func:`write_fil_model_file` — the file Triton's FIL backend loads from a version folder,
  named as FIL expects for its ``model_type``;
* :func:`write_onnx_model` — the same model as ``model.onnx`` for the ONNX Runtime backend, with
  FIL's tensor names (``input__0`` / ``output__0``) and FIL's output semantics
  (:func:`triton_nb.repository.fil_semantics.fil_output`) built into the graph; it answers the
  graph's ``[rows, width]`` where FIL squeezes a width of 1 away (``[rows]``), because Triton's
  ONNX Runtime backend checks the graph's shapes against ``dims``, which cannot be empty.

FIL facts this module relies on (FIL backend sources, ``src/tl_model.h`` and ``src/tl_utils.h``):
FIL parses every format with Treelite; ``model_type "xgboost"`` is XGBoost's legacy binary format,
which XGBoost >= 3 can no longer write (``save_model`` writes UBJSON whatever the file suffix), so
it is not offered here. scikit-learn forests reach FIL as Treelite checkpoints.

Heavy or optional libraries (LightGBM, ONNX and its converters, Treelite) are imported inside the
functions that need them, so importing this module stays cheap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from triton_nb._native_logs import route_native_logs
from triton_nb._optional import require_module
from triton_nb.errors import InvalidArgumentError
from triton_nb.repository.fil_semantics import FilSettings

__all__ = [
    "FIL_EXPORT_FILENAMES",
    "ONNX_OPSET",
    "TreeModelInfo",
    "describe_tree_model",
    "write_fil_model_file",
    "write_onnx_model",
]

#: The file FIL loads for each ``model_type`` this module can write.
FIL_EXPORT_FILENAMES: dict[str, str] = {
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}

#: Default-domain opset of the exported ONNX graphs. onnxmltools 1.16 converts XGBoost and
#: LightGBM up to opset 15, and every onnxruntime release since 1.10 runs it.
ONNX_OPSET = 15

# model_type values each library can be written as. Every library can become a Treelite
# checkpoint; only XGBoost and LightGBM have native formats FIL reads.
_ALLOWED_MODEL_TYPES = {
    "xgboost": ("xgboost_json", "xgboost_ubj", "treelite_checkpoint"),
    "lightgbm": ("lightgbm", "treelite_checkpoint"),
    "sklearn": ("treelite_checkpoint",),
}
_DEFAULT_MODEL_TYPE = {"xgboost": "xgboost_json", "lightgbm": "lightgbm", "sklearn": "treelite_checkpoint"}

_LIGHTGBM_REGRESSION_OBJECTIVES = frozenset(
    ("regression", "regression_l1", "huber", "fair", "poisson", "quantile", "mape", "gamma", "tweedie")
)


@dataclass(frozen=True)
class TreeModelInfo:
    """What a fitted tree model is, as far as a Triton deployment cares.

    ``num_classes`` is 1 for binary classifiers and regressors (FIL treats a binary model as
    having one output: P(class 1)) and k for a k-class classifier.
    """

    library: str  # "xgboost" | "lightgbm" | "sklearn"
    task: str  # "binary" | "multiclass" | "regression"
    num_features: int
    num_classes: int


# --------------------------------------------------------------------------------------------
# Recognising models
# --------------------------------------------------------------------------------------------


def _root_module(model: Any) -> str:
    return type(model).__module__.split(".", 1)[0]


def _not_fitted(model: Any) -> InvalidArgumentError:
    return InvalidArgumentError(f"the {type(model).__name__} is not fitted; train it before exporting it")


def _unsupported(model: Any) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"cannot export a {type(model).__module__}.{type(model).__name__}: supported models are "
        "xgboost.Booster, XGBClassifier, XGBRegressor, lightgbm.Booster, LGBMClassifier, LGBMRegressor and "
        "scikit-learn's RandomForest*, ExtraTrees*, GradientBoosting* and HistGradientBoosting* "
        "classifiers and regressors"
    )


def _xgboost_booster(model: Any) -> Any:
    """The fitted ``xgboost.Booster`` behind an XGBoost model, cut to what the model predicts with.

    The scikit-learn wrappers predict with ``best_iteration`` after early stopping while the
    booster keeps every round; exporting the whole booster would serve a different model than
    the one the user evaluated, so the booster is sliced to the rounds the wrapper uses.
    """
    import xgboost as xgb
    from sklearn.exceptions import NotFittedError

    if isinstance(model, xgb.Booster):
        try:
            rounds = model.num_boosted_rounds()
        except xgb.core.XGBoostError:  # a Booster() that was never trained or loaded
            raise _not_fitted(model) from None
        if rounds == 0:
            raise _not_fitted(model)
        return model
    if isinstance(model, (xgb.XGBClassifier, xgb.XGBRegressor)):
        try:
            booster = model.get_booster()
        except NotFittedError:
            raise _not_fitted(model) from None
        try:
            best_iteration = model.best_iteration
        except AttributeError:  # no early stopping: every round counts
            return booster
        if best_iteration + 1 < booster.num_boosted_rounds():
            return booster[: best_iteration + 1]
        return booster
    raise _unsupported(model)


def _lightgbm_booster(model: Any) -> Any:
    """The fitted ``lightgbm.Booster`` behind a LightGBM model."""
    lgb = require_module("lightgbm", "Exporting LightGBM models")
    from sklearn.exceptions import NotFittedError

    if isinstance(model, lgb.Booster):
        return model
    if isinstance(model, (lgb.LGBMClassifier, lgb.LGBMRegressor)):
        try:
            return model.booster_
        except NotFittedError:  # LightGBM's LGBMNotFittedError derives from it
            raise _not_fitted(model) from None
    raise _unsupported(model)


def _sklearn_model_kind(model: Any) -> str:
    """Whether a scikit-learn ensemble Treelite imports is a "classifier" or a "regressor"; else raise."""
    from sklearn import ensemble

    classifiers = (
        ensemble.RandomForestClassifier,
        ensemble.ExtraTreesClassifier,
        ensemble.GradientBoostingClassifier,
        ensemble.HistGradientBoostingClassifier,
    )
    regressors = (
        ensemble.RandomForestRegressor,
        ensemble.ExtraTreesRegressor,
        ensemble.GradientBoostingRegressor,
        ensemble.HistGradientBoostingRegressor,
    )
    if isinstance(model, classifiers):
        return "classifier"
    if isinstance(model, regressors):
        return "regressor"
    raise _unsupported(model)


def _library_of(model: Any) -> str:
    root = _root_module(model)
    if root == "xgboost":
        return "xgboost"
    if root == "lightgbm":
        return "lightgbm"
    if root == "sklearn":
        return "sklearn"
    raise _unsupported(model)


def _describe_xgboost(model: Any) -> TreeModelInfo:
    booster = _xgboost_booster(model)
    config = json.loads(booster.save_config())
    learner = config["learner"]
    objective = learner["objective"]["name"]
    params = learner["learner_model_param"]
    if learner["gradient_booster"]["name"] == "gblinear":
        raise InvalidArgumentError("XGBoost booster 'gblinear' is a linear model; FIL serves tree models only")
    if int(params.get("num_target", "1")) > 1:
        # FIL (Treelite's loader) rejects multi-target models outright.
        raise InvalidArgumentError("multi-target XGBoost models cannot be served by Triton's FIL backend")
    if objective == "binary:logistic":
        task, num_classes = "binary", 1
    elif objective in ("multi:softprob", "multi:softmax"):
        task, num_classes = "multiclass", int(params["num_class"])
    elif objective.startswith("reg:"):
        task, num_classes = "regression", 1
    else:
        raise InvalidArgumentError(
            f"XGBoost objective '{objective}' is not supported: use binary:logistic, multi:softprob, "
            "multi:softmax or a reg:* objective"
        )
    return TreeModelInfo("xgboost", task, int(booster.num_features()), num_classes)


def _lightgbm_objective(booster: Any) -> str:
    """The objective name from the model text (``objective=binary sigmoid:1`` -> ``binary``).

    ``Booster.params`` may hold an alias or be empty for a loaded model; the model text always
    carries the canonical name, in its header.
    """
    for line in booster.model_to_string().splitlines():
        if line.startswith("objective="):
            return line.split("=", 1)[1].split(" ", 1)[0]
        if line.startswith("Tree="):  # past the header
            break
    return "custom"


def _describe_lightgbm(model: Any) -> TreeModelInfo:
    booster = _lightgbm_booster(model)
    objective = _lightgbm_objective(booster)
    num_features = int(booster.num_feature())
    if objective == "binary":
        return TreeModelInfo("lightgbm", "binary", num_features, 1)
    if objective == "multiclassova":
        # FIL swaps a multiclass model's postprocessor for softmax when predict_proba is on (and
        # onnxmltools converts with softmax too), so served probabilities would not be the
        # per-class sigmoids LightGBM predicts.
        raise InvalidArgumentError(
            "LightGBM objective 'multiclassova' is not supported: Triton's FIL backend (and the ONNX "
            "converter) would serve softmax probabilities instead of its per-class sigmoids; use 'multiclass'"
        )
    if objective == "multiclass":
        return TreeModelInfo("lightgbm", "multiclass", num_features, int(booster.num_model_per_iteration()))
    if objective in _LIGHTGBM_REGRESSION_OBJECTIVES:
        return TreeModelInfo("lightgbm", "regression", num_features, 1)
    raise InvalidArgumentError(
        f"LightGBM objective '{objective}' is not supported: use binary, multiclass "
        f"or one of {', '.join(sorted(_LIGHTGBM_REGRESSION_OBJECTIVES))}"
    )


def _describe_sklearn(model: Any) -> TreeModelInfo:
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    kind = _sklearn_model_kind(model)
    try:
        check_is_fitted(model)
    except NotFittedError:
        raise _not_fitted(model) from None
    if getattr(model, "n_outputs_", 1) > 1:
        # FIL (Treelite's loader) rejects multi-target models outright.
        raise InvalidArgumentError(
            f"multi-output {type(model).__name__} models cannot be served by Triton's FIL backend"
        )
    num_features = int(model.n_features_in_)
    if kind == "regressor":
        return TreeModelInfo("sklearn", "regression", num_features, 1)
    n_classes = len(model.classes_)
    if n_classes > 2:
        return TreeModelInfo("sklearn", "multiclass", num_features, n_classes)
    return TreeModelInfo("sklearn", "binary", num_features, 1)


def describe_tree_model(model: Any) -> TreeModelInfo:
    """Library, task, feature and class counts of a fitted tree model.

    Accepts ``xgboost.Booster`` / ``XGBClassifier`` / ``XGBRegressor``, ``lightgbm.Booster`` /
    ``LGBMClassifier`` / ``LGBMRegressor``, and scikit-learn's ``RandomForest*``, ``ExtraTrees*``,
    ``GradientBoosting*`` and ``HistGradientBoosting*`` classifiers and regressors (the models
    Treelite's scikit-learn importer reads, less ``IsolationForest``, which has no FIL output).

    Raises :class:`~triton_nb.errors.InvalidArgumentError` for other objects, unfitted models,
    objectives FIL cannot serve (naming them) and multi-output models.
    """
    library = _library_of(model)
    if library == "xgboost":
        return _describe_xgboost(model)
    if library == "lightgbm":
        return _describe_lightgbm(model)
    return _describe_sklearn(model)


# --------------------------------------------------------------------------------------------
# FIL model files
# --------------------------------------------------------------------------------------------


def _treelite_model(model: Any, library: str) -> Any:
    treelite = require_module("treelite", "Writing Treelite checkpoints")
    route_native_logs()
    if library == "xgboost":
        return treelite.frontend.from_xgboost(_xgboost_booster(model))
    if library == "lightgbm":
        return treelite.frontend.from_lightgbm(_lightgbm_booster(model))
    import treelite.sklearn

    return treelite.sklearn.import_model(model)


def write_fil_model_file(model: Any, version_dir: Path, model_type: str | None = None) -> tuple[str, str]:
    """Write the model file Triton's FIL backend loads into ``version_dir``.

    ``model_type`` defaults to ``xgboost_json`` for XGBoost, ``lightgbm`` for LightGBM and
    ``treelite_checkpoint`` for scikit-learn; XGBoost and LightGBM models can also be written as
    ``treelite_checkpoint``. The file is named as FIL expects (``xgboost.json``, ``xgboost.ubj``,
    ``model.txt``, ``checkpoint.tl``). Returns ``(model_type, filename)``.

    Note for scikit-learn ``RandomForestClassifier`` / ``ExtraTreesClassifier`` with two classes:
    Treelite imports them as a two-class model (one probability per class), so FIL answers
    ``output__0`` by argmax (ignoring ``threshold``) and needs dims ``[2]`` with ``predict_proba``.

    Raises :class:`~triton_nb.errors.InvalidArgumentError` for an unknown ``model_type``, one that
    does not fit the model's library, and ``xgboost`` (the legacy binary format XGBoost >= 3
    cannot write).
    """
    info = describe_tree_model(model)  # validates the model (supported, fitted) first
    allowed = _ALLOWED_MODEL_TYPES[info.library]
    if model_type is None:
        model_type = _DEFAULT_MODEL_TYPE[info.library]
    if model_type == "xgboost":
        raise InvalidArgumentError(
            "model_type 'xgboost' is XGBoost's legacy binary format, which XGBoost >= 3 cannot write; "
            "use 'xgboost_json' or 'xgboost_ubj'"
        )
    if model_type not in FIL_EXPORT_FILENAMES:
        raise InvalidArgumentError(
            f"unknown FIL model_type '{model_type}': expected one of {', '.join(FIL_EXPORT_FILENAMES)}"
        )
    if model_type not in allowed:
        raise InvalidArgumentError(
            f"model_type '{model_type}' does not fit a {info.library} model: use {' or '.join(allowed)}"
        )
    filename = FIL_EXPORT_FILENAMES[model_type]
    version_dir = Path(version_dir)
    version_dir.mkdir(parents=True, exist_ok=True)
    path = version_dir / filename
    if model_type in ("xgboost_json", "xgboost_ubj"):
        # XGBoost picks the format from the suffix; booster.save_model (not the scikit-learn
        # wrapper's) keeps wrapper-only attributes out of the file FIL parses.
        _xgboost_booster(model).save_model(str(path))
    elif model_type == "lightgbm":
        _lightgbm_booster(model).save_model(str(path))
    else:
        _treelite_model(model, info.library).serialize(str(path))
    return model_type, filename


# --------------------------------------------------------------------------------------------
# ONNX
# --------------------------------------------------------------------------------------------

_INPUT_NAME = "input__0"
_OUTPUT_NAME = "output__0"
_PREFIX = "triton_nb_fil_"  # names of the tensors and nodes added after the converter's graph


def _convert_to_onnx(model: Any, info: TreeModelInfo) -> Any:
    """The converter's ONNX model: input ``input__0``; probabilities or values among its outputs."""
    if info.library == "xgboost":
        onnxmltools = require_module("onnxmltools", "Converting XGBoost models to ONNX")
        from onnxmltools.convert.common.data_types import FloatTensorType

        # onnxmltools maps XGBoost's feature names to input columns and fails on names that are
        # not f0, f1, ...; a copy without names converts by position, which is what FIL does too.
        booster = _xgboost_booster(model).copy()
        booster.feature_names = None
        booster.feature_types = None
        if info.task == "multiclass":
            # onnxmltools leaves multi:softmax margins untransformed; as multi:softprob the same
            # trees convert with their softmax, the probabilities FIL computes for either objective.
            booster.set_param({"objective": "multi:softprob"})
        initial_types = [(_INPUT_NAME, FloatTensorType([None, info.num_features]))]
        return onnxmltools.convert_xgboost(booster, initial_types=initial_types, target_opset=ONNX_OPSET)
    if info.library == "lightgbm":
        onnxmltools = require_module("onnxmltools", "Converting LightGBM models to ONNX")
        from onnxmltools.convert.common.data_types import FloatTensorType

        initial_types = [(_INPUT_NAME, FloatTensorType([None, info.num_features]))]
        return onnxmltools.convert_lightgbm(
            _lightgbm_booster(model), initial_types=initial_types, target_opset=ONNX_OPSET, zipmap=False
        )
    skl2onnx = require_module("skl2onnx", "Converting scikit-learn models to ONNX")
    from skl2onnx.common.data_types import FloatTensorType

    # zipmap=False: probabilities as a float tensor, not a sequence of {class: p} maps.
    options = {id(model): {"zipmap": False}} if info.task != "regression" else None
    initial_types = [(_INPUT_NAME, FloatTensorType([None, info.num_features]))]
    return skl2onnx.convert_sklearn(model, initial_types=initial_types, target_opset=ONNX_OPSET, options=options)


def _fil_head(
    source: str, info: TreeModelInfo, settings: FilSettings, proba_width: int
) -> tuple[list[Any], list[Any], int]:
    """Nodes and initializers turning the converter's output ``source`` into FIL's ``output__0``.

    ``source`` is the probabilities ``(N, 2)`` / ``(N, k)`` of a classifier or the values of a
    regressor. Returns ``(nodes, initializers, width)``; ``width`` is output__0's last dim. Only
    operators unchanged since opset 9 are used, so the head is valid under whatever default-domain
    opset the converter declared.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, _PREFIX + name))
        return _PREFIX + name

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=_PREFIX + op.lower() + str(len(nodes)), **attrs))
        return output

    if info.task == "regression":
        if settings.output_class:
            raise InvalidArgumentError("output_class 'true' needs a classifier; this model is a regressor")
        # Converters give (N, 1) already; the reshape makes that a guarantee.
        node("Reshape", [source, const("shape", np.array([-1, 1], dtype=np.int64))], _OUTPUT_NAME)
        return nodes, inits, 1

    if info.task == "multiclass":
        if settings.output_class and not settings.predict_proba:
            # ArgMax picks the first maximum, as FIL's loop (strict >) and numpy do.
            label = node("ArgMax", [source], _PREFIX + "label", axis=1, keepdims=1)
            node("Cast", [label], _OUTPUT_NAME, to=TensorProto.FLOAT)
            return nodes, inits, 1
        # Probabilities, with predict_proba or when FIL runs a classifier as a regressor.
        node("Identity", [source], _OUTPUT_NAME)
        return nodes, inits, info.num_classes

    # Binary: FIL works from P(class 1), the second probability column.
    if proba_width not in (1, 2):
        raise InvalidArgumentError(f"proba_width must be 1 or 2 for a binary classifier, got {proba_width}")
    positive = node("Gather", [source, const("class1", np.array([1], dtype=np.int64))], _PREFIX + "p1", axis=1)
    if not settings.output_class:
        node("Identity", [positive], _OUTPUT_NAME)
        return nodes, inits, 1
    if settings.predict_proba:
        if proba_width == 1:
            node("Identity", [positive], _OUTPUT_NAME)
            return nodes, inits, 1
        # (1 - p, p) from p, exactly as FIL and fil_output compute it.
        negative = node("Sub", [const("one", np.array(1.0, dtype=np.float32)), positive], _PREFIX + "p0")
        node("Concat", [negative, positive], _OUTPUT_NAME, axis=1)
        return nodes, inits, 2
    # The threshold as float32, the precision FIL compares in.
    threshold = const("threshold", np.array(settings.threshold, dtype=np.float32))
    above = node("Greater", [positive, threshold], _PREFIX + "above")
    node("Cast", [above], _OUTPUT_NAME, to=TensorProto.FLOAT)
    return nodes, inits, 1


def _prune(graph: Any) -> None:
    """Drop the nodes and initializers ``graph.output`` no longer needs (the converter's label)."""
    needed = {output.name for output in graph.output}
    kept = []
    for node in reversed(graph.node):  # nodes are topologically sorted
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    initializers = [init for init in graph.initializer if init.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    value_info = [info for info in graph.value_info if info.name in needed]
    del graph.value_info[:]
    graph.value_info.extend(value_info)


def _set_default_opset(model: Any) -> None:
    """Declare the default ONNX domain (XGBoost graphs only declare ai.onnx.ml) once.

    A version the converter declared is kept so its own nodes keep their meaning; skl2onnx may
    list a domain twice, which is folded into one entry.
    """
    from onnx import helper

    versions: dict[str, int] = {}
    for opset in model.opset_import:
        versions[opset.domain] = max(versions.get(opset.domain, 0), opset.version)
    versions.setdefault("", ONNX_OPSET)
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(domain, version) for domain, version in versions.items())


def write_onnx_model(model: Any, version_dir: Path, settings: FilSettings, proba_width: int = 1) -> Path:
    """Write ``version_dir/model.onnx``: the model with FIL's inputs, outputs and semantics.

    The graph has exactly one input, ``input__0`` (FLOAT, ``[N, num_features]``), and one output,
    ``output__0`` (FLOAT, ``[N, width]``), equal to
    ``fil_output(native_predictions, settings, proba_width)``: a regressor's value (``[N, 1]``); a
    binary classifier's class (``p > threshold``), P(class 1) (``proba_width`` 1) or
    ``(1 - p, p)`` (``proba_width`` 2); a multiclass classifier's argmax or probabilities. With
    ``output_class`` false a classifier gives its probabilities (P(class 1) when binary), as FIL
    does. The native predictions of an XGBoost ``multi:softmax`` model are taken to be its class
    probabilities (what FIL computes from it), not the labels ``Booster.predict`` returns.
    ``settings.model_type`` and ``settings.treeshap_output`` are ignored: the graph has no SHAP
    output.

    XGBoost and LightGBM are converted with onnxmltools, scikit-learn with skl2onnx, at default
    opset :data:`ONNX_OPSET`. Raises :class:`~triton_nb.errors.InvalidArgumentError` for the
    models :func:`describe_tree_model` rejects, ``output_class`` on a regressor and a binary
    ``proba_width`` other than 1 or 2.
    """
    onnx = require_module("onnx", "Exporting models for the onnxruntime backend")
    from onnx import TensorProto, helper

    info = describe_tree_model(model)
    converted = _convert_to_onnx(model, info)
    graph = converted.graph
    outputs = list(graph.output)
    # Converters list (label, probabilities) for classifiers and (values,) for regressors.
    source = outputs[0].name if info.task == "regression" else outputs[1].name
    nodes, initializers, width = _fil_head(source, info, settings, proba_width)
    graph.node.extend(nodes)
    graph.initializer.extend(initializers)
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(_OUTPUT_NAME, TensorProto.FLOAT, [None, width]))
    _prune(graph)
    _set_default_opset(converted)

    version_dir = Path(version_dir)
    version_dir.mkdir(parents=True, exist_ok=True)
    path = version_dir / "model.onnx"
    onnx.save_model(converted, str(path))
    return path
